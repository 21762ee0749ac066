// fusebox op family embedding (graph layer): a table lookup plus an optional
// repeating row add (include/fusebox/ops/embedding.h has the semantics).
// ids [N,1,1,1] int32, table [V,H,1,1], add [P,H,1,1] -> y [N,H,1,1].
#include <cmath>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

using common::dims_string;

namespace {

// [rows, H, 1, 1] with H contiguous: what the kernel reads row by row.
Status check_rows(const InferContext& ctx, std::string_view role, const char* what) {
  const ResolvedTensor& t = ctx.in(role);
  if (t.dims.size() != 4 || t.dims[2] != 1 || t.dims[3] != 1) {
    return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(t.dims) + ": embedding takes " +
                           what + " as [rows, H, 1, 1] (a row of H values each)");
  }
  if (t.dims[1] > 1 && t.strides[1] != 1) {
    return InvalidArgument(
        ctx.in_where(role) + " has strides " + dims_string(t.strides) +
        ": embedding reads rows of H contiguous values; lay it out \"nhwc\" (or row-major)");
  }
  if (t.dims[0] > 1 && t.strides[0] < t.dims[1]) {
    return InvalidArgument(ctx.in_where(role) + " has strides " + dims_string(t.strides) +
                           ": its rows overlap (stride of dim 0 below H = " + std::to_string(t.dims[1]) +
                           ")");
  }
  return check_dtype_in(ctx.in_where(role), t.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        std::string("embedding takes ") + what + " in bf16, fp16 or fp32");
}

}  // namespace

std::vector<std::string_view> type_names(std::type_identity<EmbeddingAttrs>) { return {"embedding"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<EmbeddingAttrs>) {
  if (name == "embedding") return OpAttrs{EmbeddingAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const EmbeddingAttrs&) { return "embedding"; }
std::vector<std::string_view> input_roles(const EmbeddingAttrs& a) {
  if (a.add) return {"ids", "table", "add"};
  return {"ids", "table"};
}
std::vector<std::string_view> output_roles(const EmbeddingAttrs&) { return {"y"}; }
// fusebox's own kernel writes y to memory: there is no epilogue to fuse it into.

Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec& op,
                  EmbeddingAttrs& a) {
  a.add = op.inputs.count("add") > 0;  // an optional input
  return Status::Ok();
}
void write_json(const EmbeddingAttrs&, nlohmann::ordered_json&) {}

Status infer(const InferContext& ctx, EmbeddingAttrs& a) {
  ResolvedTensor& ids = ctx.in("ids");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("ids"), ids.dtype, {DType::kInt32},
                                         "embedding takes int32 ids (set \"dtype\": \"int32\")"));
  if (ids.dims.size() != 4 || ids.dims[1] != 1 || ids.dims[2] != 1 || ids.dims[3] != 1) {
    return InvalidArgument(ctx.in_where("ids") + " has dims " + dims_string(ids.dims) +
                           ": embedding takes ids as [N, 1, 1, 1] (one id per output row)");
  }
  FUSEBOX_RETURN_IF_ERROR(check_rows(ctx, "table", "the table"));
  const int64_t n = ids.dims[0], v = ctx.in("table").dims[0], h = ctx.in("table").dims[1];
  if (a.add) {
    FUSEBOX_RETURN_IF_ERROR(check_rows(ctx, "add", "add"));
    const ResolvedTensor& add = ctx.in("add");
    if (add.dims[1] != h) {
      return InvalidArgument(ctx.in_where("add") + " has rows of " + std::to_string(add.dims[1]) + " but " +
                             ctx.in_where("table").substr(ctx.where.size() + 1) + " has rows of " +
                             std::to_string(h) + ": give add as [P, " + std::to_string(h) + ", 1, 1]");
    }
    if (n % add.dims[0] != 0) {
      return InvalidArgument(
          ctx.in_where("add") + " has " + std::to_string(add.dims[0]) + " rows, which do not divide the " +
          std::to_string(n) +
          " ids: row n of y adds row n % P of add, so P must divide N (e.g. P = the sequence "
          "length of N = batch x sequence ids)");
    }
  }
  // Fixed ids (the graph's "values") are checked now; given ones before a run (check_embedding_ids).
  for (size_t i = 0; i < ids.values.size(); ++i) {
    if (ids.values[i] >= 0 && ids.values[i] < static_cast<double>(v) &&
        ids.values[i] == static_cast<int64_t>(ids.values[i]))
      continue;
    const double bad = ids.values[i];
    const bool whole = std::isfinite(bad) && std::fabs(bad) < 9e15 && std::floor(bad) == bad;
    return InvalidArgument(ctx.in_where("ids") + ": values[" + std::to_string(i) + "] = " +
                           (whole ? std::to_string(static_cast<int64_t>(bad)) : std::to_string(bad)) +
                           " is not a row of the table (" + std::to_string(v) +
                           " rows): every id must be an integer in [0, " + std::to_string(v) + ")");
  }
  // Random ids are valid rows of the table.
  ids.random_lo = 0;
  ids.random_hi = static_cast<double>(v - 1);
  const std::vector<int64_t> ydims{n, h, 1, 1};
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", ydims, {h, 1, h, h}, ctx.io_dtype));
  const ResolvedTensor& y = ctx.out("y");
  if (h > 1 && y.strides[1] != 1) {
    return InvalidArgument(
        ctx.out_where("y") + " has strides " + dims_string(y.strides) +
        ": embedding writes rows of H contiguous values; lay it out \"nhwc\" (or row-major)");
  }
  if (n > 1 && y.strides[0] < h) {
    return InvalidArgument(ctx.out_where("y") + " has strides " + dims_string(y.strides) +
                           ": its rows overlap");
  }
  return check_dtype_in(ctx.out_where("y"), y.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        "embedding writes bf16, fp16 or fp32");
}

void canonical(const EmbeddingAttrs& a, CanonicalWriter& w) { w.field("add", a.add); }
void describe(const EmbeddingAttrs& a, std::ostream& os) {
  os << (a.add ? ", plus add[n % P]" : "") << ", fusebox kernel (no cuDNN op)";
}
void resolved_json(const FlopsContext& ctx, const EmbeddingAttrs& a, nlohmann::ordered_json& j) {
  j["add"] = a.add;
  j["vocab"] = ctx.in("table").dims[0];
  j["native_kernel"] = true;
}
// One add per output element with `add`; a lookup alone computes nothing.
double flops(const FlopsContext& ctx, const EmbeddingAttrs& a) {
  return a.add ? static_cast<double>(ctx.out("y").element_count()) : 0.0;
}

// ---- gradient rule: none yet. The table's gradient is a scatter-add of dy
// rows into it (issue 33), not an op yet; the ids carry none.
Status grad(GradContext& ctx, const EmbeddingAttrs&) {
  if (!ctx.wants("table") && !(ctx.has_in("add") && ctx.wants("add"))) return Status::Ok();
  return ctx.no_rule(
      "the table's gradient (a scatter-add of dy rows) is not an op yet: leave 'table' out of wrt");
}

}  // namespace fusebox::graph_ops
