// fusebox kernels layer (private): the softmax cross-entropy kernels (cross_entropy.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

Result<std::shared_ptr<const NativeKernel>> make_cross_entropy_kernel(const ResolvedGraph& g,
                                                                      const ResolvedOp& op,
                                                                      const CrossEntropyAttrs& a);

}  // namespace fusebox::kernels
