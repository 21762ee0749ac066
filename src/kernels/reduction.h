// fusebox kernels layer (private): reduce_sum and reduce_mean over the outer
// dims of a dense tensor, keeping its innermost ones (reduction.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for `op`, or null when it is not that form: a sum or mean of a
// dense bf16, fp16 or fp32 x into an fp32 y, the kept dims x's innermost
// (by stride) and laid out in y in the same order, at least one dim reduced.
std::shared_ptr<const NativeKernel> make_reduce_rows_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const ReductionAttrs& a);

}  // namespace fusebox::kernels
