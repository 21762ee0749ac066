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

// cuDNN 9.19's batchnorm_inference node found no engine for any graph tried on
// the H200 (9 of 9 in a sweep, e.g. tests/cases/no-engine/batchnorm_inference_*:
// fp32 statistics, NHWC). With the statistics given, it is a per-channel
// scale and shift: y = (x - mean) * inv_variance * scale + bias, four
// pointwise ops cuDNN fuses into one kernel (and into a convolution's
// epilogue when one precedes it).
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs&) {
  auto pointwise = [&](const char* step, fe::PointwiseMode_t mode, const FeTensor& a, const FeTensor& b) {
    auto attrs = fe::graph::Pointwise_attributes()
                     .set_name(op.name + "::" + step)
                     .set_mode(mode)
                     .set_compute_data_type(to_fe(op.compute_dtype));
    FeTensor out = ctx.graph().pointwise(a, b, attrs);
    out->set_data_type(fe::DataType_t::FLOAT);  // fp32 between the steps, whatever the io dtype
    return out;
  };
  FeTensor centered = pointwise("center", fe::PointwiseMode_t::SUB, ctx.in("x"), ctx.in("mean"));
  FeTensor normalized = pointwise("normalize", fe::PointwiseMode_t::MUL, centered, ctx.in("inv_variance"));
  FeTensor scaled = pointwise("scale", fe::PointwiseMode_t::MUL, normalized, ctx.in("scale"));
  FeTensor y = pointwise("shift", fe::PointwiseMode_t::ADD, scaled, ctx.in("bias"));
  ctx.note(
      "lowered as (x - mean) * inv_variance * scale + bias, four fused pointwise ops (cuDNN 9.19's "
      "batchnorm_inference node has no engine on the H200)");
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
