// fusebox: row-wise FP8 quantization (kernels/quantize.h): one block per row, the row's largest
// magnitude by a block reduction, then each element divided by the scale and converted.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "fusebox/dtype.h"
#include "kernels/quantize.h"

namespace fusebox::kernels {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline float row_scale(float amax) { return amax > 0.f ? amax / kE4M3Max : 1.f; }

__global__ void quantize_rows_kernel(Fp8Rows r) {
  __shared__ float part[kThreads];
  const int64_t row = blockIdx.x;
  const auto* x = static_cast<const __nv_bfloat16*>(r.x) + row * r.ld;
  float m = 0.f;
  for (int64_t c = threadIdx.x; c < r.cols; c += kThreads) m = fmaxf(m, fabsf(__bfloat162float(x[c])));
  part[threadIdx.x] = m;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  const float scale = row_scale(part[0]);
  if (threadIdx.x == 0) r.scale[row] = scale;
  auto* q = static_cast<__nv_fp8_e4m3*>(r.q) + row * r.cols;
  for (int64_t c = threadIdx.x; c < r.cols; c += kThreads)
    q[c] = __nv_fp8_e4m3(__fdiv_rn(__bfloat162float(x[c]), scale));  // saturating, nearest even
}

}  // namespace

Status quantize_rows_fp8(const Fp8Rows& r, void* stream) {
  if (r.rows < 0 || r.cols < 1 || r.ld < r.cols)
    return InvalidArgument("quantize_rows_fp8: rows " + std::to_string(r.rows) + ", cols " +
                           std::to_string(r.cols) + ", ld " + std::to_string(r.ld) +
                           ": rows >= 0, cols >= 1 and ld >= cols");
  if (r.rows == 0) return Status::Ok();
  if (!r.x || !r.q || !r.scale) return InvalidArgument("quantize_rows_fp8: a null device pointer");
  if (r.rows > (int64_t{1} << 31) - 1) return InvalidArgument("quantize_rows_fp8: over 2^31 rows");
  quantize_rows_kernel<<<static_cast<unsigned>(r.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError, std::string("quantize_rows_fp8: ") + cudaGetErrorString(err));
  return Status::Ok();
}

void quantize_rows_fp8_host(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, std::fabs(x[r * cols + c]));
    const float s = row_scale(m);
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c)
      q[r * cols + c] = float_to_fp8_bits(x[r * cols + c] / s, DType::kFP8E4M3);
  }
}

}  // namespace fusebox::kernels
