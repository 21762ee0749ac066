// fusebox kernels layer (private): FP8 conversion helpers shared by the quantize op's kernel
// (quantize.cu) and the pointwise graphs that quantize their outputs (pointwise.cu): a value to its
// FP8 byte, 8 values to 8 bytes with their largest magnitude, and a block's amax into memory.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "packed16.cuh"

namespace fusebox::kernels {

// v to e4m3 or e5m2: nearest even, saturated to the largest finite value, NaN kept.
__device__ __forceinline__ unsigned char to_fp8(float v, bool e5m2) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// 8 values times s as 8 FP8 bytes (value k in byte k of the pair), their largest |v| into m (NaN
// skipped, as fmaxf skips it).
__device__ __forceinline__ uint2 fp8x8(const float (&v)[8], float s, bool e5m2, float& m) {
  uint32_t lo = 0, hi = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    m = fmaxf(m, fabsf(v[k]));
    const uint32_t b = to_fp8(v[k] * s, e5m2);
    if (k < 4) {
      lo |= b << (8 * k);
    } else {
      hi |= b << (8 * (k - 4));
    }
  }
  return make_uint2(lo, hi);
}

// The same for 8 packed 16-bit values (bf16, or fp16 with kHalf).
template <bool kHalf>
__device__ __forceinline__ uint2 fp8x8(const uint4& u, float s, bool e5m2, float& m) {
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = value<kHalf>(u, k);
  return fp8x8(v, s, e5m2, m);
}

// Byte k (0-7) of 8 packed FP8 bytes.
__device__ __forceinline__ unsigned char fp8_byte(const uint2& b, int k) {
  return static_cast<unsigned char>(((k < 4 ? b.x : b.y) >> (8 * (k % 4))) & 0xffu);
}

// The block's largest |x| into *amax (as bits: non-negative floats order like them); NaN is skipped.
// Every thread of the block calls it; a second call in one kernel needs a __syncthreads() between.
__device__ inline void block_amax(float m, unsigned* amax) {
  __shared__ float warp_max[32];
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int t = threadIdx.x + threadIdx.y * blockDim.x, lane = t % 32, warp = t / 32;
  const int warps = (blockDim.x * blockDim.y + 31) / 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (t == 0) {
    float r = 0.f;
    for (int w = 0; w < warps; ++w) r = fmaxf(r, warp_max[w]);
    // Most blocks find a larger amax already there: reading first keeps them off the one address
    // every block would otherwise update atomically (the transposed cast of a [32768, 768] tensor,
    // 24576 blocks each with its atomic, moved 483 GB/s on an H100, 2026-12-06).
    if (r > __uint_as_float(*reinterpret_cast<volatile unsigned*>(amax))) atomicMax(amax, __float_as_uint(r));
  }
}

}  // namespace fusebox::kernels
