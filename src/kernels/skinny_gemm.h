// fusebox kernels layer (private): the few-row matmul on tensor cores (skinny_gemm.cu), the serving
// engine's decode GEMMs at batches of 16 to 64: y[M, N] = a[M, K] x w[K, N] for 9 <= M <= 64, where
// fusebox_gemv's fp32 FMAs are compute-bound and cuDNN 9.19's GEMM engines read the weights at about
// half the copy peak (the Llama-3.2-1B decode step at batch 64 on an H100: 1.64 ms of GEMMs for
// 2.47 GB of weights, 1.5 TB/s). Not yet faster than them: pinned only (below).
#pragma once

#include <memory>

#include "gemv.h"

namespace fusebox::kernels {

// The kernel for a GemvForm (gemv.h) without the RMSNorm prologue and without the gated epilogue:
// a matmul alone or with its pointwise epilogue, a and w both bf16 or both fp16, 9 <= M <= 64,
// K, N and a's and w's row strides multiples of 8; null for any other. A block takes 128 columns of
// y (8 warps of 16) for every row and one slice of K, through a 3-stage cp.async pipeline into
// shared memory and WMMA 16x16x16 products with fp32 sums. On sm_90 the K slices of a column tile
// (up to 8, enough for about 256 blocks) run as one thread-block cluster and are added in slice
// order through distributed shared memory, by the block that owns each value's share (no
// workspace, the same order every run); before sm_90 a block takes all of K. Pointers not on
// 16-byte boundaries run fusebox_gemv's loop instead. It runs only when pinned (engine
// "fusebox_skinny_gemm", faster_native_kernel's `pinned`). Measured on an H100 (2026-12-07, cuDNN 9.19, `run
// --cuda-graph`, the 1B decode GEMMs at 64 rows, weights in L2 for both sides) it took about twice cuDNN's
// best heuristic engine: QKV 17.9 us against 9.9, the output projection 19.4 against 9.5, gate 37.3
// against 16.4, up 40.0 against 21.3, down 46.1 against 22.6; the batch-64 decode step 4.33 ms
// against 3.21 with cuDNN's. Left for tuning (deeper pipelines, fewer splits), not by default.
std::shared_ptr<const NativeKernel> make_skinny_gemm_kernel(const GemvForm& f);

}  // namespace fusebox::kernels
