// fusebox_common (CUDA, header-only): one pointwise op on fp32 values, as fusebox's GPU code
// computes it: the GPU reference (src/reference/ops/pointwise_gpu.cu) and fusebox's own kernels'
// epilogues (src/kernels/gemv.cu), so a kernel's epilogue is the reference's formula. The CPU
// reference computes the same in double (src/reference/ops/pointwise_cpu.cpp).
#pragma once

#include <cuda_runtime.h>

#include "fusebox/ops/pointwise.h"

namespace fusebox::common {

// y of `mode` for inputs a and b (b: the second input of a binary op, the forward's x of an
// activation's backward; ignored by unary ops).
__device__ __forceinline__ float pointwise_apply(PointwiseMode mode, float a, float b) {
  switch (mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd:
      return a + b;
    case PointwiseMode::kSub:
      return a - b;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale:
      return a * b;
    case PointwiseMode::kRelu:
      return a > 0.0f ? a : 0.0f;
    case PointwiseMode::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
    }
    case PointwiseMode::kGeluErf:
      return 0.5f * a * (1.0f + erff(a * 0.7071067811865476f));
    case PointwiseMode::kSilu:
      return a / (1.0f + expf(-a));
    case PointwiseMode::kSigmoid:
      return 1.0f / (1.0f + expf(-a));
    case PointwiseMode::kTanh:
      return tanhf(a);
    case PointwiseMode::kReluBwd:
      return b > 0.0f ? a : 0.0f;  // a = dy, b = x
    case PointwiseMode::kGeluTanhBwd: {
      const float k = 0.7978845608028654f, t = tanhf(k * (b + 0.044715f * b * b * b));
      return a * (0.5f * (1.0f + t) + 0.5f * b * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * b * b));
    }
    case PointwiseMode::kGeluErfBwd:
      return a *
             (0.5f * (1.0f + erff(b * 0.7071067811865476f)) + b * expf(-0.5f * b * b) * 0.3989422804014327f);
    case PointwiseMode::kSiluBwd: {
      const float s = 1.0f / (1.0f + expf(-b));
      return a * s * (1.0f + b * (1.0f - s));
    }
    case PointwiseMode::kSigmoidBwd: {
      const float s = 1.0f / (1.0f + expf(-b));
      return a * s * (1.0f - s);
    }
    case PointwiseMode::kTanhBwd: {
      const float t = tanhf(b);
      return a * (1.0f - t * t);
    }
  }
  return a;
}

}  // namespace fusebox::common
