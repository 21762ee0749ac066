// fusebox: the cuDNN lowering of the reductions. cuDNN reads the reduced
// dims from the output's dims (1 where reduced), which bind_output sets.
// A reduction whose reduced dims all have size 1 (y's dims are x's) reduces nothing: it is
// lowered as the pointwise op it is (ABS for reduce_amax, IDENTITY for the others). On the H200
// (cuDNN 9.19, issue 29's sweep, seed 2219: reduce_amax over dim 2 of a matmul's [2,128,1]
// output) every one of the 8 candidates of the reduction form gave the same wrong values
// (rel-L2 0.87 against |y|), and the plan check refused them all.
#include "ops/ops.h"

namespace fusebox::cudnn {
namespace {

fe::ReductionMode_t to_fe(ReductionMode m) {
  switch (m) {
    case ReductionMode::kSum:
      return fe::ReductionMode_t::ADD;
    case ReductionMode::kMax:
      return fe::ReductionMode_t::MAX;
    case ReductionMode::kMin:
      return fe::ReductionMode_t::MIN;
    case ReductionMode::kAmax:
      return fe::ReductionMode_t::AMAX;
    case ReductionMode::kMean:
      return fe::ReductionMode_t::AVG;
  }
  return fe::ReductionMode_t::NOT_SET;
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ReductionAttrs& r) {
  const ResolvedGraph& g = ctx.resolved();
  if (g.tensors[op.inputs.at("x")].dims == g.tensors[op.outputs.at("y")].dims) {
    const bool amax = r.mode == ReductionMode::kAmax;
    ctx.note(std::string("every reduced dim has size 1: lowered as the pointwise ") +
             (amax ? "abs" : "identity") +
             " it is (cuDNN's reduction engines gave wrong values for a reduction of nothing)");
    FeTensor y = ctx.graph().pointwise(
        ctx.in("x"), fe::graph::Pointwise_attributes()
                         .set_name(op.name)
                         .set_mode(amax ? fe::PointwiseMode_t::ABS : fe::PointwiseMode_t::IDENTITY)
                         .set_compute_data_type(fusebox::cudnn::to_fe(op.compute_dtype)));
    return ctx.bind_output("y", y);
  }
  FeTensor y =
      ctx.graph().reduction(ctx.in("x"), fe::graph::Reduction_attributes()
                                             .set_name(op.name)
                                             .set_mode(to_fe(r.mode))
                                             .set_compute_data_type(fusebox::cudnn::to_fe(op.compute_dtype)));
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn
