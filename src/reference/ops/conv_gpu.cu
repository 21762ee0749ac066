// fusebox: the GPU reference of conv_fprop: one thread per output element,
// fp32 accumulation, inputs read in their dtype and strides.
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

struct ConvArgs {
  DevTensor x, w;  // rank 5 (N, C, D, H, W) / (K, C, T, R, S), spatial padded with 1s
  int64_t N, C, K, Cg, Kg;
  int64_t in_sp[3], f_sp[3], out_sp[3];
  int64_t pad[3], str[3], dil[3];
  int64_t count;
};

__global__ void conv_fprop_kernel(ConvArgs a, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i;
    const int64_t ow = rem % a.out_sp[2]; rem /= a.out_sp[2];
    const int64_t oh = rem % a.out_sp[1]; rem /= a.out_sp[1];
    const int64_t od = rem % a.out_sp[0]; rem /= a.out_sp[0];
    const int64_t k = rem % a.K;
    const int64_t n = rem / a.K;
    const int64_t g = k / a.Kg;
    float acc = 0.0f;
    for (int64_t c = 0; c < a.Cg; ++c) {
      const int64_t xc = g * a.Cg + c;
      for (int64_t t = 0; t < a.f_sp[0]; ++t) {
        const int64_t id = od * a.str[0] - a.pad[0] + t * a.dil[0];
        if (id < 0 || id >= a.in_sp[0]) continue;
        for (int64_t r = 0; r < a.f_sp[1]; ++r) {
          const int64_t ih = oh * a.str[1] - a.pad[1] + r * a.dil[1];
          if (ih < 0 || ih >= a.in_sp[1]) continue;
          for (int64_t s = 0; s < a.f_sp[2]; ++s) {
            const int64_t iw = ow * a.str[2] - a.pad[2] + s * a.dil[2];
            if (iw < 0 || iw >= a.in_sp[2]) continue;
            const int64_t xo = n * a.x.strides[0] + xc * a.x.strides[1] + id * a.x.strides[2] +
                               ih * a.x.strides[3] + iw * a.x.strides[4];
            const int64_t wo = k * a.w.strides[0] + c * a.w.strides[1] + t * a.w.strides[2] +
                               r * a.w.strides[3] + s * a.w.strides[4];
            acc += load_at(a.x, xo) * load_at(a.w, wo);
          }
        }
      }
    }
    y[i] = acc;
  }
}

Status launch_conv(GpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& attrs, const Located& x,
                   const Located& w, const std::vector<int64_t>& ydims, float* y) {
  const size_t rank = x.dims.size();
  if (rank < 3 || rank > 5 || w.dims.size() != rank || ydims.size() != rank)
    return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5");
  const size_t ns = rank - 2;
  ConvArgs a{};
  // Spatial dims padded to 3 at the front (size 1, stride 0).
  auto to5 = [&](const Located& l) {
    DevTensor t = l.t;
    t.rank = 5;
    t.dims[0] = l.dims[0], t.strides[0] = l.t.strides[0];
    t.dims[1] = l.dims[1], t.strides[1] = l.t.strides[1];
    for (int j = 0; j < 3; ++j) {
      const int src = 2 + j - static_cast<int>(3 - ns);
      t.dims[2 + j] = src >= 2 ? l.dims[src] : 1;
      t.strides[2 + j] = src >= 2 ? l.t.strides[src] : 0;
    }
    return t;
  };
  a.x = to5(x);
  a.w = to5(w);
  for (int j = 0; j < 3; ++j) {
    a.in_sp[j] = a.x.dims[2 + j];
    a.f_sp[j] = a.w.dims[2 + j];
    a.out_sp[j] = 1;
    a.pad[j] = 0, a.str[j] = 1, a.dil[j] = 1;
  }
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = 3 - ns + i;
    a.out_sp[j] = ydims[2 + i];
    if (i < attrs.padding.size()) a.pad[j] = attrs.padding[i];
    if (i < attrs.stride.size()) a.str[j] = attrs.stride[i];
    if (i < attrs.dilation.size()) a.dil[j] = attrs.dilation[i];
    if (a.str[j] < 1 || a.dil[j] < 1 || a.pad[j] < 0)
      return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
    const int64_t expect = (a.in_sp[j] + 2 * a.pad[j] - a.dil[j] * (a.f_sp[j] - 1) - 1) / a.str[j] + 1;
    if (expect != a.out_sp[j])
      return InvalidArgument(op_where(op) + "output dims " + dims_string(ydims) + " do not match the convolution");
  }
  a.N = x.dims[0], a.C = x.dims[1], a.K = w.dims[0], a.Cg = w.dims[1];
  if (a.Cg <= 0 || a.C % a.Cg != 0 || a.K % (a.C / a.Cg) != 0 || ydims[0] != a.N || ydims[1] != a.K)
    return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x.dims) + ", w " +
                           dims_string(w.dims) + ", y " + dims_string(ydims));
  a.Kg = a.K / (a.C / a.Cg);
  a.count = product(ydims);
  if (a.count > 0) {
    conv_fprop_kernel<<<grid_for(a.count, 256), 256, 0, ctx.stream()>>>(a, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located w, ctx.in("w"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  return launch_conv(ctx, op, a, x, w, ctx.graph().tensors[yidx].dims, y);
}

}  // namespace fusebox::reference_detail
