// fusebox op family embedding (graph layer): a table lookup plus an optional
// repeating row add (include/fusebox/ops/embedding.h has the semantics).
// ids [N,1,1,1] int32, table [V,H,1,1], add [P,H,1,1] -> y [N,H,1,1].
#include <cmath>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<EmbeddingAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "embedding", bench_family = "reduction";
  static constexpr bool outputs_in_memory = true;
  static constexpr bool native_only = true;
  static constexpr auto index_inputs = std::to_array<std::string_view>({"ids"});
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"ids"});
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op,
                                          const EmbeddingAttrs& a) {
    return a.backward && !a.deterministic
               ? "op '" + op.name + "' (embedding_bwd) adds with atomics; \"deterministic\": true repeats"
               : "";
  }
};
FUSEBOX_OP_TRAITS(EmbeddingAttrs)

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

std::vector<std::string_view> type_names(std::type_identity<EmbeddingAttrs>) {
  return {"embedding", "embedding_bwd"};
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<EmbeddingAttrs>) {
  if (name == "embedding") return OpAttrs{EmbeddingAttrs{}};
  if (name == "embedding_bwd") {
    EmbeddingAttrs a;
    a.backward = true;
    return OpAttrs{a};
  }
  return std::nullopt;
}
std::string_view type_name(const EmbeddingAttrs& a) { return a.backward ? "embedding_bwd" : "embedding"; }
std::vector<std::string_view> input_roles(const EmbeddingAttrs& a) {
  if (a.backward) return {"ids", "dy"};
  if (a.add) return {"ids", "table", "add"};
  return {"ids", "table"};
}
std::vector<std::string_view> output_roles(const EmbeddingAttrs& a) {
  if (a.backward) return {"dtable"};
  return {"y"};
}
std::vector<std::string_view> json_fields(const EmbeddingAttrs& a) {
  if (a.backward) return {"rows", "deterministic"};
  return {};
}
// fusebox's own kernel writes y to memory: there is no epilogue to fuse it into.

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                  EmbeddingAttrs& a) {
  if (!a.backward) {
    a.add = op.inputs.count("add") > 0;  // an optional input
    return Status::Ok();
  }
  std::optional<int64_t> rows;
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "rows", rows));
  if (!rows || *rows < 1)
    return r.err(path,
                 "embedding_bwd needs \"rows\": the table's row count V (an integer >= 1), which dy "
                 "and ids do not give");
  a.rows = *rows;
  return r.opt_bool(v, path, "deterministic", a.deterministic);
}
void write_json(const EmbeddingAttrs& a, nlohmann::ordered_json& j) {
  if (!a.backward) return;
  j["rows"] = a.rows;
  if (a.deterministic) j["deterministic"] = true;
}

namespace {

Status check_ids(const InferContext& ctx, int64_t v) {
  ResolvedTensor& ids = ctx.in("ids");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("ids"), ids.dtype, {DType::kInt32},
                                         "embedding takes int32 ids (set \"dtype\": \"int32\")"));
  if (ids.dims.size() != 4 || ids.dims[1] != 1 || ids.dims[2] != 1 || ids.dims[3] != 1) {
    return InvalidArgument(ctx.in_where("ids") + " has dims " + dims_string(ids.dims) +
                           ": embedding takes ids as [N, 1, 1, 1] (one id per row)");
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
  return Status::Ok();
}

// The output [rows, H, 1, 1]: rows of H contiguous values, not overlapping.
Status check_out_rows(const InferContext& ctx, const char* role, int64_t rows, int64_t h) {
  const ResolvedTensor& y = ctx.out(role);
  if (h > 1 && y.strides[1] != 1) {
    return InvalidArgument(
        ctx.out_where(role) + " has strides " + dims_string(y.strides) +
        ": embedding writes rows of H contiguous values; lay it out \"nhwc\" (or row-major)");
  }
  if (rows > 1 && y.strides[0] < h) {
    return InvalidArgument(ctx.out_where(role) + " has strides " + dims_string(y.strides) +
                           ": its rows overlap");
  }
  return Status::Ok();
}

Status infer_backward(const InferContext& ctx, EmbeddingAttrs& a) {
  FUSEBOX_RETURN_IF_ERROR(check_ids(ctx, a.rows));
  FUSEBOX_RETURN_IF_ERROR(check_rows(ctx, "dy", "dy"));
  const int64_t n = ctx.in("ids").dims[0], h = ctx.in("dy").dims[1];
  if (ctx.in("dy").dims[0] != n) {
    return InvalidArgument(ctx.in_where("dy") + " has " + std::to_string(ctx.in("dy").dims[0]) +
                           " rows but " + ctx.in_where("ids").substr(ctx.where.size() + 1) + " has " +
                           std::to_string(n) + ": dy has one row per id");
  }
  const std::vector<int64_t> dims{a.rows, h, 1, 1};
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("dtable", dims, {h, 1, h, h}, DType::kFP32));
  FUSEBOX_RETURN_IF_ERROR(check_out_rows(ctx, "dtable", a.rows, h));
  return check_dtype_in(ctx.out_where("dtable"), ctx.out("dtable").dtype, {DType::kFP32},
                        "embedding_bwd sums in fp32 and writes an fp32 table gradient (the master weights' "
                        "dtype): declare dtable fp32");
}

}  // namespace

Status infer(const InferContext& ctx, EmbeddingAttrs& a) {
  if (a.backward) return infer_backward(ctx, a);
  FUSEBOX_RETURN_IF_ERROR(check_rows(ctx, "table", "the table"));
  const int64_t v = ctx.in("table").dims[0], h = ctx.in("table").dims[1];
  FUSEBOX_RETURN_IF_ERROR(check_ids(ctx, v));
  const int64_t n = ctx.in("ids").dims[0];
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
  const std::vector<int64_t> ydims{n, h, 1, 1};
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", ydims, {h, 1, h, h}, ctx.io_dtype));
  FUSEBOX_RETURN_IF_ERROR(check_out_rows(ctx, "y", n, h));
  return check_dtype_in(ctx.out_where("y"), ctx.out("y").dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        "embedding writes bf16, fp16 or fp32");
}

void canonical(const EmbeddingAttrs& a, CanonicalWriter& w) {
  w.field("add", a.add);
  if (a.backward) {
    w.field("backward", true);
    w.field("rows", a.rows);
    w.field("deterministic", a.deterministic);
  }
}
void describe(const EmbeddingAttrs& a, std::ostream& os) {
  if (a.backward) {
    os << ", " << a.rows << " rows" << (a.deterministic ? ", deterministic" : ", atomic adds")
       << ", fusebox kernel (no cuDNN op)";
    return;
  }
  os << (a.add ? ", plus add[n % P]" : "") << ", fusebox kernel (no cuDNN op)";
}
void resolved_json(const FlopsContext& ctx, const EmbeddingAttrs& a, nlohmann::ordered_json& j) {
  j["add"] = a.add;
  j["vocab"] = a.backward ? a.rows : ctx.in("table").dims[0];
  if (a.backward) j["deterministic"] = a.deterministic;
  j["native_kernel"] = true;
}
// One add per output element with `add` (embedding_bwd: one per element of dy); a lookup alone computes
// nothing.
double flops(const FlopsContext& ctx, const EmbeddingAttrs& a) {
  if (a.backward) return static_cast<double>(ctx.in("dy").element_count());
  return a.add ? static_cast<double>(ctx.out("y").element_count()) : 0.0;
}

// ---- gradient rule: embedding -> embedding_bwd (the scatter-add of dy rows into
// an fp32 table gradient); the ids carry none, `add` none yet.
Status grad(GradContext& ctx, const EmbeddingAttrs& a) {
  if (a.backward) return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
  if (ctx.has_in("add") && ctx.wants("add"))
    return ctx.no_rule(
        "the gradient of 'add' (a sum over the rows that share it) is not derived yet: leave it out of wrt");
  if (!ctx.wants("table")) return Status::Ok();
  const ResolvedTensor& table = ctx.in_tensor("table");
  if (table.dtype != DType::kFP32)
    return ctx.no_rule("the table's gradient is summed in fp32 and the table is " +
                       std::string(dtype_name(table.dtype)) +
                       ": keep the table (the master weights) in fp32");
  EmbeddingAttrs b;
  b.backward = true;
  b.rows = table.dims[0];
  b.deterministic = ctx.deterministic();
  FUSEBOX_ASSIGN_OR_RETURN(std::string ids, ctx.in("ids"));
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("dtable", b, {{"ids", ids}, {"dy", ctx.dy("y")}}));
  return ctx.add_grad("table", r.at("dtable"));
}

}  // namespace fusebox::graph_ops
