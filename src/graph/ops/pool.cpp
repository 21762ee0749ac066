// fusebox op family pool (graph layer): max_pool, avg_pool and
// global_avg_pool, cuDNN's resample (include/fusebox/ops/pool.h has the
// semantics). x [N, C, (D,) H, W] -> y [N, C, (O,) P, Q].
#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox {

std::string_view pool_mode_name(PoolMode m) { return m == PoolMode::kAvg ? "avg" : "max"; }

namespace graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<PoolAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "pool", bench_family = "pool";
};
FUSEBOX_OP_TRAITS(PoolAttrs)

using common::dims_string;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

std::string_view pool_type_name(const PoolAttrs& a) {
  if (a.global) return "global_avg_pool";
  return a.mode == PoolMode::kAvg ? "avg_pool" : "max_pool";
}

// window (required unless global), stride (default the window), padding
// (default 0): one per spatial dim, in range, padding < window.
Status resolve_pool_geometry(const std::string& where, const std::string& type,
                             const std::vector<int64_t>& xd, PoolAttrs& a) {
  const size_t sp = xd.size() - 2;
  if (a.global) {
    if (!a.window.empty() || !a.stride.empty() || !a.padding.empty()) {
      return InvalidArgument(where +
                             " global_avg_pool takes no window, stride or padding: its window is x's " +
                             "spatial dims; use avg_pool for another window");
    }
    a.window.assign(xd.begin() + 2, xd.end());
    a.stride = a.window;
    a.padding.assign(sp, 0);
    return Status::Ok();
  }
  if (a.window.empty()) {
    return InvalidArgument(where + " has no window: " + type + " needs 'window', one size per spatial dim (" +
                           str(static_cast<int64_t>(sp)) + " for x " + dims_string(xd) + "), e.g. " +
                           dims_string(std::vector<int64_t>(sp, 3)));
  }
  if (a.stride.empty()) a.stride = a.window;
  if (a.padding.empty()) a.padding.assign(sp, 0);
  struct Field {
    const char* name;
    std::vector<int64_t>* v;
    int64_t min;
  };
  for (Field f :
       {Field{"window", &a.window, 1}, Field{"stride", &a.stride, 1}, Field{"padding", &a.padding, 0}}) {
    if (f.v->size() != sp) {
      return InvalidArgument(where + " " + f.name + " " + dims_string(*f.v) + " has " +
                             str(static_cast<int64_t>(f.v->size())) + " values but x " + dims_string(xd) +
                             " has " + str(static_cast<int64_t>(sp)) +
                             " spatial dims: give one per spatial dim");
    }
    for (size_t i = 0; i < sp; ++i) {
      const int64_t v = (*f.v)[i];
      if (v < f.min || v > kMaxDim) {
        return InvalidArgument(where + " " + f.name + "[" + str(static_cast<int64_t>(i)) + "] is " + str(v) +
                               ": " + f.name + " must be in [" + str(f.min) + ", 2147483647]");
      }
    }
  }
  for (size_t i = 0; i < sp; ++i) {
    if (a.padding[i] >= a.window[i]) {
      return InvalidArgument(where + " padding[" + str(static_cast<int64_t>(i)) + "] is " +
                             str(a.padding[i]) + " but window[" + str(static_cast<int64_t>(i)) + "] is " +
                             str(a.window[i]) +
                             ": every window must cover an element of x; give padding < window (at most " +
                             str(a.window[i] - 1) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string_view> type_names(std::type_identity<PoolAttrs>) {
  return {"max_pool", "avg_pool", "global_avg_pool"};
}
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<PoolAttrs>) {
  PoolAttrs a;
  if (name == "max_pool") return OpAttrs{a};
  a.mode = PoolMode::kAvg;
  if (name == "avg_pool") return OpAttrs{a};
  a.global = true;
  if (name == "global_avg_pool") return OpAttrs{a};
  return std::nullopt;
}
std::string_view type_name(const PoolAttrs& a) { return pool_type_name(a); }
std::vector<std::string_view> input_roles(const PoolAttrs&) { return {"x"}; }
std::vector<std::string_view> output_roles(const PoolAttrs&) { return {"y"}; }
std::vector<std::string_view> json_fields(const PoolAttrs& a) {
  if (a.global) return {};
  if (a.mode == PoolMode::kAvg) return {"window", "stride", "padding", "count_include_pad"};
  return {"window", "stride", "padding"};
}

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec&,
                  PoolAttrs& a) {
  if (a.global) return Status::Ok();
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "window", a.window));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "stride", a.stride));
  FUSEBOX_RETURN_IF_ERROR(r.opt_int_list(v, path, "padding", a.padding));
  if (a.mode == PoolMode::kAvg)
    FUSEBOX_RETURN_IF_ERROR(r.opt_bool(v, path, "count_include_pad", a.count_include_pad));
  return Status::Ok();
}
void write_json(const PoolAttrs& a, nlohmann::ordered_json& j) {
  if (a.global) return;
  if (!a.window.empty()) j["window"] = a.window;
  if (!a.stride.empty()) j["stride"] = a.stride;
  if (!a.padding.empty()) j["padding"] = a.padding;
  if (a.mode == PoolMode::kAvg) j["count_include_pad"] = a.count_include_pad;
}

Status infer(const InferContext& ctx, PoolAttrs& a) {
  const std::string type(pool_type_name(a));
  const ResolvedTensor& x = ctx.in("x");
  if (x.dims.size() != 4 && x.dims.size() != 5) {
    return InvalidArgument(ctx.in_where("x") + " has rank " + str(static_cast<int64_t>(x.dims.size())) + " " +
                           dims_string(x.dims) + ": " + type + " takes x [N, C, H, W] or [N, C, D, H, W]");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("x"), x.dtype,
                                         {DType::kBF16, DType::kFP16, DType::kFP32},
                                         type + " takes bf16, fp16 or fp32 x"));
  FUSEBOX_RETURN_IF_ERROR(resolve_pool_geometry(ctx.where, type, x.dims, a));
  std::vector<int64_t> yd = {x.dims[0], x.dims[1]};
  for (size_t i = 0; i + 2 < x.dims.size(); ++i) {
    const int64_t padded = x.dims[i + 2] + 2 * a.padding[i];
    if (a.window[i] > padded) {
      const std::string si = str(static_cast<int64_t>(i));
      return InvalidArgument(ctx.in_where("x") + " " + dims_string(x.dims) + " has " + str(x.dims[i + 2]) +
                             " in spatial dim " + si + " (" + str(padded) + " with padding " +
                             dims_string(a.padding) + ") but window[" + si + "] is " + str(a.window[i]) +
                             ": the window must fit in the padded input; give window[" + si +
                             "] <= " + str(padded) + " or more padding");
    }
    yd.push_back((padded - a.window[i]) / a.stride[i] + 1);
  }
  FUSEBOX_RETURN_IF_ERROR(ctx.finish_output("y", yd, dense_strides_like(yd, x.strides), ctx.io_dtype));
  return check_dtype_in(ctx.out_where("y"), ctx.out("y").dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                        type + " writes y in bf16, fp16 or fp32");
}

void canonical(const PoolAttrs& a, CanonicalWriter& w) {
  w.field("mode", pool_mode_name(a.mode));
  w.field("window", a.window);
  w.field("stride", a.stride);
  w.field("padding", a.padding);
  if (a.mode == PoolMode::kAvg) w.field("count_include_pad", a.count_include_pad);
}
void describe(const PoolAttrs& a, std::ostream& os) {
  os << ", window " << dims_string(a.window) << ", stride " << dims_string(a.stride) << ", padding "
     << dims_string(a.padding);
  if (a.mode == PoolMode::kAvg && !a.global)
    os << (a.count_include_pad ? ", count_include_pad" : ", count_exclude_pad");
}
void resolved_json(const FlopsContext&, const PoolAttrs& a, nlohmann::ordered_json& j) {
  j["mode"] = std::string(pool_mode_name(a.mode));
  j["window"] = a.window;
  j["stride"] = a.stride;
  j["padding"] = a.padding;
  j["count_include_pad"] = a.count_include_pad;
}
// One compare or add per window element per output element.
double flops(const FlopsContext& ctx, const PoolAttrs& a) {
  double win = 1;
  for (int64_t w : a.window) win *= static_cast<double>(w);
  return win * static_cast<double>(ctx.out("y").element_count());
}

// ---- gradient rule: none yet (cuDNN's resample backward is not lowered).
Status grad(GradContext& ctx, const PoolAttrs&) {
  return ctx.no_rule("pooling has no backward op in fusebox yet");
}

}  // namespace graph_ops
}  // namespace fusebox
