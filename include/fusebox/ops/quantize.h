// fusebox op family: quantize (a cast to FP8 with a per-tensor scale, and the input's amax), one
// of the op families of OpAttrs (fusebox/graph.h); its graph-layer definition is
// src/graph/ops/quantize.cpp (docs/architecture.md, "Adding an op"). FP8 training's cast
// (docs/training.md, "FP8"): what Transformer Engine calls cast(-transpose) with amax.
//
//   x      [...] bf16, fp16 or fp32, any strides
//   scale  fp32, one element ([1, ...] of x's rank or a by-value scalar): the delayed scale
//   y      x's dims, fp8_e4m3 (the default) or fp8_e5m2, in its own layout (dense row-major
//          unless declared): declaring y's strides writes a transposed copy, e.g. the K-major
//          operand an FP8 GEMM on Hopper reads
//   amax   fp32 [1, ...] of x's rank, optional: max |x| over the whole tensor (of x, not of
//          x * scale: the amax history of delayed scaling records it)
//   y2     optional: the same values as y in a layout of its own (y's dims and dtype): one read of
//          x for two copies, e.g. a gradient's row-major copy for its dgrad GEMM and its transposed
//          copy for its wgrad GEMM (Transformer Engine's cast-transpose)
// y = fp8(x * scale): the product in fp32, rounded to nearest even and saturated to the format's
// largest finite value (448 for e4m3, 57344 for e5m2); NaN stays NaN. It has no cuDNN op in 9.19:
// fusebox's kernel runs it, alone in its graph (a pipeline stage of its own), or after the
// compiled pointwise form that computes x in the same graph (the gated MLP's product or its
// backward, a sum: one kernel, fusebox_pointwise_quantize; x may then be virtual, and is quantized
// from its fp32 value).
#pragma once

namespace fusebox {

struct QuantizeAttrs {
  bool amax = false;  // the optional output `amax` is declared
  bool y2 = false;    // the optional output `y2` is declared
};

}  // namespace fusebox
