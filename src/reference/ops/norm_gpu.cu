// fusebox: the GPU reference of the norm ops (layernorm, rmsnorm): one block
// per row, fp32 sums; layernorm in two passes over the row (mean, then
// centered squares), rmsnorm in one (squares). Backward: dx one block per
// row, dscale and dbias one thread per column summing over the rows.
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

__device__ __forceinline__ float load_logical(const DevTensor& t, int64_t i) {
  return load_at(t, offset_of(t, i));
}

struct NormArgs {
  DevTensor x, scale, bias;  // bias.ptr == nullptr and scalar 0: no bias
  int64_t rows, n;
  float epsilon;
  int has_bias;
  int rms;  // rmsnorm: no mean, squares of x
};

__global__ void __launch_bounds__(kNormThreads)
    norm_fwd_kernel(NormArgs a, float* y, float* mean_out, float* inv_var_out) {
  __shared__ float red[kNormThreads / 32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t base = r * a.n;
    float mean = 0.0f;
    if (!a.rms) {
      float s = 0.0f;
      for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) s += load_logical(a.x, base + i);
      mean = block_reduce<kNormThreads>(s, false, red) / static_cast<float>(a.n);
    }
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

struct NormBwdArgs {
  DevTensor dy, x, scale, mean, inv_var;  // mean.ptr == nullptr: rmsnorm
  int64_t rows, n;
  int has_mean;
};

__device__ __forceinline__ float xhat_at(const NormBwdArgs& a, int64_t r, int64_t i, float inv) {
  const float m = a.has_mean ? load_logical(a.mean, r) : 0.0f;
  return (load_logical(a.x, r * a.n + i) - m) * inv;
}

__global__ void __launch_bounds__(kNormThreads) norm_bwd_dx_kernel(NormBwdArgs a, float* dx) {
  __shared__ float red[kNormThreads / 32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const float inv = load_logical(a.inv_var, r);
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) {
      const float gdy = load_logical(a.scale, i) * load_logical(a.dy, r * a.n + i);
      s1 += gdy;
      s2 += gdy * xhat_at(a, r, i, inv);
    }
    const float c1 = a.has_mean ? block_reduce<kNormThreads>(s1, false, red) / static_cast<float>(a.n) : 0.0f;
    const float c2 = block_reduce<kNormThreads>(s2, false, red) / static_cast<float>(a.n);
    for (int64_t i = threadIdx.x; i < a.n; i += kNormThreads) {
      const float gdy = load_logical(a.scale, i) * load_logical(a.dy, r * a.n + i);
      dx[r * a.n + i] = inv * (gdy - c1 - xhat_at(a, r, i, inv) * c2);
    }
  }
}

__global__ void norm_bwd_dscale_kernel(NormBwdArgs a, float* dscale, float* dbias) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float ds = 0.0f, db = 0.0f;
    for (int64_t r = 0; r < a.rows; ++r) {
      const float g = load_logical(a.dy, r * a.n + i);
      ds += g * xhat_at(a, r, i, load_logical(a.inv_var, r));
      db += g;
    }
    dscale[i] = ds;
    if (dbias) dbias[i] = db;
  }
}

// rows x n of x under scale's row dims.
Status rows_cols(const ResolvedOp& op, const Located& x, const Located& scale, int64_t& rows, int64_t& n) {
  const int64_t k = norm_row_dims(x.dims, scale.dims);
  if (k < 1)
    return InvalidArgument(op_where(op) + "scale dims " + dims_string(scale.dims) +
                           " are not the trailing dims of x " + dims_string(x.dims));
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
    norm_fwd_kernel<<<grid_for(a.rows, 1), kNormThreads, 0, ctx.stream()>>>(a, y, mean, inv_var);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RmsNormAttrs& rms) {
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located scale, ctx.in("scale"));
  NormArgs a{};
  FUSEBOX_RETURN_IF_ERROR(rows_cols(op, x, scale, a.rows, a.n));
  a.x = x.t, a.scale = scale.t, a.rms = 1;
  if (rms.bias) {
    FUSEBOX_ASSIGN_OR_RETURN(const Located bias, ctx.in("bias"));
    a.bias = bias.t, a.has_bias = 1;
  }
  a.epsilon = static_cast<float>(rms.epsilon);
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  FUSEBOX_ASSIGN_OR_RETURN(float* inv_var, optional_output(ctx, op, "inv_variance"));
  if (a.rows > 0 && a.n > 0) {
    norm_fwd_kernel<<<grid_for(a.rows, 1), kNormThreads, 0, ctx.stream()>>>(a, y, nullptr, inv_var);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

namespace {

Status norm_bwd_gpu(GpuOpContext& ctx, const ResolvedOp& op, bool has_mean) {
  NormBwdArgs a{};
  FUSEBOX_ASSIGN_OR_RETURN(const Located dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located scale, ctx.in("scale"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located inv_var, ctx.in("inv_variance"));
  FUSEBOX_RETURN_IF_ERROR(rows_cols(op, x, scale, a.rows, a.n));
  a.dy = dy.t, a.x = x.t, a.scale = scale.t, a.inv_var = inv_var.t;
  if (has_mean) {
    FUSEBOX_ASSIGN_OR_RETURN(const Located mean, ctx.in("mean"));
    a.mean = mean.t, a.has_mean = 1;
  }
  FUSEBOX_ASSIGN_OR_RETURN(const int dxi, ctx.output_index("dx"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dx, ctx.destination(dxi));
  FUSEBOX_ASSIGN_OR_RETURN(const int dsi, ctx.output_index("dscale"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dscale, ctx.destination(dsi));
  FUSEBOX_ASSIGN_OR_RETURN(float* dbias, optional_output(ctx, op, "dbias"));
  if (a.rows > 0 && a.n > 0) {
    norm_bwd_dx_kernel<<<grid_for(a.rows, 1), kNormThreads, 0, ctx.stream()>>>(a, dx);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    norm_bwd_dscale_kernel<<<grid_for(a.n, 128), 128, 0, ctx.stream()>>>(a, dscale, dbias);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const LayerNormBwdAttrs&) {
  return norm_bwd_gpu(ctx, op, /*has_mean=*/true);
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RmsNormBwdAttrs&) {
  return norm_bwd_gpu(ctx, op, /*has_mean=*/false);
}

}  // namespace fusebox::reference_detail
