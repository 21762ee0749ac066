// fusebox: the GPU references of conv_fprop, conv_dgrad and conv_wgrad: one
// thread per output element, inputs read in their dtype and strides, fp32
// accumulation (double for wgrad, whose sums run over N*O*P*Q terms).
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

// The forward convolution x [N,C,sp] * w [K,C/G,f] -> y [N,K,out] the three
// ops share. Tensors are rank 5 (N, C, D, H, W) / (K, C, T, R, S), spatial
// dims padded with 1s at the front; each kernel reads two of x, w, y (dy).
struct ConvArgs {
  DevTensor x, w, y;
  int64_t N, C, K, Cg, Kg;
  int64_t in_sp[3], f_sp[3], out_sp[3];
  int64_t pad[3], str[3], dil[3];
  int64_t count;  // elements of the op's output
};

__device__ __forceinline__ int64_t off5(const DevTensor& t, int64_t a, int64_t b, int64_t c, int64_t d,
                                        int64_t e) {
  return a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3] + e * t.strides[4];
}

__device__ __forceinline__ void split5(int64_t i, const int64_t sp[3], int64_t d1, int64_t* a, int64_t* b,
                                       int64_t* c, int64_t* d, int64_t* e) {
  *e = i % sp[2], i /= sp[2];
  *d = i % sp[1], i /= sp[1];
  *c = i % sp[0], i /= sp[0];
  *b = i % d1;
  *a = i / d1;
}

__global__ void conv_fprop_kernel(ConvArgs a, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, k, od, oh, ow;
    split5(i, a.out_sp, a.K, &n, &k, &od, &oh, &ow);
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
            acc += load_at(a.x, off5(a.x, n, xc, id, ih, iw)) * load_at(a.w, off5(a.w, k, c, t, r, s));
          }
        }
      }
    }
    y[i] = acc;
  }
}

// The output position along one spatial dim that tap `f` maps onto input
// position `in`, or -1 if none (not on the stride grid, or outside).
__device__ __forceinline__ int64_t out_pos(int64_t in, int64_t f, int64_t pad, int64_t str, int64_t dil,
                                           int64_t out_size) {
  const int64_t num = in + pad - f * dil;
  if (num < 0 || num % str != 0) return -1;
  const int64_t o = num / str;
  return o < out_size ? o : -1;
}

__global__ void conv_dgrad_kernel(ConvArgs a, float* dx) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n, c, id, ih, iw;
    split5(i, a.in_sp, a.C, &n, &c, &id, &ih, &iw);
    const int64_t g = c / a.Cg, cl = c % a.Cg;
    float acc = 0.0f;
    for (int64_t kj = 0; kj < a.Kg; ++kj) {
      const int64_t k = g * a.Kg + kj;
      for (int64_t t = 0; t < a.f_sp[0]; ++t) {
        const int64_t od = out_pos(id, t, a.pad[0], a.str[0], a.dil[0], a.out_sp[0]);
        if (od < 0) continue;
        for (int64_t r = 0; r < a.f_sp[1]; ++r) {
          const int64_t oh = out_pos(ih, r, a.pad[1], a.str[1], a.dil[1], a.out_sp[1]);
          if (oh < 0) continue;
          for (int64_t s = 0; s < a.f_sp[2]; ++s) {
            const int64_t ow = out_pos(iw, s, a.pad[2], a.str[2], a.dil[2], a.out_sp[2]);
            if (ow < 0) continue;
            acc += load_at(a.y, off5(a.y, n, k, od, oh, ow)) * load_at(a.w, off5(a.w, k, cl, t, r, s));
          }
        }
      }
    }
    dx[i] = acc;
  }
}

__global__ void conv_wgrad_kernel(ConvArgs a, float* dw) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t k, cl, t, r, s;
    split5(i, a.f_sp, a.Cg, &k, &cl, &t, &r, &s);
    const int64_t c = (k / a.Kg) * a.Cg + cl;
    double acc = 0.0;
    for (int64_t n = 0; n < a.N; ++n)
      for (int64_t od = 0; od < a.out_sp[0]; ++od) {
        const int64_t id = od * a.str[0] - a.pad[0] + t * a.dil[0];
        if (id < 0 || id >= a.in_sp[0]) continue;
        for (int64_t oh = 0; oh < a.out_sp[1]; ++oh) {
          const int64_t ih = oh * a.str[1] - a.pad[1] + r * a.dil[1];
          if (ih < 0 || ih >= a.in_sp[1]) continue;
          for (int64_t ow = 0; ow < a.out_sp[2]; ++ow) {
            const int64_t iw = ow * a.str[2] - a.pad[2] + s * a.dil[2];
            if (iw < 0 || iw >= a.in_sp[2]) continue;
            acc += static_cast<double>(load_at(a.y, off5(a.y, n, k, od, oh, ow))) *
                   load_at(a.x, off5(a.x, n, c, id, ih, iw));
          }
        }
      }
    dw[i] = static_cast<float>(acc);
  }
}

// A rank-3..5 tensor as rank 5, spatial dims padded at the front (size 1, stride 0).
DevTensor to5(const Located& l) {
  const size_t ns = l.dims.size() - 2;
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
}

template <typename A>
Result<ConvArgs> conv_args(const ResolvedOp& op, const A& attrs, const std::vector<int64_t>& x,
                           const std::vector<int64_t>& w, const std::vector<int64_t>& y) {
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || w.size() != rank || y.size() != rank)
    return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5");
  const size_t ns = rank - 2;
  ConvArgs a{};
  for (int j = 0; j < 3; ++j) {
    a.in_sp[j] = a.f_sp[j] = a.out_sp[j] = 1;
    a.pad[j] = 0, a.str[j] = 1, a.dil[j] = 1;
  }
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = 3 - ns + i;
    a.in_sp[j] = x[2 + i];
    a.f_sp[j] = w[2 + i];
    a.out_sp[j] = y[2 + i];
    if (i < attrs.padding.size()) a.pad[j] = attrs.padding[i];
    if (i < attrs.stride.size()) a.str[j] = attrs.stride[i];
    if (i < attrs.dilation.size()) a.dil[j] = attrs.dilation[i];
    if (a.str[j] < 1 || a.dil[j] < 1 || a.pad[j] < 0)
      return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
    const int64_t expect = (a.in_sp[j] + 2 * a.pad[j] - a.dil[j] * (a.f_sp[j] - 1) - 1) / a.str[j] + 1;
    if (expect != a.out_sp[j])
      return InvalidArgument(op_where(op) + "y dims " + dims_string(y) +
                             " do not match the convolution of x " + dims_string(x) + " with w " +
                             dims_string(w));
  }
  a.N = x[0], a.C = x[1], a.K = w[0], a.Cg = w[1];
  if (a.Cg <= 0 || a.C % a.Cg != 0 || a.K % (a.C / a.Cg) != 0 || y[0] != a.N || y[1] != a.K)
    return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x) + ", w " + dims_string(w) +
                           ", y " + dims_string(y));
  a.Kg = a.K / (a.C / a.Cg);
  return a;
}

template <typename Kernel>
Status launch(GpuOpContext& ctx, const ResolvedOp& op, Kernel kernel, const ConvArgs& a, float* out) {
  if (a.count > 0) {
    kernel<<<grid_for(a.count, 256), 256, 0, ctx.stream()>>>(a, out);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& attrs) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located w, ctx.in("w"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  const std::vector<int64_t>& ydims = ctx.graph().tensors[yidx].dims;
  FUSEBOX_ASSIGN_OR_RETURN(ConvArgs a, conv_args(op, attrs, x.dims, w.dims, ydims));
  a.x = to5(x);
  a.w = to5(w);
  a.count = product(ydims);
  return launch(ctx, op, conv_fprop_kernel, a, y);
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& attrs) {
  FUSEBOX_ASSIGN_OR_RETURN(const int dxidx, ctx.output_index("dx"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located w, ctx.in("w"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dx, ctx.destination(dxidx));
  const std::vector<int64_t>& dxdims = ctx.graph().tensors[dxidx].dims;
  FUSEBOX_ASSIGN_OR_RETURN(ConvArgs a, conv_args(op, attrs, dxdims, w.dims, dy.dims));
  a.y = to5(dy);
  a.w = to5(w);
  a.count = product(dxdims);
  return launch(ctx, op, conv_dgrad_kernel, a, dx);
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& attrs) {
  FUSEBOX_ASSIGN_OR_RETURN(const int dwidx, ctx.output_index("dw"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(float* dw, ctx.destination(dwidx));
  const std::vector<int64_t>& dwdims = ctx.graph().tensors[dwidx].dims;
  FUSEBOX_ASSIGN_OR_RETURN(ConvArgs a, conv_args(op, attrs, x.dims, dwdims, dy.dims));
  a.y = to5(dy);
  a.x = to5(x);
  a.count = product(dwdims);
  return launch(ctx, op, conv_wgrad_kernel, a, dw);
}

}  // namespace fusebox::reference_detail
