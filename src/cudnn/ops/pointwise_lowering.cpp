// fusebox: the cuDNN lowering of the pointwise ops.
#include "ops/ops.h"

namespace fusebox::cudnn {
namespace {

fe::PointwiseMode_t to_fe(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd:
      return fe::PointwiseMode_t::ADD;
    case PointwiseMode::kSub:
      return fe::PointwiseMode_t::SUB;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale:
      return fe::PointwiseMode_t::MUL;
    case PointwiseMode::kRelu:
      return fe::PointwiseMode_t::RELU_FWD;
    case PointwiseMode::kGeluTanh:
      return fe::PointwiseMode_t::GELU_APPROX_TANH_FWD;
    case PointwiseMode::kGeluErf:
      return fe::PointwiseMode_t::GELU_FWD;
    case PointwiseMode::kSilu:
      return fe::PointwiseMode_t::SWISH_FWD;
    case PointwiseMode::kSigmoid:
      return fe::PointwiseMode_t::SIGMOID_FWD;
    case PointwiseMode::kTanh:
      return fe::PointwiseMode_t::TANH_FWD;
    case PointwiseMode::kReluBwd:
      return fe::PointwiseMode_t::RELU_BWD;
    case PointwiseMode::kGeluTanhBwd:
      return fe::PointwiseMode_t::GELU_APPROX_TANH_BWD;
    case PointwiseMode::kGeluErfBwd:
      return fe::PointwiseMode_t::GELU_BWD;
    case PointwiseMode::kSiluBwd:
      return fe::PointwiseMode_t::SWISH_BWD;
    case PointwiseMode::kSigmoidBwd:
      return fe::PointwiseMode_t::SIGMOID_BWD;
    case PointwiseMode::kTanhBwd:
      return fe::PointwiseMode_t::TANH_BWD;
  }
  return fe::PointwiseMode_t::NOT_SET;
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const PointwiseAttrs& pw) {
  auto attrs = fe::graph::Pointwise_attributes()
                   .set_name(op.name)
                   .set_mode(to_fe(pw.mode))
                   .set_compute_data_type(to_fe(op.compute_dtype));
  if (pw.mode == PointwiseMode::kSilu || pw.mode == PointwiseMode::kSiluBwd) attrs.set_swish_beta(1.0f);
  FeTensor a, b;
  switch (pw.mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
      a = ctx.in("a");
      b = ctx.in("b");
      break;
    case PointwiseMode::kBiasAdd:
      a = ctx.in("x");
      b = ctx.in("bias");
      break;
    case PointwiseMode::kScale:
      a = ctx.in("x");
      b = ctx.in("scale");
      break;
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      a = ctx.in("dy");
      b = ctx.in("x");
      break;  // IN_0 = dy, IN_1 = x
    default:
      a = ctx.in("x");
      break;
  }
  FeTensor y = b ? ctx.graph().pointwise(a, b, attrs) : ctx.graph().pointwise(a, attrs);
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn
