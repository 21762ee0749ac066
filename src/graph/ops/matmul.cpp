// fusebox op family matmul (graph layer): a [batch..., M, K] x b [batch..., K, N]
// -> y [batch..., M, N], batch dims equal or 1 (broadcast), rank >= 3.
#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<MatmulAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "matmul", bench_family = "matmul";
};
FUSEBOX_OP_TRAITS(MatmulAttrs)

using common::dims_string;

std::vector<std::string_view> type_names(std::type_identity<MatmulAttrs>) { return {"matmul"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<MatmulAttrs>) {
  if (name == "matmul") return OpAttrs{MatmulAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const MatmulAttrs&) { return "matmul"; }
std::vector<std::string_view> input_roles(const MatmulAttrs&) { return {"a", "b"}; }
std::vector<std::string_view> output_roles(const MatmulAttrs&) { return {"y"}; }
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec&, MatmulAttrs&) {
  return Status::Ok();
}
void write_json(const MatmulAttrs&, nlohmann::ordered_json&) {}

namespace {

bool is_fp8(DType t) { return t == DType::kFP8E4M3 || t == DType::kFP8E5M2; }

// FP8 GEMM (cuDNN's "FP8-style epilogue"): both inputs FP8, the product kept
// in fp32 so that the per-tensor descales (scale ops) apply before any rounding.
Status check_fp8(const InferContext& ctx) {
  const ResolvedTensor& a = ctx.in("a");
  const ResolvedTensor& b = ctx.in("b");
  if (!is_fp8(a.dtype) && !is_fp8(b.dtype)) return Status::Ok();
  for (const char* role : {"a", "b"}) {
    const ResolvedTensor& t = ctx.in(role);
    if (!is_fp8(t.dtype)) {
      const char* other = std::string(role) == "a" ? "b" : "a";
      return InvalidArgument(ctx.in_where(role) + " is " + std::string(dtype_name(t.dtype)) + " but input '" +
                             other + "' (" + squote(ctx.in(other).name) + ") is " +
                             std::string(dtype_name(ctx.in(other).dtype)) +
                             ": an FP8 matmul takes fp8_e4m3 or fp8_e5m2 for both a and b");
    }
  }
  const ResolvedTensor& y = ctx.out("y");
  if (y.dtype != DType::kFP32) {
    return InvalidArgument(
        ctx.out_where("y") + " is " + std::string(dtype_name(y.dtype)) +
        ": an FP8 matmul's product is fp32 (leave it undeclared or virtual fp32), then "
        "scale ops apply the fp32 [1,...,1] descales and the output dtype (bf16, fp8) goes on "
        "the last op (docs/graph-format.md, FP8 epilogues)");
  }
  return Status::Ok();
}

}  // namespace

Status infer(const InferContext& ctx, MatmulAttrs&) {
  const ResolvedTensor& a = ctx.in("a");
  const ResolvedTensor& b = ctx.in("b");
  const size_t rank = a.dims.size();
  if (rank < 3) {
    return InvalidArgument(
        ctx.in_where("a") + " has rank " + std::to_string(rank) + " " + dims_string(a.dims) +
        ": matmul takes [batch..., M, K] with rank >= 3 (write [1, M, K] for a plain GEMM)");
  }
  if (b.dims.size() != rank) {
    return InvalidArgument(ctx.in_where("b") + " has rank " + std::to_string(b.dims.size()) + " " +
                           dims_string(b.dims) + " but input 'a' (" + squote(a.name) + ") has rank " +
                           std::to_string(rank) + ": both must have the same rank");
  }
  if (a.dims[rank - 1] != b.dims[rank - 2]) {
    return InvalidArgument(
        ctx.in_where("a") + " " + dims_string(a.dims) + " has K=" + std::to_string(a.dims[rank - 1]) +
        " but input 'b' (" + squote(b.name) + ") " + dims_string(b.dims) +
        " has K=" + std::to_string(b.dims[rank - 2]) + ": a's last dim must equal b's second-to-last");
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i + 2 < rank; ++i) {
    int64_t da = a.dims[i], db = b.dims[i];
    if (da != db && da != 1 && db != 1) {
      return InvalidArgument(ctx.where + " batch dim " + std::to_string(i) + " is " + std::to_string(da) +
                             " in 'a' (" + squote(a.name) + ") but " + std::to_string(db) + " in 'b' (" +
                             squote(b.name) + "): batch dims must be equal or 1 (broadcast)");
    }
    out.push_back(std::max(da, db));
  }
  out.push_back(a.dims[rank - 2]);
  out.push_back(b.dims[rank - 1]);
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", out, dense_strides_like(out, a.strides), ctx.io_dtype));
  return check_fp8(ctx);
}

void canonical(const MatmulAttrs&, CanonicalWriter&) {}
void describe(const MatmulAttrs&, std::ostream&) {}
void resolved_json(const FlopsContext&, const MatmulAttrs&, nlohmann::ordered_json&) {}

double flops(const FlopsContext& ctx, const MatmulAttrs&) {
  return 2.0 * static_cast<double>(ctx.out("y").element_count()) *
         static_cast<double>(ctx.in("a").dims.back());
}

// ---- gradient rule: y = a b  ->  da = dy b^T, db = a^T dy (transposed views of
// the saved inputs; add_grad sums over batch dims a or b was broadcast along).
Status grad(GradContext& ctx, const MatmulAttrs&) {
  const std::string dy = ctx.dy("y");
  if (ctx.wants("a")) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string bt, ctx.in_transposed("b"));
    FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("da", MatmulAttrs{}, {{"a", dy}, {"b", bt}}));
    FUSEBOX_RETURN_IF_ERROR(ctx.add_grad("a", r.at("y")));
  }
  if (ctx.wants("b")) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string at, ctx.in_transposed("a"));
    FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("db", MatmulAttrs{}, {{"a", at}, {"b", dy}}));
    FUSEBOX_RETURN_IF_ERROR(ctx.add_grad("b", r.at("y")));
  }
  return Status::Ok();
}

}  // namespace fusebox::graph_ops
