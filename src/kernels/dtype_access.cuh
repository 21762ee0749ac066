// fusebox kernels layer (private): reading and writing one value of a graph
// dtype (bf16, fp16, fp32) as float, for kernels that take any of them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "fusebox/graph.h"

namespace fusebox::kernels {

__device__ __forceinline__ float load_as_float(const void* p, int dtype, int64_t off) {
  switch (static_cast<DType>(dtype)) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
    case DType::kFP16:
      return __half2float(static_cast<const __half*>(p)[off]);
    default:
      return static_cast<const float*>(p)[off];
  }
}

__device__ __forceinline__ void store_from_float(void* p, int dtype, int64_t off, float v) {
  switch (static_cast<DType>(dtype)) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[off] = __float2bfloat16_rn(v);
      break;
    case DType::kFP16:
      static_cast<__half*>(p)[off] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[off] = v;
      break;
  }
}

}  // namespace fusebox::kernels
