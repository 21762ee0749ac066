// fusebox kernels layer (private): the quantize op's kernel (quantize.cu; the op is
// include/fusebox/ops/quantize.h).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

Result<std::shared_ptr<const NativeKernel>> make_quantize_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                                 const QuantizeAttrs& a);

}  // namespace fusebox::kernels
