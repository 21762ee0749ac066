// fusebox serving (private): the graphs of one model step, declared once for both backends (the
// reference engine runs them on the CPU reference, the GPU engine builds a plan of each through a
// Session). Every graph is bf16 in and out with fp32 accumulation, as the training forward's
// stages (src/train/lm_pipeline.cpp), over N = B x S rows of new tokens.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/serve.h"
#include "fusebox/status.h"
#include "fusebox/train.h"

namespace fusebox::serve {

// A graph's key (its shape: equal keys are equal graphs) and its resolved form.
struct LmGraph {
  std::string key;
  ResolvedGraph graph;
};

enum class Epilogue { kNone, kResidual, kSilu, kMul };

// y [1, n, p] = a [1, n, k] @ w [1, k, p], then by `e`: + r (kResidual), silu (kSilu), g * (kMul);
// y is fp32 when `fp32_out` (the logits), bf16 otherwise. With `fp8` (FP8 weights), a and w are
// e4m3 (w column-major: each output channel's k values contiguous) and the product is descaled
// before the epilogue by sa [1, n, 1] (a's per-token scales) and sw [1, 1, p] (w's per-channel
// scales), both fp32 (kernels/quantize.h).
Result<LmGraph> gemm_graph(int64_t n, int64_t k, int64_t p, Epilogue e, bool fp32_out = false,
                           bool fp8 = false);
// The same in bf16 with the RMSNorm before it: y = epilogue(rmsnorm(x) @ w), x [1, n, k] bf16, its
// gain scale [1, 1, k] fp32, the normalized rows virtual (fp32, never stored). For the GPU engine's
// decode buckets of at most 8 rows, which fusebox's few-row matmul runs as one kernel
// (kernels/gemv.h); cuDNN would run it as two plans.
Result<LmGraph> normed_gemm_graph(const LmModelConfig& m, int64_t n, int64_t k, int64_t p, Epilogue e,
                                  bool fp32_out = false);
// y [1, n, p] = silu(rmsnorm(x) @ w_gate) * (rmsnorm(x) @ w_up): a SwiGLU's gate and up projections
// of one normalized x in one graph (x [1, n, k] bf16, scale [1, 1, k] fp32, both weights [1, k, p]),
// which fusebox's few-row matmul runs as one pass over both weights (its gated form) in the decode
// buckets; cuDNN would run it in parts.
Result<LmGraph> normed_swiglu_graph(const LmModelConfig& m, int64_t n, int64_t k, int64_t p);
// A weight matrix w [k, p] (row-major, the checkpoint's) in FP8: q [p][k] e4m3 (w column-major)
// and scale [p] (per output channel, or one value repeated with `per_tensor`), w ~= q * scale.
struct Fp8Weight {
  std::vector<uint8_t> q;
  std::vector<float> scale;
};
Fp8Weight quantize_weight(const std::vector<float>& w, int64_t k, int64_t p, bool per_tensor);
// Whether the engine's `weights` option stores parameter `name` in FP8 (the layers' matrices).
bool fp8_matrix(ServeWeights weights, const LmParameter& param);

// y [n, dim] = rmsnorm(x) * scale (fp32 scale), rows as [n, dim, 1, 1] NHWC.
Result<LmGraph> rmsnorm_graph(const LmModelConfig& m, int64_t n);
// y = RoPE(x) at each sequence's offset: x and y [B, H, S, head_dim] in "bshd" memory (the rows of
// a projection), freqs [1, 1, freq_rows, head_dim / 2] fp32, offset [B, 1, 1, 1] int32. With
// `x_row` > 0, x's rows are x_row elements apart (the first H heads of the fused QKV
// projection's rows); y stays dense.
Result<LmGraph> rope_graph(const LmModelConfig& m, int64_t B, int64_t H, int64_t S, int64_t freq_rows,
                           int64_t x_row = 0);
// Paged causal attention (bottom-right aligned) of B sequences of S new queries: q and o
// [B, heads, S, head_dim] "bshd", k and v pools [pool_pages, kv_heads, page_size, head_dim], one
// page table [B, 1, max_pages, 1] for both, seq_len_q "lq" and seq_len_kv "lkv" [B, 1, 1, 1].
// With `q_row` > 0, q's rows are q_row elements apart (the rotated queries beside the keys).
// `fp8_kv`: an FP8 cache (EngineOptions::fp8_kv): e4m3 pools and their descales "dk", "dv"
// [pool_pages, kv_heads, page_size, 1] fp32, one a row.
Result<LmGraph> attention_graph(const LmModelConfig& m, int64_t B, int64_t S, int64_t max_pages,
                                int64_t pool_pages, int64_t page_size, int64_t q_row = 0,
                                bool fp8_kv = false);

// The fused Q/K/V projection: the layer's wq, wk and wv side by side ([dim, (heads + 2 kv_heads)
// x head_dim], one GEMM), under this name beside them.
std::string qkv_name(int64_t layer);
// The parameters the engine holds: lm_parameters() with each layer's wq, wk, wv replaced by its
// wqkv ([dim, (heads + 2 kv_heads) x head_dim]); `weights` (the checkpoint's, by name) gets the
// fused matrices in place of the three.
std::vector<LmParameter> serve_parameters(const LmModelConfig& m);
void fuse_qkv(const LmModelConfig& m, std::map<std::string, std::vector<float>>* weights);
// y [n, dim] bf16 = rows `ids` [n] (int32) of the fp32 table [vocab, dim].
Result<LmGraph> embedding_graph(const LmModelConfig& m, int64_t n);

}  // namespace fusebox::serve
