// fusebox serving (private): the model step on the GPU for the engine's kGpu backend
// (include/fusebox/serve.h). The graphs are lm_graphs.h's, one plan each through a Session (the
// plan cache and the plan check as for any graph); the new keys and values go into the paged
// pools with kernels::write_kv_pages and the next tokens are sampled on the GPU
// (kernels::sample_tokens).
//
// Shapes are bucketed so that nothing is built after warm-up: a decode step of B sequences runs
// the program of the smallest power-of-two bucket >= B (up to max_batch), padded, replayed as one
// CUDA graph (the inputs' upload, every layer, sampling and the tokens' download); a prompt chunk
// of up to S tokens in each of R sequences (the prompts admitted together, padded to the longest)
// runs the program of S's bucket, prefill_bucket(), and the smallest power-of-two row bucket >= R
// up to prefill_rows(), eagerly. Padding rows and a row's tokens past its count write no key or
// value, and padding rows are not sampled from.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/serve.h"
#include "fusebox/status.h"

namespace fusebox::serve {

// One sequence of a step: its `count` new tokens go to positions [start, start + count), in
// `pages` (the sequence's pages in position order); the next token is sampled with `sampling`
// and the uniform draw `u`.
// The prefill buckets: a chunk of S tokens runs at the smallest power of two >= max(S, 16), at most
// the context; a bucket of Sb tokens takes up to prefill_rows() sequences (Sb x rows <= the
// context, the activations' size). The engine groups admitted prompts by them (both backends).
int64_t prefill_bucket(int64_t S, int64_t context);
int64_t prefill_rows(int64_t Sb, int64_t context, int64_t max_batch);

struct GpuRow {
  int64_t start = 0, count = 0;
  const std::vector<int32_t>* pages = nullptr;
  SamplingParams sampling;
  double u = 0;
};

struct GpuStepOut {
  std::vector<int32_t> tokens;  // one per row
  std::vector<float> logits;    // rows x vocab, when asked for
};

class GpuForward {
 public:
  // `weights`: every parameter in fp32 (the checkpoint's); matrices are uploaded rounded to bf16
  // (nearest even), the embedding table and norm gains as they are. options.pool_pages 0: as many pages as
  // the free device memory holds. Builds every bucket's plans and captures the decode buckets' CUDA graphs
  // (the warm-up).
  static Result<std::unique_ptr<GpuForward>> create(const LmConfig& config, const EngineOptions& options,
                                                    const std::map<std::string, std::vector<float>>& weights);
  ~GpuForward();

  // One step: rows.size() sequences of up to S new tokens each (ids: row-major, rows.size() x S,
  // the tokens past a row's count ignored); S is 1 (decode, up to max_batch rows) or a prompt
  // chunk's (up to prefill_rows(prefill_bucket(S)) rows).
  Result<GpuStepOut> run(const std::vector<GpuRow>& rows, int64_t S, const std::vector<int32_t>& ids,
                         bool want_logits);

  std::string summary() const;  // buckets, plans, CUDA graphs, warm-up time, device memory
  // Where the warm-up went: plans built and read from the plan cache (with the plan checks inside
  // them and the three slowest graphs), the eager runs of every program, the CUDA graph captures.
  std::string warmup_breakdown() const;
  // Times a decode step of B sequences at `context` tokens each: the bucket's CUDA graph replayed,
  // then each of its steps eagerly between CUDA events (medians of `iters` runs), with the bytes
  // a step must read (weights, the embedding rows, the KV cache) against the device's copy peak
  // measured here. It writes keys and values into pool pages: only for an engine with no
  // requests and nothing cached (LmEngine::profile_decode checks).
  Result<std::string> profile(int64_t B, int64_t context, int iters);
  int64_t device_bytes() const;
  int64_t pool_pages() const;  // KV pages per layer (options.pool_pages, or what free memory held)

  struct Impl;

 private:
  explicit GpuForward(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox::serve
