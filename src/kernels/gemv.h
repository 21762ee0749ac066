// fusebox kernels layer (private): a matmul of a few rows (gemv.cu), the serving engine's decode
// GEMMs at small batches: y[M, N] = a[M, K] x w[K, N] for M <= 8, with an optional RMSNorm of a
// before it (the prologue) and an optional pointwise epilogue, where cuDNN 9.19's GEMM engines
// read the weights at a fraction of the bandwidth (and run no norm and matmul in one plan).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/ops/pointwise.h"
#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The epilogue: none, a unary pointwise op of the product, a binary one of the product and a
// tensor (the product its first input, or with product_second its second), or gated: the unary op
// of the product times a second product of the same rows with a second weight (w2, of w's shape):
// y = act(a w) * (a w2), a SwiGLU's gate and up projections in one pass over both weights.
enum class GemvEpi : int { kNone, kUnary, kBinary, kGated };

// A graph of the form below, matched once for every kernel that runs it (this file's and the
// few-row tensor-core matmul, skinny_gemm.h): its tensors, epilogue and row strides.
struct GemvForm {
  const ResolvedTensor *a = nullptr, *w = nullptr, *w2 = nullptr, *e = nullptr, *scale = nullptr,
                       *y = nullptr;
  const ResolvedOp* mm = nullptr;  // the (first) matmul: the messages' op
  double epsilon = 0;              // the RMSNorm prologue's (scale set)
  GemvEpi epi = GemvEpi::kNone;
  PointwiseMode mode = PointwiseMode::kAdd;
  bool product_second = false;
  int64_t m = 0, k = 0, n = 0, lda = 0, ldw = 0, lde = 0, ldy = 0;
};
std::optional<GemvForm> match_gemv_form(const ResolvedGraph& g);
// What every few-row kernel's arguments carry of a GemvForm: sizes, row strides, the output's and
// the epilogue tensor's dtypes (DType as int), the epilogue.
struct FewRowShape {
  int64_t m = 0, k = 0, n = 0, lda = 0, ldw = 0, lde = 0, ldy = 0;
  int y_dtype = 0, e_dtype = 0;
  GemvEpi epi = GemvEpi::kNone;
  PointwiseMode mode = PointwiseMode::kAdd;
  int product_second = 0;
};
FewRowShape few_row_shape(const GemvForm& f);
// Weights of K x N where fusebox's few-row kernels were measured faster than cuDNN's GEMMs: N >= 256
// and 2^20 <= K x N <= 2^26.
bool gemv_weights_in_range(int64_t k, int64_t n);
// The kernel's tensors in launch order: a, scale, w, w2, e, y (those the form has).
std::vector<std::string> gemv_tensor_names(const GemvForm& f);
std::shared_ptr<const NativeKernel> make_gemv_kernel(const GemvForm& f, bool* by_default);

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
