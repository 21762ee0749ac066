// fusebox kernels layer: paged attention for decode (sdpa_decode.h). One thread block per
// (sequence, KV head) computes the softmax attention of that KV head's group of query heads
// (GQA) over the sequence's kept keys: its 8 warps take every 8th key, each warp's 32 lanes a
// row's D values (at most 8 each), the scores of the group's heads by warp reductions, an online
// softmax per warp in fp32, then the warps' partial sums combined through shared memory. Two keys
// in flight per warp (their pages looked up, K and V loaded) before either is used. With few
// sequences, each pair's keys are split among several blocks (flash-decoding): each writes its
// maxima, sums and unnormalized outputs to the workspace and decode_combine_kernel merges them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "sdpa_decode.h"

namespace fusebox::kernels {

namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32, kMaxPerLane = 8, kMaxGroup = 8;
constexpr int kMaxGroupValues = 1024;  // group heads x D: the shared-memory combine

struct DecodeArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t *lq = nullptr, *lkv = nullptr, *table_k = nullptr, *table_v = nullptr;
  void* o = nullptr;
  Strides4 qs, ks, vs, os, tks, tvs;
  int64_t lq_stride = 1, lkv_stride = 1;
  int64_t kv_heads = 0, group = 0, dim = 0, page_size = 0, max_pages_k = 0, max_pages_v = 0;
  int64_t pages_k = 0, pages_v = 0, max_kv = 0;
  int dtype = 0;
  float scale = 1.f;
  // The mask (SdpaOptions, as src/reference/ops/sdpa_mask.h applies it to row 0).
  int has_right = 0, has_left = 0, bottom_right = 0;
  int64_t right = 0, left = 0;
  // Split keys (few sequences): block (b, h, s) takes the s-th of `splits` equal parts of the kept
  // keys and writes its softmax partials to `part` (per block: kG maxima, kG sums, then kG x dim
  // unnormalized outputs); decode_combine_kernel merges them into o. 1: no split, o directly.
  int64_t splits = 1;
  float* part = nullptr;
};

// Floats of one block's partials.
__host__ __device__ inline int64_t part_floats(int64_t group, int64_t dim) { return group * (dim + 2); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Where key j of sequence b lives in a pool: its page from the table, its row in the page; -1
// when the table entry is outside the pool (then the key counts as masked).
__device__ __forceinline__ int64_t key_base(const int32_t* table, const Strides4& ts, const Strides4& ps,
                                            int64_t pages, int64_t max_pages, int64_t page_size, int64_t b,
                                            int64_t h, int64_t j) {
  const int64_t slot = j / page_size;
  if (slot >= max_pages) return -1;
  const int64_t page = table[b * ts.s[0] + slot * ts.s[2]];
  if (page < 0 || page >= pages) return -1;
  return page * ps.s[0] + h * ps.s[1] + (j % page_size) * ps.s[2];
}

// kG query heads per KV head, kPL values of a row per lane (D <= 32 kPL): compile-time sizes, so
// the per-lane arrays stay in registers (sized for the largest they took 218 registers a thread).
template <int kG, int kPL>
__global__ void __launch_bounds__(kThreads) sdpa_decode_kernel(DecodeArgs a) {
  __shared__ float sm_m[kWarps][kG], sm_l[kWarps][kG];
  __shared__ float sm_acc[kWarps][kG * 32 * kPL];
  const int64_t bh = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
  const int64_t b = bh / a.kv_heads, h = bh % a.kv_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int64_t G = kG;
  const int64_t D = a.dim;
  // Kept keys of the single query row (sdpa_kept_keys for i = 0).
  const int64_t lq = a.lq ? a.lq[b * a.lq_stride] : 1;
  int64_t lkv = a.lkv ? a.lkv[b * a.lkv_stride] : a.max_kv;
  if (lkv > a.max_kv) lkv = a.max_kv;
  int64_t lo = 0, hi = lq > 0 ? lkv - 1 : -1;
  const int64_t off = a.bottom_right ? lkv - lq : 0;
  if (a.has_right && off + a.right < hi) hi = off + a.right;
  if (a.has_left && off - a.left + 1 > lo) lo = off - a.left + 1;
  if (a.splits > 1 && hi >= lo) {  // this block's part of the kept keys
    const int64_t chunk = (hi - lo + a.splits) / a.splits, first = lo + split * chunk;
    hi = first + chunk - 1 < hi ? first + chunk - 1 : hi;
    lo = first;
  }

  // Register arrays: every loop over them runs to a constant bound (unrolled, constant
  // indices), with the group's and the row's real sizes as guards.
  float q[kG][kPL], acc[kG][kPL], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int e = 0; e < kPL; ++e) {
      const int64_t d = lane + 32 * e;
      acc[g][e] = 0.f;
      q[g][e] = d < D ? load_as_float(a.q, a.dtype, b * a.qs.s[0] + (h * G + g) * a.qs.s[1] + d * a.qs.s[3]) *
                            a.scale
                      : 0.f;
    }
  }
  for (int64_t j0 = lo + warp; j0 <= hi; j0 += 2 * kWarps) {
    float kx[2][kPL], vx[2][kPL];
    bool valid[2];
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int64_t j = j0 + t * kWarps;
      const int64_t kb =
          j <= hi ? key_base(a.table_k, a.tks, a.ks, a.pages_k, a.max_pages_k, a.page_size, b, h, j) : -1;
      const int64_t vb =
          j <= hi ? key_base(a.table_v, a.tvs, a.vs, a.pages_v, a.max_pages_v, a.page_size, b, h, j) : -1;
      valid[t] = kb >= 0 && vb >= 0;
#pragma unroll
      for (int e = 0; e < kPL; ++e) {
        const int64_t d = lane + 32 * e;
        const bool in = valid[t] && d < D;
        kx[t][e] = in ? load_as_float(a.k, a.dtype, kb + d * a.ks.s[3]) : 0.f;
        vx[t][e] = in ? load_as_float(a.v, a.dtype, vb + d * a.vs.s[3]) : 0.f;
      }
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      if (!valid[t]) continue;  // uniform across the warp: j and its pages are the warp's
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < kPL; ++e) s = fmaf(q[g][e], kx[t][e], s);  // zeros past the row
        s = warp_sum(s);
        const float m_new = fmaxf(m[g], s);
        const float corr = __expf(m[g] - m_new), p = __expf(s - m_new);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < kPL; ++e) acc[g][e] = fmaf(acc[g][e], corr, p * vx[t][e]);
        m[g] = m_new;
      }
    }
  }
  // The warps' partial softmax sums, combined.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (lane == 0) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < kPL; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < D) sm_acc[warp][g * D + d] = acc[g][e];
    }
  }
  __syncthreads();
  float* part = a.splits > 1 ? a.part + blockIdx.x * part_floats(G, D) : nullptr;
  for (int64_t idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int64_t g = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, sum = 0.f;
    if (M > -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = __expf(sm_m[w][g] - M);  // a warp that kept no key: exp(-inf) = 0
        L += sm_l[w][g] * f;
        sum += sm_acc[w][idx] * f;
      }
    }
    if (part) {  // the block's partials: its maximum and sum per head, its unnormalized outputs
      if (d == 0) {
        part[g] = M;
        part[G + g] = L;
      }
      part[2 * G + idx] = sum;
      continue;
    }
    // A row that keeps no key (or is padding) gets 0, as the reference writes it.
    store_from_float(a.o, a.dtype, b * a.os.s[0] + (h * G + g) * a.os.s[1] + d * a.os.s[3],
                     L > 0.f ? sum / L : 0.f);
  }
}

// The split blocks of one (sequence, KV head) merged, over the splits in order: o = sum_s acc_s
// e^(M_s - M) / sum_s L_s e^(M_s - M), M the largest M_s (a split that kept no key: M_s = -inf).
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(DecodeArgs a) {
  const int64_t bh = blockIdx.x, b = bh / a.kv_heads, h = bh % a.kv_heads, G = a.group, D = a.dim;
  const float* part = a.part + bh * a.splits * part_floats(G, D);
  for (int64_t idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int64_t g = idx / D, d = idx % D;
    float M = -INFINITY;
    for (int64_t s = 0; s < a.splits; ++s) M = fmaxf(M, part[s * part_floats(G, D) + g]);
    float L = 0.f, sum = 0.f;
    if (M > -INFINITY) {
      for (int64_t s = 0; s < a.splits; ++s) {
        const float* ps = part + s * part_floats(G, D);
        const float f = __expf(ps[g] - M);  // a split that kept no key: exp(-inf) = 0
        L += ps[G + g] * f;
        sum += ps[2 * G + idx] * f;
      }
    }
    store_from_float(a.o, a.dtype, b * a.os.s[0] + (h * G + g) * a.os.s[1] + d * a.os.s[3],
                     L > 0.f ? sum / L : 0.f);
  }
}

// The kernel for a group of kG heads at `per_lane` values a lane (1, 2, 4 or 8; 8 heads of more
// than 128 values are refused by the builder: the group's values are at most 1024).
template <int kG>
void launch_group(int per_lane, unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  switch (per_lane) {
    case 1:
      sdpa_decode_kernel<kG, 1><<<grid, kThreads, 0, st>>>(a);
      break;
    case 2:
      sdpa_decode_kernel<kG, 2><<<grid, kThreads, 0, st>>>(a);
      break;
    case 4:
      sdpa_decode_kernel<kG, 4><<<grid, kThreads, 0, st>>>(a);
      break;
    default:
      if constexpr (kG < 8) sdpa_decode_kernel<kG, 8><<<grid, kThreads, 0, st>>>(a);
      break;
  }
}

class SdpaDecodeKernel final : public KernelBase {
 public:
  // The split blocks' partials (none without a split).
  int64_t workspace_bytes() const override {
    return args_.splits > 1 ? blocks_ * args_.splits * part_floats(args_.group, args_.dim) * 4 : 0;
  }
  Status launch(void* const* ptrs, void* stream) const override {
    return launch_with_workspace(ptrs, nullptr, stream);
  }
  Status launch_with_workspace(void* const* ptrs, void* workspace, void* stream) const override {
    DecodeArgs a = args_;
    a.part = static_cast<float*>(workspace);
    if (a.splits > 1 && !a.part)
      return Internal(where_ + " paged decode attention with split keys needs its workspace (" +
                      std::to_string(workspace_bytes()) + " bytes)");
    a.q = ptrs[0];
    a.k = ptrs[1];
    a.v = ptrs[2];
    a.lq = static_cast<const int32_t*>(ptrs[3]);
    a.lkv = static_cast<const int32_t*>(ptrs[4]);
    a.table_k = static_cast<const int32_t*>(ptrs[5]);
    a.table_v = static_cast<const int32_t*>(ptrs[6]);
    a.o = ptrs[7];
    if (blocks_ == 0) return Status::Ok();
    const auto st = static_cast<cudaStream_t>(stream);
    const auto grid = static_cast<unsigned>(blocks_ * a.splits);
    switch (a.group) {  // the builder accepts powers of two up to 8
      case 1:
        launch_group<1>(per_lane_, grid, st, a);
        break;
      case 2:
        launch_group<2>(per_lane_, grid, st, a);
        break;
      case 4:
        launch_group<4>(per_lane_, grid, st, a);
        break;
      default:
        launch_group<8>(per_lane_, grid, st, a);
        break;
    }
    FUSEBOX_RETURN_IF_ERROR(
        common::cuda_status(cudaGetLastError(), where_, " paged decode attention kernel launch"));
    if (a.splits == 1) return Status::Ok();
    decode_combine_kernel<<<static_cast<unsigned>(blocks_), kThreads, 0, st>>>(a);
    return common::cuda_status(cudaGetLastError(), where_, " decode attention combine launch");
  }

  DecodeArgs args_;
  int64_t blocks_ = 0;
  int per_lane_ = 1;  // a power of two >= D / 32
};

}  // namespace

std::shared_ptr<const NativeKernel> make_sdpa_decode_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const SdpaFwdAttrs& a) {
  if (g.ops.size() != 1 || !a.paged || !a.padding || a.generate_stats || a.bias || a.alibi || a.dropout ||
      a.sink || a.block_mask || a.dump_dropout_mask)
    return nullptr;
  auto in = [&](const char* role) { return role_tensor(g, op.inputs, role); };
  const ResolvedTensor *q = in("q"), *k = in("k"), *v = in("v"), *lq = in("seq_len_q"),
                       *lkv = in("seq_len_kv"), *tk = in("page_table_k"), *tv = in("page_table_v");
  auto out = op.outputs.find("o");
  if (!q || !k || !v || !lq || !lkv || !tk || !tv || out == op.outputs.end() || op.outputs.size() != 1)
    return nullptr;
  const ResolvedTensor& o = g.tensors[static_cast<size_t>(out->second)];
  for (const ResolvedTensor* t : {q, k, v, lq, lkv, tk, tv, &o})
    if (t->is_virtual || t->scalar_value || t->dims.size() != 4) return nullptr;
  if ((q->dtype != DType::kBF16 && q->dtype != DType::kFP16) || k->dtype != q->dtype ||
      v->dtype != q->dtype || o.dtype != q->dtype)
    return nullptr;
  for (const ResolvedTensor* t : {lq, lkv, tk, tv})
    if (t->dtype != DType::kInt32) return nullptr;
  const int64_t B = q->dims[0], H = q->dims[1], Sq = q->dims[2], D = q->dims[3];
  const int64_t KVH = k->dims[1], P = k->dims[2];
  const int64_t group = KVH >= 1 && H % KVH == 0 ? H / KVH : 0;
  if (Sq != 1 || group < 1 || group > kMaxGroup || (group & (group - 1)) != 0 || D < 1 ||
      D > 32 * kMaxPerLane || (H / KVH) * D > kMaxGroupValues || v->dims[1] != KVH || v->dims[2] != P ||
      v->dims[3] != D || k->dims[3] != D || o.dims != std::vector<int64_t>{B, H, 1, D} ||
      tv->dims[2] != tk->dims[2] || lq->dims[0] != B || lkv->dims[0] != B || tk->dims[0] != B ||
      tv->dims[0] != B)
    return nullptr;
  auto kern = std::make_shared<SdpaDecodeKernel>();
  kern->name_ = "fusebox_sdpa_decode";
  kern->where_ = common::op_where("sdpa_fwd", op.name);
  DecodeArgs& d = kern->args_;
  d.qs = strides4(*q);
  d.ks = strides4(*k);
  d.vs = strides4(*v);
  d.os = strides4(o);
  d.tks = strides4(*tk);
  d.tvs = strides4(*tv);
  d.lq_stride = lq->strides[0];
  d.lkv_stride = lkv->strides[0];
  d.kv_heads = KVH;
  d.group = H / KVH;
  d.dim = D;
  d.page_size = P;
  d.max_pages_k = tk->dims[2];
  d.max_pages_v = tv->dims[2];
  d.pages_k = k->dims[0];
  d.pages_v = v->dims[0];
  d.max_kv = sdpa_kv_length(a, k->dims);
  d.dtype = static_cast<int>(q->dtype);
  d.scale = static_cast<float>(a.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(D))));
  d.has_right = (a.right_bound || a.causal) ? 1 : 0;
  d.right = a.right_bound.value_or(0);
  d.has_left = a.left_bound ? 1 : 0;
  d.left = a.left_bound.value_or(0);
  d.bottom_right = a.alignment == SdpaAlignment::kBottomRight ? 1 : 0;
  kern->blocks_ = B * KVH;
  // Fewer than 128 (sequence, KV head) pairs: each pair's keys split among several blocks, about 256
  // blocks in all, at least 64 keys each.
  if (B * KVH < 128) {
    const int64_t want = (256 + B * KVH - 1) / (B * KVH), most = std::max<int64_t>(1, d.max_kv / 64);
    d.splits = std::max<int64_t>(1, std::min(want, most));
    if (d.splits == 1) return nullptr;  // too few keys to split: cuDNN's engine
  }
  while (32 * kern->per_lane_ < D) kern->per_lane_ *= 2;
  kern->tensors_ = {q->name, k->name, v->name, lq->name, lkv->name, tk->name, tv->name, o.name};
  return kern;
}

}  // namespace fusebox::kernels
