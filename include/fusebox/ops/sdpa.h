// fusebox op family: scaled-dot-product attention (sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd, sdpa_fp8_bwd).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/sdpa.cpp (docs/architecture.md, "Adding an op").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fusebox {

// ---- Scaled-dot-product attention (cuDNN's fused flash attention).
//
// Tensors are logical [B, H, S, D] (bshd memory through strides):
//   q [B,Hq,Sq,D], k [B,Hk,Skv,D], v [B,Hk,Skv,Dv] (or page pools, see
//   SdpaOptions::paged), Hq % Hk == 0 (grouped-query /
//   multi-query attention: q head h reads kv head h / (Hq/Hk)).
// Score of query row i and key column j in batch b, head h:
//   s = attn_scale * q_i . k_j  [+ bias[b,h,i,j]]  [+ alibi_slope(h) * (j - i)]
// A score is kept (else it is -inf before the softmax) iff, with
//   lq  = seq_len_q[b]  (padding) or Sq,   lkv = seq_len_kv[b] (padding) or Skv,
//   off = lkv - lq when alignment is bottom-right, else 0:
//   j <  lkv                                      (padding only)
//   j <= i + off + right_bound                    (when right_bound is set; causal sets 0)
//   j >  i + off - left_bound                     (when left_bound is set: a sliding window
//                                                  of left_bound keys ending at the diagonal)
// Rows i >= lq (padding) are "don't care": no reference value, verification skips them
// (and, in backward, dk/dv rows j >= lkv).
// P = softmax(s) over kept columns; with dropout, each P element is kept with
// probability 1 - dropout and scaled by 1 / (1 - dropout) (Philox, from seed and offset).
// o = P @ v. stats = the per-row logsumexp of the kept scores in natural log
// (max + log(sum(exp(s - max)))), fp32 [B,Hq,Sq,1]: what backward needs.
enum class SdpaAlignment { kTopLeft, kBottomRight };
std::string_view sdpa_alignment_name(SdpaAlignment a);  // "top_left", "bottom_right"

struct SdpaOptions {
  std::optional<double> attn_scale;  // empty: 1/sqrt(D); resolve() fills it in
  bool causal = false;               // sets right_bound = 0 when right_bound is not given
  SdpaAlignment alignment = SdpaAlignment::kTopLeft;
  std::optional<int64_t> left_bound;   // sliding window length (>= 1)
  std::optional<int64_t> right_bound;  // >= 0; resolve() sets 0 when causal
  bool padding = false;                // inputs "seq_len_q", "seq_len_kv": int32 [B,1,1,1]
  bool bias = false;                   // input "bias": additive, [B|1, Hq|1, Sq, Skv]
  bool alibi = false;                  // ALiBi with cuDNN's slopes (alibi_slopes()); needs causal
  std::optional<double> dropout;       // probability in [0, 1); inputs "seed", "offset": int64 [1,1,1,1]
  // With dropout: also write the Bernoulli keep-mask cuDNN drew (1 kept, 0
  // dropped) as output "dropout_mask", fp32 [B,Hq,Sq,Skv] (cuDNN's RNG dump,
  // a debugging output): the references read it, so dropout can be verified.
  bool dump_dropout_mask = false;
  // Paged K/V cache (sdpa_fwd, sdpa_fp8_fwd): inputs "page_table_k" and
  // "page_table_v", int32 [B,1,max_pages,1]; k and v are then page pools
  // [num_pages, Hk, page_size, D] and [num_pages_v, Hk, page_size, Dv]. Key j of
  // sequence b is row j % page_size of page page_table[b,0,j / page_size,0] of
  // the pool. Needs padding (seq_len_kv[b] <= max_seq_len_kv). Every table entry
  // is a page of its pool, [0, num_pages), unused slots included.
  bool paged = false;
  // The logical key length Skv of a paged op (the frontend's
  // set_paged_attention_max_seq_len_kv): <= max_pages * page_size; resolve()
  // fills max_pages * page_size when not given.
  std::optional<int64_t> max_seq_len_kv;
  // Attention sinks (sdpa_fwd, sdpa_fp8_fwd; cuDNN's set_sink_token): input
  // "sink_token", fp32 [1,Hq,1,1], a learned logit per query head that joins
  // every row's softmax without a value: stats = log(exp(sink[h]) + sum over
  // kept j of exp(s_ij)), P_ij = exp(s_ij - stats) (a row sums to < 1),
  // o = P @ v. A row that keeps no key gets o = 0, stats = sink[h].
  // sdpa_bwd takes the same input (with the forward's stats, which include
  // the sink) and, with sink_grad, writes its gradient.
  bool sink = false;
  // Block-sparse attention (sdpa_fwd only; cuDNN's set_block_mask on the
  // frontend's unified SDPA node, cuDNN >= 9.14): input "block_mask", uint8
  // [B, Hq, ceil(Sq / 128), ceil(ceil(Skv / 128) / 8)], one bit per 128 x 128
  // tile of the scores: query tile r of head h of sequence b sees key tile t
  // when bit t % 8 (least significant first) of byte [b, h, r, t / 8] is 1.
  // It masks on top of every other mask (a pair is kept only if both keep it).
  bool block_mask = false;
};

// The tile of a block mask (SdpaOptions::block_mask): 128 x 128 scores.
inline constexpr int64_t kSdpaBlockTile = 128;
// The dims of the block mask of a [B, Hq, Sq, D] q and a key length Skv.
inline std::vector<int64_t> sdpa_block_mask_dims(int64_t B, int64_t Hq, int64_t Sq, int64_t Skv) {
  const int64_t key_tiles = (Skv + kSdpaBlockTile - 1) / kSdpaBlockTile;
  return {B, Hq, (Sq + kSdpaBlockTile - 1) / kSdpaBlockTile, (key_tiles + 7) / 8};
}
// Whether `byte`, the block-mask byte of query row i's tile row and key j's
// tile byte ([b, h, i / 128, j / 128 / 8]), keeps key j.
inline bool sdpa_block_keeps(unsigned byte, int64_t j) {
  return ((byte >> ((j / kSdpaBlockTile) % 8)) & 1u) != 0;
}

// The logical key length of an sdpa op whose k has dims `k_dims`: max_seq_len_kv
// when paged, else k's S.
inline int64_t sdpa_kv_length(const SdpaOptions& o, const std::vector<int64_t>& k_dims) {
  return o.paged && o.max_seq_len_kv ? *o.max_seq_len_kv : k_dims.at(2);
}

// sdpa_fwd: inputs q, k, v (bf16 or fp16) [+ the optional inputs above];
// outputs "o" [B,Hq,Sq,Dv] and, with generate_stats, "stats".
struct SdpaFwdAttrs : SdpaOptions {
  bool generate_stats = false;  // also write "stats" (training mode)
  // An FP8 K/V cache: inputs "descale_k" and "descale_v" (fp32) make k and v fp8_e4m3 while q and o
  // stay bf16 or fp16. Key j's values are k[..., j, :] * descale_k[..., j, 0] (v likewise), the
  // descale either [1,1,1,1] (one for the tensor) or k's (v's) dims with a last dim of 1 (one per
  // row of D values: per token and KV head, as the serving engine quantizes its cache). cuDNN 9.19
  // has no mixed-precision SDPA: fusebox_sdpa_decode runs one query row a sequence, the GPU
  // reference kernel anything else.
  bool fp8_kv = false;
};

// sdpa_bwd: inputs q, k, v, o, do (dL/do, like o), stats (from sdpa_fwd with
// generate_stats) [+ the optional inputs above, the same as the forward's];
// outputs "dq", "dk", "dv" shaped like q, k, v. With dropout, the same seed and
// offset as the forward regenerate its mask.
struct SdpaBwdAttrs : SdpaOptions {
  // cuDNN's deterministic backward (no atomics in dq): bit-reproducible, slower.
  bool deterministic = false;
  // Output "dsink_token", fp32 [1,Hq,1,1] (cuDNN's set_dsink_token; needs the
  // "sink_token" input): dL/dsink[h] = -sum over b, i of exp(sink[h] -
  // stats[b,h,i]) * sum_d(do * o)[b,h,i], the sink's share of each row's
  // softmax times the row's dP . P (a sink takes probability from every key).
  bool sink_grad = false;
};

// sdpa_fp8_fwd (FP8 e4m3 q, k, v; cuDNN 9.19 on Hopper: fp8 output, no bias,
// no bottom-right alignment). Extra inputs, fp32 [1,1,1,1]: descale_q,
// descale_k, descale_v, descale_s, scale_s, scale_o. Computes
//   s   = attn_scale * descale_q * descale_k * (q @ k^T), masked as above
//   P   = softmax(s);  amax_s = max(P)
//   P8  = fp8_e4m3(P * scale_s)
//   O   = descale_s * descale_v * (P8 @ v);  amax_o = max|O|
//   o   = fp8_e4m3(O * scale_o)
// Outputs "o" (fp8 e4m3) [B,Hq,Sq,Dv], "amax_s" and "amax_o" (fp32 [1,1,1,1]),
// and, with generate_stats, "stats".
struct SdpaFp8FwdAttrs : SdpaOptions {
  bool generate_stats = false;
};

// sdpa_fp8_bwd (cuDNN 9.19 on Hopper: fp8 gradients). Inputs q, k, v, o
// (fp8_e4m3), do (fp8_e4m3 or fp8_e5m2), stats (fp32, from the forward), and
// fp32 [1,1,1,1] factors descale_q, descale_k, descale_v, descale_o,
// descale_do, descale_s, descale_dp, scale_s, scale_dq, scale_dk, scale_dv,
// scale_dp (+ the optional mask inputs). Outputs dq, dk, dv (fp8, shaped
// like q, k, v) and amax_dq, amax_dk, amax_dv, amax_dp (fp32 [1,1,1,1]).
// The quantization points are cuDNN's (the frontend's SDPAFP8BackwardNode);
// the references document them.
struct SdpaFp8BwdAttrs : SdpaOptions {};

// cuDNN's ALiBi slope of each of `heads` query heads (the frontend's get_alibi_slope):
// with n the largest power of two <= heads, head h < n gets 2^(-8(h+1)/n), and the
// remaining heads get 2^(-4(2m+1)/n) for m = 0, 1, ...
std::vector<double> alibi_slopes(int64_t heads);
// Whether score (i, j) is kept under `o` (fully resolved: right_bound set for
// causal) with actual lengths lq, lkv (Sq and Skv without padding).
bool sdpa_keeps(const SdpaOptions& o, int64_t i, int64_t j, int64_t lq, int64_t lkv);
// Kept (query, key) pairs of one (batch, head): the sum over rows i < lq of the
// kept columns. For TFLOP/s, counting only unmasked elements.
double sdpa_kept_pairs(const SdpaOptions& o, int64_t lq, int64_t lkv);

}  // namespace fusebox
