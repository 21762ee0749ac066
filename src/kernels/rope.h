// fusebox kernels layer (private): the rope / rope_bwd kernel (rope.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

Result<std::shared_ptr<const NativeKernel>> make_rope_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                             const RopeAttrs& a);

}  // namespace fusebox::kernels
