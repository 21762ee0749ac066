// fusebox kernels layer (private): 16-bit values (bf16 or fp16) read 8 at a time, as one 16-byte
// load where the data allows, for the kernels bound by reading them (few-row matmul, decode
// attention).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fusebox::kernels {

// One 16-bit value (bf16 or fp16 bits) as float.
template <bool kHalf>
__device__ __forceinline__ float bits_to_float(uint32_t b) {
  if constexpr (kHalf) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
  } else {
    return __uint_as_float(b << 16);
  }
}

// Value i (0-7, a constant once unrolled) of 8 packed 16-bit values.
template <bool kHalf>
__device__ __forceinline__ float value(const uint4& u, int i) {
  const uint32_t word = i < 2 ? u.x : i < 4 ? u.y : i < 6 ? u.z : u.w;
  return bits_to_float<kHalf>(i % 2 ? word >> 16 : word & 0xffffu);
}

// The 16-bit bits (bf16 or fp16, rounded to nearest even) of v.
template <bool kHalf>
__device__ __forceinline__ uint32_t float_to_bits(float v) {
  if constexpr (kHalf) {
    return __half_as_ushort(__float2half_rn(v));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}

// 8 16-bit values' bits (float_to_bits), as one 16-byte store takes them.
__device__ __forceinline__ uint4 pack8(const uint32_t (&b)[8]) {
  return make_uint4(b[0] | b[1] << 16, b[2] | b[3] << 16, b[4] | b[5] << 16, b[6] | b[7] << 16);
}

// 8 16-bit values from p, `stride` values apart: one 16-byte load (kVec: p aligned, stride 1, all
// 8 inside the tensor), else one at a time, the first `count` read and the rest 0.
template <bool kVec>
__device__ __forceinline__ uint4 load8(const void* p, int64_t count, int64_t stride = 1) {
  if constexpr (kVec) {
    return __ldg(static_cast<const uint4*>(p));
  } else {
    const auto* s = static_cast<const uint16_t*>(p);
    uint32_t t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) t[i] = i < count ? s[i * stride] : 0u;
    return make_uint4(t[0] | t[1] << 16, t[2] | t[3] << 16, t[4] | t[5] << 16, t[6] | t[7] << 16);
  }
}

}  // namespace fusebox::kernels
