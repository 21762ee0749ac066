// fusebox op family cross_entropy (graph layer): softmax cross-entropy forward
// ("cross_entropy": logits, labels -> loss [, lse]) and backward
// ("cross_entropy_bwd": logits, labels, lse, dloss -> dlogits); the semantics
// are in include/fusebox/ops/cross_entropy.h.
#include <cmath>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<CrossEntropyAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "cross_entropy", bench_family = "reduction";
  static constexpr auto json_fields = std::to_array<std::string_view>({"ignore_index"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"labels"});
  static constexpr bool native_only = true;
};
FUSEBOX_OP_TRAITS(CrossEntropyAttrs)

using common::dims_string;

namespace {

std::string type(const CrossEntropyAttrs& a) { return a.backward ? "cross_entropy_bwd" : "cross_entropy"; }

// A [N, 1, 1, 1] input of `dtype`, one value per row.
Status check_per_row(const InferContext& ctx, std::string_view role, int64_t n, DType dtype,
                     const std::string& what) {
  const ResolvedTensor& t = ctx.in(role);
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where(role), t.dtype, {dtype}, what));
  if (t.dims != std::vector<int64_t>{n, 1, 1, 1}) {
    return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(t.dims) +
                           ": give it as [N, 1, 1, 1] = [" + std::to_string(n) +
                           ", 1, 1, 1], one value per row of the logits");
  }
  return Status::Ok();
}

// A [N, 1, 1, 1] fp32 output written to memory.
Status finish_per_row(const InferContext& ctx, const char* role, int64_t n, const std::string& t) {
  const std::vector<int64_t> dims{n, 1, 1, 1};
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output(role, dims, {1, 1, 1, 1}, DType::kFP32));
  return check_dtype_in(ctx.out_where(role), ctx.out(role).dtype, {DType::kFP32},
                        t + " writes " + role + " in fp32");
}

}  // namespace

std::vector<std::string_view> type_names(std::type_identity<CrossEntropyAttrs>) {
  return {"cross_entropy", "cross_entropy_bwd"};
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<CrossEntropyAttrs>) {
  if (name == "cross_entropy") return OpAttrs{CrossEntropyAttrs{}};
  if (name == "cross_entropy_bwd") return OpAttrs{CrossEntropyAttrs{.backward = true}};
  return std::nullopt;
}
std::string_view type_name(const CrossEntropyAttrs& a) {
  return a.backward ? "cross_entropy_bwd" : "cross_entropy";
}
std::vector<std::string_view> input_roles(const CrossEntropyAttrs& a) {
  if (a.backward) return {"logits", "labels", "lse", "dloss"};
  return {"logits", "labels"};
}
std::vector<std::string_view> output_roles(const CrossEntropyAttrs& a) {
  if (a.backward) return {"dlogits"};
  if (a.lse) return {"loss", "lse"};
  return {"loss"};
}

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                  CrossEntropyAttrs& a) {
  a.lse = !a.backward && op.outputs.count("lse") > 0;  // an optional output
  std::optional<int64_t> ignore;
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "ignore_index", ignore));
  if (ignore) a.ignore_index = *ignore;
  return Status::Ok();
}
void write_json(const CrossEntropyAttrs& a, nlohmann::ordered_json& j) {
  if (a.ignore_index != -100) j["ignore_index"] = a.ignore_index;
}

Status infer(const InferContext& ctx, CrossEntropyAttrs& a) {
  const std::string t = type(a);
  const ResolvedTensor& logits = ctx.in("logits");
  if (logits.dims.size() != 4 || logits.dims[2] != 1 || logits.dims[3] != 1) {
    return InvalidArgument(ctx.in_where("logits") + " has dims " + dims_string(logits.dims) + ": " + t +
                           " takes logits as [N, V, 1, 1] (a row of V class scores per token)");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("logits"), logits.dtype,
                                         {DType::kBF16, DType::kFP16, DType::kFP32},
                                         t + " takes logits in bf16, fp16 or fp32"));
  const int64_t n = logits.dims[0], v = logits.dims[1];
  if (v > 1 && logits.strides[1] != 1) {
    return InvalidArgument(ctx.in_where("logits") + " has strides " + dims_string(logits.strides) + ": " + t +
                           " reads rows of V contiguous values; lay it out \"nhwc\" (or row-major)");
  }
  if (n > 1 && logits.strides[0] < v) {
    return InvalidArgument(ctx.in_where("logits") + " has strides " + dims_string(logits.strides) +
                           ": its rows overlap");
  }
  if (a.ignore_index >= 0 && a.ignore_index < v) {
    return InvalidArgument(ctx.where + " ignore_index is " + std::to_string(a.ignore_index) +
                           ", a class of the " + std::to_string(v) +
                           " logits: give a label outside [0, V) (default -100, as PyTorch's)");
  }
  FUSEBOX_RETURN_IF_ERROR(check_per_row(ctx, "labels", n, DType::kInt32,
                                        t + " takes labels as int32 classes (set \"dtype\": \"int32\")"));
  ResolvedTensor& labels = ctx.in("labels");
  labels.random_lo = 0;  // random labels are classes
  labels.random_hi = static_cast<double>(v - 1);
  if (!a.backward) {
    FUSEBOX_RETURN_IF_ERROR(finish_per_row(ctx, "loss", n, t));
    if (a.lse) FUSEBOX_RETURN_IF_ERROR(finish_per_row(ctx, "lse", n, t));
    return Status::Ok();
  }
  FUSEBOX_RETURN_IF_ERROR(
      check_per_row(ctx, "lse", n, DType::kFP32, t + " takes lse (the forward's) in fp32"));
  FUSEBOX_RETURN_IF_ERROR(check_per_row(ctx, "dloss", n, DType::kFP32, t + " takes dloss in fp32"));
  // Random lse: a row's log-sum-exp of logits in [-1, 1] lies near log(V); the
  // reference recomputes softmax from whatever lse is given, so any value checks the kernel.
  ctx.in("lse").random_lo = std::log(static_cast<double>(v)) - 0.5;
  ctx.in("lse").random_hi = std::log(static_cast<double>(v)) + 0.5;
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("dlogits", logits.dims, {v, 1, v, v}, ctx.io_dtype));
  const ResolvedTensor& d = ctx.out("dlogits");
  if ((v > 1 && d.strides[1] != 1) || (n > 1 && d.strides[0] < v)) {
    return InvalidArgument(ctx.out_where("dlogits") + " has strides " + dims_string(d.strides) + ": " + t +
                           " writes rows of V contiguous values; lay it out \"nhwc\" (or row-major)");
  }
  return check_dtype_in(ctx.out_where("dlogits"), d.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        t + " writes dlogits in bf16, fp16 or fp32");
}

void canonical(const CrossEntropyAttrs& a, CanonicalWriter& w) {
  w.field("backward", a.backward);
  w.field("lse", a.lse);
  w.field("ignore_index", a.ignore_index);
}
void describe(const CrossEntropyAttrs& a, std::ostream& os) {
  if (a.ignore_index != -100) os << ", ignore_index " << a.ignore_index;
  os << ", fusebox kernel";
}
void resolved_json(const FlopsContext& ctx, const CrossEntropyAttrs& a, nlohmann::ordered_json& j) {
  j["classes"] = ctx.in("logits").dims.at(1);
  j["ignore_index"] = a.ignore_index;
  j["lse"] = a.lse;
  j["native_kernel"] = true;
}
// Per logit: forward a max, a subtract, an exp and an add; backward a subtract,
// an exp and a multiply.
double flops(const FlopsContext& ctx, const CrossEntropyAttrs& a) {
  const double elems = static_cast<double>(ctx.in("logits").element_count());
  return (a.backward ? 3.0 : 4.0) * elems;
}

// ---- gradient rule: cross_entropy -> cross_entropy_bwd from the saved lse;
// labels carry none (traits.h).
Status grad(GradContext& ctx, const CrossEntropyAttrs& a) {
  if (a.backward) return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
  if (!ctx.dy("lse").empty()) return ctx.no_rule("a gradient flows into 'lse'; take only 'loss' as a seed");
  if (!a.lse) return ctx.no_rule("the backward reads the forward's log-sum-exp: declare the output 'lse'");
  if (!ctx.wants("logits") || ctx.dy("loss").empty()) return Status::Ok();
  CrossEntropyAttrs b = a;
  b.backward = true;
  b.lse = false;
  std::map<std::string, std::string> in{{"dloss", ctx.dy("loss")}};
  FUSEBOX_ASSIGN_OR_RETURN(in["logits"], ctx.in("logits"));
  FUSEBOX_ASSIGN_OR_RETURN(in["labels"], ctx.in("labels"));
  FUSEBOX_ASSIGN_OR_RETURN(in["lse"], ctx.out("lse"));
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", b, in));
  return ctx.add_grad("logits", r.at("dlogits"));
}

}  // namespace fusebox::graph_ops
