// fusebox: the CPU references of conv_fprop, conv_dgrad and conv_wgrad
// (grouped, 1 to 3 spatial dims), direct loops accumulating in double, and
// their verification tolerances.
#include <algorithm>
#include <vector>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

// Integer division rounding toward -inf / +inf (b > 0).
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

int64_t attr_or(const std::vector<int64_t>& v, size_t i, int64_t dflt) { return i < v.size() ? v[i] : dflt; }

// The forward convolution x [N,C,sp] * w [K,C/G,f] -> y [N,K,out] that all
// three ops share, spatial dims padded to 3 (D, H, W) with leading 1s.
struct ConvShape {
  int64_t N, C, K, Cg, Kg;
  int64_t in_sp[3] = {1, 1, 1}, f_sp[3] = {1, 1, 1}, out_sp[3] = {1, 1, 1};
  int64_t pad[3] = {0, 0, 0}, str[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  int64_t in_plane, f_plane, out_plane;

  // Output columns ow whose input column ow*stride - pad + s*dil lies inside the row.
  void columns(int64_t s, int64_t* shift, int64_t* lo, int64_t* hi) const {
    *shift = s * dil[2] - pad[2];
    *lo = std::max<int64_t>(0, ceil_div(-*shift, str[2]));
    *hi = std::min<int64_t>(out_sp[2] - 1, floor_div(in_sp[2] - 1 - *shift, str[2]));
  }
};

template <typename A>
Result<ConvShape> conv_shape(const ResolvedOp& op, const A& attrs, const std::vector<int64_t>& x,
                             const std::vector<int64_t>& w, const std::vector<int64_t>& y) {
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || w.size() != rank || y.size() != rank)
    return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5; got x " +
                           dims_string(x) + ", w " + dims_string(w) + ", y " + dims_string(y));
  ConvShape c;
  const size_t ns = rank - 2;
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = 3 - ns + i;
    c.in_sp[j] = x[2 + i];
    c.f_sp[j] = w[2 + i];
    c.out_sp[j] = y[2 + i];
    c.pad[j] = attr_or(attrs.padding, i, 0);
    c.str[j] = attr_or(attrs.stride, i, 1);
    c.dil[j] = attr_or(attrs.dilation, i, 1);
    if (c.str[j] < 1 || c.dil[j] < 1 || c.pad[j] < 0)
      return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
    const int64_t expect = (c.in_sp[j] + 2 * c.pad[j] - c.dil[j] * (c.f_sp[j] - 1) - 1) / c.str[j] + 1;
    if (expect != c.out_sp[j])
      return InvalidArgument(op_where(op) + "y dims " + dims_string(y) + " do not match the " +
                             "convolution of x " + dims_string(x) + " with w " + dims_string(w));
  }
  c.N = x[0], c.C = x[1], c.K = w[0], c.Cg = w[1];
  if (c.Cg <= 0 || c.C % c.Cg != 0 || c.K % (c.C / c.Cg) != 0 || y[0] != c.N || y[1] != c.K)
    return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x) + ", w " + dims_string(w) +
                           ", y " + dims_string(y));
  c.Kg = c.K / (c.C / c.Cg);
  c.in_plane = c.in_sp[0] * c.in_sp[1] * c.in_sp[2];
  c.f_plane = c.f_sp[0] * c.f_sp[1] * c.f_sp[2];
  c.out_plane = c.out_sp[0] * c.out_sp[1] * c.out_sp[2];
  return c;
}

// Calls fn(x_row, y_row, lo, hi, shift) for every (od, oh) output row and
// filter tap (t, r, s) whose input row lies inside the input, where
// x_row/y_row are the row offsets within an input/output plane and output
// columns lo..hi read input columns ow*stride + shift.
template <typename Fn>
void for_each_row(const ConvShape& c, int64_t t, int64_t r, int64_t s, Fn&& fn) {
  int64_t shift, lo, hi;
  c.columns(s, &shift, &lo, &hi);
  if (lo > hi) return;
  for (int64_t od = 0; od < c.out_sp[0]; ++od) {
    const int64_t id = od * c.str[0] - c.pad[0] + t * c.dil[0];
    if (id < 0 || id >= c.in_sp[0]) continue;
    for (int64_t oh = 0; oh < c.out_sp[1]; ++oh) {
      const int64_t ih = oh * c.str[1] - c.pad[1] + r * c.dil[1];
      if (ih < 0 || ih >= c.in_sp[1]) continue;
      fn((id * c.in_sp[1] + ih) * c.in_sp[2], (od * c.out_sp[1] + oh) * c.out_sp[2], lo, hi, shift);
    }
  }
}

// y[n,k] = sum over c in k's group, taps: w[k,c,tap] * x[n,c,at(tap)].
// Per (n, k) plane: filter taps outermost, output columns innermost, so the
// hot loop is a contiguous, branch-free axpy.
void conv_fprop(const ConvShape& c, const float* x, const float* w, float* y) {
  parallel_for(c.N * c.K, static_cast<double>(c.out_plane) * c.Cg * c.f_plane,
               [&](int64_t begin, int64_t end) {
                 std::vector<double> acc(static_cast<size_t>(c.out_plane));
                 for (int64_t nk = begin; nk < end; ++nk) {
                   const int64_t n = nk / c.K, k = nk % c.K, g = k / c.Kg;
                   std::fill(acc.begin(), acc.end(), 0.0);
                   for (int64_t ci = 0; ci < c.Cg; ++ci) {
                     const float* xc = x + (n * c.C + g * c.Cg + ci) * c.in_plane;
                     const float* wk = w + (k * c.Cg + ci) * c.f_plane;
                     for (int64_t t = 0; t < c.f_sp[0]; ++t)
                       for (int64_t r = 0; r < c.f_sp[1]; ++r)
                         for (int64_t s = 0; s < c.f_sp[2]; ++s) {
                           const double wv = wk[(t * c.f_sp[1] + r) * c.f_sp[2] + s];
                           for_each_row(c, t, r, s,
                                        [&](int64_t xr, int64_t yr, int64_t lo, int64_t hi, int64_t shift) {
                                          const float* xrow = xc + xr;
                                          double* arow = acc.data() + yr;
                                          for (int64_t ow = lo; ow <= hi; ++ow)
                                            arow[ow] += wv * xrow[ow * c.str[2] + shift];
                                        });
                         }
                   }
                   float* yo = y + nk * c.out_plane;
                   for (int64_t i = 0; i < c.out_plane; ++i) yo[i] = static_cast<float>(acc[i]);
                 }
               });
}

// dx[n,c] = sum over k in c's group, taps: w[k,c,tap] * dy[n,k] scattered
// back to the input positions fprop read. Per (n, c) plane, so each thread
// owns the dx elements it scatters into.
void conv_dgrad(const ConvShape& c, const float* dy, const float* w, float* dx) {
  parallel_for(c.N * c.C, static_cast<double>(c.out_plane) * c.Kg * c.f_plane,
               [&](int64_t begin, int64_t end) {
                 std::vector<double> acc(static_cast<size_t>(c.in_plane));
                 for (int64_t nc = begin; nc < end; ++nc) {
                   const int64_t n = nc / c.C, ch = nc % c.C, g = ch / c.Cg, ci = ch % c.Cg;
                   std::fill(acc.begin(), acc.end(), 0.0);
                   for (int64_t kj = 0; kj < c.Kg; ++kj) {
                     const int64_t k = g * c.Kg + kj;
                     const float* dyk = dy + (n * c.K + k) * c.out_plane;
                     const float* wk = w + (k * c.Cg + ci) * c.f_plane;
                     for (int64_t t = 0; t < c.f_sp[0]; ++t)
                       for (int64_t r = 0; r < c.f_sp[1]; ++r)
                         for (int64_t s = 0; s < c.f_sp[2]; ++s) {
                           const double wv = wk[(t * c.f_sp[1] + r) * c.f_sp[2] + s];
                           for_each_row(c, t, r, s,
                                        [&](int64_t xr, int64_t yr, int64_t lo, int64_t hi, int64_t shift) {
                                          double* arow = acc.data() + xr;
                                          const float* dyrow = dyk + yr;
                                          for (int64_t ow = lo; ow <= hi; ++ow)
                                            arow[ow * c.str[2] + shift] += wv * dyrow[ow];
                                        });
                         }
                   }
                   float* o = dx + nc * c.in_plane;
                   for (int64_t i = 0; i < c.in_plane; ++i) o[i] = static_cast<float>(acc[i]);
                 }
               });
}

// dw[k,c,tap] = sum over n and output positions: dy[n,k,o] * x[n,c,at(o, tap)].
// Per (k, c) filter, so each thread owns the dw elements it sums into.
void conv_wgrad(const ConvShape& c, const float* dy, const float* x, float* dw) {
  parallel_for(
      c.K * c.Cg, static_cast<double>(c.N) * c.out_plane * c.f_plane, [&](int64_t begin, int64_t end) {
        for (int64_t kc = begin; kc < end; ++kc) {
          const int64_t k = kc / c.Cg, ci = kc % c.Cg, ch = (k / c.Kg) * c.Cg + ci;
          for (int64_t t = 0; t < c.f_sp[0]; ++t)
            for (int64_t r = 0; r < c.f_sp[1]; ++r)
              for (int64_t s = 0; s < c.f_sp[2]; ++s) {
                double sum = 0;
                for (int64_t n = 0; n < c.N; ++n) {
                  const float* xc = x + (n * c.C + ch) * c.in_plane;
                  const float* dyk = dy + (n * c.K + k) * c.out_plane;
                  for_each_row(c, t, r, s,
                               [&](int64_t xr, int64_t yr, int64_t lo, int64_t hi, int64_t shift) {
                                 const float* xrow = xc + xr;
                                 const float* dyrow = dyk + yr;
                                 for (int64_t ow = lo; ow <= hi; ++ow)
                                   sum += static_cast<double>(dyrow[ow]) * xrow[ow * c.str[2] + shift];
                               });
                }
                dw[kc * c.f_plane + (t * c.f_sp[1] + r) * c.f_sp[2] + s] = static_cast<float>(sum);
              }
        }
      });
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* w, ctx.in("w"));
  FUSEBOX_ASSIGN_OR_RETURN(const ConvShape c, conv_shape(op, a, x->dims, w->dims, y->dims));
  conv_fprop(c, x->data.data(), w->data.data(), y->data.data());
  return Status::Ok();
}

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Values * dx, ctx.out("dx"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* w, ctx.in("w"));
  FUSEBOX_ASSIGN_OR_RETURN(const ConvShape c, conv_shape(op, a, dx->dims, w->dims, dy->dims));
  conv_dgrad(c, dy->data.data(), w->data.data(), dx->data.data());
  return Status::Ok();
}

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Values * dw, ctx.out("dw"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const ConvShape c, conv_shape(op, a, x->dims, dw->dims, dy->dims));
  conv_wgrad(c, dy->data.data(), x->data.data(), dw->data.data());
  return Status::Ok();
}

// The default per-dtype tolerance (compare.cpp): cuDNN and the reference
// both accumulate in at least fp32, so the output's rounding to its dtype
// dominates. The gradients are sums of up to K*T*R*S (dgrad) or N*O*P*Q
// (wgrad: 100352 for N32 56x56) products of inputs in [-1, 1]; fp32
// accumulation error (about sqrt(terms) * 2^-24 relative, 2e-5 here) stays
// far below bf16's and fp16's rounding, so no looser bound is needed.
Tolerance tolerance(const ConvFpropAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }
Tolerance tolerance(const ConvDgradAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }
Tolerance tolerance(const ConvWgradAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
