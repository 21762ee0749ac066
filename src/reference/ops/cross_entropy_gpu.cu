// fusebox: the GPU reference of cross_entropy and cross_entropy_bwd: the
// forward one thread per row in double (two passes over the row), the
// backward one thread per logit, every tensor read through its strides
// (independent of fusebox's own kernel in src/kernels/cross_entropy.cu).
#include <cuda_runtime.h>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

__global__ void ce_forward_reference(DevTensor logits, DevTensor labels, int64_t n, int64_t v, int64_t ignore,
                                     float* loss, float* lse_out) {
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = r * logits.strides[0];
    double m = -INFINITY;
    for (int64_t c = 0; c < v; ++c)
      m = fmax(m, static_cast<double>(load_at(logits, base + c * logits.strides[1])));
    double s = 0;
    for (int64_t c = 0; c < v; ++c)
      s += exp(static_cast<double>(load_at(logits, base + c * logits.strides[1])) - m);
    const double lse = m + log(s);
    const int64_t y = static_cast<int64_t>(load_at(labels, r * labels.strides[0]));
    double l = NAN;
    if (y == ignore) {
      l = 0;
    } else if (y >= 0 && y < v) {
      l = lse - load_at(logits, base + y * logits.strides[1]);
    }
    loss[r] = static_cast<float>(l);
    if (lse_out) lse_out[r] = static_cast<float>(lse);
  }
}

__global__ void ce_backward_reference(DevTensor logits, DevTensor labels, DevTensor lse, DevTensor dloss,
                                      int64_t n, int64_t v, int64_t ignore, float* dlogits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * v;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / v, c = i % v;
    const int64_t y = static_cast<int64_t>(load_at(labels, r * labels.strides[0]));
    double d = NAN;
    if (y == ignore) {
      d = 0;
    } else if (y >= 0 && y < v) {
      const double x = load_at(logits, r * logits.strides[0] + c * logits.strides[1]);
      d = (exp(x - static_cast<double>(load_at(lse, r * lse.strides[0]))) - (c == y ? 1.0 : 0.0)) *
          static_cast<double>(load_at(dloss, r * dloss.strides[0]));
    }
    dlogits[i] = static_cast<float>(d);
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const CrossEntropyAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Located logits, ctx.in("logits"));
  FUSEBOX_ASSIGN_OR_RETURN(Located labels, ctx.in("labels"));
  if (logits.dims.size() != 4 || labels.dims.size() != 4)
    return InvalidArgument(op_where(op) + "logits and labels must have rank 4");
  const int64_t n = logits.dims[0], v = logits.dims[1];
  if (!a.backward) {
    FUSEBOX_ASSIGN_OR_RETURN(const int li, ctx.output_index("loss"));
    FUSEBOX_ASSIGN_OR_RETURN(float* loss, ctx.destination(li));
    float* lse = nullptr;
    if (a.lse) {
      FUSEBOX_ASSIGN_OR_RETURN(const int si, ctx.output_index("lse"));
      FUSEBOX_ASSIGN_OR_RETURN(lse, ctx.destination(si));
    }
    if (n > 0) {
      ce_forward_reference<<<grid_for(n, 128), 128, 0, ctx.stream()>>>(logits.t, labels.t, n, v,
                                                                       a.ignore_index, loss, lse);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    }
    return Status::Ok();
  }
  FUSEBOX_ASSIGN_OR_RETURN(Located lse, ctx.in("lse"));
  FUSEBOX_ASSIGN_OR_RETURN(Located dloss, ctx.in("dloss"));
  FUSEBOX_ASSIGN_OR_RETURN(const int di, ctx.output_index("dlogits"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dlogits, ctx.destination(di));
  if (n * v > 0) {
    ce_backward_reference<<<grid_for(n * v, 256), 256, 0, ctx.stream()>>>(logits.t, labels.t, lse.t, dloss.t,
                                                                          n, v, a.ignore_index, dlogits);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
