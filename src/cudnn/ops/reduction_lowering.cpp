// fusebox: the cuDNN lowering of the reductions. cuDNN reads the reduced
// dims from the output's dims (1 where reduced), which bind_output sets.
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
  FeTensor y =
      ctx.graph().reduction(ctx.in("x"), fe::graph::Reduction_attributes()
                                             .set_name(op.name)
                                             .set_mode(to_fe(r.mode))
                                             .set_compute_data_type(fusebox::cudnn::to_fe(op.compute_dtype)));
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn
