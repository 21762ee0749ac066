// fusebox kernels layer: reduce_sum and reduce_mean over the outer dims of a
// dense tensor, keeping its innermost ones: y[k] = sum over r of x[r, k] with
// x read as rows [R, K] (include/fusebox/ops/reduction.h). The bias gradient
// of an NHWC dy (reduce over N, H, W, keeping C) is this form, and cuDNN
// 9.19's reduction engines take it at a fraction of the memory bandwidth
// (native_kernel.cpp says when fusebox takes it, with the measurements).
//
// y is fp32 and zeroed first; blocks of (K-tile x row lanes) threads sum
// their share of the rows in registers (8 columns per 16-byte load for 16-bit
// x when aligned, else one), add the lanes in shared memory, and add their
// partial sums into y with atomics. The order of those additions varies from
// run to run: like cuDNN's reductions, the result is not bit-reproducible
// (the run's CUDA-graph check compares it within tolerance).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "reduction.h"

namespace fusebox::kernels {

namespace {

constexpr int kThreads = 256;

struct ReduceArgs {
  const void* x = nullptr;
  float* y = nullptr;
  int64_t rows = 0, cols = 0;  // x as [rows, cols], dense
  int64_t y_stride = 1;        // elements between consecutive kept values of y
  float scale = 1.f;           // 1, or 1 / rows for a mean
  int dtype = 0;
};

template <int VEC>
__global__ void __launch_bounds__(kThreads) reduce_rows(ReduceArgs a) {
  __shared__ float partial[kThreads * VEC];
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * VEC;
  float sum[VEC] = {};
  if (col < a.cols) {
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; r < a.rows;
         r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
      const int64_t off = r * a.cols + col;
      if constexpr (VEC == 8) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(a.x) + off * 2));
        if (static_cast<DType>(a.dtype) == DType::kBF16) {
          const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = __bfloat1622float2(p2[k]);
            sum[2 * k] += f.x;
            sum[2 * k + 1] += f.y;
          }
        } else {
          const auto* p2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float2 f = __half22float2(p2[k]);
            sum[2 * k] += f.x;
            sum[2 * k + 1] += f.y;
          }
        }
      } else {
        sum[0] += load_as_float(a.x, a.dtype, off);
      }
    }
  }
  const int t = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < VEC; ++k) partial[t * VEC + k] = sum[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < a.cols) {
    for (int lane = 1; lane < static_cast<int>(blockDim.y); ++lane) {
#pragma unroll
      for (int k = 0; k < VEC; ++k) sum[k] += partial[(lane * blockDim.x + threadIdx.x) * VEC + k];
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k)
      if (col + k < a.cols) atomicAdd(a.y + (col + k) * a.y_stride, sum[k] * a.scale);
  }
}

class ReduceRowsKernel final : public KernelBase {
 public:
  ReduceRowsKernel() { name_ = "fusebox_reduce_rows"; }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    ReduceArgs a = args_;
    a.x = ptrs[0];
    a.y = static_cast<float*>(ptrs[1]);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (a.cols == 0) return Status::Ok();
    FUSEBOX_RETURN_IF_ERROR(common::cuda_status(
        cudaMemsetAsync(a.y, 0, static_cast<size_t>((a.cols - 1) * a.y_stride + 1) * sizeof(float), stream),
        where_, " zeroing the output"));
    if (a.rows == 0) return Status::Ok();
    const bool vec8 =
        (a.dtype == static_cast<int>(DType::kBF16) || a.dtype == static_cast<int>(DType::kFP16)) &&
        a.cols % 8 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0;
    const int vec = vec8 ? 8 : 1;
    const int64_t col_threads = (a.cols + vec - 1) / vec;
    const int tx = static_cast<int>(std::min<int64_t>(col_threads, kThreads));
    const int ty = std::max(1, kThreads / tx);
    const int64_t col_blocks = (col_threads + tx - 1) / tx;
    // About 2048 blocks in all (16 per SM on the H200), each lane at least 16 rows.
    const int64_t row_blocks = std::clamp<int64_t>(
        std::min<int64_t>(2048 / col_blocks, (a.rows + 16 * ty - 1) / (16 * ty)), 1, 65535);
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks)), block(tx, ty);
    if (vec8) {
      reduce_rows<8><<<grid, block, 0, stream>>>(a);
    } else {
      reduce_rows<1><<<grid, block, 0, stream>>>(a);
    }
    return common::cuda_status(cudaGetLastError(), where_, " kernel launch");
  }

  ReduceArgs args_;
};

}  // namespace

std::shared_ptr<const NativeKernel> make_reduce_rows_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const ReductionAttrs& a) {
  if (a.mode != ReductionMode::kSum && a.mode != ReductionMode::kMean) return nullptr;
  const ResolvedTensor& x = g.tensors[static_cast<size_t>(op.inputs.at("x"))];
  const ResolvedTensor& y = g.tensors[static_cast<size_t>(op.outputs.at("y"))];
  if (x.is_virtual || y.is_virtual || x.scalar_value || y.dtype != DType::kFP32) return nullptr;
  if (x.dtype != DType::kBF16 && x.dtype != DType::kFP16 && x.dtype != DType::kFP32) return nullptr;
  if (x.dims.size() != y.dims.size()) return nullptr;
  // Dims of x by stride, innermost first: x dense, the kept dims (y's dim = x's > 1) innermost,
  // then the reduced ones (y's dim 1); y laid out over the kept dims in the same order, dense.
  std::vector<size_t> order;
  for (size_t d = 0; d < x.dims.size(); ++d)
    if (x.dims[d] > 1) order.push_back(d);
  std::sort(order.begin(), order.end(), [&](size_t p, size_t q) { return x.strides[p] < x.strides[q]; });
  int64_t expect = 1, cols = 1, rows = 1, y_expect = -1, y_stride = 1;
  bool in_kept = true;
  for (size_t d : order) {
    if (x.strides[d] != expect) return nullptr;
    expect *= x.dims[d];
    const bool kept = y.dims[d] == x.dims[d];
    if (!kept && y.dims[d] != 1) return nullptr;
    if (kept) {
      if (!in_kept) return nullptr;  // a kept dim outside a reduced one: not rows of columns
      if (y_expect < 0) {
        y_stride = y.strides[d];
        y_expect = y_stride;
      }
      if (y.strides[d] != y_expect) return nullptr;
      y_expect *= y.dims[d];
      cols *= x.dims[d];
    } else {
      in_kept = false;
      rows *= x.dims[d];
    }
  }
  if (rows == 1 || cols > (int64_t{1} << 24)) return nullptr;  // nothing reduced, or too many columns
  auto k = std::make_shared<ReduceRowsKernel>();
  k->where_ = common::op_where(std::string(reduction_mode_name(a.mode)), op.name);
  k->args_.rows = rows;
  k->args_.cols = cols;
  k->args_.y_stride = y_stride;
  k->args_.scale = a.mode == ReductionMode::kMean ? 1.f / static_cast<float>(rows) : 1.f;
  k->args_.dtype = static_cast<int>(x.dtype);
  k->tensors_ = {x.name, y.name};
  return k;
}

}  // namespace fusebox::kernels
