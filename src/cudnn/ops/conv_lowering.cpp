// fusebox: the cuDNN lowering of conv_fprop.
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

}  // namespace fusebox::cudnn
