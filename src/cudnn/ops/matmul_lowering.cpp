// fusebox: the cuDNN lowering of matmul.
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const MatmulAttrs&) {
  FeTensor y = ctx.graph().matmul(
      ctx.in("a"), ctx.in("b"),
      fe::graph::Matmul_attributes().set_name(op.name).set_compute_data_type(to_fe(op.compute_dtype)));
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn
