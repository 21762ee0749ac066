// fusebox: the GPU training step of the language model (the trainer's kGpu backend,
// include/fusebox/train.h). One Session builds every stage of the forward and the derived
// backward pipelines (a backward stage that no engine runs whole is partitioned per GEMM by the
// session); two PipelineExecutors run them, the backward reading the forward's saved activations
// and working weights in place. The optimizer (optim_kernels.h) keeps fp32 master weights and
// moments on the device and writes the bf16 working copies the forward reads. From the second
// step on, the whole step (the token upload, accum x (forward, loss sum, backward, fp32
// accumulation), the norm and AdamW) replays as one CUDA graph; the learning rate and bias
// corrections come in through pinned memory, so the schedule needs no recapture.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/pipeline.h"
#include "fusebox/pipeline_backward.h"
#include "fusebox/status.h"
#include "fusebox/train.h"

namespace fusebox {

using ParamMap = std::map<std::string, std::vector<float>>;

struct GpuStepResult {
  double loss = 0, norm = 0;
  bool finite = true;
  bool graph = false;  // replayed as a CUDA graph
};

// train.fp8: the buffers the pipelines quantize (each with fp8.scale.<b>, fp8.scale_inv.<b> and,
// where recorded, fp8.amax.<b> buffers: fusebox/fp8_training.h) and the delayed scaling's history
// and margin. The step keeps the scaling state on the device (optim_kernels.h, Fp8State).
struct GpuFp8 {
  std::vector<std::pair<std::string, DType>> tensors;
  int64_t history = 16, margin = 0;
};

class GpuStep {
 public:
  // `fwd` is the model at the training batch; `bwd` and `derived` its backward. The pipelines
  // must outlive the step. `plan_cache`: a plan cache file ("" none).
  static Result<std::unique_ptr<GpuStep>> create(const LmConfig& config, const Pipeline& fwd,
                                                 const Pipeline& bwd, const PipelineBackward& derived,
                                                 const std::string& plan_cache, const GpuFp8* fp8 = nullptr);
  ~GpuStep();

  // train.fp8: forward and backward passes of the first micro-batch of ids and labels, without an
  // update, each recording the amaxes and updating the scales, until every quantized buffer has an
  // amax above 0 or a pass adds none (at most max_passes). Returns the passes run.
  Result<int> fp8_calibrate(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                            int max_passes);
  // train.fp8: the device scaling state in Fp8DelayedScaling::state()'s form ("fp8_scale.<b>" [1],
  // "fp8_amax_history.<b>" [history], oldest first), and back (restore() has checked it).
  Result<std::map<std::string, std::vector<float>>> fp8_state() const;
  Status fp8_restore(const std::map<std::string, std::vector<float>>& state);

  Status upload(const ParamMap& master, const ParamMap& m, const ParamMap& v);
  Status download(ParamMap* master, ParamMap* m, ParamMap* v) const;
  // One optimizer step over accum micro-batches (ids and labels: accum x batch x seq each).
  // A non-finite loss or norm leaves the parameters and moments unchanged (finite = false).
  Result<GpuStepResult> step(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels, double lr,
                             int64_t t);
  // LmTrainer::profile_step: every stage and kernel of a step timed alone, then the whole step.
  // Runs the optimizer: the caller uploads the state again afterwards.
  Result<LmStepProfile> profile(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                                int iters);
  // The mean loss of one micro-batch, forward only.
  Result<double> loss(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels);
  // The summed gradients of the last step (before clipping), by parameter.
  Result<ParamMap> gradients() const;
  // Per-parameter sum of squares of the last step's gradients: which one is non-finite.
  Result<std::string> first_non_finite_gradient() const;
  int64_t device_bytes() const;
  std::string plan_summary() const;  // stages, engines, partitioned stages, build time

  struct Impl;

 private:
  explicit GpuStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
