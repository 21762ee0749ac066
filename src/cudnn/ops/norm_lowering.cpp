// fusebox: the cuDNN lowering of the norm ops (the frontend's Graph::layernorm,
// Graph::rmsnorm, Graph::layernorm_backward and Graph::rmsnorm_backward).
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

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const RmsNormAttrs& rms) {
  FeTensor eps = epsilon_tensor(ctx, op, rms.epsilon);
  auto attrs = fe::graph::Rmsnorm_attributes()
                   .set_name(op.name)
                   .set_forward_phase(to_fe(rms.phase))
                   .set_epsilon(eps)
                   .set_compute_data_type(to_fe(op.compute_dtype));
  FeTensor bias = ctx.in("bias");
  if (bias) attrs.set_bias(bias);
  auto [y, inv_variance] = ctx.graph().rmsnorm(ctx.in("x"), ctx.in("scale"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("y", y));
  if (rms.phase == NormPhase::kTraining)
    FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("inv_variance", inv_variance));
  return Status::Ok();
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const LayerNormBwdAttrs&) {
  auto attrs = fe::graph::Layernorm_backward_attributes()
                   .set_name(op.name)
                   .set_saved_mean_and_inv_variance(ctx.in("mean"), ctx.in("inv_variance"))
                   .set_compute_data_type(to_fe(op.compute_dtype));
  auto [dx, dscale, dbias] =
      ctx.graph().layernorm_backward(ctx.in("dy"), ctx.in("x"), ctx.in("scale"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dx", dx));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dscale", dscale));
  return ctx.bind_output("dbias", dbias);
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const RmsNormBwdAttrs& a) {
  auto attrs =
      fe::graph::Rmsnorm_backward_attributes().set_name(op.name).has_dbias(a.dbias).set_compute_data_type(
          to_fe(op.compute_dtype));
  auto [dx, dscale, dbias] =
      ctx.graph().rmsnorm_backward(ctx.in("dy"), ctx.in("x"), ctx.in("scale"), ctx.in("inv_variance"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dx", dx));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dscale", dscale));
  if (a.dbias) FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dbias", dbias));
  return Status::Ok();
}

}  // namespace fusebox::cudnn
