// fusebox: training a Llama-style language model (docs/lm.md fixes the model, the data,
// the optimizer and the checkpoint; docs/training.md shows the command and the loop).
//
// The model is declared as a forward pipeline of graphs (write_lm_pipeline); its
// backward pipeline is derived by the gradient rules (fusebox/pipeline_backward.h); the
// trainer runs forward, loss, backward, clipping and AdamW as one step over fp32 master
// weights, bf16 working copies and fp32 moments.
//
// Backends: kReference runs every stage through the CPU reference (tiny models: the CI
// training run, gradient checks); kGpu runs the step on the GPU (src/train/gpu_step.h: cuDNN
// plans and fusebox's kernels per stage, the optimizer in one launch, the step replayed as one
// CUDA graph from the second on).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/distributed.h"
#include "fusebox/gradient_check.h"
#include "fusebox/status.h"

namespace fusebox {

struct LmModelConfig {
  int64_t vocab = 0;  // required
  int64_t dim = 768, layers = 12, heads = 12, kv_heads = 4, head_dim = 64, ffn_dim = 2048, context = 1024;
  double rope_theta = 10000, norm_eps = 1e-5, init_std = 0.02;
};

struct LmTrainConfig {
  int64_t batch = 32, accum = 1, warmup = 100, val_batches = 4;
  // "none": the backward reads every stage's saved output. "mlp": each layer's SwiGLU MLP (the
  // gate and up GEMMs, silu, the product, the down GEMM and the residual) is one stage; only the
  // product reaches memory, and the backward recomputes silu(x @ w_gate) and x @ w_up: one
  // [tokens, ffn_dim] activation per layer fewer for two more GEMMs (saved_activation_bytes()
  // reports each choice).
  std::string recompute = "none";
  // How the SwiGLU MLP's forward is staged (recompute "none" only). "fused": silu rides the gate
  // GEMM's epilogue and the product the up GEMM's, so x @ w_gate and x @ w_up stay virtual and the
  // derived backward recomputes both GEMMs. "split": two plain GEMMs write x @ w_gate and x @ w_up,
  // and a pointwise stage forms silu(a) * b: the backward recomputes no GEMM, for one more
  // [tokens, ffn_dim] activation kept per layer (saved_activation_bytes() reports it).
  std::string swiglu = "fused";
  // Backward ops without atomics (embedding_bwd's per-column sums), so that a resumed run repeats
  // an uninterrupted one bit for bit on the GPU too; slower there. The reference backend is
  // deterministic either way.
  bool deterministic = false;
  // The backward's intermediate buffers (gradient parts, mostly) share one device arena by their
  // lives in the backward's stage order (fusebox/pipeline_run.h, plan_buffer_arena) instead of one
  // allocation each. GPU backend only; not yet the default (not yet run on a GPU).
  bool share_buffers = false;
  // FP8 training (fusebox/fp8_training.h): the transformer blocks' GEMMs read e4m3 copies of their
  // inputs and weights forward and e5m2 copies of the gradients backward, each with a per-tensor
  // delayed scale (fusebox/fp8_scaling.h: the largest amax of the last fp8_history steps, over
  // 2^fp8_margin); the output projection stays in bf16. Master weights and AdamW stay fp32.
  bool fp8 = false;
  // FP8: the casts of buffers a pointwise stage writes (the gated MLP's product and its backward,
  // gradient sums) fused into that stage (Fp8RewriteOptions::fuse_casts; its kernel,
  // fusebox_pointwise_quantize, verified on an H100 and 3.4% faster on the 125M step, docs/training.md);
  // false: stages of their own.
  bool fp8_fuse_casts = true;
  int64_t fp8_history = 16, fp8_margin = 0;
  double lr = 6e-4, min_lr = 6e-5, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, clip = 1.0;
  uint64_t seed = 1;
};

struct LmConfig {
  LmModelConfig model;
  LmTrainConfig train;
};

// {"model": {...}, "train": {...}}: unknown keys, wrong types and out-of-range values are
// InvalidArgument naming the key and what is accepted. `origin` names the file in messages.
Result<LmConfig> parse_lm_config(std::string_view json, std::string_view origin);
Result<LmConfig> load_lm_config(const std::string& path);
// Every field, in the file's form (what a checkpoint records).
std::string lm_config_json(const LmConfig& c);

struct LmParameter {
  std::string name;            // docs/lm.md's name, also the forward pipeline's buffer
  std::vector<int64_t> shape;  // [in, out] for matrices
  bool decay = true;           // AdamW's weight decay applies (2-D parameters)
  double init_std = 0;         // normal(0, init_std); 0: ones (the norm gains)
  int64_t elements() const;
};
std::vector<LmParameter> lm_parameters(const LmModelConfig& m);
// Parameters, without the two embedding matrices when `with_embeddings` is false.
int64_t lm_parameter_count(const LmModelConfig& m, bool with_embeddings = true);

// docs/lm.md's schedule: linear warmup, then cosine to min_lr at `total_steps`.
double lm_learning_rate(const LmTrainConfig& t, int64_t step, int64_t total_steps);

// The model's forward pipeline for `batch` sequences of `seq` tokens: `dir`/lm.json and its
// graph files (written atomically; `dir` is created). Buffers: inputs "ids" and "labels"
// (int32 [batch*seq]), "freqs" (RoPE angles, fp32 [seq, head_dim/2]) and one per parameter;
// outputs "loss" (fp32 per token), "lse" and the saved statistics. Returns the file's path.
// `recompute` and `swiglu` as LmTrainConfig's.
Result<std::string> write_lm_pipeline(const LmModelConfig& m, int64_t batch, int64_t seq,
                                      const std::string& dir, const std::string& recompute = "none",
                                      const std::string& swiglu = "fused");
// The parameters of a checkpoint (docs/lm.md, "Checkpoints") of this model config, fp32 by name:
// a file that is not one, or of another config, is an error naming the first mismatched tensor.
Result<std::map<std::string, std::vector<float>>> load_lm_weights(const LmConfig& config,
                                                                  const std::string& checkpoint);
// The model config a checkpoint records (its metadata), as parse_lm_config() reads it.
Result<LmConfig> lm_checkpoint_config(const std::string& checkpoint);
// RoPE angles for positions [0, seq): p * rope_theta^(-2i/head_dim), row-major [seq, head_dim/2].
std::vector<float> lm_rope_angles(const LmModelConfig& m, int64_t seq);

// A token stream (docs/lm.md, "Data files"): a 1-D .npy of ids in [0, vocab), at least
// seq + 1 of them. A file that is not such an array is one clear error.
struct TokenStream {
  std::string path;
  std::vector<int32_t> tokens;
  int64_t sequences(int64_t seq) const;  // (n - 1) / seq
};
Result<TokenStream> load_token_stream(const std::string& path, int64_t vocab, int64_t seq);
// docs/lm.md's batching rule: `batch` sequences from sequence `first` on, wrapping around.
void lm_micro_batch(const TokenStream& s, int64_t seq, int64_t batch, int64_t first,
                    std::vector<int32_t>* ids, std::vector<int32_t>* labels);

// docs/lm.md's vocab_bytes.json: each token id's bytes (decoding is concatenation). A file that
// is not one, or of another vocabulary size, is one error naming it.
Result<std::vector<std::string>> load_vocab_bytes(const std::string& path, int64_t vocab);

enum class TrainBackend { kReference, kGpu };

struct LmTrainerOptions {
  std::string work_dir;     // the generated pipelines go to work_dir/forward and work_dir/backward
  int64_t total_steps = 0;  // the schedule's length
  TrainBackend backend = TrainBackend::kReference;
  std::string plan_cache;  // kGpu: the plan cache file ("" none)
  // Data parallel (fusebox/distributed.h, issue 31): this rank's communicator (not owned; null:
  // one rank). With world size W > 1, config.train.batch is the global micro-batch: each rank
  // runs batch / W sequences (batch must divide), the loss and gradients are all-reduced, and
  // every rank takes the same update. The reference backend only for now (the GPU step needs a
  // device communicator: NotSupported).
  Communicator* communicator = nullptr;
  int64_t bucket_bytes = int64_t{25} << 20;  // gradients all-reduced together (as torch DDP's 25 MiB)
};

struct LmStepResult {
  int64_t step = 0;      // the optimizer step just taken (from 0)
  double loss = 0;       // mean over its micro-batches
  double grad_norm = 0;  // before clipping
  double lr = 0;
  double seconds = 0;
  int64_t tokens = 0;
  bool cuda_graph = false;  // kGpu: the step replayed as one CUDA graph
  int world_size = 1;       // ranks the step ran on (LmTrainerOptions::communicator)
  int buckets = 0;          // gradient all-reduces issued (world_size > 1)
};

// One row of LmTrainer::profile_step(): a stage of the step, or one of the trainer's own kernels.
struct LmStepProfileRow {
  std::string part;    // "forward", "backward" or "optimizer" (the trainer's own kernels)
  std::string stage;   // the pipeline stage, or what the kernel does
  std::string engine;  // the stage's bound plan; "" for the trainer's kernels
  double ms = 0;       // median over the runs, launched back to back
  double flops = 0;    // the stage graph's; 0 for the trainer's kernels
};

struct LmStepProfile {
  std::vector<LmStepProfileRow> rows;  // in the order a micro-batch runs them, then the optimizer
  int iters = 0;
  int64_t accum = 1;         // micro-batches per step: the stage rows are per micro-batch
  double step_ms = 0;        // the whole step as training runs it (one CUDA graph launch), median
  double step_eager_ms = 0;  // the same step launched stage by stage
  std::string graph_note;    // why step_ms is 0 (the step could not be captured)
};

// An LmStepProfile summed by kind: a stage name's ".<n>." becomes ".*." (the layers summed);
// times and FLOPs per step (a forward or backward row times accum); largest time first.
struct LmStepProfileKind {
  std::string part, stage;
  double ms = 0, flops = 0;
  int count = 0;                     // rows summed
  std::vector<std::string> engines;  // distinct, sorted
};
std::vector<LmStepProfileKind> lm_profile_by_kind(const LmStepProfile& p);
// Every row's time per step, summed: what the step would take run part by part.
double lm_profile_sum_ms(const LmStepProfile& p);
// The profile as one JSON document: the totals, the kinds and every row (`train lm --profile`).
std::string lm_profile_json(const LmStepProfile& p);

class LmTrainer {
 public:
  static Result<std::unique_ptr<LmTrainer>> create(const LmConfig& config, const LmTrainerOptions& options);
  ~LmTrainer();
  LmTrainer(const LmTrainer&) = delete;
  LmTrainer& operator=(const LmTrainer&) = delete;

  // Seeded initialization (docs/lm.md); zero moments, step 0, data position 0.
  void init_parameters();
  // One optimizer step over `accum` micro-batches of `train`. A non-finite loss or gradient
  // is an error naming the step and the first such tensor; the parameters are then unchanged.
  Result<LmStepResult> step(const TokenStream& train);
  // The same step on the caller's micro-batches: `ids` and `labels` hold accum x batch x context
  // tokens (micro-batch after micro-batch, each row-major [batch, context]); labels are the next
  // tokens. The data position advances by accum x batch sequences, as with a stream.
  Result<LmStepResult> step_tokens(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels);
  // Mean loss over the first `batches` micro-batches of `val` (forward only).
  Result<double> validation_loss(const TokenStream& val, int64_t batches);
  // The logits (fp32, vocab values) of the token after `tokens`: a full forward of the training
  // pipeline's stages at batch 1 (the serving engine's tests compare with it). Small models.
  Result<std::vector<float>> next_token_logits(const std::vector<int32_t>& tokens);
  // Greedy continuation of `prompt` by `n` tokens (at most `context` tokens in all).
  Result<std::vector<int32_t>> generate(const std::vector<int32_t>& prompt, int64_t n);
  // kGpu: where a step's time goes. Each stage of the forward and backward, and each of the
  // optimizer's kernels, runs `iters` times back to back on the next micro-batches of `train`
  // (CUDA events, median), then the whole step, as a CUDA graph and eagerly. The parameters,
  // moments, step and data position are as before: the state is downloaded first and uploaded
  // again before the next step. NotSupported on the reference backend.
  Result<LmStepProfile> profile_step(const TokenStream& train, int iters = 20);

  // Checkpoints (docs/lm.md): parameters, moments, step and data position; written through a
  // temporary file. Loading refuses another model config, naming the first mismatched tensor.
  Status save_checkpoint(const std::string& path) const;
  Status load_checkpoint(const std::string& path);
  // The summed gradients of the last step (before clipping), as "grad.<name>", and its loss.
  Status save_gradients(const std::string& path) const;

  // The derived backward checked against finite differences (fusebox/gradient_check.h) on
  // this model's pipeline at batch 1 and `seq` tokens, in fp32, to 1% (the chain's fp32
  // rounding over many stages, divided by the difference's step). Small models only.
  Result<GradientCheck> check_gradients(int64_t seq, uint32_t seed = 1);

  int64_t steps_done() const;
  int64_t sequences_done() const;
  const LmConfig& config() const;
  const std::map<std::string, std::vector<float>>& parameters() const;
  // Bytes the step keeps: parameters, moments, gradients and the saved activations of one
  // micro-batch (the backward's saved buffers).
  int64_t saved_activation_bytes() const;
  // Where create() spent its time (phase, milliseconds): the pipelines, the backward, on the GPU
  // the plans (from the plan cache when warm) and the executors. The first step's own time is
  // its LmStepResult::seconds.
  const std::vector<std::pair<std::string, double>>& startup_ms() const;
  // kGpu: the device memory the step holds, and how its plans were built; 0 and "" otherwise.
  int64_t device_bytes() const;
  std::string plan_summary() const;

 private:
  struct Impl;
  explicit LmTrainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
