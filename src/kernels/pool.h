// fusebox kernels layer (private): the global average pool (pool.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for a global average pool `op` (global_avg_pool, or an avg_pool
// whose window is x's whole spatial extent with no padding), or null when `op`
// is not one, or a tensor is virtual.
std::shared_ptr<const NativeKernel> make_global_avg_pool_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                                const PoolAttrs& a);

// The kernel for a max_pool or avg_pool `op` of rank 4 or 5 with any window,
// stride and padding (bf16, fp16, fp32), or null when a tensor is virtual.
std::shared_ptr<const NativeKernel> make_window_pool_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const PoolAttrs& a);

}  // namespace fusebox::kernels
