// fusebox op family transpose (graph layer): a permutation of x's dims written to memory in y's
// own layout (include/fusebox/ops/transpose.h has the semantics).
#include <algorithm>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

using common::dims_string;

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<TransposeAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "transpose", bench_family = "reduction";  // memory-bound
  static constexpr auto json_fields = std::to_array<std::string_view>({"permutation"});
  static constexpr bool outputs_in_memory = true;
};
FUSEBOX_OP_TRAITS(TransposeAttrs)

std::vector<std::string_view> type_names(std::type_identity<TransposeAttrs>) { return {"transpose"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<TransposeAttrs>) {
  if (name == "transpose") return OpAttrs{TransposeAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const TransposeAttrs&) { return "transpose"; }
std::vector<std::string_view> input_roles(const TransposeAttrs&) { return {"x"}; }
std::vector<std::string_view> output_roles(const TransposeAttrs&) { return {"y"}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  TransposeAttrs& a) {
  return r.opt_int_list(v, path, "permutation", a.permutation);
}
void write_json(const TransposeAttrs& a, nlohmann::ordered_json& j) { j["permutation"] = a.permutation; }

Status infer(const InferContext& ctx, TransposeAttrs& a) {
  const ResolvedTensor& x = ctx.in("x");
  const size_t rank = x.dims.size();
  std::vector<int64_t> sorted = a.permutation;
  std::sort(sorted.begin(), sorted.end());
  bool valid = sorted.size() == rank;
  for (size_t i = 0; valid && i < rank; ++i) valid = sorted[i] == static_cast<int64_t>(i);
  if (!valid) {
    return InvalidArgument(ctx.where + " permutation " + dims_string(a.permutation) +
                           " is not a permutation of x's " + std::to_string(rank) + " dims " +
                           dims_string(x.dims) + ": give each of 0.." +
                           std::to_string(rank == 0 ? 0 : rank - 1) +
                           " once, y's dim i being x's dim permutation[i] (as torch.permute)");
  }
  std::vector<int64_t> ydims(rank);
  for (size_t i = 0; i < rank; ++i) ydims[i] = x.dims[static_cast<size_t>(a.permutation[i])];
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", ydims, dense_strides_like(ydims, {}), x.dtype));
  if (ctx.out("y").dtype != x.dtype) {
    return InvalidArgument(ctx.out_where("y") + " is " + std::string(dtype_name(ctx.out("y").dtype)) +
                           " but x is " + std::string(dtype_name(x.dtype)) +
                           ": a transpose moves values and keeps their dtype (omit y's dtype)");
  }
  return Status::Ok();
}

void canonical(const TransposeAttrs& a, CanonicalWriter& w) { w.field("permutation", a.permutation); }
void describe(const TransposeAttrs& a, std::ostream& os) {
  os << ", permutation " << dims_string(a.permutation);
}
void resolved_json(const FlopsContext&, const TransposeAttrs& a, nlohmann::ordered_json& j) {
  j["permutation"] = a.permutation;
}
// No arithmetic: it moves bytes.
double flops(const FlopsContext&, const TransposeAttrs&) { return 0; }

// ---- gradient rule: dx is dy transposed back (the inverse permutation).
Status grad(GradContext& ctx, const TransposeAttrs& a) {
  if (!ctx.wants("x")) return Status::Ok();
  TransposeAttrs back;
  back.permutation.resize(a.permutation.size());
  for (size_t i = 0; i < a.permutation.size(); ++i)
    back.permutation[static_cast<size_t>(a.permutation[i])] = i;
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", back, {{"x", ctx.dy("y")}}));
  return ctx.add_grad("x", r.at("y"));
}

}  // namespace fusebox::graph_ops
