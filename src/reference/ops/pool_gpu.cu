// fusebox: the GPU reference of the pool ops (max_pool, avg_pool,
// global_avg_pool): one thread per output element, reading x through its
// strides, fp32 window sums. A rank-4 x is seen as D = 1.
#include <cuda_runtime.h>

#include <cfloat>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

struct PoolArgs {
  DevTensor x;
  int64_t n, c;
  int64_t in[3], out[3], window[3], stride[3], pad[3];
  int64_t xs[3];  // x's strides of D, H, W (0 for a missing D)
  int is_max, include_pad;
};

__global__ void pool_kernel(PoolArgs a, float* y) {
  const int64_t total = a.n * a.c * a.out[0] * a.out[1] * a.out[2];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t ow = r % a.out[2];
    r /= a.out[2];
    const int64_t oh = r % a.out[1];
    r /= a.out[1];
    const int64_t od = r % a.out[0];
    r /= a.out[0];
    const int64_t c = r % a.c, n = r / a.c;
    const int64_t base = n * a.x.strides[0] + c * a.x.strides[1];
    float acc = a.is_max ? -FLT_MAX : 0.0f;
    int64_t covered = 0;
    for (int64_t kd = 0; kd < a.window[0]; ++kd) {
      const int64_t id = od * a.stride[0] - a.pad[0] + kd;
      if (id < 0 || id >= a.in[0]) continue;
      for (int64_t kh = 0; kh < a.window[1]; ++kh) {
        const int64_t ih = oh * a.stride[1] - a.pad[1] + kh;
        if (ih < 0 || ih >= a.in[1]) continue;
        for (int64_t kw = 0; kw < a.window[2]; ++kw) {
          const int64_t iw = ow * a.stride[2] - a.pad[2] + kw;
          if (iw < 0 || iw >= a.in[2]) continue;
          const float v = load_at(a.x, base + id * a.xs[0] + ih * a.xs[1] + iw * a.xs[2]);
          acc = a.is_max ? fmaxf(acc, v) : acc + v;
          ++covered;
        }
      }
    }
    if (!a.is_max) {
      const int64_t div =
          a.include_pad ? a.window[0] * a.window[1] * a.window[2] : (covered > 0 ? covered : 1);
      acc /= static_cast<float>(div);
    }
    y[i] = acc;
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const PoolAttrs& pa) {
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  const std::vector<int64_t>& yd = ctx.graph().tensors[yidx].dims;
  const size_t sp = x.dims.size() >= 2 ? x.dims.size() - 2 : 0;
  if ((sp != 2 && sp != 3) || yd.size() != x.dims.size() || pa.window.size() != sp ||
      pa.stride.size() != sp || pa.padding.size() != sp)
    return InvalidArgument(op_where(op) + "x " + dims_string(x.dims) + " and y " + dims_string(yd) +
                           " do not match the resolved window/stride/padding");
  PoolArgs a{};
  a.x = x.t;
  a.n = x.dims[0], a.c = x.dims[1];
  a.is_max = pa.mode == PoolMode::kMax;
  a.include_pad = pa.count_include_pad;
  const size_t off = 3 - sp;
  for (size_t i = 0; i < 3; ++i) a.in[i] = a.out[i] = a.window[i] = a.stride[i] = 1, a.pad[i] = a.xs[i] = 0;
  for (size_t i = 0; i < sp; ++i) {
    a.in[off + i] = x.dims[2 + i];
    a.out[off + i] = yd[2 + i];
    a.window[off + i] = pa.window[i];
    a.stride[off + i] = pa.stride[i];
    a.pad[off + i] = pa.padding[i];
    a.xs[off + i] = x.t.strides[2 + i];
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  const int64_t total = a.n * a.c * a.out[0] * a.out[1] * a.out[2];
  if (total > 0) {
    pool_kernel<<<grid_for(total, 256), 256, 0, ctx.stream()>>>(a, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
