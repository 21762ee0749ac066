// fusebox: the GPU reference of the norm ops (layernorm): one block per row,
// fp32 sums, two passes over the row (mean, then centered squares).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

constexpr int kNormThreads = 256;

// The offset of logical (row-major) element i of t.
__device__ __forceinline__ int64_t offset_of(const DevTensor& t, int64_t i) {
  int64_t off = 0;
  for (int d = t.rank - 1; d >= 0; --d) {
    off += (i % t.dims[d]) * t.strides[d];
    i /= t.dims[d];
  }
  return off;
}

__device__ __forceinline__ float load_logical(const DevTensor& t, int64_t i) { return load_at(t, offset_of(t, i)); }

struct NormArgs {
  DevTensor x, scale, bias;  // bias.ptr == nullptr and scalar 0: no bias
  int64_t rows, n;
  float epsilon;
  int has_bias;
};

__global__ void __launch_bounds__(kNormThreads)
    layernorm_fwd_kernel(NormArgs a, float* y, float* mean_out, float* inv_var_out) {
  __shared__ float red[kNormThreads / 32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t base = r * a.n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) s += load_logical(a.x, base + i);
    const float mean = block_reduce<kNormThreads>(s, false, red) / static_cast<float>(a.n);
    float sq = 0.0f;
    for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) {
      const float d = load_logical(a.x, base + i) - mean;
      sq += d * d;
    }
    const float var = block_reduce<kNormThreads>(sq, false, red) / static_cast<float>(a.n);
    const float inv = rsqrtf(var + a.epsilon);
    for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) {
      float v = (load_logical(a.x, base + i) - mean) * inv * load_logical(a.scale, i);
      if (a.has_bias) v += load_logical(a.bias, i);
      y[base + i] = v;
    }
    if (threadIdx.x == 0) {
      if (mean_out) mean_out[r] = mean;
      if (inv_var_out) inv_var_out[r] = inv;
    }
  }
}

// rows x n of x under scale's row dims.
Status rows_cols(const ResolvedOp& op, const Located& x, const Located& scale, int64_t& rows, int64_t& n) {
  const int64_t k = norm_row_dims(x.dims, scale.dims);
  if (k < 1)
    return InvalidArgument(op_where(op) + "scale dims " + dims_string(scale.dims) + " are not the trailing dims of x " +
                           dims_string(x.dims));
  rows = n = 1;
  for (size_t i = 0; i < x.dims.size(); ++i) (static_cast<int64_t>(i) < k ? rows : n) *= x.dims[i];
  return Status::Ok();
}

// The buffer of optional output `role` (nullptr when the op has none).
Result<float*> optional_output(GpuOpContext& ctx, const ResolvedOp& op, const char* role) {
  if (!op.outputs.count(role)) return static_cast<float*>(nullptr);
  FUSEBOX_ASSIGN_OR_RETURN(const int idx, ctx.output_index(role));
  return ctx.destination(idx);
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const LayerNormAttrs& ln) {
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located scale, ctx.in("scale"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located bias, ctx.in("bias"));
  NormArgs a{};
  FUSEBOX_RETURN_IF_ERROR(rows_cols(op, x, scale, a.rows, a.n));
  a.x = x.t, a.scale = scale.t, a.bias = bias.t, a.has_bias = 1;
  a.epsilon = static_cast<float>(ln.epsilon);
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  FUSEBOX_ASSIGN_OR_RETURN(float* mean, optional_output(ctx, op, "mean"));
  FUSEBOX_ASSIGN_OR_RETURN(float* inv_var, optional_output(ctx, op, "inv_variance"));
  if (a.rows > 0 && a.n > 0) {
    layernorm_fwd_kernel<<<grid_for(a.rows, 1), kNormThreads, 0, ctx.stream()>>>(a, y, mean, inv_var);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
