// fusebox: the cuDNN lowering of conv_fprop, conv_dgrad and conv_wgrad.
// The frontend cannot infer dx's or dw's dims (several shapes give one dy):
// bind_output sets them from the resolved graph (the ops' x_dims / w_dims).
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& conv) {
  FeTensor y = ctx.graph().conv_fprop(ctx.in("x"), ctx.in("w"),
                                      fe::graph::Conv_fprop_attributes()
                                          .set_name(op.name)
                                          .set_padding(conv.padding)
                                          .set_stride(conv.stride)
                                          .set_dilation(conv.dilation)
                                          .set_compute_data_type(to_fe(op.compute_dtype)));
  return ctx.bind_output("y", y);
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& conv) {
  FeTensor dx = ctx.graph().conv_dgrad(ctx.in("dy"), ctx.in("w"),
                                       fe::graph::Conv_dgrad_attributes()
                                           .set_name(op.name)
                                           .set_padding(conv.padding)
                                           .set_stride(conv.stride)
                                           .set_dilation(conv.dilation)
                                           .set_compute_data_type(to_fe(op.compute_dtype)));
  return ctx.bind_output("dx", dx);
}

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& conv) {
  FeTensor dw = ctx.graph().conv_wgrad(ctx.in("dy"), ctx.in("x"),
                                       fe::graph::Conv_wgrad_attributes()
                                           .set_name(op.name)
                                           .set_padding(conv.padding)
                                           .set_stride(conv.stride)
                                           .set_dilation(conv.dilation)
                                           .set_compute_data_type(to_fe(op.compute_dtype)));
  return ctx.bind_output("dw", dw);
}

}  // namespace fusebox::cudnn
