// fusebox: per-tensor delayed scaling for FP8 training (issue 33, "FP8 training"), the recipe of
// Transformer Engine: each FP8 tensor of a step (a GEMM's e4m3 inputs forward, its e5m2 gradients
// backward) is quantized with a scale chosen from the amaxes of earlier steps, so the step needs
// no pass over the tensor before its cast; the step's own amax (written by the casts: the quantize
// op's amax output) is recorded after it for the next ones.
//
//   scale = fp8_max(dtype) / amax_history / 2^margin,  x_fp8 = cast(x * scale), x = x_fp8 / scale
//
// amax_history is the largest of the last `history` recorded amaxes (or the last one, kMostRecent).
// A scale stays as it was where that amax is 0 (nothing recorded yet, or an all-zero tensor); a
// non-finite amax is refused, naming the tensor (the step that produced it overflowed or diverged).
// The trainer's FP8 step (fusebox/fp8_training.h, train.fp8) keeps this state on the host for the
// reference backend; the GPU step keeps the same rule on the device (src/train/optim_kernels.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/status.h"

namespace fusebox {

struct Fp8ScalingConfig {
  int64_t history = 16;  // steps of amax kept per tensor (Transformer Engine's amax_history_len)
  int margin = 0;        // scales divided by 2^margin: headroom for growth between steps
  enum class Amax { kMaxOfHistory, kMostRecent } amax = Amax::kMaxOfHistory;
};

class Fp8DelayedScaling {
 public:
  // One entry per tensor: its name and FP8 dtype (e4m3 or e5m2). InvalidArgument for another
  // dtype, a repeated name, a history outside [1, 1024] or a margin outside [0, 32].
  static Result<Fp8DelayedScaling> create(const std::vector<std::pair<std::string, DType>>& tensors,
                                          const Fp8ScalingConfig& config);

  // The scale to quantize `tensor` with in the coming step (1 until an amax is recorded), and its
  // inverse (what a GEMM multiplies its fp8 product by). InvalidArgument for an unknown tensor.
  Result<float> scale(const std::string& tensor) const;
  Result<float> scale_inv(const std::string& tensor) const;
  // After a step: the amax of the values `tensor` held before its cast (the epilogue's amax). The
  // scale for the next step is updated at once.
  Status record(const std::string& tensor, float amax);

  // The state as fp32 vectors by name (for a checkpoint: "fp8_scale.<tensor>" [1],
  // "fp8_amax_history.<tensor>" [history], the most recent last), and back. restore() checks every
  // tensor is there with the right length and finite, non-negative values, naming the first that is not.
  std::map<std::string, std::vector<float>> state() const;
  Status restore(const std::map<std::string, std::vector<float>>& state);

  const Fp8ScalingConfig& config() const { return config_; }
  std::vector<std::string> tensors() const;

 private:
  struct Entry {
    DType dtype = DType::kFP8E4M3;
    float scale = 1.f;
    std::vector<float> history;  // at most config_.history, oldest first
  };
  Result<const Entry*> find(const std::string& tensor) const;
  void update_scale(Entry& e) const;

  Fp8ScalingConfig config_;
  std::map<std::string, Entry> entries_;
};

}  // namespace fusebox
