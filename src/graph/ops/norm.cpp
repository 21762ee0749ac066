// fusebox op family norm (graph layer): layernorm, rmsnorm, layernorm_bwd and
// rmsnorm_bwd (include/fusebox/ops/norm.h has the semantics). x [rows...,
// normalized...] with scale/bias [1..., normalized...]; the training phase also
// writes fp32 statistics [rows..., 1...].
#include <cmath>
#include <sstream>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;

std::string_view norm_phase_name(NormPhase p) { return p == NormPhase::kTraining ? "training" : "inference"; }

int64_t norm_row_dims(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& scale_dims) {
  if (x_dims.size() < 2 || scale_dims.size() != x_dims.size()) return -1;
  for (size_t k = 1; k < x_dims.size(); ++k) {
    bool ok = true;
    for (size_t i = 0; i < x_dims.size() && ok; ++i) ok = scale_dims[i] == (i < k ? 1 : x_dims[i]);
    if (ok) return static_cast<int64_t>(k);
  }
  return -1;
}

namespace graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<LayerNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon"});
};
template <>
struct OpTraits<RmsNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon"});
};
template <>
struct OpTraits<LayerNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};
template <>
struct OpTraits<RmsNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};
FUSEBOX_OP_TRAITS(LayerNormAttrs)
FUSEBOX_OP_TRAITS(RmsNormAttrs)
FUSEBOX_OP_TRAITS(LayerNormBwdAttrs)
FUSEBOX_OP_TRAITS(RmsNormBwdAttrs)

namespace {

// x's dims on the row dims, 1 on the normalized ones.
std::vector<int64_t> stats_dims(const std::vector<int64_t>& x_dims, int64_t row_dims) {
  std::vector<int64_t> d = x_dims;
  for (size_t i = static_cast<size_t>(row_dims); i < d.size(); ++i) d[i] = 1;
  return d;
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

Status parse_epsilon(const JsonReader& r, const nlohmann::json& v, const std::string& path, double& eps) {
  std::optional<double> e;
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "epsilon", e));
  if (e) eps = *e;
  return Status::Ok();
}

Status check_epsilon(const std::string& where, double eps) {
  if (!std::isfinite(eps) || eps < 0) {
    return InvalidArgument(where + " epsilon is " + number(eps) +
                           ": give a finite epsilon >= 0 (added to the variance; default 1e-05)");
  }
  return Status::Ok();
}

// x: rank >= 2, a floating dtype. Returns nothing; the caller reads the dims.
Status check_x(const InferContext& ctx, const char* role, const std::string& type) {
  const ResolvedTensor& x = ctx.in(role);
  if (x.dims.size() < 2) {
    return InvalidArgument(
        ctx.in_where(role) + " has rank " + std::to_string(x.dims.size()) + " " + dims_string(x.dims) + ": " +
        type + " takes x of rank >= 2, [rows..., normalized...] (e.g. [B*S, H, 1, 1] or [B, S, H])");
  }
  return check_dtype_in(ctx.in_where(role), x.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        type + " takes bf16, fp16 or fp32 " + role);
}

// scale (or bias): x's dims with the leading row dims 1, a floating dtype.
// Returns the number of row dims.
Result<int64_t> check_scale(const InferContext& ctx, const char* role, const char* x_role,
                            const std::string& type) {
  const ResolvedTensor& x = ctx.in(x_role);
  const ResolvedTensor& s = ctx.in(role);
  const int64_t k = norm_row_dims(x.dims, s.dims);
  if (k < 0) {
    std::vector<int64_t> example = x.dims;
    example[0] = 1;
    return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(s.dims) + " but '" + x_role +
                           "' (" + squote(x.name) + ") is " + dims_string(x.dims) + ": " + type + "'s " +
                           role +
                           " has x's normalized (trailing) dims and 1 on its row (leading) dims, e.g. " +
                           dims_string(example) + " to normalize over all dims but the first");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where(role), s.dtype,
                                         {DType::kFP32, DType::kBF16, DType::kFP16},
                                         type + " takes an fp32, bf16 or fp16 " + role));
  // Random gains near 1, as trained ones are: y stays on x's scale.
  ctx.in(role).random_lo = 0.5;
  ctx.in(role).random_hi = 1.5;
  return k;
}

// The same row dims for every per-column input (bias like scale).
Status check_like_scale(const InferContext& ctx, const char* role, const std::string& type) {
  const ResolvedTensor& s = ctx.in("scale");
  const ResolvedTensor& t = ctx.in(role);
  if (t.dims != s.dims) {
    return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(t.dims) + " but 'scale' (" +
                           squote(s.name) + ") has " + dims_string(s.dims) + ": " + type + "'s " + role +
                           " must have the scale's dims");
  }
  return check_dtype_in(ctx.in_where(role), t.dtype, {DType::kFP32, DType::kBF16, DType::kFP16},
                        type + " takes an fp32, bf16 or fp16 " + role);
}

// y like x (x's stride order), the io dtype unless declared.
Status finish_like_x(const InferContext& ctx, const char* out_role, const char* x_role,
                     const std::string& type) {
  const ResolvedTensor& x = ctx.in(x_role);
  FUSEBOX_RETURN_IF_ERROR(
      ctx.finish_output(out_role, x.dims, dense_strides_like(x.dims, x.strides), ctx.io_dtype));
  return check_dtype_in(ctx.out_where(out_role), ctx.out(out_role).dtype,
                        {DType::kBF16, DType::kFP16, DType::kFP32},
                        type + " writes " + out_role + " in bf16, fp16 or fp32");
}

// A statistic written by the forward (fp32, in memory).
Status finish_stats(const InferContext& ctx, const char* role, const std::vector<int64_t>& dims,
                    const std::string& type) {
  const ResolvedTensor& x = ctx.in("x");
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output(role, dims, dense_strides_like(dims, x.strides), DType::kFP32));
  const ResolvedTensor& t = ctx.out(role);
  if (t.is_virtual) {
    return InvalidArgument(
        ctx.out_where(role) + " is virtual: " + type +
        " writes its statistics to memory for the backward pass; declare it in 'tensors' as a "
        "graph output (not virtual), or leave it out for the inference phase");
  }
  return check_dtype_in(ctx.out_where(role), t.dtype, {DType::kFP32},
                        type + " writes " + role + " in fp32 only (dims " + dims_string(dims) + ")");
}

std::string phase_hint(NormPhase p, const char* stats) {
  return p == NormPhase::kTraining
             ? std::string(" (training phase: ") + stats + " are written too)"
             : std::string(" (inference phase; naming ") + stats + " selects the training phase)";
}

void resolved_norm_json(const FlopsContext& ctx, const char* x_role, nlohmann::ordered_json& j) {
  const int64_t k = norm_row_dims(ctx.in(x_role).dims, ctx.in("scale").dims);
  std::vector<int64_t> axes;
  for (int64_t i = std::max<int64_t>(k, 1); i < static_cast<int64_t>(ctx.in(x_role).dims.size()); ++i)
    axes.push_back(i);
  j["normalized_dims"] = axes;
}

}  // namespace

// ---------------------------------------------------------------- layernorm

std::vector<std::string_view> type_names(std::type_identity<LayerNormAttrs>) { return {"layernorm"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<LayerNormAttrs>) {
  if (name == "layernorm") return OpAttrs{LayerNormAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const LayerNormAttrs&) { return "layernorm"; }
std::vector<std::string_view> input_roles(const LayerNormAttrs&) { return {"x", "scale", "bias"}; }
std::vector<std::string_view> output_roles(const LayerNormAttrs& a) {
  if (a.phase == NormPhase::kTraining) return {"y", "mean", "inv_variance"};
  return {"y"};
}
// y may feed a pointwise op; the statistics are checked to be in memory (infer).
std::string output_roles_hint(const LayerNormAttrs& a) {
  return phase_hint(a.phase, "'mean' and 'inv_variance'");
}

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                  LayerNormAttrs& a) {
  // Naming a statistic selects the training phase.
  a.phase = op.outputs.count("mean") || op.outputs.count("inv_variance") ? NormPhase::kTraining
                                                                         : NormPhase::kInference;
  return parse_epsilon(r, v, path, a.epsilon);
}
void write_json(const LayerNormAttrs& a, nlohmann::ordered_json& j) { j["epsilon"] = a.epsilon; }

Status infer(const InferContext& ctx, LayerNormAttrs& a) {
  const std::string type = "layernorm";
  FUSEBOX_RETURN_IF_ERROR(check_epsilon(ctx.where, a.epsilon));
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_ASSIGN_OR_RETURN(const int64_t k, check_scale(ctx, "scale", "x", type));
  FUSEBOX_RETURN_IF_ERROR(check_like_scale(ctx, "bias", type));
  FUSEBOX_RETURN_IF_ERROR(finish_like_x(ctx, "y", "x", type));
  if (a.phase == NormPhase::kTraining) {
    const std::vector<int64_t> sd = stats_dims(ctx.in("x").dims, k);
    FUSEBOX_RETURN_IF_ERROR(finish_stats(ctx, "mean", sd, type));
    FUSEBOX_RETURN_IF_ERROR(finish_stats(ctx, "inv_variance", sd, type));
  }
  return Status::Ok();
}

void canonical(const LayerNormAttrs& a, CanonicalWriter& w) {
  w.field("epsilon", a.epsilon);
  w.field("phase", norm_phase_name(a.phase));
}
void describe(const LayerNormAttrs& a, std::ostream& os) {
  os << ", epsilon " << a.epsilon << ", " << norm_phase_name(a.phase);
}
void resolved_json(const FlopsContext& ctx, const LayerNormAttrs& a, nlohmann::ordered_json& j) {
  j["epsilon"] = a.epsilon;
  j["phase"] = std::string(norm_phase_name(a.phase));
  resolved_norm_json(ctx, "x", j);
}
// Per element of x: mean 1, variance 3 (sub, square, add), normalize 2, scale and bias 2.
double flops(const FlopsContext& ctx, const LayerNormAttrs&) {
  return 8.0 * static_cast<double>(ctx.in("x").element_count());
}

// ---------------------------------------------------------------- rmsnorm

std::vector<std::string_view> type_names(std::type_identity<RmsNormAttrs>) { return {"rmsnorm"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<RmsNormAttrs>) {
  if (name == "rmsnorm") return OpAttrs{RmsNormAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const RmsNormAttrs&) { return "rmsnorm"; }
std::vector<std::string_view> input_roles(const RmsNormAttrs& a) {
  if (a.bias) return {"x", "scale", "bias"};
  return {"x", "scale"};
}
std::vector<std::string_view> output_roles(const RmsNormAttrs& a) {
  if (a.phase == NormPhase::kTraining) return {"y", "inv_variance"};
  return {"y"};
}
std::string output_roles_hint(const RmsNormAttrs& a) { return phase_hint(a.phase, "'inv_variance'"); }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                  RmsNormAttrs& a) {
  a.phase = op.outputs.count("inv_variance") ? NormPhase::kTraining : NormPhase::kInference;
  a.bias = op.inputs.count("bias") > 0;  // an optional input
  return parse_epsilon(r, v, path, a.epsilon);
}
void write_json(const RmsNormAttrs& a, nlohmann::ordered_json& j) { j["epsilon"] = a.epsilon; }

Status infer(const InferContext& ctx, RmsNormAttrs& a) {
  const std::string type = "rmsnorm";
  FUSEBOX_RETURN_IF_ERROR(check_epsilon(ctx.where, a.epsilon));
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_ASSIGN_OR_RETURN(const int64_t k, check_scale(ctx, "scale", "x", type));
  if (a.bias) FUSEBOX_RETURN_IF_ERROR(check_like_scale(ctx, "bias", type));
  FUSEBOX_RETURN_IF_ERROR(finish_like_x(ctx, "y", "x", type));
  if (a.phase == NormPhase::kTraining) {
    FUSEBOX_RETURN_IF_ERROR(finish_stats(ctx, "inv_variance", stats_dims(ctx.in("x").dims, k), type));
  }
  return Status::Ok();
}

void canonical(const RmsNormAttrs& a, CanonicalWriter& w) {
  w.field("epsilon", a.epsilon);
  w.field("phase", norm_phase_name(a.phase));
  w.field("bias", a.bias);
}
void describe(const RmsNormAttrs& a, std::ostream& os) {
  os << ", epsilon " << a.epsilon << ", " << norm_phase_name(a.phase) << (a.bias ? ", bias" : "");
}
void resolved_json(const FlopsContext& ctx, const RmsNormAttrs& a, nlohmann::ordered_json& j) {
  j["epsilon"] = a.epsilon;
  j["phase"] = std::string(norm_phase_name(a.phase));
  j["bias"] = a.bias;
  resolved_norm_json(ctx, "x", j);
}
// Per element of x: square and add 2, normalize 1, scale 1 (and bias 1).
double flops(const FlopsContext& ctx, const RmsNormAttrs& a) {
  return (a.bias ? 5.0 : 4.0) * static_cast<double>(ctx.in("x").element_count());
}

// ---------------------------------------------------------------- backward

namespace {

// dy like x; the saved statistics fp32 with the forward's dims. Random
// statistics near those of x in [-1, 1] (mean about 0, mean square 1/3, so
// inv_variance about sqrt(3)): the backward uses them as given, so any values
// give a well-defined, comparable result; these keep it realistic.
Status check_bwd_inputs(const InferContext& ctx, const std::string& type, bool has_mean) {
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "dy", type));
  const ResolvedTensor& x = ctx.in("x");
  const ResolvedTensor& dy = ctx.in("dy");
  if (dy.dims != x.dims) {
    return InvalidArgument(ctx.in_where("dy") + " has dims " + dims_string(dy.dims) + " but 'x' (" +
                           squote(x.name) + ") has " + dims_string(x.dims) + ": " + type +
                           "'s dy is the gradient of y, shaped like x");
  }
  FUSEBOX_ASSIGN_OR_RETURN(const int64_t k, check_scale(ctx, "scale", "x", type));
  const std::vector<int64_t> sd = stats_dims(x.dims, k);
  std::vector<const char*> stats = {"inv_variance"};
  if (has_mean) stats.insert(stats.begin(), "mean");
  for (const char* role : stats) {
    ResolvedTensor& t = ctx.in(role);
    if (t.dims != sd || t.dtype != DType::kFP32) {
      return InvalidArgument(ctx.in_where(role) + " is " + dims_string(t.dims) + " " +
                             std::string(dtype_name(t.dtype)) + ": " + type + " takes the forward's " + role +
                             ", fp32 " + dims_string(sd) + " (x's row dims, 1 on the normalized ones)");
    }
    const bool is_mean = std::string(role) == "mean";
    t.random_lo = is_mean ? -0.05 : 1.6;
    t.random_hi = is_mean ? 0.05 : 1.9;
  }
  return Status::Ok();
}

Status finish_bwd_outputs(const InferContext& ctx, const std::string& type, bool dbias) {
  FUSEBOX_RETURN_IF_ERROR(finish_like_x(ctx, "dx", "x", type));
  const ResolvedTensor& s = ctx.in("scale");
  std::vector<const char*> roles = {"dscale"};
  if (dbias) roles.push_back("dbias");
  for (const char* role : roles) {
    FUSEBOX_RETURN_IF_ERROR(ctx.finish_output(role, s.dims, dense_strides_like(s.dims, s.strides), s.dtype));
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.out_where(role), ctx.out(role).dtype,
                                           {DType::kFP32, DType::kBF16, DType::kFP16},
                                           type + " writes " + role + " in fp32, bf16 or fp16"));
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string_view> type_names(std::type_identity<LayerNormBwdAttrs>) { return {"layernorm_bwd"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<LayerNormBwdAttrs>) {
  if (name == "layernorm_bwd") return OpAttrs{LayerNormBwdAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const LayerNormBwdAttrs&) { return "layernorm_bwd"; }
std::vector<std::string_view> input_roles(const LayerNormBwdAttrs&) {
  return {"dy", "x", "scale", "mean", "inv_variance"};
}
std::vector<std::string_view> output_roles(const LayerNormBwdAttrs&) { return {"dx", "dscale", "dbias"}; }
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec&, LayerNormBwdAttrs&) {
  return Status::Ok();
}
void write_json(const LayerNormBwdAttrs&, nlohmann::ordered_json&) {}
Status infer(const InferContext& ctx, LayerNormBwdAttrs&) {
  FUSEBOX_RETURN_IF_ERROR(check_bwd_inputs(ctx, "layernorm_bwd", /*has_mean=*/true));
  return finish_bwd_outputs(ctx, "layernorm_bwd", /*dbias=*/true);
}
void canonical(const LayerNormBwdAttrs&, CanonicalWriter&) {}
void describe(const LayerNormBwdAttrs&, std::ostream&) {}
void resolved_json(const FlopsContext& ctx, const LayerNormBwdAttrs&, nlohmann::ordered_json& j) {
  resolved_norm_json(ctx, "x", j);
}
// Per element of x: xhat 2, g*dy 1, two row means 3, dx 4, dscale 2, dbias 1, and the rest rounded up.
double flops(const FlopsContext& ctx, const LayerNormBwdAttrs&) {
  return 14.0 * static_cast<double>(ctx.in("x").element_count());
}

std::vector<std::string_view> type_names(std::type_identity<RmsNormBwdAttrs>) { return {"rmsnorm_bwd"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<RmsNormBwdAttrs>) {
  if (name == "rmsnorm_bwd") return OpAttrs{RmsNormBwdAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const RmsNormBwdAttrs&) { return "rmsnorm_bwd"; }
std::vector<std::string_view> input_roles(const RmsNormBwdAttrs&) {
  return {"dy", "x", "scale", "inv_variance"};
}
std::vector<std::string_view> output_roles(const RmsNormBwdAttrs& a) {
  if (a.dbias) return {"dx", "dscale", "dbias"};
  return {"dx", "dscale"};
}
std::string output_roles_hint(const RmsNormBwdAttrs& a) {
  return a.dbias ? " (a 'dbias' output is named: the forward had a bias)"
                 : " ('dbias' is optional: name it when the forward had a bias)";
}
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec& op,
                  RmsNormBwdAttrs& a) {
  a.dbias = op.outputs.count("dbias") > 0;
  return Status::Ok();
}
void write_json(const RmsNormBwdAttrs&, nlohmann::ordered_json&) {}
Status infer(const InferContext& ctx, RmsNormBwdAttrs& a) {
  FUSEBOX_RETURN_IF_ERROR(check_bwd_inputs(ctx, "rmsnorm_bwd", /*has_mean=*/false));
  return finish_bwd_outputs(ctx, "rmsnorm_bwd", a.dbias);
}
void canonical(const RmsNormBwdAttrs& a, CanonicalWriter& w) { w.field("dbias", a.dbias); }
void describe(const RmsNormBwdAttrs& a, std::ostream& os) {
  if (a.dbias) os << ", dbias";
}
void resolved_json(const FlopsContext& ctx, const RmsNormBwdAttrs& a, nlohmann::ordered_json& j) {
  j["dbias"] = a.dbias;
  resolved_norm_json(ctx, "x", j);
}
// Per element of x: layernorm_bwd's less the mean terms.
double flops(const FlopsContext& ctx, const RmsNormBwdAttrs&) {
  return 11.0 * static_cast<double>(ctx.in("x").element_count());
}

// ---- gradient rules: layernorm / rmsnorm in the training phase -> their
// backward ops, from the saved statistics. The statistics carry no gradient.
namespace {
Status norm_stats_take_no_gradient(GradContext& ctx) {
  for (const char* role : {"mean", "inv_variance"})
    if (!ctx.dy(role).empty())
      return ctx.no_rule(std::string("a gradient flows into its statistic '") + role +
                         "'; statistics carry none: take only 'y' as a seed");
  return Status::Ok();
}
}  // namespace

Status grad(GradContext& ctx, const LayerNormAttrs& a) {
  if (a.phase != NormPhase::kTraining)
    return ctx.no_rule(
        "the inference phase saves no statistics: declare the outputs 'mean' and "
        "'inv_variance' (the training phase)");
  FUSEBOX_RETURN_IF_ERROR(norm_stats_take_no_gradient(ctx));
  if (ctx.dy("y").empty()) return Status::Ok();
  std::map<std::string, std::string> in{{"dy", ctx.dy("y")}};
  for (const char* role : {"x", "scale"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.in(role));
  }
  for (const char* role : {"mean", "inv_variance"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.out(role));
  }
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", LayerNormBwdAttrs{}, in));
  return ctx.hand(r, {{"x", "dx"}, {"scale", "dscale"}, {"bias", "dbias"}});
}
Status grad(GradContext& ctx, const RmsNormAttrs& a) {
  if (a.phase != NormPhase::kTraining)
    return ctx.no_rule(
        "the inference phase saves no statistics: declare the output 'inv_variance' "
        "(the training phase)");
  FUSEBOX_RETURN_IF_ERROR(norm_stats_take_no_gradient(ctx));
  if (ctx.dy("y").empty()) return Status::Ok();
  std::map<std::string, std::string> in{{"dy", ctx.dy("y")}};
  for (const char* role : {"x", "scale"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.in(role));
  }
  FUSEBOX_ASSIGN_OR_RETURN(in["inv_variance"], ctx.out("inv_variance"));
  RmsNormBwdAttrs b;
  b.dbias = a.bias;
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", b, in));
  return ctx.hand(r, {{"x", "dx"}, {"scale", "dscale"}, {"bias", "dbias"}});
}
Status grad(GradContext& ctx, const LayerNormBwdAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}
Status grad(GradContext& ctx, const RmsNormBwdAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}

}  // namespace graph_ops
}  // namespace fusebox
