// fusebox: the cuDNN lowering of transpose: an identity pointwise operation that reads x and
// writes y's memory seen in x's dim order (y's strides taken back through the permutation), so
// any cuDNN from 9.19 runs it and an op before it fuses (a matmul writing its result transposed).
// cuDNN 9.22's transpose operation is not used: this form needs no newer backend. y is the
// graph's to read afterwards: an op of the same graph reading it is refused here, and the
// partitioner then ends the part at the transpose.
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const TransposeAttrs& a) {
  const ResolvedGraph& g = ctx.resolved();
  const int yi = op.outputs.at("y");
  for (const ResolvedOp& other : g.ops) {
    for (const auto& [role, ti] : other.inputs) {
      if (ti == yi) {
        return NotSupported(ctx.where() + ": its output '" + g.tensors[yi].name + "' is read by op '" +
                            other.name +
                            "' of the same graph; a transpose ends its graph in cuDNN (split the graph after "
                            "it, which the session's partition does)");
      }
    }
  }
  const ResolvedTensor& y = g.tensors[yi];
  const ResolvedTensor& x = g.tensors[op.inputs.at("x")];
  // y's memory in x's dim order: x's dim p_k is y's dim k.
  std::vector<int64_t> strides(y.strides.size());
  for (size_t k = 0; k < a.permutation.size(); ++k)
    strides[static_cast<size_t>(a.permutation[k])] = y.strides[k];
  FeTensor out = ctx.graph().pointwise(ctx.in("x"), fe::graph::Pointwise_attributes()
                                                        .set_name(op.name)
                                                        .set_mode(fe::PointwiseMode_t::IDENTITY)
                                                        .set_compute_data_type(fe::DataType_t::FLOAT));
  FUSEBOX_RETURN_IF_ERROR(ctx.bind_output("y", out));
  out->set_dim(x.dims).set_stride(strides);
  return Status::Ok();
}

}  // namespace fusebox::cudnn
