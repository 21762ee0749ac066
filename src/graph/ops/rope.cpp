// fusebox op family rope (graph layer): rotary position embedding, forward
// ("rope": x -> y) and backward ("rope_bwd": dy -> dx); the semantics are in
// include/fusebox/ops/rope.h. x [B,H,S,D], freqs [1,1,P,R/2] fp32, offset
// [B,1,1,1] int32 (optional) -> y [B,H,S,D].
#include <cmath>

#include "common/dims_string.h"
#include "ops/ops.h"

namespace fusebox::graph_ops {

// ---- the family's op traits (traits.h): only what differs from OpTraitsDefaults
template <>
struct OpTraits<RopeAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "rope", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"layout", "rope_dim", "scale"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"freqs", "offset"});
  static constexpr bool native_only = true;
};
FUSEBOX_OP_TRAITS(RopeAttrs)

using common::dims_string;

namespace {

const char* in_role(const RopeAttrs& a) { return a.backward ? "dy" : "x"; }
const char* out_role(const RopeAttrs& a) { return a.backward ? "dx" : "y"; }
std::string type(const RopeAttrs& a) { return a.backward ? "rope_bwd" : "rope"; }

}  // namespace

std::vector<std::string_view> type_names(std::type_identity<RopeAttrs>) { return {"rope", "rope_bwd"}; }
std::optional<OpAttrs> make_attrs(std::string_view name, std::type_identity<RopeAttrs>) {
  if (name == "rope") return OpAttrs{RopeAttrs{}};
  if (name == "rope_bwd") return OpAttrs{RopeAttrs{.backward = true}};
  return std::nullopt;
}
std::string_view type_name(const RopeAttrs& a) { return a.backward ? "rope_bwd" : "rope"; }
std::vector<std::string_view> input_roles(const RopeAttrs& a) {
  if (a.offset) return {in_role(a), "freqs", "offset"};
  return {in_role(a), "freqs"};
}
std::vector<std::string_view> output_roles(const RopeAttrs& a) { return {out_role(a)}; }

Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op,
                  RopeAttrs& a) {
  a.offset = op.inputs.count("offset") > 0;  // an optional input
  if (v.contains("layout")) {
    FUSEBOX_ASSIGN_OR_RETURN(const std::string layout, r.get_string(path + ".layout", v["layout"]));
    if (layout == "half") {
      a.layout = RopeLayout::kHalf;
    } else if (layout == "interleaved") {
      a.layout = RopeLayout::kInterleaved;
    } else {
      return r.err(path + ".layout",
                   "is '" + layout +
                       "': accepted are \"half\" (pair i is (i, i + R/2): GPT-NeoX, Hugging "
                       "Face Llama; the default) and \"interleaved\" (pair i is (2i, 2i + 1))");
    }
  }
  std::optional<int64_t> rope_dim;
  FUSEBOX_RETURN_IF_ERROR(r.opt_int(v, path, "rope_dim", rope_dim));
  if (rope_dim) a.rope_dim = *rope_dim;
  std::optional<double> scale;
  FUSEBOX_RETURN_IF_ERROR(r.opt_number(v, path, "scale", scale));
  if (scale) a.scale = *scale;
  return Status::Ok();
}
void write_json(const RopeAttrs& a, nlohmann::ordered_json& j) {
  if (a.layout == RopeLayout::kInterleaved) j["layout"] = "interleaved";
  if (a.rope_dim) j["rope_dim"] = a.rope_dim;
  if (a.scale != 1.0) j["scale"] = a.scale;
}

Status infer(const InferContext& ctx, RopeAttrs& a) {
  const std::string t = type(a);
  const ResolvedTensor& x = ctx.in(in_role(a));
  if (x.dims.size() != 4) {
    return InvalidArgument(
        ctx.in_where(in_role(a)) + " has dims " + dims_string(x.dims) + ": " + t +
        " takes it as [B, H, S, D] (batch, heads, sequence, head dim), like sdpa's q and k");
  }
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where(in_role(a)), x.dtype,
                                         {DType::kBF16, DType::kFP16, DType::kFP32},
                                         t + " takes " + in_role(a) + " in bf16, fp16 or fp32"));
  const int64_t b = x.dims[0], s = x.dims[2], d = x.dims[3];
  if (a.rope_dim < 0 || a.rope_dim > d) {
    return InvalidArgument(ctx.where + " rope_dim is " + std::to_string(a.rope_dim) +
                           ": give 0 (rotate the whole head dim) or an even number up to the head dim " +
                           std::to_string(d));
  }
  const int64_t r = a.rope_dim ? a.rope_dim : d;
  if (r % 2 != 0) {
    return InvalidArgument(ctx.where + " rotates " + std::to_string(r) +
                           " values (rope_dim, or the head dim when rope_dim is 0): RoPE rotates pairs, "
                           "so give an even rope_dim");
  }
  if (!std::isfinite(a.scale)) {
    return InvalidArgument(ctx.where + " scale is not finite: give a finite scale (default 1)");
  }
  const ResolvedTensor& f = ctx.in("freqs");
  FUSEBOX_RETURN_IF_ERROR(check_dtype_in(ctx.in_where("freqs"), f.dtype, {DType::kFP32},
                                         t + " takes freqs (raw angles, in radians) in fp32"));
  if (f.dims.size() != 4 || f.dims[0] != 1 || f.dims[1] != 1 || f.dims[3] != r / 2) {
    return InvalidArgument(
        ctx.in_where("freqs") + " has dims " + dims_string(f.dims) + ": " + t + " takes freqs as [1, 1, P, " +
        std::to_string(r / 2) +
        "]: one angle per position p < P and per rotated pair (R/2 = " + std::to_string(r / 2) + ")");
  }
  const int64_t p = f.dims[2];
  if (a.offset) {
    ResolvedTensor& off = ctx.in("offset");
    FUSEBOX_RETURN_IF_ERROR(
        check_dtype_in(ctx.in_where("offset"), off.dtype, {DType::kInt32},
                       t + " takes offset as int32 positions (set \"dtype\": \"int32\")"));
    if (off.dims != std::vector<int64_t>{b, 1, 1, 1}) {
      return InvalidArgument(ctx.in_where("offset") + " has dims " + dims_string(off.dims) + ": " + t +
                             " takes offset as [B, 1, 1, 1] = [" + std::to_string(b) +
                             ", 1, 1, 1]: the position of each sequence's first token");
    }
    if (p < s) {
      return InvalidArgument(ctx.in_where("freqs") + " has " + std::to_string(p) + " positions for " +
                             std::to_string(s) + " tokens: freqs needs P >= S");
    }
    for (size_t i = 0; i < off.values.size(); ++i) {
      const double o = off.values[i];
      if (o >= 0 && o + static_cast<double>(s) <= static_cast<double>(p) && o == std::floor(o)) continue;
      return InvalidArgument(ctx.in_where("offset") + ": values[" + std::to_string(i) +
                             "] = " + std::to_string(o) + " puts tokens outside freqs' " + std::to_string(p) +
                             " positions: every offset must be an integer in [0, " + std::to_string(p - s) +
                             "]");
    }
    off.random_lo = 0;  // random offsets keep every position inside freqs
    off.random_hi = static_cast<double>(p - s);
  } else if (p < s) {
    return InvalidArgument(ctx.in_where("freqs") + " has " + std::to_string(p) +
                           " positions for a sequence of " + std::to_string(s) +
                           ": freqs needs P >= S (position s of every sequence is s)");
  }
  // Random angles within a few turns, like real positions' (p * base^(-2i/R)).
  ctx.in("freqs").random_lo = -8.0;
  ctx.in("freqs").random_hi = 8.0;
  FUSEBOX_RETURN_IF_ERROR(
      ctx.finish_output(out_role(a), x.dims, dense_strides_like(x.dims, x.strides), ctx.io_dtype));
  return check_dtype_in(ctx.out_where(out_role(a)), ctx.out(out_role(a)).dtype,
                        {DType::kBF16, DType::kFP16, DType::kFP32},
                        t + " writes " + out_role(a) + " in bf16, fp16 or fp32");
}

void canonical(const RopeAttrs& a, CanonicalWriter& w) {
  w.field("backward", a.backward);
  w.field("layout", a.layout == RopeLayout::kHalf ? "half" : "interleaved");
  w.field("rope_dim", a.rope_dim);
  w.field("scale", a.scale);
  w.field("offset", a.offset);
}
void describe(const RopeAttrs& a, std::ostream& os) {
  os << ", " << (a.layout == RopeLayout::kHalf ? "half" : "interleaved") << " pairs";
  if (a.rope_dim) os << ", rope_dim " << a.rope_dim;
  if (a.scale != 1.0) os << ", scale " << a.scale;
  if (a.offset) os << ", positions from offset";
  os << ", fusebox kernel";
}
void resolved_json(const FlopsContext& ctx, const RopeAttrs& a, nlohmann::ordered_json& j) {
  j["layout"] = a.layout == RopeLayout::kHalf ? "half" : "interleaved";
  j["rope_dim"] = a.rope_dim ? a.rope_dim : ctx.in(in_role(a)).dims.at(3);
  j["scale"] = a.scale;
  j["offset"] = a.offset;
  j["native_kernel"] = true;
}
// Per rotated pair: 4 multiplies and 2 adds (and the scale, folded into c and s);
// per passed-through value: 1 multiply.
double flops(const FlopsContext& ctx, const RopeAttrs& a) {
  const ResolvedTensor& x = ctx.in(in_role(a));
  const double rows = static_cast<double>(x.dims.at(0) * x.dims.at(1) * x.dims.at(2));
  const int64_t d = x.dims.at(3), r = a.rope_dim ? a.rope_dim : d;
  return rows * (3.0 * static_cast<double>(r) + static_cast<double>(d - r));
}

// ---- gradient rule: rope -> rope_bwd (the rotation by -theta) with the same
// freqs, offset and attributes; freqs and offset carry none (traits.h).
Status grad(GradContext& ctx, const RopeAttrs& a) {
  if (a.backward) return ctx.no_rule("it is a backward op (fusebox derives first derivatives only)");
  if (!ctx.wants("x")) return Status::Ok();
  RopeAttrs b = a;
  b.backward = true;
  std::map<std::string, std::string> in{{"dy", ctx.dy("y")}};
  FUSEBOX_ASSIGN_OR_RETURN(in["freqs"], ctx.in("freqs"));
  if (a.offset) {
    FUSEBOX_ASSIGN_OR_RETURN(in["offset"], ctx.in("offset"));
  }
  FUSEBOX_ASSIGN_OR_RETURN(auto r, ctx.emit("bwd", b, in));
  return ctx.add_grad("x", r.at("dx"));
}

}  // namespace fusebox::graph_ops
