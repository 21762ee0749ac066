// fusebox: the CPU reference of conv_fprop (grouped, 1 to 3 spatial dims),
// and its verification tolerance.
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

Status conv_fprop(const ResolvedOp& op, const ConvFpropAttrs& attrs, const Values& x, const Values& w, Values* y) {
  const size_t rank = x.dims.size();
  if (rank < 3 || rank > 5 || w.dims.size() != rank || y->dims.size() != rank)
    return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5; got x " + dims_string(x.dims) +
                           ", w " + dims_string(w.dims) + ", y " + dims_string(y->dims));
  const size_t ns = rank - 2;
  // Spatial dims padded to 3 (D, H, W), leading ones of size 1.
  int64_t in_sp[3] = {1, 1, 1}, f_sp[3] = {1, 1, 1}, out_sp[3] = {1, 1, 1};
  int64_t pad[3] = {0, 0, 0}, str[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = 3 - ns + i;
    in_sp[j] = x.dims[2 + i];
    f_sp[j] = w.dims[2 + i];
    out_sp[j] = y->dims[2 + i];
    pad[j] = attr_or(attrs.padding, i, 0);
    str[j] = attr_or(attrs.stride, i, 1);
    dil[j] = attr_or(attrs.dilation, i, 1);
    if (str[j] < 1 || dil[j] < 1 || pad[j] < 0)
      return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
    const int64_t expect = (in_sp[j] + 2 * pad[j] - dil[j] * (f_sp[j] - 1) - 1) / str[j] + 1;
    if (expect != out_sp[j])
      return InvalidArgument(op_where(op) + "output 'y' dims " + dims_string(y->dims) + " do not match the " +
                             "convolution of x " + dims_string(x.dims) + " with w " + dims_string(w.dims));
  }
  const int64_t N = x.dims[0], C = x.dims[1], K = w.dims[0], Cg = w.dims[1];
  if (Cg <= 0 || C % Cg != 0 || K % (C / Cg) != 0 || y->dims[0] != N || y->dims[1] != K)
    return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x.dims) + ", w " + dims_string(w.dims) +
                           ", y " + dims_string(y->dims));
  const int64_t groups = C / Cg, Kg = K / groups;
  const int64_t in_plane = in_sp[0] * in_sp[1] * in_sp[2], f_plane = f_sp[0] * f_sp[1] * f_sp[2];
  const int64_t out_plane = out_sp[0] * out_sp[1] * out_sp[2];

  // Per (n, k) plane: loop over filter taps outermost and output columns
  // innermost, so the hot loop is a contiguous, branch-free axpy.
  parallel_for(N * K, static_cast<double>(out_plane) * Cg * f_plane, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(out_plane));
    for (int64_t nk = begin; nk < end; ++nk) {
      const int64_t n = nk / K, k = nk % K, g = k / Kg;
      const float* xn = x.data.data() + (n * C + g * Cg) * in_plane;
      const float* wk = w.data.data() + k * Cg * f_plane;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t c = 0; c < Cg; ++c)
        for (int64_t t = 0; t < f_sp[0]; ++t)
          for (int64_t r = 0; r < f_sp[1]; ++r)
            for (int64_t s = 0; s < f_sp[2]; ++s) {
              const double wv = wk[((c * f_sp[0] + t) * f_sp[1] + r) * f_sp[2] + s];
              // Output columns whose input column ow*stride - pad + s*dil lies inside the row.
              const int64_t shift = s * dil[2] - pad[2];
              const int64_t ow_lo = std::max<int64_t>(0, ceil_div(-shift, str[2]));
              const int64_t ow_hi = std::min<int64_t>(out_sp[2] - 1, floor_div(in_sp[2] - 1 - shift, str[2]));
              if (ow_lo > ow_hi) continue;
              for (int64_t od = 0; od < out_sp[0]; ++od) {
                const int64_t id = od * str[0] - pad[0] + t * dil[0];
                if (id < 0 || id >= in_sp[0]) continue;
                for (int64_t oh = 0; oh < out_sp[1]; ++oh) {
                  const int64_t ih = oh * str[1] - pad[1] + r * dil[1];
                  if (ih < 0 || ih >= in_sp[1]) continue;
                  const float* xrow = xn + c * in_plane + (id * in_sp[1] + ih) * in_sp[2];
                  double* arow = acc.data() + (od * out_sp[1] + oh) * out_sp[2];
                  const int64_t st = str[2];
                  for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) arow[ow] += wv * xrow[ow * st + shift];
                }
              }
            }
      float* yo = y->data.data() + nk * out_plane;
      for (int64_t i = 0; i < out_plane; ++i) yo[i] = static_cast<float>(acc[i]);
    }
  });
  return Status::Ok();
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Values* y, ctx.out("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* w, ctx.in("w"));
  return conv_fprop(op, a, *x, *w, y);
}

Tolerance tolerance(const ConvFpropAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
