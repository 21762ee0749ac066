// fusebox: serving the language model of docs/lm.md (issue 34, docs/serving.md): requests in,
// tokens out, with continuous batching over a paged KV cache.
//
// Each step() admits waiting requests while the KV pool can hold them (prompt plus
// max_new_tokens, less the prefix pages already cached for the same prompt prefix), prefills
// the admitted prompts (the parts not cached) together through paged attention, one padded batch
// per prefill length bucket (serve: prefill_bucket/prefill_rows), then decodes one token
// for every running request in one batch; finished requests leave and free their pages. Prefix
// pages (whole pages of prompt tokens) are shared between requests and kept, least recently
// used first out, until the pool needs them.
//
// Backends: kReference computes every stage with the CPU reference (small models; the tests
// compare its logits with the trainer's full forward). kGpu runs the same graphs as cuDNN (or
// fusebox) plans on the GPU: the paged pools on the device, decode steps replayed as one CUDA
// graph per batch-size bucket (powers of two up to max_batch, padded), prompt batches in
// power-of-two length buckets (16 up to the context) by power-of-two row buckets (length x rows
// at most the context), sampling on the GPU; every bucket is built
// at create(), so nothing is built on the request path. Without a GPU it is refused
// (NotSupported).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/status.h"
#include "fusebox/train.h"

namespace fusebox {

struct SamplingParams {
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;       // 0: all
  double top_p = 1;        // 1: all
  uint64_t seed = 0;       // per request: the same seed and prompt give the same tokens
};

struct LmRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int64_t max_new_tokens = 16;
  int32_t stop_token = -1;  // ends the request when sampled (-1: none)
  // Teacher forcing (verification): when not empty, the i-th new token is forced[i] instead of
  // the sampled one; the logits are computed as usual (last_logits, with keep_logits on kGpu).
  // max_new_tokens may not exceed its size.
  std::vector<int32_t> forced;
};

struct TokenEvent {
  int64_t request = 0;
  int32_t token = 0;
  bool finished = false;
};

enum class ServeBackend { kReference, kGpu };
// The layers' weight matrices (wq, wk, wv, wo, w_gate, w_up, w_down; the embedding table, the
// output projection and the norm gains stay as they are): bf16, or FP8 e4m3 with one fp32 scale
// per output channel or per tensor. With FP8 each GEMM's input activations are quantized by token
// (one scale per row) and the product descaled in the GEMM's epilogue (fusebox's FP8 GEMM).
enum class ServeWeights { kBF16, kFP8Channel, kFP8Tensor };

struct EngineOptions {
  ServeBackend backend = ServeBackend::kReference;
  int64_t max_batch = 8;   // running requests at most
  int64_t page_size = 16;  // tokens per KV page
  // KV pages per layer (each page: kv_heads x page_size x head_dim, K and V); on kGpu 0 means
  // as many as 90% of the device's free memory holds after a 2 GiB reserve, at most 4 full
  // contexts per running request (max_batch).
  int64_t pool_pages = 256;
  // kGpu: copy each step's logits to the host for last_logits() (tests; B x vocab floats a step).
  bool keep_logits = false;
  std::string plan_cache;  // kGpu: a plan cache file ("" none)
  ServeWeights weights = ServeWeights::kBF16;
  // kGpu: build the prompt buckets' plans at create(). false: the decode buckets only (a profile of
  // the decode step needs no prompt; `serve lm --profile-decode` sets it), and a prompt then builds
  // its bucket on the request path.
  bool warm_prompt_buckets = true;
  // A request's tokens do not depend on the requests it runs beside (issue 34, "continuous batching
  // changes nothing"), bit for bit: each prompt is prefilled alone (its own batch, no prefix pages
  // shared with other requests), and on kGpu the decode step runs kernels whose rows do not depend
  // on the batch: fusebox_gemv for every GEMM (the RMSNorms in its prologue) and
  // fusebox_sdpa_decode for the attention, pinned, where cuDNN's engines are faster. bf16 weights.
  bool deterministic = false;
  // An FP8 KV cache: each new key and value row (head_dim values of one token and KV head) is stored
  // as e4m3 times 448 / its largest magnitude, with that magnitude / 448 beside it (fp32): 1 byte a
  // value instead of 2, plus 4 bytes a row. Attention reads it through sdpa_fwd's FP8 cache
  // (descale_k, descale_v): on kGpu fusebox_sdpa_decode for the decode step, cuDNN 9.19 having no
  // such attention. bf16 weights or FP8 ones alike.
  bool fp8_kv = false;
  // kGpu: every decode-step graph whose engine is not pinned is tuned at warm-up (TunePolicy,
  // CUDA-graph timing, cuDNN's first 4 admissible candidates and fusebox's pinned-only kernel:
  // engines' last candidate), and the verified winner runs; with a plan cache the winners
  // are stored, so a later start reads them instead of tuning again. A graph that cannot be tuned
  // takes the session's choice. Not with `deterministic` (its kernels are pinned).
  bool tune_decode = false;
};

struct EngineStats {
  int64_t steps = 0, prefill_tokens = 0, cached_prompt_tokens = 0, decode_tokens = 0;
  int64_t prefill_batches = 0;  // padded prompt batches run (the prompts admitted in a step, by bucket)
  int64_t running = 0, waiting = 0;
  int64_t pages_used = 0, pages_cached = 0, pages_free = 0;  // cached: prefix pages no request holds
  int64_t pages_total = 0;                                   // the pool's pages per layer
};

class LmEngine {
 public:
  // The model: a docs/lm.md config and a checkpoint of it (the trainer's).
  static Result<std::unique_ptr<LmEngine>> create(const LmConfig& config, const std::string& checkpoint,
                                                  const EngineOptions& options);
  ~LmEngine();
  LmEngine(const LmEngine&) = delete;
  LmEngine& operator=(const LmEngine&) = delete;

  // Queues a request; its id. A prompt outside the vocabulary, longer than the context with
  // its new tokens, or larger than the whole pool is refused here.
  Result<int64_t> add_request(const LmRequest& r);
  // One engine step: admissions and their prefill, then one decode token for every running
  // request. The tokens produced, in request order.
  Result<std::vector<TokenEvent>> step();
  bool idle() const;  // nothing waiting or running
  EngineStats stats() const;
  // The backend, and for kGpu its buckets, KV pages, plans, CUDA graphs, warm-up time and device memory.
  std::string summary() const;
  // kGpu: times a decode step of `batch` sequences at `context` tokens (its CUDA graph, then stage
  // by stage; medians of `iters` runs), with the bytes it reads against the device's copy peak
  // measured in the same call: a table, one line per stage shape. It writes into the KV pool, so
  // it is refused unless the engine has no requests and no cached prefix pages.
  Result<std::string> profile_decode(int64_t batch, int64_t context, int iters = 20);
  // The logits (fp32, vocab values) each request's last token was sampled from, for tests (a
  // finished request's until the next step, when finished requests are dropped; on kGpu only
  // with keep_logits, else empty).
  const std::vector<float>& last_logits(int64_t request) const;

 private:
  struct Impl;
  explicit LmEngine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The sampling rule (on the host): temperature, then top-k, then top-p over the softmax, one
// draw from `u` in [0, 1); greedy (the first largest logit) when temperature is 0.
int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, double u);

}  // namespace fusebox
