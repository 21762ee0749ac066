// fusebox: the cuDNN lowering of the batchnorm ops (the frontend's
// Graph::batchnorm, Graph::batchnorm_inference and Graph::batchnorm_backward).
// epsilon and momentum become by-value fp32 tensors, baked into the plan like
// any scalar.
#include "ops/ops.h"

namespace fusebox::cudnn {
namespace {

FeTensor scalar_tensor(LowerContext& ctx, const ResolvedOp& op, const char* what, double v) {
  fe::graph::Tensor_attributes t(static_cast<float>(v));
  t.set_name(op.name + "::" + what);
  return ctx.graph().tensor(t);
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormAttrs& bn) {
  FeTensor eps = scalar_tensor(ctx, op, "epsilon", bn.epsilon);  // the setters take lvalues
  FeTensor momentum = scalar_tensor(ctx, op, "momentum", bn.momentum);
  FeTensor run_mean = ctx.in("running_mean");
  FeTensor run_var = ctx.in("running_var");
  auto attrs =
      fe::graph::Batchnorm_attributes().set_name(op.name).set_epsilon(eps).set_previous_running_stats(
          run_mean, run_var, momentum);
  attrs.set_compute_data_type(to_fe(op.compute_dtype));
  auto [y, mean, inv_variance, next_mean, next_var] =
      ctx.graph().batchnorm(ctx.in("x"), ctx.in("scale"), ctx.in("bias"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("y", y));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("mean", mean));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("inv_variance", inv_variance));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("next_running_mean", next_mean));
  return ctx.bind_output("next_running_var", next_var);
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs&) {
  auto attrs = fe::graph::Batchnorm_inference_attributes().set_name(op.name);
  attrs.set_compute_data_type(to_fe(op.compute_dtype));
  FeTensor y = ctx.graph().batchnorm_inference(ctx.in("x"), ctx.in("mean"), ctx.in("inv_variance"),
                                               ctx.in("scale"), ctx.in("bias"), attrs);
  return ctx.bind_output("y", y);
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormBwdAttrs&) {
  auto attrs = fe::graph::Batchnorm_backward_attributes().set_name(op.name).set_saved_mean_and_inv_variance(
      ctx.in("mean"), ctx.in("inv_variance"));
  attrs.set_compute_data_type(to_fe(op.compute_dtype));
  auto [dx, dscale, dbias] =
      ctx.graph().batchnorm_backward(ctx.in("dy"), ctx.in("x"), ctx.in("scale"), attrs);
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dx", dx));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("dscale", dscale));
  return ctx.bind_output("dbias", dbias);
}

}  // namespace fusebox::cudnn
