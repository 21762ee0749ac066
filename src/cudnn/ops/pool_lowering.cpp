// fusebox: the cuDNN lowering of the pool ops (the frontend's resample).
// max_pool pads with -infinity (padding is never the maximum), avg_pool with
// zeros, counted in the divisor or not (count_include_pad). No index output:
// it would only feed a max-pool backward, which the frontend 1.32 graph API
// does not offer (include/fusebox/ops/pool.h).
//
// cuDNN 9.19's NHWC resample engine (eng3, the heuristics' first choice) is
// wrong for bf16 on the H200: measured 2026-12-01, max and average pooling
// 3x3/2 pad 1 on 2x16x9x9 gave wrong values (rel. L2 0.9) and on
// 32x64x112x112 or a 32x2048x7x7 global average an illegal memory access,
// while the same graphs in fp16 or fp32 on eng3, and in bf16 on eng2, match
// the reference exactly. So a bf16 pool bars eng3; eng2 (or eng1) serves it.
// The frontend bars by substring of the engine tag ("eng3_k24=0"): "eng3_k"
// names engine 3 with its knobs and not engines 30-39.
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const PoolAttrs& a) {
  fe::ResampleMode_t mode = fe::ResampleMode_t::MAXPOOL;
  if (a.mode == PoolMode::kAvg)
    mode = a.count_include_pad ? fe::ResampleMode_t::AVGPOOL_INCLUDE_PADDING
                               : fe::ResampleMode_t::AVGPOOL_EXCLUDE_PADDING;
  auto attrs = fe::graph::Resample_attributes()
                   .set_name(op.name)
                   .set_generate_index(false)
                   .set_resampling_mode(mode)
                   .set_padding_mode(a.mode == PoolMode::kMax ? fe::PaddingMode_t::NEG_INF_PAD
                                                              : fe::PaddingMode_t::ZERO_PAD)
                   .set_window(a.window)
                   .set_stride(a.stride)
                   .set_pre_padding(a.padding)
                   .set_post_padding(a.padding);
  attrs.set_compute_data_type(to_fe(op.compute_dtype));
  if (ctx.resolved().tensors[static_cast<size_t>(op.inputs.at("x"))].dtype == DType::kBF16)
    ctx.graph().deselect_engines({"eng3_k"});
  auto [y, index] = ctx.graph().resample(ctx.in("x"), attrs);
  (void)index;  // nullptr: generate_index is false
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn
