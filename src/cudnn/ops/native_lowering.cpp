// The ops fusebox runs only with its own kernel (OpTraits::native_only:
// embedding, rope, cross_entropy, quantize; docs/architecture.md, "Native ops") have no
// lowering: their lower_op (one line each, below) is this refusal, reached only by a
// graph that mixes such an op with cuDNN ops (the kernels layer refuses it
// first, with the same advice).
#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_native_op(LowerContext& ctx, std::string_view what) {
  return InvalidArgument(ctx.where() + " fusebox runs " + std::string(what) +
                         " with its own CUDA kernel, alone in its graph (in a pipeline, a stage of its own): "
                         "there is no cuDNN operation to lower it to");
}

Status lower_op(LowerContext& ctx, const ResolvedOp&, const EmbeddingAttrs&) {
  return lower_native_op(ctx, "an embedding lookup");
}
Status lower_op(LowerContext& ctx, const ResolvedOp&, const RopeAttrs&) {
  return lower_native_op(ctx, "rope (not lowered to cuDNN 9.24's RoPE operation yet)");
}
Status lower_op(LowerContext& ctx, const ResolvedOp&, const CrossEntropyAttrs&) {
  return lower_native_op(ctx, "softmax cross-entropy");
}
Status lower_op(LowerContext& ctx, const ResolvedOp&, const QuantizeAttrs&) {
  return lower_native_op(ctx, "quantize (a cast to FP8 with its amax)");
}

}  // namespace fusebox::cudnn
