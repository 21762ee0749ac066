// fusebox op family conv (graph layer): conv_fprop, with grouped convolution.
//   x [N, C, (D,) H, W], w [K, C/G, (T,) R, S] -> y [N, K, (O,) P, Q]
// G = C / w's dim 1 groups (1: a plain convolution); K must be a multiple of G.
#include <sstream>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

using common::dims_string;

std::vector<std::string_view> type_names(std::type_identity<ConvFpropAttrs>) { return {"conv_fprop"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<ConvFpropAttrs>) {
  if (name == "conv_fprop") return OpAttrs{ConvFpropAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const ConvFpropAttrs&) { return "conv_fprop"; }
std::vector<std::string_view> input_roles(const ConvFpropAttrs&) { return {"x", "w"}; }
std::vector<std::string_view> output_roles(const ConvFpropAttrs&) { return {"y"}; }
std::vector<std::string_view> json_fields(const ConvFpropAttrs&) { return {"padding", "stride", "dilation"}; }
bool accepts_scalar_inputs(const ConvFpropAttrs&) { return false; }
bool outputs_in_memory(const ConvFpropAttrs&) { return false; }
std::string output_roles_hint(const ConvFpropAttrs&) { return ""; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  ConvFpropAttrs& a) {
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "padding", a.padding));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "stride", a.stride));
  return r.opt_int_list(v, path, "dilation", a.dilation);
}

void write_json(const ConvFpropAttrs& a, nlohmann::ordered_json& j) {
  if (!a.padding.empty()) j["padding"] = a.padding;
  if (!a.stride.empty()) j["stride"] = a.stride;
  if (!a.dilation.empty()) j["dilation"] = a.dilation;
}

Status infer(const InferContext& ctx, ConvFpropAttrs& attrs) {
  const std::string& where = ctx.where;
  const ResolvedTensor& x = ctx.in("x");
  const ResolvedTensor& w = ctx.in("w");
  const size_t rank = x.dims.size();
  if (rank != 4 && rank != 5) {
    return InvalidArgument(ctx.in_where("x") + " has rank " + std::to_string(rank) + " " + dims_string(x.dims) +
                           ": conv_fprop takes [N,C,H,W] or [N,C,D,H,W]");
  }
  if (w.dims.size() != rank) {
    return InvalidArgument(ctx.in_where("w") + " has rank " + std::to_string(w.dims.size()) + " " +
                           dims_string(w.dims) + " but input 'x' (" + squote(x.name) + ") has rank " +
                           std::to_string(rank) + ": the filter must be [K,C,R,S] (or [K,C,T,R,S]) matching x");
  }
  // Grouped convolution: w holds C/G input channels per filter.
  if (x.dims[1] % w.dims[1] != 0) {
    return InvalidArgument(ctx.in_where("w") + " has C=" + std::to_string(w.dims[1]) + " but input 'x' (" +
                           squote(x.name) + ") has C=" + std::to_string(x.dims[1]) +
                           ": the filter's dim 1 must equal x's channels, or divide them (grouped convolution: "
                           "C/groups)");
  }
  const int64_t groups = x.dims[1] / w.dims[1];
  if (w.dims[0] % groups != 0) {
    return InvalidArgument(ctx.in_where("w") + " has K=" + std::to_string(w.dims[0]) + " output channels but " +
                           std::to_string(groups) + " groups (x's C=" + std::to_string(x.dims[1]) +
                           " / w's C=" + std::to_string(w.dims[1]) +
                           "): K must be a multiple of the group count");
  }
  const size_t sp = rank - 2;
  struct Field {
    const char* name;
    std::vector<int64_t>* v;
    int64_t def;
    int64_t min;
  };
  for (Field f : {Field{"padding", &attrs.padding, 0, 0}, Field{"stride", &attrs.stride, 1, 1},
                  Field{"dilation", &attrs.dilation, 1, 1}}) {
    if (f.v->empty()) f.v->assign(sp, f.def);
    if (f.v->size() != sp) {
      return InvalidArgument(where + " " + f.name + " " + dims_string(*f.v) + " has " + std::to_string(f.v->size()) +
                             " values but the convolution has " + std::to_string(sp) +
                             " spatial dims: give one per spatial dim (or none for the default " +
                             std::to_string(f.def) + ")");
    }
    for (size_t i = 0; i < sp; ++i) {
      int64_t v = (*f.v)[i];
      if (v < f.min || v > kMaxDim) {
        return InvalidArgument(where + " " + f.name + "[" + std::to_string(i) + "] is " + std::to_string(v) + ": " +
                               f.name + " must be in [" + std::to_string(f.min) + ", 2147483647]");
      }
    }
  }
  std::vector<int64_t> out{x.dims[0], w.dims[0]};
  for (size_t i = 0; i < sp; ++i) {
    int64_t in = x.dims[2 + i], f = w.dims[2 + i];
    int64_t p = attrs.padding[i], s = attrs.stride[i], d = attrs.dilation[i];
    int64_t num = in + 2 * p - d * (f - 1) - 1;  // all terms < 2^33: no overflow
    if (num < 0) {
      return InvalidArgument(where + " spatial dim " + std::to_string(i) +
                             ": output size (in + 2*pad - dil*(f-1) - 1)/stride + 1 = (" + std::to_string(in) +
                             " + 2*" + std::to_string(p) + " - " + std::to_string(d) + "*(" + std::to_string(f) +
                             "-1) - 1)/" + std::to_string(s) + " + 1 is < 1: the dilated filter of 'w' (" +
                             squote(w.name) + ") is larger than the padded input 'x' (" + squote(x.name) + ")");
    }
    out.push_back(num / s + 1);
  }
  return ctx.finish_output("y", out, dense_strides_like(out, x.strides), ctx.io_dtype);
}

void canonical(const ConvFpropAttrs& a, CanonicalWriter& w) {
  w.field("padding", a.padding);
  w.field("stride", a.stride);
  w.field("dilation", a.dilation);
}

void describe(const ConvFpropAttrs& a, std::ostream& os) {
  os << ", padding " << dims_string(a.padding) << ", stride " << dims_string(a.stride) << ", dilation "
     << dims_string(a.dilation);
}

void resolved_json(const FlopsContext&, const ConvFpropAttrs& a, nlohmann::ordered_json& j) {
  j["padding"] = a.padding;
  j["stride"] = a.stride;
  j["dilation"] = a.dilation;
}

double flops(const FlopsContext& ctx, const ConvFpropAttrs&) {
  const ResolvedTensor& w = ctx.in("w");
  double macs = static_cast<double>(ctx.out("y").element_count());  // N*K*P*Q(*O)
  for (size_t d = 1; d < w.dims.size(); ++d) macs *= static_cast<double>(w.dims[d]);  // C/G*R*S
  return 2 * macs;
}

}  // namespace fusebox::graph_ops
