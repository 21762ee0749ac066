// fusebox op family rope (cuDNN layer): no lowering yet. fusebox runs rope and
// rope_bwd with its own kernel on every cuDNN (src/kernels/rope.cu), alone in
// their graph. cuDNN >= 9.24 has ROPE_FWD/BWD operations, but they take one
// angle per rotated value (not per pair) and are meant to fuse into an SDPA
// graph; lowering to them is issue 35's next step, with the H200 to verify it.
// Reached only by a graph that mixes rope with cuDNN ops, which the kernels
// layer refuses with the same message first; kept so the dispatch stays complete.
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp&, const RopeAttrs&) {
  return InvalidArgument(
      ctx.where() +
      " fusebox runs rope with its own kernel, alone in its graph (in a pipeline, a stage of "
      "its own); it is not lowered to cuDNN's RoPE operation yet");
}

}  // namespace fusebox::cudnn
