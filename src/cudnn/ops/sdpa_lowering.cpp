// fusebox: the cuDNN lowering of the sdpa ops (sdpa_fwd, sdpa_bwd,
// sdpa_fp8_fwd, sdpa_fp8_bwd).
#include <cmath>

#include "ops/ops.h"

namespace fusebox::cudnn {
namespace {

// resolve() fills attn_scale; 1/sqrt(D) guards hand-built graphs.
double attn_scale(const LowerContext& ctx, const ResolvedOp& op, const SdpaOptions& o) {
  return o.attn_scale
             ? *o.attn_scale
             : 1.0 / std::sqrt(static_cast<double>(ctx.resolved().tensors[op.inputs.at("q")].dims.back()));
}

// True when the diagonal band masks nothing: one query per sequence (q's Sq
// is 1 at this shape; a symbolic graph lowers each shape anew), bottom-right
// alignment, a right bound >= 0 and no left bound. That query sits at the
// last key position (seq_len_kv[b] - 1 with padding), so keys
// j <= seq_len_kv[b] - 1 + right_bound are all the keys there are: a causal
// decode step. cuDNN 9.19 on the H200 offers one engine for the masked form
// of the paged decode example (eng1, 389 us) and the faster eng8 without it
// (300 us, 3.7 TB/s), so the lowering leaves the band out and notes it.
// ALiBi keeps it (cuDNN 9.19 needs it causal).
bool band_masks_nothing(const SdpaOptions& o, const LowerContext& ctx, const ResolvedOp& op) {
  if (o.alibi || o.alignment != SdpaAlignment::kBottomRight || !o.right_bound || o.left_bound) return false;
  const ResolvedTensor& q = ctx.resolved().tensors[op.inputs.at("q")];
  return q.dims.size() == 4 && q.dims[2] == 1;
}

// Applies the options shared by every sdpa op to SDPA_attributes,
// SDPA_backward_attributes or SDPA_fp8_backward_attributes (the frontend gives
// them the same setters; ALiBi and the RNG dump are set by the callers, as FP8
// backward has neither).
template <typename Attrs>
void apply_sdpa_options(Attrs& attrs, const SdpaOptions& o, double scale, LowerContext& ctx,
                        const ResolvedOp& op) {
  attrs.set_attn_scale(static_cast<float>(scale));
  if (band_masks_nothing(o, ctx, op)) {
    ctx.note("the " + std::string(*o.right_bound == 0 ? "causal mask" : "right bound") +
             " is left out: with one query per sequence and bottom-right alignment it masks no key "
             "(the references still apply it)");
  } else {
    attrs.set_diagonal_alignment(o.alignment == SdpaAlignment::kBottomRight
                                     ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                     : fe::DiagonalAlignment_t::TOP_LEFT);
    // resolve() turns causal into right_bound 0; the fallback guards hand-built graphs.
    if (o.right_bound) {
      attrs.set_diagonal_band_right_bound(static_cast<int>(*o.right_bound));
    } else if (o.causal) {
      attrs.set_diagonal_band_right_bound(0);
    }
    if (o.left_bound) attrs.set_diagonal_band_left_bound(static_cast<int>(*o.left_bound));
  }
  if (o.padding)
    attrs.set_padding_mask(true).set_seq_len_q(ctx.in("seq_len_q")).set_seq_len_kv(ctx.in("seq_len_kv"));
  if (o.bias) attrs.set_bias(ctx.in("bias"));
  if (o.dropout) attrs.set_dropout(static_cast<float>(*o.dropout), ctx.in("seed"), ctx.in("offset"));
}

// Paged K/V (forward attributes only: the frontend has no paged backward):
// k and v are the page pools, the tables say where each sequence's pages are.
void apply_paged(fe::graph::SDPA_attributes& attrs, const SdpaOptions& o, const LowerContext& ctx) {
  if (!o.paged) return;
  attrs.set_paged_attention_k_table(ctx.in("page_table_k"))
      .set_paged_attention_v_table(ctx.in("page_table_v"));
  // resolve() fills it; without it the frontend infers it from the tables.
  if (o.max_seq_len_kv) attrs.set_paged_attention_max_seq_len_kv(static_cast<int>(*o.max_seq_len_kv));
}

// cuDNN 9.19 runs block masks only on Blackwell. On the H200 its heuristics
// offer no engine ("Block mask is only supported on Blackwell at:
// !(receive_op_->target == fort_device::SM100)", 2026-12-01), which a
// deviceless build cannot see (its runtime-compiled engines are not tried
// there); said here, before any cuDNN call, for live and deviceless targets
// alike. On sm_10x the frontend's validate refuses them below cuDNN 9.26 by
// itself (a masked-tile bug). An unknown architecture (0) is left to cuDNN.
Status block_mask_runs_on(const LowerContext& ctx, const ResolvedOp& op) {
  const DeviceTarget& target = ctx.target();
  if (target.sm_version == 0 || target.sm_version >= 100) return Status::Ok();
  const auto in = op.inputs.find("block_mask");
  const std::string tensor =
      in == op.inputs.end() ? "" : " ('" + ctx.resolved().tensors[in->second].name + "')";
  return NotSupported(
      ctx.where() + ": input 'block_mask'" + tensor +
      ": block masks need a Blackwell GPU (sm_100 and newer; frontend 1.32 allows them on sm_10x "
      "only with cuDNN 9.26 or newer), and the target is " +
      (target.device_name.empty() ? std::string("a GPU") : target.device_name) + " (sm_" +
      std::to_string(target.sm_version) +
      "), where cuDNN 9.19 has no engine for them (its reason: \"Block mask is only supported on "
      "Blackwell\"). The masks that skip work on this GPU: \"causal\", a sliding window "
      "(\"left_bound\"), ragged lengths (inputs seq_len_q, seq_len_kv); any other pattern is an "
      "additive \"bias\" (-inf where a tile is dropped)");
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& fwd) {
  if (fwd.fp8_kv) {
    return NotSupported(ctx.where() +
                        " an FP8 K/V cache ('descale_k', 'descale_v') with bf16 or fp16 q: cuDNN 9.19 has no "
                        "mixed-precision SDPA (its FP8 SDPA takes fp8 q, k and v and writes fp8 o); "
                        "fusebox_sdpa_decode runs it over paged K and V, fusebox's GPU reference the rest");
  }
  const double scale = attn_scale(ctx, op, fwd);
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name(op.name)
                   .set_generate_stats(fwd.generate_stats)
                   .set_compute_data_type(to_fe(op.compute_dtype));
  apply_sdpa_options(attrs, fwd, scale, ctx, op);
  apply_paged(attrs, fwd, ctx);
  if (fwd.sink) attrs.set_sink_token(ctx.in("sink_token"));
  // The frontend serves a block mask only with its unified SDPA node: asked
  // for by name, so that what that node refuses (in cuDNN 9.19: bias,
  // dropout, sinks, dynamic shapes) fails validate with the frontend's reason
  // rather than "No suitable implementation".
  if (fwd.block_mask) {
    FUSEBOX_RETURN_IF_ERROR(block_mask_runs_on(ctx, op));
    attrs.set_block_mask(ctx.in("block_mask")).set_implementation(fe::AttentionImplementation_t::UNIFIED);
  }
  if (fwd.alibi) attrs.set_alibi_mask(true);
  if (fwd.dump_dropout_mask) attrs.set_rng_dump(ctx.create_output("dropout_mask"));
  auto [o, stats] = ctx.graph().sdpa(ctx.in("q"), ctx.in("k"), ctx.in("v"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("o", o));
  if (fwd.generate_stats) FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("stats", stats));
  return Status::Ok();
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& bwd) {
  const double scale = attn_scale(ctx, op, bwd);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name(op.name)
                   .set_compute_data_type(to_fe(op.compute_dtype))
                   .set_deterministic_algorithm(bwd.deterministic);
  apply_sdpa_options(attrs, bwd, scale, ctx, op);
  if (bwd.sink) attrs.set_sink_token(ctx.in("sink_token"));
  if (bwd.sink_grad) attrs.set_dsink_token(ctx.create_output("dsink_token"));
  if (bwd.alibi) attrs.set_alibi_mask(true);
  if (bwd.dump_dropout_mask) attrs.set_rng_dump(ctx.create_output("dropout_mask"));
  auto [dq, dk, dv] = ctx.graph().sdpa_backward(ctx.in("q"), ctx.in("k"), ctx.in("v"), ctx.in("o"),
                                                ctx.in("do"), ctx.in("stats"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dq", dq));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dk", dk));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dv", dv));
  return Status::Ok();
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& f8) {
  const double scale = attn_scale(ctx, op, f8);
  auto attrs = fe::graph::SDPA_fp8_attributes()
                   .set_name(op.name)
                   .set_generate_stats(f8.generate_stats)
                   .set_compute_data_type(to_fe(op.compute_dtype));
  apply_sdpa_options(attrs, f8, scale, ctx, op);
  apply_paged(attrs, f8, ctx);
  if (f8.sink) attrs.set_sink_token(ctx.in("sink_token"));
  if (f8.alibi) attrs.set_alibi_mask(true);
  if (f8.dump_dropout_mask) attrs.set_rng_dump(ctx.create_output("dropout_mask"));
  auto [o, stats, amax_s, amax_o] = ctx.graph().sdpa_fp8(
      ctx.in("q"), ctx.in("k"), ctx.in("v"), ctx.in("descale_q"), ctx.in("descale_k"), ctx.in("descale_v"),
      ctx.in("descale_s"), ctx.in("scale_s"), ctx.in("scale_o"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("o", o));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_s", amax_s));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_o", amax_o));
  if (f8.generate_stats) FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("stats", stats));
  return Status::Ok();
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& b8) {
  const double scale = attn_scale(ctx, op, b8);
  if (b8.alibi || b8.dump_dropout_mask) {
    return NotSupported(ctx.where() + std::string(b8.alibi ? " alibi" : " a 'dropout_mask' output") +
                        ": the cuDNN frontend has no such option for FP8 backward; remove it");
  }
  auto attrs = fe::graph::SDPA_fp8_backward_attributes().set_name(op.name).set_compute_data_type(
      to_fe(op.compute_dtype));
  apply_sdpa_options(attrs, b8, scale, ctx, op);
  auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = ctx.graph().sdpa_fp8_backward(
      ctx.in("q"), ctx.in("k"), ctx.in("v"), ctx.in("o"), ctx.in("do"), ctx.in("stats"), ctx.in("descale_q"),
      ctx.in("descale_k"), ctx.in("descale_v"), ctx.in("descale_o"), ctx.in("descale_do"),
      ctx.in("descale_s"), ctx.in("descale_dp"), ctx.in("scale_s"), ctx.in("scale_dq"), ctx.in("scale_dk"),
      ctx.in("scale_dv"), ctx.in("scale_dp"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dq", dq));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dk", dk));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dv", dv));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_dq", amax_dq));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_dk", amax_dk));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_dv", amax_dv));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("amax_dp", amax_dp));
  return Status::Ok();
}

}  // namespace fusebox::cudnn
