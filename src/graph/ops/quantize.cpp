// fusebox op family quantize (graph layer): x, scale -> y in FP8 [, amax]; the semantics are in
// include/fusebox/ops/quantize.h.
#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<QuantizeAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "quantize", bench_family = "reduction";  // memory-bound
  static constexpr bool accepts_scalar_inputs = true;
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"scale"});
  static constexpr bool native_only = true;
};
FUSEBOX_OP_TRAITS(QuantizeAttrs)

using common::dims_string;

std::vector<std::string_view> type_names(std::type_identity<QuantizeAttrs>) { return {"quantize"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<QuantizeAttrs>) {
  if (name == "quantize") return OpAttrs{QuantizeAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const QuantizeAttrs&) { return "quantize"; }
std::vector<std::string_view> input_roles(const QuantizeAttrs&) { return {"x", "scale"}; }
std::vector<std::string_view> output_roles(const QuantizeAttrs& a) {
  std::vector<std::string_view> r{"y"};
  if (a.amax) r.push_back("amax");
  if (a.y2) r.push_back("y2");
  return r;
}

Status parse_json(const JsonReader&, const nlohmann::json&, const std::string&, OpSpec& op,
                  QuantizeAttrs& a) {
  a.amax = op.outputs.count("amax") > 0;  // optional outputs
  a.y2 = op.outputs.count("y2") > 0;
  return Status::Ok();
}
void write_json(const QuantizeAttrs&, nlohmann::ordered_json&) {}

Status infer(const InferContext& ctx, QuantizeAttrs& a) {
  const ResolvedTensor& x = ctx.in("x");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("x"), x.dtype,
                                         {DType::kBF16, DType::kFP16, DType::kFP32},
                                         "quantize takes x in bf16, fp16 or fp32"));
  if (x.dims.empty()) return InvalidArgument(ctx.in_where("x") + " has no dims: quantize takes a tensor");
  ResolvedTensor& s = ctx.in("scale");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("scale"), s.dtype, {DType::kFP32},
                                         "quantize takes its scale in fp32 (one value)"));
  if (s.element_count() != 1) {
    return InvalidArgument(ctx.in_where("scale") + " has dims " + dims_string(s.dims) +
                           ": quantize takes one scale for the whole tensor (dims [1, ..., 1] or a "
                           "by-value scalar)");
  }
  s.random_lo = 0.5;  // random scales: positive, as delayed scaling makes them
  s.random_hi = 4.0;
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", x.dims, dense_strides_like(x.dims, {}), DType::kFP8E4M3));
  const ResolvedTensor& y = ctx.out("y");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.out_where("y"), y.dtype, {DType::kFP8E4M3, DType::kFP8E5M2},
                                         "quantize writes y in fp8_e4m3 or fp8_e5m2"));
  if (a.y2) {
    FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y2", x.dims, dense_strides_like(x.dims, {}), y.dtype));
    const ResolvedTensor& y2 = ctx.out("y2");
    if (y2.dtype != y.dtype) {
      return InvalidArgument(ctx.out_where("y2") + " is " + std::string(dtype_name(y2.dtype)) + " but y is " +
                             std::string(dtype_name(y.dtype)) +
                             ": y2 is a second copy of y in a layout of its own (omit its dtype)");
    }
  }
  if (a.amax) {
    const std::vector<int64_t> one(x.dims.size(), 1);
    FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("amax", one, one, DType::kFP32));
    const ResolvedTensor& m = ctx.out("amax");
    FUSEBOX_RETURN_IF_ERROR(
        check_dtype_in(ctx.out_where("amax"), m.dtype, {DType::kFP32}, "quantize writes amax in fp32"));
    if (m.element_count() != 1) {
      return InvalidArgument(ctx.out_where("amax") + " has dims " + dims_string(m.dims) +
                             ": quantize's amax is one value, dims " + dims_string(one));
    }
  }
  return Status::Ok();
}

void canonical(const QuantizeAttrs& a, CanonicalWriter& w) {
  w.field("amax", a.amax);
  w.field("y2", a.y2);
}
void describe(const QuantizeAttrs& a, std::ostream& os) {
  if (a.amax) os << ", with amax";
  if (a.y2) os << ", two copies";
  os << ", fusebox kernel";
}
void resolved_json(const FlopsContext&, const QuantizeAttrs& a, nlohmann::ordered_json& j) {
  j["amax"] = a.amax;
  j["y2"] = a.y2;
  j["native_kernel"] = true;
}
// Per element a multiply (and an abs and a max for amax).
double flops(const FlopsContext& ctx, const QuantizeAttrs& a) {
  return (a.amax ? 3.0 : 1.0) * static_cast<double>(ctx.in("x").element_count());
}

// ---- gradient rule: none. FP8 training quantizes the operands of its GEMMs after the backward
// is derived (fusebox/fp8_training.h), and a quantized copy passes no gradient to x.
Status grad(GradContext& ctx, const QuantizeAttrs&) {
  return ctx.no_rule(
      "a quantized copy carries no gradient: declare the forward in bf16 and let FP8 training "
      "(train.fp8) quantize its GEMMs' operands after deriving the backward");
}

}  // namespace fusebox::graph_ops
