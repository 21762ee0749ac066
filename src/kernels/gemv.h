// fusebox kernels layer (private): a matmul of a few rows (gemv.cu), the serving engine's decode
// GEMMs at small batches: y[M, N] = a[M, K] x w[K, N] for M <= 8, with an optional RMSNorm of a
// before it (the prologue) and an optional pointwise epilogue, where cuDNN 9.19's GEMM engines
// read the weights at a fraction of the bandwidth (and run no norm and matmul in one plan).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for `g`, or null when `g` is not the form it serves: a matmul, optionally after an
// inference rmsnorm of a over its last dim (no bias; its output virtual and the matmul's a), alone
// or with its product (virtual, fp32) feeding one pointwise op (add, sub or mul with a tensor of
// y's dims, or relu, silu, sigmoid, tanh, gelu_tanh, gelu_erf), or gated: two matmuls of the same a
// (weights of one shape and layout), the unary op of the first product times the second product
// (a SwiGLU's gate and up projections: one pass over both weights), with fp32 intermediates and
// compute; a and w both bf16 or both fp16, every batch dim 1, M <= 8, N >= 256 and
// 2^20 <= K x N <= 2^26 (smaller weights leave the GPU idle either way, and K is not split across
// blocks; cuDNN reads larger ones near the copy peak), a's K and every N dim of stride 1; y (and
// the epilogue's tensor) bf16, fp16 or fp32. `*by_default` says whether it is that form; up to 256
// rows and weights of any size it runs too, pinned (engine "fusebox_gemv"), for a row's values that
// do not depend on the batch (the serving engine's deterministic mode), `*by_default` false.
std::shared_ptr<const NativeKernel> make_gemv_kernel(const ResolvedGraph& g, bool* by_default);

}  // namespace fusebox::kernels
