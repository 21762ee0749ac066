// fusebox: the CPU reference of cross_entropy and cross_entropy_bwd
// (include/fusebox/ops/cross_entropy.h), in double, and its tolerance.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const CrossEntropyAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* logits, ctx.in("logits"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* labels, ctx.in("labels"));
  const int64_t n = logits->dims.at(0), v = logits->dims.at(1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto label_of = [&](int64_t r) { return static_cast<int64_t>(labels->data[static_cast<size_t>(r)]); };
  if (!a.backward) {
    FUSEBOX_ASSIGN_OR_RETURN(Values * loss, ctx.out("loss"));
    Values* lse_out = nullptr;
    if (a.lse) {
      FUSEBOX_ASSIGN_OR_RETURN(lse_out, ctx.out("lse"));
    }
    for (int64_t r = 0; r < n; ++r) {
      const float* row = logits->data.data() + r * v;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t c = 0; c < v; ++c) m = std::max(m, static_cast<double>(row[c]));
      double s = 0;
      for (int64_t c = 0; c < v; ++c) s += std::exp(static_cast<double>(row[c]) - m);
      const double lse = m + std::log(s);
      const int64_t y = label_of(r);
      double l = nan;
      if (y == a.ignore_index) {
        l = 0;
      } else if (y >= 0 && y < v) {
        l = lse - row[y];
      }
      loss->data[static_cast<size_t>(r)] = static_cast<float>(l);
      if (lse_out) lse_out->data[static_cast<size_t>(r)] = static_cast<float>(lse);
    }
    return Status::Ok();
  }
  FUSEBOX_ASSIGN_OR_RETURN(const Values* lse, ctx.in("lse"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* dloss, ctx.in("dloss"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * dlogits, ctx.out("dlogits"));
  if (dlogits->dims != logits->dims)
    return InvalidArgument(op_where(op) + "dlogits is not shaped like logits");
  for (int64_t r = 0; r < n; ++r) {
    const int64_t y = label_of(r);
    const bool ignored = y == a.ignore_index, valid = y >= 0 && y < v;
    const double g = dloss->data[static_cast<size_t>(r)], l = lse->data[static_cast<size_t>(r)];
    for (int64_t c = 0; c < v; ++c) {
      const size_t i = static_cast<size_t>(r * v + c);
      double d = nan;
      if (ignored) {
        d = 0;
      } else if (valid) {
        d = (std::exp(static_cast<double>(logits->data[i]) - l) - (c == y ? 1.0 : 0.0)) * g;
      }
      dlogits->data[i] = static_cast<float>(d);
    }
  }
  return Status::Ok();
}

// The loss is lse - logit: for a confident row both are large and close, so
// the fp32 kernel's absolute error (a few ulps of lse, ~1e-6 * lse) is large
// relative to a small loss; the gradient is a softmax minus a one-hot, each
// term computed once in fp32. The default tolerances of fp32 (loss, lse) and
// of the output's dtype (dlogits) hold with the exp and the row sum in fp32.
// A limit of a whole-tensor comparison: with many classes the softmax term of
// dlogits is small beside the one-hot term (its L2 is about 1/sqrt(V) of it),
// so the GPU tests also check few-class shapes, where it is not.
Tolerance tolerance(const CrossEntropyAttrs&, std::string_view, DType dtype) {
  return default_tolerance(dtype);
}

}  // namespace fusebox::reference_detail
