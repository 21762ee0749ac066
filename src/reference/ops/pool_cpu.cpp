// fusebox: the CPU reference of the pool ops (max_pool, avg_pool,
// global_avg_pool; semantics in include/fusebox/ops/pool.h), and their
// verification tolerance. Tensors are logical row-major [N, C, (D,) H, W];
// a rank-4 tensor is seen as D = 1. Window sums are in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

// Spatial dims as 3 (D, H, W), with the attributes padded alike.
struct Geometry3 {
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1};
  int64_t window[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
};

Result<Geometry3> geometry3(const ResolvedOp& op, const PoolAttrs& a, const std::vector<int64_t>& xd,
                            const std::vector<int64_t>& yd) {
  const size_t sp = xd.size() - 2;
  if ((sp != 2 && sp != 3) || yd.size() != xd.size() || a.window.size() != sp || a.stride.size() != sp ||
      a.padding.size() != sp)
    return InvalidArgument(op_where(op) + "x " + dims_string(xd) + " and y " + dims_string(yd) +
                           " do not match the resolved window/stride/padding");
  Geometry3 g;
  const size_t off = 3 - sp;
  for (size_t i = 0; i < sp; ++i) {
    g.in[off + i] = xd[2 + i];
    g.out[off + i] = yd[2 + i];
    g.window[off + i] = a.window[i];
    g.stride[off + i] = a.stride[i];
    g.pad[off + i] = a.padding[i];
  }
  return g;
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const PoolAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Geometry3 g, geometry3(op, a, x->dims, y->dims));
  const int64_t planes = x->dims[0] * x->dims[1];
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2];
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  const double window_size = static_cast<double>(g.window[0] * g.window[1] * g.window[2]);
  const bool is_max = a.mode == PoolMode::kMax;
  parallel_for(planes, static_cast<double>(out_plane) * window_size, [&](int64_t begin, int64_t end) {
    for (int64_t pl = begin; pl < end; ++pl) {
      const float* xp = x->data.data() + pl * in_plane;
      float* yp = y->data.data() + pl * out_plane;
      for (int64_t od = 0; od < g.out[0]; ++od)
        for (int64_t oh = 0; oh < g.out[1]; ++oh)
          for (int64_t ow = 0; ow < g.out[2]; ++ow) {
            double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
            int64_t covered = 0;
            for (int64_t kd = 0; kd < g.window[0]; ++kd) {
              const int64_t id = od * g.stride[0] - g.pad[0] + kd;
              if (id < 0 || id >= g.in[0]) continue;
              for (int64_t kh = 0; kh < g.window[1]; ++kh) {
                const int64_t ih = oh * g.stride[1] - g.pad[1] + kh;
                if (ih < 0 || ih >= g.in[1]) continue;
                for (int64_t kw = 0; kw < g.window[2]; ++kw) {
                  const int64_t iw = ow * g.stride[2] - g.pad[2] + kw;
                  if (iw < 0 || iw >= g.in[2]) continue;
                  const double v = xp[(id * g.in[1] + ih) * g.in[2] + iw];
                  acc = is_max ? std::max(acc, v) : acc + v;
                  ++covered;
                }
              }
            }
            // padding < window (resolve), so every window covers an element of x.
            double r = acc;
            if (!is_max)
              r = acc /
                  (a.count_include_pad ? window_size : static_cast<double>(std::max<int64_t>(covered, 1)));
            yp[(od * g.out[1] + oh) * g.out[2] + ow] = static_cast<float>(r);
          }
    }
  });
  return Status::Ok();
}

// Tighter than the dtype defaults, since pooling has no long reduction:
// - max_pool selects one element of x, so cuDNN's y is that element cast to
//   y's dtype: at most half a unit in the last place of y's dtype from the
//   reference (exact when y's dtype holds x's), i.e. |a - r| <= u*|r| with u
//   the unit roundoff (bf16 2^-8, fp16 2^-11, fp32 2^-24, given as 1e-6).
// - avg_pool sums at most a window (49 for ResNet's 7x7 global pool) in fp32
//   and casts once: the cast's u*|r| dominates; the fp32 sum adds about
//   window * 2^-24 * max|x|, below 1e-5 of max|y| for these windows, so y's
//   bound is 2u for bf16/fp16 and 1e-5 for fp32. An average can cancel to
//   near 0, so the per-element bound is taken relative to max|y| (the
//   comparison's max measure) and the rel_l2 bound is u (2u in the worst case
//   of every element rounding a full half unit is not reached: rounding
//   errors average u/sqrt(3)).
Tolerance tolerance(const PoolAttrs& a, std::string_view, DType dtype) {
  double u = 0;
  switch (dtype) {
    case DType::kBF16:
      u = 0x1p-8;
      break;
    case DType::kFP16:
      u = 0x1p-11;
      break;
    case DType::kFP32:
      u = 1e-6;
      break;
    default:
      return default_tolerance(dtype);
  }
  if (a.mode == PoolMode::kMax) return {u, u};
  if (dtype == DType::kFP32) return {1e-5, 1e-5};
  return {u, 2 * u};
}

}  // namespace fusebox::reference_detail
