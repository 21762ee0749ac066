// fusebox op family cross_entropy (cuDNN layer): cuDNN has no cross-entropy
// op, so no lowering: fusebox runs it with its own kernel (src/kernels/cross_entropy.cu),
// alone in its graph. Reached only by a graph that mixes it with cuDNN ops, which the
// kernels layer refuses with the same message first; kept so the dispatch stays complete.
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp&, const CrossEntropyAttrs&) {
  return InvalidArgument(
      ctx.where() +
      " cuDNN has no cross-entropy op: fusebox runs it with its own kernel, alone in its graph "
      "(in a pipeline, a stage of its own)");
}

}  // namespace fusebox::cudnn
