// fusebox: the cuDNN lowering of the norm ops (the frontend's Graph::layernorm).
// epsilon becomes a by-value fp32 tensor, baked into the plan like any scalar.
#include "ops/ops.h"

namespace fusebox::cudnn {
namespace {

fe::NormFwdPhase_t to_fe(NormPhase p) {
  return p == NormPhase::kTraining ? fe::NormFwdPhase_t::TRAINING : fe::NormFwdPhase_t::INFERENCE;
}

FeTensor epsilon_tensor(LowerContext& ctx, const ResolvedOp& op, double epsilon) {
  fe::graph::Tensor_attributes eps(static_cast<float>(epsilon));
  eps.set_name(op.name + "::epsilon");
  return ctx.graph().tensor(eps);
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const LayerNormAttrs& ln) {
  FeTensor eps = epsilon_tensor(ctx, op, ln.epsilon);  // set_epsilon takes an lvalue
  auto attrs = fe::graph::Layernorm_attributes()
                   .set_name(op.name)
                   .set_forward_phase(to_fe(ln.phase))
                   .set_epsilon(eps)
                   .set_compute_data_type(to_fe(op.compute_dtype));
  auto [y, mean, inv_variance] = ctx.graph().layernorm(ctx.in("x"), ctx.in("scale"), ctx.in("bias"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("y", y));
  if (ln.phase == NormPhase::kTraining) {
    FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("mean", mean));
    FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("inv_variance", inv_variance));
  }
  return Status::Ok();
}

}  // namespace fusebox::cudnn
