// fusebox op family embedding (cuDNN layer): cuDNN 9.19 has no op for it, so
// no lowering. A graph of an embedding alone never gets here: build_plan and
// CandidateSet run it with fusebox's own kernel (src/kernels/). Reached only
// by a graph that mixes it with cuDNN ops, which the kernels layer refuses
// with the same message first; kept so that the dispatch stays complete.
#include "kernels/native_kernel.h"
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp&, const EmbeddingAttrs&) {
  return InvalidArgument(
      ctx.where() +
      " cuDNN 9.19 has no op for an embedding lookup: fusebox runs it with its own kernel, "
      "alone in its graph (in a pipeline, a stage of its own)");
}

}  // namespace fusebox::cudnn
