// fusebox: the references of sdpa_fp8_bwd (private to the reference layer).
//
// Semantics: cuDNN's per-tensor-scaled FP8 backward as the frontend composes
// it (third_party/cudnn-frontend/include/cudnn_frontend/node/sdpa_fp8_bwd.h,
// SDPAFP8BackwardNode::expand_and_infer_properties_node, the non-MXFP8 path;
// matmul_fp8.h for the three fp8 matmuls). With q8, k8, v8, o8, do8 the fp8
// inputs as stored, F = M / (1 - p) with dropout (M: the keep-mask), else 1:
//
//   Di   = rowsum(do8 * o8) * descale_do * descale_o           sdpa_fp8_bwd.h 727-748
//          (the frontend's softmax_sum is Di * (1 - p) with dropout, 784-788;
//          with its / (1 - p) at 1033-1038 that is the Di below)
//   s    = (q8 @ k8^T) * attn_scale * descale_q * descale_k      799-827
//          masked (padding, causal / windows: -inf)              837-912
//   P    = exp(s - stats)                                        917-924 (exp_S)
//   P8   = cast_q_dtype(P * F * scale_s)        [e4m3]           927-953
//   dV'  = (P8^T @ do8) * descale_s * descale_do                 993-1002; matmul_fp8.h 43-66
//          (summed over the query heads of a kv head, matmul_fp8.h 48-53)
//   amax_dv = max|dV'|,  dv = dV' * scale_dv, cast to dv's dtype matmul_fp8.h 68-78
//   dP   = (do8 @ v8^T) * descale_do * descale_v                 1006-1021
//   dS   = P * (F * dP - Di) * attn_scale                        1024-1050
//          (the fp8 frontend multiplies by 1 / (1 - p) but shows no mask on
//          dP; the bf16 node does, scaled_dot_product_flash_attention.h
//          2163-2167; we apply M as the bf16 reference does: UNVERIFIED)
//   amax_dp = max|dS|   (dS after attn_scale, before scale_dp)   1052-1055
//   dS8  = cast_do_dtype(dS * scale_dp)     [e4m3 or e5m2]       1057-1059, 1115-1118
//   dQ'  = (dS8 @ k8) * descale_dp * descale_k                   1097-1112
//   dK'  = (dS8^T @ q8) * descale_dp * descale_q  (GQA: summed)  1163-1173
//   amax_dq = max|dQ'|, amax_dk = max|dK'|; dq = dQ' * scale_dq, dk = dK' * scale_dk
//
// So every amax is taken before the output's scale (as sdpa_fp8_fwd's amax_o),
// amax_dp measures dS (not dP) after attn_scale and before scale_dp, and the
// two fp8 roundings inside the op are P (to q's dtype) and dS (to do's dtype),
// both saturating, round-to-nearest-even (cuDNN's cast mode is assumed).
// The references return dq, dk, dv as dQ' * scale_dq etc. in fp32, NOT rounded
// to the output's fp8 dtype (the comparison tolerates that rounding), like
// sdpa_fp8_fwd's "o" (O * scale_o); amax_* as above. Rows i >= seq_len_q and
// keys j >= seq_len_kv (padding) get 0. No bias, no ALiBi (cuDNN 9.19 FP8
// backward has neither): NotSupported.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"
#include "ops/sdpa_mask.h"

namespace fusebox::reference_detail {

struct SdpaFp8BwdShape {
  int64_t B = 0, Hq = 0, Hk = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
};

// The 12 fp32 factors, by their input roles.
struct SdpaFp8BwdScales {
  double descale_q = 1, descale_k = 1, descale_v = 1, descale_o = 1, descale_do = 1, descale_s = 1,
         descale_dp = 1, scale_s = 1, scale_dq = 1, scale_dk = 1, scale_dv = 1, scale_dp = 1;
};

// The input roles of the 12 factors, in SdpaFp8BwdScales order.
const std::vector<std::string>& sdpa_fp8_bwd_scale_roles();

// fp8 rounding as cuDNN's casts are assumed to do it: saturating to the
// largest finite value, round to nearest even. t: kFP8E4M3 or kFP8E5M2.
double round_to_fp8(double x, DType t);

// The CPU core. Inputs dense logical row-major floats (fp8 values widened):
// q [B,Hq,Sq,D], k [B,Hk,Skv,D], v [B,Hk,Skv,Dv], o and dout [B,Hq,Sq,Dv],
// stats [B,Hq,Sq,1], dropout_mask [B,Hq,Sq,Skv] or nullptr; lq, lkv one length
// per batch. p_dtype: q's (P8), ds_dtype: do's (dS8). Writes dq, dk, dv (dense,
// like q, k, v) and amax[4] = amax_dq, amax_dk, amax_dv, amax_dp.
struct SdpaFp8BwdCpuArgs {
  SdpaFp8BwdShape sh;
  SdpaMaskParams mask;
  double attn_scale = 1;
  SdpaFp8BwdScales sc;
  DType p_dtype = DType::kFP8E4M3, ds_dtype = DType::kFP8E4M3;
  std::vector<int64_t> lq, lkv;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr, *stats = nullptr;
  const float* dropout_mask = nullptr;
  double dropout_scale = 1;  // 1 / (1 - p)
};
void sdpa_fp8_bwd_cpu_core(const SdpaFp8BwdCpuArgs& a, float* dq, float* dk, float* dv, double amax[4]);

// Rounding ties. cuDNN computes dS and P before their fp8 casts (dS8, P8) in its own precision, not
// the reference's fp64. On an H100 (cuDNN 9.19, sweep seed 7312,
// tests/cases/wrong-values/sdpa_fp8_bwd_dS8_tie_saturating.json, run seeds 1-60), values of
// dS * scale_dp from 3.8e-5 to 2.5e-3 (relative) past an e5m2 midpoint were cast the other way
// (mostly toward zero), each moving one dq row and one dk row by a whole e5m2 step times k or q, up
// to 0.30 of the saturated max|dq|: 15 of the 60 seeds failed dq or dk so, with every other row
// as the reference has it. kFp8TieRel = 2^-8 covers the largest seen 1.5 times over.
inline constexpr double kFp8TieRel = 1.0 / 256;
// The step x's cast takes if x, off by up to rel * |x|, lands on the other side of an fp8 midpoint
// (type t, saturating): the other neighbour minus round_to_fp8(x); 0 where x lies farther than that
// from every midpoint.
double fp8_tie_other_way(double x, DType t, double rel);
// One tie: the row (query row of a key's list, key of a query row's list) and the cast's step.
struct SdpaFp8BwdTie {
  int64_t other = 0;
  double step = 0;
};
// Every tie of `a` within `rel`: by query row the dS8 ties over its keys (they move dq's row by
// step * k[key]), by key the dS8 ties over its query rows (dk's row: step * q[row]) and the P8
// ties (dv's row: step * do[row]); rows and keys are dense indices (b, h, i), (b, hk, j).
struct SdpaFp8BwdTies {
  std::vector<std::vector<SdpaFp8BwdTie>> by_row, ds_by_key, p_by_key;
};
SdpaFp8BwdTies sdpa_fp8_bwd_ties(const SdpaFp8BwdCpuArgs& a, double rel);

// The adapter the CPU reference (ops/sdpa_cpu.cpp) calls: `in` / `out` map roles to objects with
// `dims` and `data` (logical row-major floats), as its SdpaTensors hold them
// (in also "dropout_mask" with dropout). Checks shapes and lengths.
struct SdpaFp8BwdValues {
  const std::vector<int64_t>* dims = nullptr;
  const std::vector<float>* data = nullptr;
};
Status sdpa_fp8_bwd_cpu(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFp8BwdAttrs& attrs,
                        const std::map<std::string, SdpaFp8BwdValues>& in,
                        const std::map<std::string, std::vector<float>*>& out);
// The checked arguments of the core (pointers into `in`).
Result<SdpaFp8BwdCpuArgs> sdpa_fp8_bwd_cpu_args(const ResolvedGraph& g, const ResolvedOp& op,
                                                const SdpaFp8BwdAttrs& attrs,
                                                const std::map<std::string, SdpaFp8BwdValues>& in);
template <typename InMap, typename OutMap>
Status sdpa_fp8_bwd_cpu(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFp8BwdAttrs& attrs,
                        const InMap& in, const OutMap& out) {
  std::map<std::string, SdpaFp8BwdValues> i;
  std::map<std::string, std::vector<float>*> o;
  for (const auto& [role, x] : in) i[std::string(role)] = {&x->dims, &x->data};
  for (const auto& [role, x] : out) o[std::string(role)] = &x->data;
  return sdpa_fp8_bwd_cpu(g, op, attrs, i, o);
}

// ---- GPU (ops/sdpa_fp8_bwd_gpu.cu)

// One tensor as a kernel reads it: graph dtype and strides of its 4 dims;
// ptr == nullptr: the by-value `scalar`.
struct SdpaFp8BwdDevTensor {
  const void* ptr = nullptr;
  int dtype = 0;  // static_cast<int>(DType)
  int64_t strides[4] = {};
  float scalar = 0;
};

struct SdpaFp8BwdGpuArgs {
  SdpaFp8BwdShape sh;
  SdpaMaskParams mask;
  float attn_scale = 1;
  // q k v o do stats, then the 12 factors in SdpaFp8BwdScales order.
  SdpaFp8BwdDevTensor q, k, v, o, dout, stats;
  SdpaFp8BwdDevTensor scales[12];
  SdpaFp8BwdDevTensor dropout_mask;  // ptr == nullptr: no dropout
  float dropout_scale = 1;
  const int* seq_len_q = nullptr;  // int32 [B,1,1,1] with padding, else nullptr
  const int* seq_len_kv = nullptr;
  int64_t seq_len_q_stride = 0, seq_len_kv_stride = 0;
};

// Writes dq, dk, dv (dense fp32 like q, k, v) and the four amax values
// (device fp32 scalars; nullptr skips one). `stream`: a cudaStream_t.
// Without a CUDA build: NotSupported.
Status sdpa_fp8_bwd_gpu_launch(const std::string& where, const SdpaFp8BwdGpuArgs& a, float* dq, float* dk,
                               float* dv, float* amax_dq, float* amax_dk, float* amax_dv, float* amax_dp,
                               void* stream);

// The adapter the GPU reference (ops/sdpa_gpu.cu) calls, from its per-role Located inputs (`.t` a
// DevTensor with ptr, dtype, strides[], scalar) and its SdpaArgs (shape, mask,
// seq_len pointers, dropout mask, attn scale), which it has checked.
template <typename LocatedMap, typename Args>
Status sdpa_fp8_bwd_gpu(const std::string& where, const LocatedMap& in, const Args& a,
                        const std::map<std::string, float*>& out, void* stream) {
  auto dev = [](const auto& t) {
    SdpaFp8BwdDevTensor d;
    d.ptr = t.ptr, d.dtype = t.dtype, d.scalar = t.scalar;
    for (int i = 0; i < 4; ++i) d.strides[i] = t.strides[i];
    return d;
  };
  SdpaFp8BwdGpuArgs g;
  g.sh = {a.B, a.Hq, a.Hk, a.Sq, a.Skv, a.D, a.Dv};
  g.mask = a.mask;
  g.attn_scale = a.scale;
  if (a.bias.ptr || a.slopes) return NotSupported(where + "sdpa_fp8_bwd takes no bias and no ALiBi");
  g.q = dev(in.at("q").t), g.k = dev(in.at("k").t), g.v = dev(in.at("v").t);
  g.o = dev(in.at("o").t), g.dout = dev(in.at("do").t), g.stats = dev(in.at("stats").t);
  const std::vector<std::string>& roles = sdpa_fp8_bwd_scale_roles();
  for (size_t i = 0; i < roles.size(); ++i) g.scales[i] = dev(in.at(roles[i]).t);
  g.dropout_mask = dev(a.dropout_mask);
  g.dropout_scale = a.dropout_scale;
  g.seq_len_q = a.seq_len_q, g.seq_len_kv = a.seq_len_kv;
  g.seq_len_q_stride = a.seq_len_q_stride, g.seq_len_kv_stride = a.seq_len_kv_stride;
  auto o = [&](const char* r) -> float* {
    auto it = out.find(r);
    return it == out.end() ? nullptr : it->second;
  };
  return sdpa_fp8_bwd_gpu_launch(where, g, o("dq"), o("dk"), o("dv"), o("amax_dq"), o("amax_dk"),
                                 o("amax_dv"), o("amax_dp"), stream);
}

// ---- verification helpers (ops/sdpa_fp8_bwd_cpu.cpp)

// The sdpa_fp8_fwd of sdpa_fp8_bwd op `op` as a graph of its own: same q, k,
// v, mask inputs and options (no dropout), descale_q/k/v, descale_s and
// scale_s from the bwd's inputs, scale_o = 1 / descale_o (a by-value scalar,
// so that descale_o * o8 is O), generate_stats; its o and stats are the bwd's
// o (fp8 e4m3: rounded when stored) and stats tensors. `inputs` supplies
// descale_o's value.
Result<ResolvedGraph> sdpa_fp8_bwd_forward_of(const ResolvedGraph& g, const ResolvedOp& op,
                                              const std::map<std::string, HostTensor>& inputs);

}  // namespace fusebox::reference_detail
