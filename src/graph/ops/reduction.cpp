// fusebox op family reduction (graph layer): reduce_sum, reduce_max,
// reduce_min, reduce_amax, reduce_mean (include/fusebox/ops/reduction.h has
// the semantics). x of any rank -> y with x's rank and 1 on the reduced dims.
#include <algorithm>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;

namespace {
constexpr ReductionMode kAllReductionModes[] = {ReductionMode::kSum, ReductionMode::kMax, ReductionMode::kMin,
                                                ReductionMode::kAmax, ReductionMode::kMean};
}  // namespace

std::string_view reduction_mode_name(ReductionMode m) {
  switch (m) {
    case ReductionMode::kSum:
      return "reduce_sum";
    case ReductionMode::kMax:
      return "reduce_max";
    case ReductionMode::kMin:
      return "reduce_min";
    case ReductionMode::kAmax:
      return "reduce_amax";
    case ReductionMode::kMean:
      return "reduce_mean";
  }
  return "unknown";
}

std::optional<ReductionMode> parse_reduction_mode(std::string_view s) {
  for (ReductionMode m : kAllReductionModes)
    if (reduction_mode_name(m) == s) return m;
  return std::nullopt;
}

namespace graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<ReductionAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "reduction", bench_family = "reduction";
  static constexpr auto json_fields = std::to_array<std::string_view>({"reduce_dims"});
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op, const ReductionAttrs&) {
    return "op '" + op.name + "' (a reduction) adds partial sums in no fixed order";
  }
  static bool sums_inputs(const ReductionAttrs& a) {
    return a.mode == ReductionMode::kSum || a.mode == ReductionMode::kMean;
  }
};
FUSEBOX_OP_TRAITS(ReductionAttrs)

std::vector<std::string_view> type_names(std::type_identity<ReductionAttrs>) {
  std::vector<std::string_view> r;
  for (ReductionMode m : kAllReductionModes) r.push_back(reduction_mode_name(m));
  return r;
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<ReductionAttrs>) {
  if (auto m = parse_reduction_mode(name)) return OpAttrs{ReductionAttrs{*m, {}}};
  return std::nullopt;
}
std::string_view type_name(const ReductionAttrs& a) { return reduction_mode_name(a.mode); }
std::vector<std::string_view> input_roles(const ReductionAttrs&) { return {"x"}; }
std::vector<std::string_view> output_roles(const ReductionAttrs&) { return {"y"}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  ReductionAttrs& a) {
  return r.opt_int_list(v, path, "reduce_dims", a.reduce_dims);
}
void write_json(const ReductionAttrs& a, nlohmann::ordered_json& j) { j["reduce_dims"] = a.reduce_dims; }

Status infer(const InferContext& ctx, ReductionAttrs& a) {
  const ResolvedTensor& x = ctx.in("x");
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  const std::string type(reduction_mode_name(a.mode));
  FUSEBOX_RETURN_IF_ERROR(
      check_dtype_in(ctx.in_where("x"), x.dtype,
                     {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP8E5M2},
                     type + " takes a floating x (bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2)"));
  // No reduce_dims: every dim (a one-element result such as an amax).
  if (a.reduce_dims.empty()) {
    for (int64_t d = 0; d < rank; ++d) a.reduce_dims.push_back(d);
  }
  std::vector<int64_t> sorted = a.reduce_dims;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= rank) {
      return InvalidArgument(ctx.where + " reduce_dims " + dims_string(a.reduce_dims) + " names dim " +
                             std::to_string(sorted[i]) + " but " +
                             ctx.in_where("x").substr(ctx.where.size() + 1) + " " + dims_string(x.dims) +
                             " has rank " + std::to_string(rank) + ": give dims from 0 to " +
                             std::to_string(rank - 1) + " (or omit reduce_dims to reduce over every dim)");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return InvalidArgument(ctx.where + " reduce_dims " + dims_string(a.reduce_dims) + " names dim " +
                             std::to_string(sorted[i]) + " twice: give each reduced dim once");
    }
  }
  a.reduce_dims = sorted;
  std::vector<int64_t> ydims = x.dims;
  for (int64_t d : sorted) ydims[static_cast<size_t>(d)] = 1;
  // cuDNN infers the reduced dims from y's dims, so a declared y must agree.
  Status st = ctx.finish_output("y", ydims, dense_strides_like(ydims, x.strides), DType::kFP32);
  if (!st.ok()) {
    return Status(st.code(), st.message() + " (" + type + " over reduce_dims " + dims_string(sorted) +
                                 " of x " + dims_string(x.dims) + " gives " + dims_string(ydims) +
                                 ": set reduce_dims to the dims where y is 1)");
  }
  return check_dtype_in(ctx.out_where("y"), ctx.out("y").dtype, {DType::kFP32, DType::kBF16, DType::kFP16},
                        type + " writes fp32 (the default), bf16 or fp16");
}

void canonical(const ReductionAttrs& a, CanonicalWriter& w) { w.field("reduce_dims", a.reduce_dims); }
void describe(const ReductionAttrs& a, std::ostream& os) {
  os << ", reduce_dims " << dims_string(a.reduce_dims);
}
void resolved_json(const FlopsContext&, const ReductionAttrs& a, nlohmann::ordered_json& j) {
  j["reduce_dims"] = a.reduce_dims;
}
// One per element of x.
double flops(const FlopsContext& ctx, const ReductionAttrs&) {
  return static_cast<double>(ctx.in("x").element_count());
}

// ---- gradient rule: none yet. A sum's gradient is dy broadcast back to x's
// dims, and fusebox has no broadcast op; max/min/amax pick an element.
Status grad(GradContext& ctx, const ReductionAttrs& a) {
  return ctx.no_rule(std::string(reduction_mode_name(a.mode)) +
                     " has no gradient rule yet (it needs a broadcast op); end the forward before it");
}

}  // namespace graph_ops
}  // namespace fusebox
