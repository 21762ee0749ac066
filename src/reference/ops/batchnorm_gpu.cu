// fusebox: the GPU reference of the batchnorm ops: one block per channel,
// fp32 sums (the training forward in two passes: mean, then centered
// squares), reading tensors through their strides; outputs fp32, logical
// row-major.
#include <cuda_runtime.h>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

constexpr int kBnThreads = 256;

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

struct BnArgs {
  DevTensor x, dy, scale, bias, mean, inv_var, run_mean, run_var;
  int64_t n, c, s;  // x as [N, C, S]
  float epsilon, momentum;
};

// The logical index of element j (of n*s) of channel c.
__device__ __forceinline__ int64_t chan_index(const BnArgs& a, int64_t c, int64_t j) {
  return ((j / a.s) * a.c + c) * a.s + j % a.s;
}

__global__ void __launch_bounds__(kBnThreads)
    bn_fwd_kernel(BnArgs a, int training, float* y, float* mean_out, float* inv_out, float* next_mean,
                  float* next_var) {
  __shared__ float red[kBnThreads / 32];
  const int64_t m = a.n * a.s;
  for (int64_t c = blockIdx.x; c < a.c; c += gridDim.x) {
    float mu, inv;
    if (training) {
      float s = 0.0f;
      for (int64_t j = threadIdx.x; j < m; j += kBnThreads) s += load_logical(a.x, chan_index(a, c, j));
      mu = block_reduce<kBnThreads>(s, false, red) / static_cast<float>(m);
      float sq = 0.0f;
      for (int64_t j = threadIdx.x; j < m; j += kBnThreads) {
        const float d = load_logical(a.x, chan_index(a, c, j)) - mu;
        sq += d * d;
      }
      const float var = block_reduce<kBnThreads>(sq, false, red) / static_cast<float>(m);
      inv = rsqrtf(var + a.epsilon);
      if (threadIdx.x == 0) {
        mean_out[c] = mu;
        inv_out[c] = inv;
        const float unbiased = m > 1 ? var * static_cast<float>(m) / static_cast<float>(m - 1) : var;
        next_mean[c] = (1.0f - a.momentum) * load_logical(a.run_mean, c) + a.momentum * mu;
        next_var[c] = (1.0f - a.momentum) * load_logical(a.run_var, c) + a.momentum * unbiased;
      }
    } else {
      mu = load_logical(a.mean, c);
      inv = load_logical(a.inv_var, c);
    }
    const float g = load_logical(a.scale, c), b = load_logical(a.bias, c);
    for (int64_t j = threadIdx.x; j < m; j += kBnThreads) {
      const int64_t i = chan_index(a, c, j);
      y[i] = (load_logical(a.x, i) - mu) * inv * g + b;
    }
  }
}

__global__ void __launch_bounds__(kBnThreads)
    bn_bwd_kernel(BnArgs a, float* dx, float* dscale, float* dbias) {
  __shared__ float red[kBnThreads / 32];
  const int64_t m = a.n * a.s;
  for (int64_t c = blockIdx.x; c < a.c; c += gridDim.x) {
    const float mu = load_logical(a.mean, c), inv = load_logical(a.inv_var, c), g = load_logical(a.scale, c);
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = threadIdx.x; j < m; j += kBnThreads) {
      const int64_t i = chan_index(a, c, j);
      const float d = load_logical(a.dy, i);
      s1 += d;
      s2 += d * (load_logical(a.x, i) - mu) * inv;
    }
    const float sum_dy = block_reduce<kBnThreads>(s1, false, red);
    const float sum_dy_xhat = block_reduce<kBnThreads>(s2, false, red);
    const float c1 = sum_dy / static_cast<float>(m), c2 = sum_dy_xhat / static_cast<float>(m);
    for (int64_t j = threadIdx.x; j < m; j += kBnThreads) {
      const int64_t i = chan_index(a, c, j);
      const float xhat = (load_logical(a.x, i) - mu) * inv;
      dx[i] = g * inv * (load_logical(a.dy, i) - c1 - xhat * c2);
    }
    if (threadIdx.x == 0) {
      dscale[c] = sum_dy_xhat;
      dbias[c] = sum_dy;
    }
  }
}

Status shape(const ResolvedOp& op, const Located& x, BnArgs& a) {
  if (x.dims.size() < 3)
    return InvalidArgument(op_where(op) + "x " + dims_string(x.dims) + " is not [N, C, (D,) H, W]");
  a.n = x.dims[0], a.c = x.dims[1], a.s = 1;
  for (size_t i = 2; i < x.dims.size(); ++i) a.s *= x.dims[i];
  return Status::Ok();
}

Result<float*> out(GpuOpContext& ctx, const char* role) {
  FUSEBOX_ASSIGN_OR_RETURN(const int idx, ctx.output_index(role));
  return ctx.destination(idx);
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormAttrs& bn) {
  BnArgs a{};
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_RETURN_IF_ERROR(shape(op, x, a));
  a.x = x.t;
  for (auto [role, dst] : {std::pair{"scale", &a.scale}, std::pair{"bias", &a.bias},
                           std::pair{"running_mean", &a.run_mean}, std::pair{"running_var", &a.run_var}}) {
    FUSEBOX_ASSIGN_OR_RETURN(const Located t, ctx.in(role));
    *dst = t.t;
  }
  a.epsilon = static_cast<float>(bn.epsilon);
  a.momentum = static_cast<float>(bn.momentum);
  FUSEBOX_ASSIGN_OR_RETURN(float* y, out(ctx, "y"));
  FUSEBOX_ASSIGN_OR_RETURN(float* mean, out(ctx, "mean"));
  FUSEBOX_ASSIGN_OR_RETURN(float* inv, out(ctx, "inv_variance"));
  FUSEBOX_ASSIGN_OR_RETURN(float* next_mean, out(ctx, "next_running_mean"));
  FUSEBOX_ASSIGN_OR_RETURN(float* next_var, out(ctx, "next_running_var"));
  if (a.c > 0 && a.n * a.s > 0) {
    bn_fwd_kernel<<<grid_for(a.c, 1), kBnThreads, 0, ctx.stream()>>>(a, 1, y, mean, inv, next_mean, next_var);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs&) {
  BnArgs a{};
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_RETURN_IF_ERROR(shape(op, x, a));
  a.x = x.t;
  for (auto [role, dst] : {std::pair{"scale", &a.scale}, std::pair{"bias", &a.bias},
                           std::pair{"mean", &a.mean}, std::pair{"inv_variance", &a.inv_var}}) {
    FUSEBOX_ASSIGN_OR_RETURN(const Located t, ctx.in(role));
    *dst = t.t;
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* y, out(ctx, "y"));
  if (a.c > 0 && a.n * a.s > 0) {
    bn_fwd_kernel<<<grid_for(a.c, 1), kBnThreads, 0, ctx.stream()>>>(a, 0, y, nullptr, nullptr, nullptr,
                                                                     nullptr);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormBwdAttrs&) {
  BnArgs a{};
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_RETURN_IF_ERROR(shape(op, x, a));
  a.x = x.t;
  for (auto [role, dst] : {std::pair{"dy", &a.dy}, std::pair{"scale", &a.scale}, std::pair{"mean", &a.mean},
                           std::pair{"inv_variance", &a.inv_var}}) {
    FUSEBOX_ASSIGN_OR_RETURN(const Located t, ctx.in(role));
    *dst = t.t;
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* dx, out(ctx, "dx"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dscale, out(ctx, "dscale"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dbias, out(ctx, "dbias"));
  if (a.c > 0 && a.n * a.s > 0) {
    bn_bwd_kernel<<<grid_for(a.c, 1), kBnThreads, 0, ctx.stream()>>>(a, dx, dscale, dbias);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
