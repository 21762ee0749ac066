// fusebox: the optimizer's CUDA kernels for the GPU training step (gpu_step.h): the fp32
// gradient accumulation over micro-batches, the global gradient norm and the clip factor, AdamW
// over every parameter in one launch, and the loss sum. Every parameter is one Segment; work is
// split into chunks of at most kChunk elements, one block each, so one launch covers them all.
// Reductions are in a fixed order (bit-reproducible). optimizer.h is their host reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusebox::train_kernels {

enum class ElemType : int32_t { kFP32 = 0, kBF16 = 1 };

struct Segment {
  const void* grad = nullptr;  // the backward's gradient buffer
  ElemType grad_type = ElemType::kFP32;
  float* accum = nullptr;  // fp32 sum of the micro-batches' gradients
  float* master = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  void* work = nullptr;  // the working copy the forward reads; null when the forward reads master
  ElemType work_type = ElemType::kBF16;
  int64_t n = 0;
  int32_t decay = 0;
};

struct Chunk {
  int32_t seg = 0;
  int64_t start = 0, len = 0;
};
inline constexpr int64_t kChunk = 32768;

// Per-step values the kernels write (device memory; the host reads them after the step).
struct StepScalars {
  double loss_sum = 0;  // sum over micro-batches of their mean loss / accum
  double sumsq = 0;     // of the summed gradients
  float norm = 0, coef = 1;
  int32_t finite = 1;  // loss and norm finite: AdamW ran
};

// Per-step inputs (device memory, copied from pinned host memory at the start of the step).
struct Hyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0, clip = 1;
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.05f;  // computed in double
  float c1 = 1, c2 = 1;                                   // bias corrections 1 - beta^t
  float loss_scale = 1;                                   // 1 / (tokens per micro-batch * accum)
};

// accum[i] = (first ? 0 : accum[i]) + grad[i], every segment.
cudaError_t accumulate(const Segment* segs, const Chunk* chunks, int nchunks, bool first, cudaStream_t s);
// s->sumsq, ->norm, ->coef (clip / (norm + 1e-6) when below 1), ->finite; `partials` holds nchunks
// doubles. Reads accum (or grad when `from_grad`).
cudaError_t grad_norm(const Segment* segs, const Chunk* chunks, int nchunks, bool from_grad, double* partials,
                      StepScalars* s, const Hyper* h, cudaStream_t stream);
// AdamW (torch.optim.AdamW) with the gradient times s->coef; nothing when !s->finite.
cudaError_t adamw(const Segment* segs, const Chunk* chunks, int nchunks, bool from_grad, const StepScalars* s,
                  const Hyper* h, cudaStream_t stream);
// s->loss_sum = (first ? 0 : s->loss_sum) + sum(loss[0..n)) * h->loss_scale (one block, fixed order).
cudaError_t loss_sum(const float* loss, int64_t n, bool first, StepScalars* s, const Hyper* h,
                     cudaStream_t stream);
// FP8 training's delayed scaling on the device (fusebox/fp8_scaling.h is the host rule): one
// entry per quantized buffer. The pipelines' quantize stages read scale, the FP8 GEMMs scale_inv,
// and each pass writes amax (max |x| of that pass).
struct Fp8State {
  float* scale = nullptr;          // [n]
  float* scale_inv = nullptr;      // [n]
  float* amax = nullptr;           // [n], this pass's
  float* step_amax = nullptr;      // [n], the largest over the step's micro-batches
  float* history = nullptr;        // [n * h]: a ring of the last h steps' amaxes (0 where none yet)
  const float* fp8_max = nullptr;  // [n]: 448 (e4m3) or 57344 (e5m2)
  int32_t* pos = nullptr;          // [1]: the ring's next slot
  int32_t n = 0, h = 1, margin = 0, stride = 64;
};
// step_amax = first ? amax : max(step_amax, amax).
cudaError_t fp8_fold_amax(const Fp8State& st, bool first, cudaStream_t stream);
// The step's amaxes into the ring, then every scale from the largest amax in it, as
// Fp8DelayedScaling::record does: scale = fp8_max / amax / 2^margin computed in double (a scale
// stays where the ring holds no amax above 0, or where that would overflow fp32), scale_inv =
// 1 / scale in fp32. A non-finite amax is recorded as 0 (the step's loss or norm reports it).
cudaError_t fp8_update(const Fp8State& st, cudaStream_t stream);

// work = master rounded to the working type, every segment with a working copy.
cudaError_t copy_to_working(const Segment* segs, const Chunk* chunks, int nchunks, cudaStream_t stream);

}  // namespace fusebox::train_kernels
