// fusebox kernels layer (private): layernorm and rmsnorm forward for 16-bit x
// with fp32 scale and bias (norm.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for `op` (a layernorm, or an rmsnorm when `rms`), or null when the
// graph is not the form it serves: bf16 or fp16 x and y of one dtype, fp32
// scale, bias and statistics, every tensor in memory, the normalized elements
// of a row dense and laid out alike in x, y, scale and bias, at most 16,384 of them.
std::shared_ptr<const NativeKernel> make_norm_kernel(const ResolvedGraph& g, const ResolvedOp& op, bool rms,
                                                     double epsilon);

}  // namespace fusebox::kernels
