// fusebox: the CPU reference of rope and rope_bwd (include/fusebox/ops/rope.h),
// in double, and its verification tolerance. The backward is computed as the
// rotation by -theta, which is the transpose of the forward's rotation.
#include <cmath>
#include <limits>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const RopeAttrs& a) {
  const std::string in_role = a.backward ? "dy" : "x", out_role = a.backward ? "dx" : "y";
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in(in_role));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* freqs, ctx.in("freqs"));
  const Values* offset = nullptr;
  if (a.offset) {
    FUSEBOX_ASSIGN_OR_RETURN(offset, ctx.in("offset"));
  }
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out(out_role));
  if (x->dims.size() != 4 || y->dims != x->dims || freqs->dims.size() != 4)
    return InvalidArgument(op_where(op) + in_role + " and " + out_role + " must be [B, H, S, D] alike");
  const int64_t nb = x->dims[0], nh = x->dims[1], ns = x->dims[2], d = x->dims[3];
  const int64_t r = a.rope_dim ? a.rope_dim : d, half = r / 2, lead = d - r, np = freqs->dims[2];
  const double sign = a.backward ? -1.0 : 1.0;  // dx = R(-theta) dy
  // Element j of the rotated segment (0 <= j < R/2) and its partner.
  auto lo = [&](int64_t i) { return a.layout == RopeLayout::kHalf ? i : 2 * i; };
  auto hi = [&](int64_t i) { return a.layout == RopeLayout::kHalf ? i + half : 2 * i + 1; };
  for (int64_t b = 0; b < nb; ++b) {
    const double off = offset ? offset->data[static_cast<size_t>(b)] : 0.0;
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t s = 0; s < ns; ++s) {
        const size_t row = static_cast<size_t>(((b * nh + h) * ns + s) * d);
        const double pos = off + static_cast<double>(s);
        const bool inside = pos >= 0 && pos < static_cast<double>(np);
        for (int64_t j = 0; j < lead; ++j) {
          y->data[row + j] = inside ? static_cast<float>(a.scale * x->data[row + j])
                                    : std::numeric_limits<float>::quiet_NaN();
        }
        for (int64_t i = 0; i < half; ++i) {
          double c = std::numeric_limits<double>::quiet_NaN(), sn = c;
          if (inside) {
            const double theta = freqs->data[static_cast<size_t>(static_cast<int64_t>(pos) * half + i)];
            c = a.scale * std::cos(theta);
            sn = sign * a.scale * std::sin(theta);
          }
          const size_t l = row + static_cast<size_t>(lead + lo(i)),
                       u = row + static_cast<size_t>(lead + hi(i));
          const double xl = x->data[l], xu = x->data[u];
          y->data[l] = static_cast<float>(xl * c - xu * sn);
          y->data[u] = static_cast<float>(xu * c + xl * sn);
        }
      }
    }
  }
  return Status::Ok();
}

// Two products and a sum per value in fp32 from the same inputs, rounded once
// to the output's dtype (fp32 cos/sin of angles within a few turns are within
// a few ulps of the double ones): the default tolerance of that dtype.
Tolerance tolerance(const RopeAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
