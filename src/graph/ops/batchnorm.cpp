// fusebox op family batchnorm (graph layer): batchnorm (training forward),
// batchnorm_inference and batchnorm_bwd (include/fusebox/ops/batchnorm.h has
// the semantics). x [N, C, (D,) H, W]; every per-channel tensor [1, C, 1, 1].
#include <cmath>
#include <sstream>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<BatchNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon", "momentum"});
};
template <>
struct OpTraits<BatchNormInferenceAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
};
template <>
struct OpTraits<BatchNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};
FUSEBOX_OP_TRAITS(BatchNormAttrs)
FUSEBOX_OP_TRAITS(BatchNormInferenceAttrs)
FUSEBOX_OP_TRAITS(BatchNormBwdAttrs)

using common::dims_string;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// [1, C, 1, 1] (or rank 5) for x's dims.
std::vector<int64_t> channel_dims(const std::vector<int64_t>& xd) {
  std::vector<int64_t> d(xd.size(), 1);
  d[1] = xd[1];
  return d;
}

// x (or dy): rank 4 or 5, a floating dtype.
Status check_x(const InferContext& ctx, const char* role, const std::string& type) {
  const ResolvedTensor& x = ctx.in(role);
  if (x.dims.size() != 4 && x.dims.size() != 5) {
    return InvalidArgument(ctx.in_where(role) + " has rank " + str(static_cast<int64_t>(x.dims.size())) +
                           " " + dims_string(x.dims) + ": " + type + " takes " + role +
                           " [N, C, H, W] or [N, C, D, H, W], normalized per channel C");
  }
  if (x.element_count() / std::max<int64_t>(x.dims[1], 1) < 2 && type == "batchnorm") {
    return InvalidArgument(ctx.in_where(role) + " is " + dims_string(x.dims) + ": " + type +
                           " needs at least 2 elements per channel (N*H*W >= 2) for the unbiased running "
                           "variance");
  }
  return check_dtype_in(ctx.in_where(role), x.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        type + " takes bf16, fp16 or fp32 " + role);
}

// A per-channel input: [1, C, 1, 1] with x's C; `stats` ones are fp32.
Status check_channel_input(const InferContext& ctx, const char* role, const std::string& type, bool stats,
                           double lo, double hi) {
  const ResolvedTensor& x = ctx.in("x");
  ResolvedTensor& t = ctx.in(role);
  const std::vector<int64_t> cd = channel_dims(x.dims);
  if (t.dims != cd) {
    return InvalidArgument(ctx.in_where(role) + " has dims " + dims_string(t.dims) + " but 'x' (" +
                           squote(x.name) + ") is " + dims_string(x.dims) + " (C=" + str(x.dims[1]) + "): " +
                           type + "'s " + role + " has one value per channel, dims " + dims_string(cd));
  }
  if (stats) {
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where(role), t.dtype, {DType::kFP32},
                                           type + " takes its " + role + " in fp32 only"));
  } else {
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where(role), t.dtype,
                                           {DType::kFP32, DType::kBF16, DType::kFP16},
                                           type + " takes an fp32, bf16 or fp16 " + role));
  }
  t.random_lo = lo;
  t.random_hi = hi;
  return Status::Ok();
}

// y (or dx) like x, the io dtype unless declared.
Status finish_like_x(const InferContext& ctx, const char* out_role, const std::string& type) {
  const ResolvedTensor& x = ctx.in("x");
  FUSEBOX_RETURN_IF_ERROR(
      ctx.finish_output(out_role, x.dims, dense_strides_like(x.dims, x.strides), ctx.io_dtype));
  return check_dtype_in(ctx.out_where(out_role), ctx.out(out_role).dtype,
                        {DType::kBF16, DType::kFP16, DType::kFP32},
                        type + " writes " + out_role + " in bf16, fp16 or fp32");
}

// A per-channel output in memory: fp32 statistics, or the gradients of
// scale and bias (scale's dtype unless declared).
Status finish_channel_output(const InferContext& ctx, const char* role, const std::string& type, bool stats) {
  const ResolvedTensor& x = ctx.in("x");
  const std::vector<int64_t> cd = channel_dims(x.dims);
  const DType dflt = stats ? DType::kFP32 : ctx.in("scale").dtype;
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output(role, cd, dense_strides_like(cd, x.strides), dflt));
  const ResolvedTensor& t = ctx.out(role);
  if (t.is_virtual) {
    return InvalidArgument(ctx.out_where(role) + " is virtual: " + type + " writes its " + role +
                           " to memory; declare it in 'tensors' as a graph output (not virtual)");
  }
  if (stats) {
    return check_dtype_in(ctx.out_where(role), t.dtype, {DType::kFP32},
                          type + " writes " + role + " in fp32 only (dims " + dims_string(cd) + ")");
  }
  return check_dtype_in(ctx.out_where(role), t.dtype, {DType::kFP32, DType::kBF16, DType::kFP16},
                        type + " writes " + role + " in fp32, bf16 or fp16");
}

// Scale near 1 and bias near 0, as trained ones are; saved statistics near
// those of x in [-1, 1] (mean about 0, variance 1/3: inv_variance about 1.7).
constexpr double kScaleLo = 0.5, kScaleHi = 1.5;
constexpr double kBiasLo = -0.5, kBiasHi = 0.5;
constexpr double kMeanLo = -0.05, kMeanHi = 0.05;
constexpr double kInvVarLo = 1.6, kInvVarHi = 1.9;

void channel_json(const FlopsContext& ctx, nlohmann::ordered_json& j) {
  const auto& xd = ctx.in("x").dims;
  std::vector<int64_t> axes = {0};
  for (int64_t i = 2; i < static_cast<int64_t>(xd.size()); ++i) axes.push_back(i);
  j["normalized_dims"] = axes;  // the dims each channel's statistics run over
}

}  // namespace

// ---------------------------------------------------------------- batchnorm (training)

std::vector<std::string_view> type_names(std::type_identity<BatchNormAttrs>) { return {"batchnorm"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<BatchNormAttrs>) {
  if (name == "batchnorm") return OpAttrs{BatchNormAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const BatchNormAttrs&) { return "batchnorm"; }
std::vector<std::string_view> input_roles(const BatchNormAttrs&) {
  return {"x", "scale", "bias", "running_mean", "running_var"};
}
std::vector<std::string_view> output_roles(const BatchNormAttrs&) {
  return {"y", "mean", "inv_variance", "next_running_mean", "next_running_var"};
}
// y may feed a pointwise op (a ReLU); the statistics are checked to be in memory (infer).
std::string output_roles_hint(const BatchNormAttrs&) {
  return " (the training forward writes the saved statistics and the updated running statistics; "
         "batchnorm_inference normalizes with given statistics)";
}

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  BatchNormAttrs& a) {
  std::optional<double> e, m;
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "epsilon", e));
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "momentum", m));
  if (e) a.epsilon = *e;
  if (m) a.momentum = *m;
  return Status::Ok();
}
void write_json(const BatchNormAttrs& a, nlohmann::ordered_json& j) {
  j["epsilon"] = a.epsilon;
  j["momentum"] = a.momentum;
}

Status infer(const InferContext& ctx, BatchNormAttrs& a) {
  const std::string type = "batchnorm";
  if (!std::isfinite(a.epsilon) || a.epsilon < 0) {
    return InvalidArgument(ctx.where + " epsilon is " + number(a.epsilon) +
                           ": give a finite epsilon >= 0 (added to the variance; default 1e-05)");
  }
  if (!std::isfinite(a.momentum) || a.momentum < 0 || a.momentum > 1) {
    return InvalidArgument(ctx.where + " momentum is " + number(a.momentum) +
                           ": give a momentum in [0, 1] (the batch statistics' weight in the running "
                           "statistics; default 0.1)");
  }
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "scale", type, false, kScaleLo, kScaleHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "bias", type, false, kBiasLo, kBiasHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "running_mean", type, true, -0.5, 0.5));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "running_var", type, true, 0.5, 1.5));
  FUSEBOX_RETURN_IF_ERROR(finish_like_x(ctx, "y", type));
  for (const char* role : {"mean", "inv_variance", "next_running_mean", "next_running_var"})
    FUSEBOX_RETURN_IF_ERROR(finish_channel_output(ctx, role, type, /*stats=*/true));
  return Status::Ok();
}

void canonical(const BatchNormAttrs& a, CanonicalWriter& w) {
  w.field("epsilon", a.epsilon);
  w.field("momentum", a.momentum);
}
void describe(const BatchNormAttrs& a, std::ostream& os) {
  os << ", epsilon " << a.epsilon << ", momentum " << a.momentum << ", training";
}
void resolved_json(const FlopsContext& ctx, const BatchNormAttrs& a, nlohmann::ordered_json& j) {
  j["epsilon"] = a.epsilon;
  j["momentum"] = a.momentum;
  channel_json(ctx, j);
}
// Per element of x: mean 1, variance 3, normalize 2, scale and bias 2 (the
// per-channel running statistics are negligible).
double flops(const FlopsContext& ctx, const BatchNormAttrs&) {
  return 8.0 * static_cast<double>(ctx.in("x").element_count());
}

// ---------------------------------------------------------------- batchnorm_inference

std::vector<std::string_view> type_names(std::type_identity<BatchNormInferenceAttrs>) {
  return {"batchnorm_inference"};
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<BatchNormInferenceAttrs>) {
  if (name == "batchnorm_inference") return OpAttrs{BatchNormInferenceAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const BatchNormInferenceAttrs&) { return "batchnorm_inference"; }
std::vector<std::string_view> input_roles(const BatchNormInferenceAttrs&) {
  return {"x", "scale", "bias", "mean", "inv_variance"};
}
std::vector<std::string_view> output_roles(const BatchNormInferenceAttrs&) { return {"y"}; }
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec&,
                  BatchNormInferenceAttrs&) {
  return Status::Ok();
}
void write_json(const BatchNormInferenceAttrs&, nlohmann::ordered_json&) {}
Status infer(const InferContext& ctx, BatchNormInferenceAttrs&) {
  const std::string type = "batchnorm_inference";
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "scale", type, false, kScaleLo, kScaleHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "bias", type, false, kBiasLo, kBiasHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "mean", type, true, kMeanLo, kMeanHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "inv_variance", type, true, kInvVarLo, kInvVarHi));
  return finish_like_x(ctx, "y", type);
}
void canonical(const BatchNormInferenceAttrs&, CanonicalWriter&) {}
void describe(const BatchNormInferenceAttrs&, std::ostream&) {}
void resolved_json(const FlopsContext& ctx, const BatchNormInferenceAttrs&, nlohmann::ordered_json& j) {
  channel_json(ctx, j);
}
// Per element of x: subtract, two multiplies, add.
double flops(const FlopsContext& ctx, const BatchNormInferenceAttrs&) {
  return 4.0 * static_cast<double>(ctx.in("x").element_count());
}

// ---------------------------------------------------------------- batchnorm_bwd

std::vector<std::string_view> type_names(std::type_identity<BatchNormBwdAttrs>) { return {"batchnorm_bwd"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<BatchNormBwdAttrs>) {
  if (name == "batchnorm_bwd") return OpAttrs{BatchNormBwdAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const BatchNormBwdAttrs&) { return "batchnorm_bwd"; }
std::vector<std::string_view> input_roles(const BatchNormBwdAttrs&) {
  return {"dy", "x", "scale", "mean", "inv_variance"};
}
std::vector<std::string_view> output_roles(const BatchNormBwdAttrs&) { return {"dx", "dscale", "dbias"}; }
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec&, BatchNormBwdAttrs&) {
  return Status::Ok();
}
void write_json(const BatchNormBwdAttrs&, nlohmann::ordered_json&) {}
Status infer(const InferContext& ctx, BatchNormBwdAttrs&) {
  const std::string type = "batchnorm_bwd";
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "x", type));
  FUSEBOX_RETURN_IF_ERROR(check_x(ctx, "dy", type));
  const ResolvedTensor& x = ctx.in("x");
  const ResolvedTensor& dy = ctx.in("dy");
  if (dy.dims != x.dims) {
    return InvalidArgument(ctx.in_where("dy") + " has dims " + dims_string(dy.dims) + " but 'x' (" +
                           squote(x.name) + ") has " + dims_string(x.dims) + ": " + type +
                           "'s dy is the gradient of y, shaped like x");
  }
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "scale", type, false, kScaleLo, kScaleHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "mean", type, true, kMeanLo, kMeanHi));
  FUSEBOX_RETURN_IF_ERROR(check_channel_input(ctx, "inv_variance", type, true, kInvVarLo, kInvVarHi));
  FUSEBOX_RETURN_IF_ERROR(finish_like_x(ctx, "dx", type));
  FUSEBOX_RETURN_IF_ERROR(finish_channel_output(ctx, "dscale", type, /*stats=*/false));
  return finish_channel_output(ctx, "dbias", type, /*stats=*/false);
}
void canonical(const BatchNormBwdAttrs&, CanonicalWriter&) {}
void describe(const BatchNormBwdAttrs&, std::ostream&) {}
void resolved_json(const FlopsContext& ctx, const BatchNormBwdAttrs&, nlohmann::ordered_json& j) {
  channel_json(ctx, j);
}
// Per element of x: xhat 2, the two channel sums 3, dx 5.
double flops(const FlopsContext& ctx, const BatchNormBwdAttrs&) {
  return 10.0 * static_cast<double>(ctx.in("x").element_count());
}

// ---- gradient rules: batchnorm (training) -> batchnorm_bwd from its saved
// statistics; inference and the backward op have none.
Status grad(GradContext& ctx, const BatchNormAttrs&) {
  for (const char* role : {"mean", "inv_variance", "next_running_mean", "next_running_var"})
    if (!ctx.dy(role).empty())
      return ctx.no_rule(std::string("a gradient flows into its statistic '") + role +
                         "'; statistics carry none: take only 'y' as a seed");
  if (ctx.wants("running_mean") || ctx.wants("running_var"))
    return ctx.no_rule("the running statistics get no gradient: leave them out of wrt");
  if (ctx.dy("y").empty()) return Status::Ok();
  std::map<std::string, std::string> in{{"dy", ctx.dy("y")}};
  for (const char* role : {"x", "scale"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.in(role));
  }
  for (const char* role : {"mean", "inv_variance"}) {
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.out(role));
  }
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", BatchNormBwdAttrs{}, in));
  return ctx.hand(r, {{"x", "dx"}, {"scale", "dscale"}, {"bias", "dbias"}});
}
Status grad(GradContext& ctx, const BatchNormInferenceAttrs&) {
  return ctx.no_rule("batchnorm_inference is for inference: train with batchnorm (its training phase)");
}
Status grad(GradContext& ctx, const BatchNormBwdAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}

}  // namespace fusebox::graph_ops
