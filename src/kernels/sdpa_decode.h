// fusebox kernels layer (private): paged attention for decode (sdpa_decode.cu): one query per
// sequence over its K/V pages, the serving engine's decode step at larger batches, where cuDNN
// 9.19's paged-attention engine reads the cache at a fraction of the bandwidth.
#pragma once

#include <memory>

#include "fusebox/ops/sdpa.h"
#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for `op`, or null when the graph is not the form it serves: an sdpa_fwd alone with
// paged K and V (padding lengths), one query per sequence (Sq = 1), no stats, bias, ALiBi,
// dropout, sink or block mask; q, k, v and o bf16 or fp16 alike (or, with an FP8 cache
// (SdpaFwdAttrs::fp8_kv), k and v e4m3 times their descales, one a tensor or one a row) with Dv = D <= 256
// and at most 8 query heads per KV head (at most 1024 values of a group's rows). A (sequence, KV head)
// pair's keys go to blocks of a fixed chunk (at least 128 keys, at most 32 chunks for the pool's
// longest sequence), their softmax partials in the plan's workspace, merged by a second kernel; a
// pool of one chunk needs no workspace. The chunks depend on the pool only: a sequence's result is
// the same at any batch size. D 64 with pages of a multiple of 16 keys and 16-byte aligned
// rows runs on tensor cores (sdpa_decode_mma_kernel), other shapes on CUDA cores.
std::shared_ptr<const NativeKernel> make_sdpa_decode_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const SdpaFwdAttrs& a);

}  // namespace fusebox::kernels
