// fusebox op family conv (graph layer): conv_fprop, conv_dgrad and conv_wgrad,
// with grouped convolution. The forward convolution they share:
//   x [N, C, (D,) H, W], w [K, C/G, (T,) R, S] -> y [N, K, (O,) P, Q]
// G = C / w's dim 1 groups (1: a plain convolution); K must be a multiple of G.
//   conv_fprop: x, w  -> y
//   conv_dgrad: dy, w -> dx   (dx's dims given by the attribute x_dims)
//   conv_wgrad: dy, x -> dw   (dw's dims given by the attribute w_dims)
#include <sstream>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<ConvFpropAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv";
  static constexpr auto json_fields = std::to_array<std::string_view>({"padding", "stride", "dilation"});
};
template <>
struct OpTraits<ConvDgradAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv_bwd";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"padding", "stride", "dilation", "x_dims"});
};
template <>
struct OpTraits<ConvWgradAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv_bwd";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"padding", "stride", "dilation", "w_dims"});
};
FUSEBOX_OP_TRAITS(ConvFpropAttrs)
FUSEBOX_OP_TRAITS(ConvDgradAttrs)
FUSEBOX_OP_TRAITS(ConvWgradAttrs)

using common::dims_string;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Rank 4 or 5, for a tensor (or attribute) described by `what`.
Status check_conv_rank(const std::string& what, const std::vector<int64_t>& dims, const char* op,
                       const char* expected) {
  if (dims.size() == 4 || dims.size() == 5) return Status::Ok();
  return InvalidArgument(what + " has rank " + str(static_cast<int64_t>(dims.size())) + " " +
                         dims_string(dims) + ": " + op + " takes " + expected);
}

// padding, stride, dilation: defaults applied, one per spatial dim, in range.
Status resolve_geometry(const std::string& where, size_t sp, std::vector<int64_t>& padding,
                        std::vector<int64_t>& stride, std::vector<int64_t>& dilation) {
  struct Field {
    const char* name;
    std::vector<int64_t>* v;
    int64_t def;
    int64_t min;
  };
  for (Field f : {Field{"padding", &padding, 0, 0}, Field{"stride", &stride, 1, 1},
                  Field{"dilation", &dilation, 1, 1}}) {
    if (f.v->empty()) f.v->assign(sp, f.def);
    if (f.v->size() != sp) {
      return InvalidArgument(where + " " + f.name + " " + dims_string(*f.v) + " has " + str(f.v->size()) +
                             " values but the convolution has " + str(sp) +
                             " spatial dims: give one per spatial dim (or none for the default " +
                             str(f.def) + ")");
    }
    for (size_t i = 0; i < sp; ++i) {
      int64_t v = (*f.v)[i];
      if (v < f.min || v > kMaxDim) {
        return InvalidArgument(where + " " + f.name + "[" + str(i) + "] is " + str(v) + ": " + f.name +
                               " must be in [" + str(f.min) + ", 2147483647]");
      }
    }
  }
  return Status::Ok();
}

// Channel rules between x's dims (`x_what`) and w's (`w_what`): w's dim 1
// divides C (G = C / w.C groups) and K is a multiple of G.
Status check_groups(const std::string& x_what, const std::vector<int64_t>& xd, const std::string& w_what,
                    const std::vector<int64_t>& wd) {
  if (xd[1] % wd[1] != 0) {
    return InvalidArgument(
        w_what + " has C=" + str(wd[1]) + " but " + x_what + " has C=" + str(xd[1]) +
        ": the filter's dim 1 must equal x's channels, or divide them (grouped convolution: "
        "C/groups)");
  }
  const int64_t groups = xd[1] / wd[1];
  if (wd[0] % groups != 0) {
    return InvalidArgument(w_what + " has K=" + str(wd[0]) + " output channels but " + str(groups) +
                           " groups (" + x_what + " C=" + str(xd[1]) + " / w's C=" + str(wd[1]) +
                           "): K must be a multiple of the group count");
  }
  return Status::Ok();
}

// The forward output dims [N, K, out...] of x (dims `xd`) convolved with w
// (`wd`); an error when the dilated filter is larger than the padded input.
Result<std::vector<int64_t>> forward_dims(const std::string& where, const std::string& x_what,
                                          const std::vector<int64_t>& xd, const std::string& w_what,
                                          const std::vector<int64_t>& wd, const std::vector<int64_t>& padding,
                                          const std::vector<int64_t>& stride,
                                          const std::vector<int64_t>& dilation) {
  std::vector<int64_t> out{xd[0], wd[0]};
  for (size_t i = 0; i + 2 < xd.size(); ++i) {
    int64_t in = xd[2 + i], f = wd[2 + i];
    int64_t p = padding[i], s = stride[i], d = dilation[i];
    int64_t num = in + 2 * p - d * (f - 1) - 1;  // all terms < 2^33: no overflow
    if (num < 0) {
      return InvalidArgument(
          where + " spatial dim " + str(i) + ": output size (in + 2*pad - dil*(f-1) - 1)/stride + 1 = (" +
          str(in) + " + 2*" + str(p) + " - " + str(d) + "*(" + str(f) + "-1) - 1)/" + str(s) +
          " + 1 is < 1: the dilated filter of " + w_what + " is larger than the padded " + x_what);
    }
    out.push_back(num / s + 1);
  }
  return out;
}

// A dims attribute (x_dims, w_dims): required, the op's rank, dims in range.
Status check_dims_attr(const std::string& where, const char* name, const std::vector<int64_t>& v, size_t rank,
                       const std::string& what) {
  if (v.empty()) {
    return InvalidArgument(where + " needs '" + name + "': " + what);
  }
  if (v.size() != rank) {
    return InvalidArgument(where + " " + name + " " + dims_string(v) + " has " + str(v.size()) +
                           " values but input 'dy' has rank " + str(rank) + ": give " + what);
  }
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 1 || v[i] > kMaxDim) {
      return InvalidArgument(where + " " + name + "[" + str(i) + "] is " + str(v[i]) +
                             ": dims must be in [1, 2147483647]");
    }
  }
  return Status::Ok();
}

// dy must have the forward output's dims.
Status check_dy(const InferContext& ctx, const std::vector<int64_t>& y, const std::string& forward) {
  const ResolvedTensor& dy = ctx.in("dy");
  if (dy.dims == y) return Status::Ok();
  return InvalidArgument(ctx.in_where("dy") + " has dims " + dims_string(dy.dims) + " but " + forward +
                         " gives y dims " + dims_string(y) + ": dy must have the forward output's dims");
}

std::string geometry_string(const std::vector<int64_t>& padding, const std::vector<int64_t>& stride,
                            const std::vector<int64_t>& dilation) {
  return "padding " + dims_string(padding) + ", stride " + dims_string(stride) + ", dilation " +
         dims_string(dilation);
}

template <typename A>
Status parse_geometry(const JsonReader& r, const nlohmann::json& v, const std::string& path, A& a) {
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "padding", a.padding));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "stride", a.stride));
  return r.opt_int_list(v, path, "dilation", a.dilation);
}

template <typename A>
void write_geometry(const A& a, nlohmann::ordered_json& j) {
  if (!a.padding.empty()) j["padding"] = a.padding;
  if (!a.stride.empty()) j["stride"] = a.stride;
  if (!a.dilation.empty()) j["dilation"] = a.dilation;
}

template <typename A>
void canonical_geometry(const A& a, CanonicalWriter& w) {
  w.field("padding", a.padding);
  w.field("stride", a.stride);
  w.field("dilation", a.dilation);
}

template <typename A>
void describe_geometry(const A& a, std::ostream& os) {
  os << ", " << geometry_string(a.padding, a.stride, a.dilation);
}

template <typename A>
void json_geometry(const A& a, nlohmann::ordered_json& j) {
  j["padding"] = a.padding;
  j["stride"] = a.stride;
  j["dilation"] = a.dilation;
}

// 2 * N*K*(O)*P*Q * C/G*(T)*R*S: the same multiply-adds in all three ops.
double conv_flops(const std::vector<int64_t>& y_dims, const std::vector<int64_t>& w_dims) {
  double macs = 1;
  for (int64_t d : y_dims) macs *= static_cast<double>(d);
  for (size_t d = 1; d < w_dims.size(); ++d) macs *= static_cast<double>(w_dims[d]);
  return 2 * macs;
}

const char* kXDimsHelp =
    "the forward input's dims [N, C, H, W] (or [N, C, D, H, W]), which are dx's: with stride > 1 several "
    "input sizes give the same dy, and dy and w do not give the group count";
const char* kWDimsHelp =
    "the filter's dims [K, C/groups, R, S] (or [K, C/groups, T, R, S]), which are dw's: with stride > 1 "
    "several filter sizes give the same dy, and dy and x do not give the group count";

}  // namespace

// ---------------------------------------------------------------- conv_fprop

std::vector<std::string_view> type_names(std::type_identity<ConvFpropAttrs>) { return {"conv_fprop"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<ConvFpropAttrs>) {
  if (name == "conv_fprop") return OpAttrs{ConvFpropAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const ConvFpropAttrs&) { return "conv_fprop"; }
std::vector<std::string_view> input_roles(const ConvFpropAttrs&) { return {"x", "w"}; }
std::vector<std::string_view> output_roles(const ConvFpropAttrs&) { return {"y"}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  ConvFpropAttrs& a) {
  return parse_geometry(r, v, path, a);
}

void write_json(const ConvFpropAttrs& a, nlohmann::ordered_json& j) { write_geometry(a, j); }

Status infer(const InferContext& ctx, ConvFpropAttrs& attrs) {
  const ResolvedTensor& x = ctx.in("x");
  const ResolvedTensor& w = ctx.in("w");
  const size_t rank = x.dims.size();
  FUSEBOX_RETURN_IF_ERROR(
      check_conv_rank(ctx.in_where("x"), x.dims, "conv_fprop", "[N,C,H,W] or [N,C,D,H,W]"));
  if (w.dims.size() != rank) {
    return InvalidArgument(ctx.in_where("w") + " has rank " + str(w.dims.size()) + " " + dims_string(w.dims) +
                           " but input 'x' (" + squote(x.name) + ") has rank " + str(rank) +
                           ": the filter must be [K,C,R,S] (or [K,C,T,R,S]) matching x");
  }
  const std::string x_what = "input 'x' (" + squote(x.name) + ")";
  FUSEBOX_RETURN_IF_ERROR(check_groups(x_what, x.dims, ctx.in_where("w"), w.dims));
  FUSEBOX_RETURN_IF_ERROR(resolve_geometry(ctx.where, rank - 2, attrs.padding, attrs.stride, attrs.dilation));
  FUSEBOX_ASSIGN_OR_RETURN(auto out, forward_dims(ctx.where, x_what, x.dims, "'w' (" + squote(w.name) + ")",
                                                  w.dims, attrs.padding, attrs.stride, attrs.dilation));
  return ctx.finish_output("y", out, dense_strides_like(out, x.strides), ctx.io_dtype);
}

void canonical(const ConvFpropAttrs& a, CanonicalWriter& w) { canonical_geometry(a, w); }
void describe(const ConvFpropAttrs& a, std::ostream& os) { describe_geometry(a, os); }
void resolved_json(const FlopsContext&, const ConvFpropAttrs& a, nlohmann::ordered_json& j) {
  json_geometry(a, j);
}

double flops(const FlopsContext& ctx, const ConvFpropAttrs&) {
  return conv_flops(ctx.out("y").dims, ctx.in("w").dims);
}

// ---------------------------------------------------------------- conv_dgrad

std::vector<std::string_view> type_names(std::type_identity<ConvDgradAttrs>) { return {"conv_dgrad"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<ConvDgradAttrs>) {
  if (name == "conv_dgrad") return OpAttrs{ConvDgradAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const ConvDgradAttrs&) { return "conv_dgrad"; }
std::vector<std::string_view> input_roles(const ConvDgradAttrs&) { return {"dy", "w"}; }
std::vector<std::string_view> output_roles(const ConvDgradAttrs&) { return {"dx"}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  ConvDgradAttrs& a) {
  FUSEBOX_RETURN_IF_ERROR(parse_geometry(r, v, path, a));
  return r.opt_int_list(v, path, "x_dims", a.x_dims);
}

void write_json(const ConvDgradAttrs& a, nlohmann::ordered_json& j) {
  write_geometry(a, j);
  if (!a.x_dims.empty()) j["x_dims"] = a.x_dims;
}

Status infer(const InferContext& ctx, ConvDgradAttrs& attrs) {
  const ResolvedTensor& dy = ctx.in("dy");
  const ResolvedTensor& w = ctx.in("w");
  const size_t rank = dy.dims.size();
  FUSEBOX_RETURN_IF_ERROR(
      check_conv_rank(ctx.in_where("dy"), dy.dims, "conv_dgrad", "dy [N,K,P,Q] or [N,K,O,P,Q]"));
  if (w.dims.size() != rank) {
    return InvalidArgument(ctx.in_where("w") + " has rank " + str(w.dims.size()) + " " + dims_string(w.dims) +
                           " but input 'dy' (" + squote(dy.name) + ") has rank " + str(rank) +
                           ": the filter must be [K,C/groups,R,S] (or [K,C/groups,T,R,S]) matching dy");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dims_attr(ctx.where, "x_dims", attrs.x_dims, rank, kXDimsHelp));
  const std::vector<int64_t>& xd = attrs.x_dims;
  if (w.dims[0] != dy.dims[1]) {
    return InvalidArgument(ctx.in_where("w") + " has K=" + str(w.dims[0]) +
                           " output channels but input 'dy' (" + squote(dy.name) +
                           ") has K=" + str(dy.dims[1]) + " (dim 1): they must be equal");
  }
  if (xd[0] != dy.dims[0]) {
    return InvalidArgument(ctx.where + " x_dims " + dims_string(xd) + " has N=" + str(xd[0]) +
                           " but input 'dy' (" + squote(dy.name) + ") has N=" + str(dy.dims[0]) +
                           ": they must be equal");
  }
  const std::string x_what = "x_dims " + dims_string(xd);
  FUSEBOX_RETURN_IF_ERROR(check_groups(x_what, xd, ctx.in_where("w"), w.dims));
  FUSEBOX_RETURN_IF_ERROR(resolve_geometry(ctx.where, rank - 2, attrs.padding, attrs.stride, attrs.dilation));
  const std::string w_what = "'w' (" + squote(w.name) + ")";
  FUSEBOX_ASSIGN_OR_RETURN(auto y, forward_dims(ctx.where, "input of " + x_what, xd, w_what, w.dims,
                                                attrs.padding, attrs.stride, attrs.dilation));
  FUSEBOX_RETURN_IF_ERROR(check_dy(ctx, y,
                                   "the forward convolution of " + x_what + " with " + w_what + " " +
                                       dims_string(w.dims) + " (" +
                                       geometry_string(attrs.padding, attrs.stride, attrs.dilation) + ")"));
  return ctx.finish_output("dx", xd, dense_strides_like(xd, dy.strides), ctx.io_dtype);
}

void canonical(const ConvDgradAttrs& a, CanonicalWriter& w) {
  canonical_geometry(a, w);
  w.field("x_dims", a.x_dims);
}
void describe(const ConvDgradAttrs& a, std::ostream& os) { describe_geometry(a, os); }
void resolved_json(const FlopsContext&, const ConvDgradAttrs& a, nlohmann::ordered_json& j) {
  json_geometry(a, j);
  j["x_dims"] = a.x_dims;
}

double flops(const FlopsContext& ctx, const ConvDgradAttrs&) {
  return conv_flops(ctx.in("dy").dims, ctx.in("w").dims);
}

// ---------------------------------------------------------------- conv_wgrad

std::vector<std::string_view> type_names(std::type_identity<ConvWgradAttrs>) { return {"conv_wgrad"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<ConvWgradAttrs>) {
  if (name == "conv_wgrad") return OpAttrs{ConvWgradAttrs{}};
  return std::nullopt;
}
std::string_view type_name(const ConvWgradAttrs&) { return "conv_wgrad"; }
std::vector<std::string_view> input_roles(const ConvWgradAttrs&) { return {"dy", "x"}; }
std::vector<std::string_view> output_roles(const ConvWgradAttrs&) { return {"dw"}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  ConvWgradAttrs& a) {
  FUSEBOX_RETURN_IF_ERROR(parse_geometry(r, v, path, a));
  return r.opt_int_list(v, path, "w_dims", a.w_dims);
}

void write_json(const ConvWgradAttrs& a, nlohmann::ordered_json& j) {
  write_geometry(a, j);
  if (!a.w_dims.empty()) j["w_dims"] = a.w_dims;
}

Status infer(const InferContext& ctx, ConvWgradAttrs& attrs) {
  const ResolvedTensor& dy = ctx.in("dy");
  const ResolvedTensor& x = ctx.in("x");
  const size_t rank = dy.dims.size();
  FUSEBOX_RETURN_IF_ERROR(
      check_conv_rank(ctx.in_where("dy"), dy.dims, "conv_wgrad", "dy [N,K,P,Q] or [N,K,O,P,Q]"));
  if (x.dims.size() != rank) {
    return InvalidArgument(ctx.in_where("x") + " has rank " + str(x.dims.size()) + " " + dims_string(x.dims) +
                           " but input 'dy' (" + squote(dy.name) + ") has rank " + str(rank) +
                           ": x must be [N,C,H,W] (or [N,C,D,H,W]) matching dy");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dims_attr(ctx.where, "w_dims", attrs.w_dims, rank, kWDimsHelp));
  const std::vector<int64_t>& wd = attrs.w_dims;
  if (x.dims[0] != dy.dims[0]) {
    return InvalidArgument(ctx.in_where("x") + " has N=" + str(x.dims[0]) + " but input 'dy' (" +
                           squote(dy.name) + ") has N=" + str(dy.dims[0]) + ": they must be equal");
  }
  if (wd[0] != dy.dims[1]) {
    return InvalidArgument(ctx.where + " w_dims " + dims_string(wd) + " has K=" + str(wd[0]) +
                           " output channels but input 'dy' (" + squote(dy.name) +
                           ") has K=" + str(dy.dims[1]) + " (dim 1): they must be equal");
  }
  const std::string x_what = "input 'x' (" + squote(x.name) + ")";
  const std::string w_what = "w_dims " + dims_string(wd);
  FUSEBOX_RETURN_IF_ERROR(check_groups(x_what, x.dims, ctx.where + " " + w_what, wd));
  FUSEBOX_RETURN_IF_ERROR(resolve_geometry(ctx.where, rank - 2, attrs.padding, attrs.stride, attrs.dilation));
  FUSEBOX_ASSIGN_OR_RETURN(auto y, forward_dims(ctx.where, x_what, x.dims, w_what, wd, attrs.padding,
                                                attrs.stride, attrs.dilation));
  FUSEBOX_RETURN_IF_ERROR(check_dy(ctx, y,
                                   "the forward convolution of " + x_what + " " + dims_string(x.dims) +
                                       " with " + w_what + " (" +
                                       geometry_string(attrs.padding, attrs.stride, attrs.dilation) + ")"));
  return ctx.finish_output("dw", wd, dense_strides_like(wd, x.strides), ctx.io_dtype);
}

void canonical(const ConvWgradAttrs& a, CanonicalWriter& w) {
  canonical_geometry(a, w);
  w.field("w_dims", a.w_dims);
}
void describe(const ConvWgradAttrs& a, std::ostream& os) { describe_geometry(a, os); }
void resolved_json(const FlopsContext&, const ConvWgradAttrs& a, nlohmann::ordered_json& j) {
  json_geometry(a, j);
  j["w_dims"] = a.w_dims;
}

double flops(const FlopsContext& ctx, const ConvWgradAttrs& a) {
  return conv_flops(ctx.in("dy").dims, a.w_dims);
}

// ---- gradient rules: conv_fprop -> conv_dgrad (dx) and conv_wgrad (dw) with
// its padding, stride and dilation; the backward ops have none.
Status grad(GradContext& ctx, const ConvFpropAttrs& a) {
  const std::string dy = ctx.dy("y");
  if (ctx.wants("x")) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string w, ctx.in("w"));
    ConvDgradAttrs d{a.padding, a.stride, a.dilation, ctx.in_tensor("x").dims};
    FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("dgrad", d, {{"dy", dy}, {"w", w}}));
    FUSEBOX_RETURN_IF_ERROR(ctx.add_grad("x", r.at("dx")));
  }
  if (ctx.wants("w")) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string x, ctx.in("x"));
    ConvWgradAttrs wg{a.padding, a.stride, a.dilation, ctx.in_tensor("w").dims};
    FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("wgrad", wg, {{"dy", dy}, {"x", x}}));
    FUSEBOX_RETURN_IF_ERROR(ctx.add_grad("w", r.at("dw")));
  }
  return Status::Ok();
}
Status grad(GradContext& ctx, const ConvDgradAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}
Status grad(GradContext& ctx, const ConvWgradAttrs&) {
  return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
}

}  // namespace fusebox::graph_ops
