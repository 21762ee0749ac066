// fusebox op family pointwise (graph layer): add, sub, mul, bias_add, scale
// (binary, numpy-style broadcast over equal ranks), relu, gelu_tanh,
// gelu_erf, silu, sigmoid, tanh (unary) and relu_bwd (dy, x: dy where x > 0). One attrs type, one JSON name
// per mode.
#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;

namespace {
constexpr PointwiseMode kAllModes[] = {
    PointwiseMode::kAdd,         PointwiseMode::kSub,        PointwiseMode::kMul,
    PointwiseMode::kBiasAdd,     PointwiseMode::kScale,      PointwiseMode::kRelu,
    PointwiseMode::kGeluTanh,    PointwiseMode::kGeluErf,    PointwiseMode::kSilu,
    PointwiseMode::kSigmoid,     PointwiseMode::kTanh,       PointwiseMode::kReluBwd,
    PointwiseMode::kGeluTanhBwd, PointwiseMode::kGeluErfBwd, PointwiseMode::kSiluBwd,
    PointwiseMode::kSigmoidBwd,  PointwiseMode::kTanhBwd};
}  // namespace

std::string_view pointwise_mode_name(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
      return "add";
    case PointwiseMode::kSub:
      return "sub";
    case PointwiseMode::kMul:
      return "mul";
    case PointwiseMode::kBiasAdd:
      return "bias_add";
    case PointwiseMode::kScale:
      return "scale";
    case PointwiseMode::kRelu:
      return "relu";
    case PointwiseMode::kGeluTanh:
      return "gelu_tanh";
    case PointwiseMode::kGeluErf:
      return "gelu_erf";
    case PointwiseMode::kSilu:
      return "silu";
    case PointwiseMode::kSigmoid:
      return "sigmoid";
    case PointwiseMode::kTanh:
      return "tanh";
    case PointwiseMode::kReluBwd:
      return "relu_bwd";
    case PointwiseMode::kGeluTanhBwd:
      return "gelu_tanh_bwd";
    case PointwiseMode::kGeluErfBwd:
      return "gelu_erf_bwd";
    case PointwiseMode::kSiluBwd:
      return "silu_bwd";
    case PointwiseMode::kSigmoidBwd:
      return "sigmoid_bwd";
    case PointwiseMode::kTanhBwd:
      return "tanh_bwd";
  }
  return "unknown";
}

std::optional<PointwiseMode> parse_pointwise_mode(std::string_view s) {
  for (PointwiseMode m : kAllModes)
    if (pointwise_mode_name(m) == s) return m;
  return std::nullopt;
}

bool pointwise_is_activation_bwd(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      return true;
    default:
      return false;
  }
}

bool pointwise_is_unary(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
    case PointwiseMode::kBiasAdd:
    case PointwiseMode::kScale:
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      return false;
    case PointwiseMode::kRelu:
    case PointwiseMode::kGeluTanh:
    case PointwiseMode::kGeluErf:
    case PointwiseMode::kSilu:
    case PointwiseMode::kSigmoid:
    case PointwiseMode::kTanh:
      return true;
  }
  return true;
}

namespace graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<PointwiseAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "pointwise", bench_family = "pointwise";
  static constexpr bool accepts_scalar_inputs = true;
};
FUSEBOX_OP_TRAITS(PointwiseAttrs)

std::vector<std::string_view> type_names(std::type_identity<PointwiseAttrs>) {
  std::vector<std::string_view> r;
  for (PointwiseMode m : kAllModes) r.push_back(pointwise_mode_name(m));
  return r;
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<PointwiseAttrs>) {
  if (auto m = parse_pointwise_mode(name)) return OpAttrs{PointwiseAttrs{*m}};
  return std::nullopt;
}
std::string_view type_name(const PointwiseAttrs& a) { return pointwise_mode_name(a.mode); }

std::vector<std::string_view> input_roles(const PointwiseAttrs& a) {
  switch (a.mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
      return {"a", "b"};
    case PointwiseMode::kBiasAdd:
      return {"x", "bias"};
    case PointwiseMode::kScale:
      return {"x", "scale"};
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      return {"dy", "x"};
    default:
      return {"x"};
  }
}
std::vector<std::string_view> output_roles(const PointwiseAttrs&) { return {"y"}; }
Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec&, PointwiseAttrs&) {
  return Status::Ok();
}
void write_json(const PointwiseAttrs&, nlohmann::ordered_json&) {}

namespace {

// Output dims of a binary broadcast; `into_a` requires the result to equal a's dims.
Result<std::vector<int64_t>> broadcast(const std::string& where, const std::string& ra,
                                       const ResolvedTensor& a, const std::string& rb,
                                       const ResolvedTensor& b, bool into_a) {
  if (a.dims.size() != b.dims.size()) {
    return InvalidArgument(where + " input " + squote(rb) + " (" + squote(b.name) + ") has rank " +
                           std::to_string(b.dims.size()) + " " + dims_string(b.dims) + " but input " +
                           squote(ra) + " (" + squote(a.name) + ") has rank " +
                           std::to_string(a.dims.size()) + " " + dims_string(a.dims) +
                           ": pointwise inputs must have equal ranks (write 1 for broadcast dims)");
  }
  std::vector<int64_t> out(a.dims.size());
  for (size_t i = 0; i < a.dims.size(); ++i) {
    int64_t da = a.dims[i], db = b.dims[i];
    bool ok = into_a ? (db == da || db == 1) : (da == db || da == 1 || db == 1);
    if (!ok) {
      if (into_a) {
        return InvalidArgument(where + " input " + squote(rb) + " (" + squote(b.name) + ") " +
                               dims_string(b.dims) + " does not broadcast into input " + squote(ra) + " (" +
                               squote(a.name) + ") " + dims_string(a.dims) + ": dim " + std::to_string(i) +
                               " must be " + std::to_string(da) + " or 1");
      }
      return InvalidArgument(where + " inputs " + squote(ra) + " (" + squote(a.name) + ") " +
                             dims_string(a.dims) + " and " + squote(rb) + " (" + squote(b.name) + ") " +
                             dims_string(b.dims) + " do not broadcast: dim " + std::to_string(i) + " is " +
                             std::to_string(da) + " vs " + std::to_string(db) + " (dims must be equal or 1)");
    }
    out[i] = std::max(da, db);
  }
  return out;
}

}  // namespace

Status infer(const InferContext& ctx, PointwiseAttrs& a) {
  const auto roles = input_roles(a);
  std::vector<int64_t> ydims;
  if (pointwise_is_unary(a.mode)) {
    ydims = ctx.in("x").dims;
  } else {
    const std::string r0(roles[0]), r1(roles[1]);
    const bool into = a.mode == PointwiseMode::kBiasAdd || a.mode == PointwiseMode::kScale ||
                      pointwise_is_activation_bwd(a.mode);
    FUSEBOX_ASSIGN_OR_RETURN(ydims, broadcast(ctx.where, r0, ctx.in(r0), r1, ctx.in(r1), into));
  }
  // A per-tensor scale given as a tensor (an FP8 descale or scale) is an fp32
  // scalar tensor, as cuDNN's FP8 graphs take it.
  if (a.mode == PointwiseMode::kScale) {
    const ResolvedTensor& s = ctx.in("scale");
    if (!s.scalar_value && s.element_count() == 1 && s.dtype != DType::kFP32) {
      return InvalidArgument(
          ctx.in_where("scale") + " is " + std::string(dtype_name(s.dtype)) + " " + dims_string(s.dims) +
          ": a per-tensor scale (FP8 descale or scale) must be an fp32 tensor with every dim 1");
    }
  }
  // strides like the op's first non-scalar input
  std::vector<int64_t> like;
  for (auto role : roles) {
    const auto& t = ctx.in(role);
    if (!t.scalar_value) {
      like = t.strides;
      break;
    }
  }
  return ctx.finish_output("y", ydims, dense_strides_like(ydims, like), ctx.io_dtype);
}

void canonical(const PointwiseAttrs&, CanonicalWriter&) {}  // the mode is the type name
void describe(const PointwiseAttrs&, std::ostream&) {}
void resolved_json(const FlopsContext&, const PointwiseAttrs&, nlohmann::ordered_json&) {
}  // mode = type name

double flops(const FlopsContext& ctx, const PointwiseAttrs&) {
  return static_cast<double>(ctx.out("y").element_count());
}

// ---- gradient rules: one per mode.
Status grad(GradContext& ctx, const PointwiseAttrs& a) {
  const std::string dy = ctx.dy("y");
  auto pass = [&](std::string_view role) { return ctx.wants(role) ? ctx.add_grad(role, dy) : Status::Ok(); };
  // dy * (input `other`), handed to input `role`.
  auto times = [&](std::string_view role, std::string_view other, PointwiseMode mode) -> Status {
    if (!ctx.wants(role)) return Status::Ok();
    FUSEBOX_ASSIGN_OR_RETURN(std::string o, ctx.in(other));
    FUSEBOX_ASSIGN_OR_RETURN(std::string g, ctx.pointwise("d" + std::string(role), mode, dy, o));
    return ctx.add_grad(role, g);
  };
  // f'(x) dy through the activation's backward mode.
  auto activation = [&](PointwiseMode bwd) -> Status {
    if (!ctx.wants("x")) return Status::Ok();
    FUSEBOX_ASSIGN_OR_RETURN(std::string x, ctx.in("x"));
    FUSEBOX_ASSIGN_OR_RETURN(std::string g, ctx.pointwise("dx", bwd, dy, x));
    return ctx.add_grad("x", g);
  };
  switch (a.mode) {
    case PointwiseMode::kAdd:
      FUSEBOX_RETURN_IF_ERROR(pass("a"));
      return pass("b");
    case PointwiseMode::kSub: {
      FUSEBOX_RETURN_IF_ERROR(pass("a"));
      if (!ctx.wants("b")) return Status::Ok();
      FUSEBOX_ASSIGN_OR_RETURN(std::string g,
                               ctx.pointwise("db", PointwiseMode::kScale, dy, ctx.scalar(-1.0)));
      return ctx.add_grad("b", g);
    }
    case PointwiseMode::kMul:
      FUSEBOX_RETURN_IF_ERROR(times("a", "b", PointwiseMode::kMul));
      return times("b", "a", PointwiseMode::kMul);
    case PointwiseMode::kBiasAdd:
      FUSEBOX_RETURN_IF_ERROR(pass("x"));
      return pass("bias");
    case PointwiseMode::kScale:
      FUSEBOX_RETURN_IF_ERROR(times("x", "scale", PointwiseMode::kScale));
      return times("scale", "x", PointwiseMode::kMul);
    case PointwiseMode::kRelu:
      return activation(PointwiseMode::kReluBwd);
    case PointwiseMode::kGeluTanh:
      return activation(PointwiseMode::kGeluTanhBwd);
    case PointwiseMode::kGeluErf:
      return activation(PointwiseMode::kGeluErfBwd);
    case PointwiseMode::kSilu:
      return activation(PointwiseMode::kSiluBwd);
    case PointwiseMode::kSigmoid:
      return activation(PointwiseMode::kSigmoidBwd);
    case PointwiseMode::kTanh:
      return activation(PointwiseMode::kTanhBwd);
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
  }
  return ctx.no_rule("unknown pointwise mode");
}

}  // namespace graph_ops
}  // namespace fusebox
