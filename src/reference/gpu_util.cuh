// Device helpers shared by the naive GPU references (reference_gpu.cu,
// sdpa_fp8_bwd_gpu.cu). Tensors are any struct with `ptr`, `dtype` (a DType
// as int), `strides` and `scalar` (the value when ptr is null).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "fusebox/dtype.h"

namespace fusebox::reference_detail::gpu {

__device__ __forceinline__ float load_as_float(const void* p, int dtype, int64_t off) {
  switch (static_cast<DType>(dtype)) {
    case DType::kFP32:
      return static_cast<const float*>(p)[off];
    case DType::kBF16: {
      const unsigned int b = static_cast<const unsigned short*>(p)[off];
      return __uint_as_float(b << 16);
    }
    case DType::kFP16:
      return __half2float(__ushort_as_half(static_cast<const unsigned short*>(p)[off]));
    case DType::kFP8E4M3: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[off], __NV_E4M3);
      return __half2float(__half(h));
    }
    case DType::kFP8E5M2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[off], __NV_E5M2);
      return __half2float(__half(h));
    }
    case DType::kInt32:
      return static_cast<float>(static_cast<const int*>(p)[off]);
    case DType::kInt64:
      return static_cast<float>(static_cast<const long long*>(p)[off]);
    case DType::kUInt8:
      return static_cast<float>(static_cast<const unsigned char*>(p)[off]);
  }
  return 0.0f;
}

template <typename Tensor>
__device__ __forceinline__ float load_at(const Tensor& t, int64_t off) {
  return t.ptr ? load_as_float(t.ptr, t.dtype, off) : t.scalar;
}

// Offset of row (b, h, s) of a [B, H, S, D] tensor.
template <typename Tensor>
__device__ __forceinline__ int64_t row_offset(const Tensor& t, int64_t b, int64_t h, int64_t s) {
  return b * t.strides[0] + h * t.strides[1] + s * t.strides[2];
}

// x (n values in shared memory) . the row of t starting at `base`, along dim 3.
template <typename Tensor>
__device__ __forceinline__ float dot_row(const float* x, const Tensor& t, int64_t base, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc += x[d] * load_at(t, base + d * t.strides[3]);
  return acc;
}

// Block-wide max (is_max) or sum over kThreads threads; every thread gets the
// result. `red` holds kThreads / 32 floats of shared memory.
template <int kThreads>
__device__ float block_reduce(float x, bool is_max, float* red) {
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// Non-negative floats order like their bits as ints. A null target is skipped.
__device__ __forceinline__ void atomic_max_nonneg(float* p, float v) {
  if (p) atomicMax(reinterpret_cast<int*>(p), __float_as_int(v));
}

// Saturating, round-to-nearest-even fp8: e5m2 when `e5m2`, else e4m3.
__device__ __forceinline__ float round_fp8(float x, bool e5m2 = false) {
  const __nv_fp8_interpretation_t k = e5m2 ? __NV_E5M2 : __NV_E4M3;
  const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, k);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, k)));
}

}  // namespace fusebox::reference_detail::gpu
