// fusebox kernels layer: paged attention for decode (sdpa_decode.h). A (sequence, KV head) pair's
// kept keys are cut into chunks of a fixed length that depends only on the pool (its longest
// sequence), one thread block per chunk (flash-decoding): each block writes its softmax partials
// (maxima, sums, unnormalized outputs) to the workspace and decode_combine_kernel merges the chunks
// in order. A pool of one chunk writes o directly. Within a block, kL lanes share a key (8 values
// of its row each, one 16-byte load where the layout allows), so a key's score takes log2(kL)
// shuffles; the block's 128 / kL key slots take every (128 / kL)-th key, two keys in flight each,
// with an online softmax per slot in fp32; the slots meet in shared memory in a fixed order. A
// sequence's result therefore depends on its own keys only, never on the batch it runs in.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "packed16.cuh"
#include "sdpa_decode.h"

namespace fusebox::kernels {

namespace {

constexpr int kThreads = 128, kMaxGroup = 8, kMaxDim = 256;
constexpr int kMaxGroupValues = 1024;  // group heads x D: the combine kernel's rows
// Chunks of at least 128 keys (a round of the tensor-core kernel's 4 warps of two 16-key tiles), at
// most 32 a sequence: the workspace stays within 32 chunks' partials a pair whatever the context,
// and batch 1 at 2048 tokens still gets 8 x 16 blocks.
constexpr int64_t kMinChunk = 128, kMaxChunks = 32;
// Keys in flight a slot, and the page-table entries a block stages in shared memory (a chunk of
// more pages reads the table key by key).
constexpr int kT = 4, kStagedPages = 64;

struct DecodeArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t *lq = nullptr, *lkv = nullptr, *table_k = nullptr, *table_v = nullptr;
  const float *dk = nullptr, *dv = nullptr;  // an FP8 cache's descales (fp8_kv), else null
  void* o = nullptr;
  Strides4 qs, ks, vs, os, tks, tvs, dks, dvs;  // dks, dvs: 0 where a descale is one for the tensor
  int64_t lq_stride = 1, lkv_stride = 1;
  int64_t kv_heads = 0, group = 0, dim = 0, page_size = 0, max_pages_k = 0, max_pages_v = 0;
  int64_t pages_k = 0, pages_v = 0, max_kv = 0;
  int64_t rows = 1;      // query rows a sequence (Sq): a block per (sequence, row tile, KV head, chunk)
  int64_t row_tile = 1;  // query rows a block (the tensor-core kernel's prompts: 16 / group)
  int64_t chunk = 0;     // keys a block (the kept keys from the first on)
  int dtype = 0;
  float scale = 1.f;
  // The mask (SdpaOptions, as src/reference/ops/sdpa_mask.h applies it to row 0).
  int has_right = 0, has_left = 0, bottom_right = 0;
  int64_t right = 0, left = 0;
  // Block (b, h, s) takes keys [s chunk, (s + 1) chunk) of the kept ones and writes its softmax
  // partials to `part` (per block: group maxima, group sums, then group x dim unnormalized
  // outputs); decode_combine_kernel merges them into o. splits 1: o directly.
  int64_t splits = 1;
  float* part = nullptr;
};

// Floats of one block's partials.
__host__ __device__ inline int64_t part_floats(int64_t group, int64_t dim) { return group * (dim + 2); }

// The page of table slot `slot` of sequence b, or -1 when the slot or its entry is outside the pool.
__device__ __forceinline__ int64_t page_of(const int32_t* table, const Strides4& ts, int64_t pages,
                                           int64_t max_pages, int64_t b, int64_t slot) {
  if (slot >= max_pages) return -1;
  const int64_t page = table[b * ts.s[0] + slot * ts.s[2]];
  return page < 0 || page >= pages ? -1 : page;
}
// Where row r of KV head h of a page lives, -1 for no page.
__device__ __forceinline__ int64_t row_base(int64_t page, const Strides4& ps, int64_t h, int64_t r) {
  return page < 0 ? -1 : page * ps.s[0] + h * ps.s[1] + r * ps.s[2];
}
// 8 values of a K or V row from `base` + `off` (elements): 16-bit ones (load8), or with kFp8 8 bytes
// of e4m3 in the low half (one 8-byte load with kVec).
template <bool kFp8, bool kVec>
__device__ __forceinline__ uint4 load_kv(const void* base, int64_t off, int64_t count, int64_t stride) {
  if constexpr (kFp8) {
    const auto* p = static_cast<const uint8_t*>(base) + off;
    if constexpr (kVec) {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
      return make_uint4(u.x, u.y, 0, 0);
    } else {
      uint32_t w[2] = {0u, 0u};
      for (int i = 0; i < 8; ++i)
        if (i < count) w[i / 4] |= static_cast<uint32_t>(p[i * stride]) << (8 * (i % 4));
      return make_uint4(w[0], w[1], 0, 0);
    }
  } else {
    return load8<kVec>(static_cast<const uint16_t*>(base) + off, count, stride);
  }
}
// Value e (0-7) of what load_kv loaded.
template <bool kFp8, bool kHalf>
__device__ __forceinline__ float kv_value(const uint4& u, int e) {
  if constexpr (kFp8) {
    const auto byte = static_cast<__nv_fp8_storage_t>(((e < 4 ? u.x : u.y) >> (8 * (e % 4))) & 0xffu);
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(byte, __NV_E4M3)));
  } else {
    return value<kHalf>(u, e);
  }
}

// Where block `block` of the main kernels (or the combine kernel's, with splits 1) works: sequence b,
// query rows [i, i + row_tile), KV head h, chunk `split`.
struct BlockPos {
  int64_t b = 0, i = 0, h = 0, split = 0;
};
__device__ __forceinline__ BlockPos block_pos(const DecodeArgs& a, int64_t block, int64_t splits) {
  BlockPos p;
  const int64_t pair = block / splits;
  p.split = block % splits;
  p.h = pair % a.kv_heads;
  const int64_t tiles = (a.rows + a.row_tile - 1) / a.row_tile;
  p.i = pair / a.kv_heads % tiles * a.row_tile;
  p.b = pair / a.kv_heads / tiles;
  return p;
}

// Sequence b's query row i's keys [lo, hi] (sdpa_kept_keys; empty past the rows), cut to chunk
// `split`'s of them (empty past their end).
__device__ __forceinline__ void kept_keys(const DecodeArgs& a, int64_t b, int64_t i, int64_t split,
                                          int64_t& lo, int64_t& hi) {
  const int64_t lq = a.lq ? a.lq[b * a.lq_stride] : a.rows;
  int64_t lkv = a.lkv ? a.lkv[b * a.lkv_stride] : a.max_kv;
  if (lkv > a.max_kv) lkv = a.max_kv;
  lo = 0;
  hi = i < lq && i < a.rows ? lkv - 1 : -1;
  const int64_t off = a.bottom_right ? lkv - lq : 0;
  if (a.has_right && i + off + a.right < hi) hi = i + off + a.right;
  if (a.has_left && i + off - a.left + 1 > lo) lo = i + off - a.left + 1;
  if (a.splits > 1) {
    lo += split * a.chunk;
    if (lo + a.chunk - 1 < hi) hi = lo + a.chunk - 1;
  }
}
__device__ __forceinline__ void kept_keys(const DecodeArgs& a, const BlockPos& p, int64_t& lo, int64_t& hi) {
  kept_keys(a, p.b, p.i, p.split, lo, hi);
}
// Where head `head`'s value d of block p's query row p.i + di lives in q or o.
__device__ __forceinline__ int64_t row_at(const Strides4& s, const BlockPos& p, int64_t head, int64_t d,
                                          int64_t di = 0) {
  return p.b * s.s[0] + head * s.s[1] + (p.i + di) * s.s[2] + d * s.s[3];
}

// A block's slots merged in slot order (each slot's maximum m, sum l and unnormalized outputs acc, the
// maxima in the natural-log domain), written as the block's partials (split keys) or to o. The
// block's m_rows rows: row r is query row p.i + r / group's head r % group.
template <class MOf, class LOf, class AccOf>
__device__ __forceinline__ void finish_block(const DecodeArgs& a, const BlockPos& p, int slots,
                                             int64_t m_rows, MOf m_of, LOf l_of, AccOf acc_of) {
  const int64_t G = a.group, D = a.dim;
  float* part = a.splits > 1 ? a.part + blockIdx.x * part_floats(G, D) : nullptr;  // m_rows = G
  for (int64_t idx = threadIdx.x; idx < m_rows * D; idx += blockDim.x) {
    const int64_t r = idx / D, d = idx % D;
    if (p.i + r / G >= a.rows) break;  // past the last query row (rows in order)
    float M = -INFINITY;
    for (int s = 0; s < slots; ++s) M = fmaxf(M, m_of(s, r));
    float L = 0.f, sum = 0.f;
    if (M > -INFINITY) {
      for (int s = 0; s < slots; ++s) {
        const float f = __expf(m_of(s, r) - M);  // a slot that kept no key: exp(-inf) = 0
        L += l_of(s, r) * f;
        sum += acc_of(s, r, d) * f;
      }
    }
    if (part) {  // the block's partials: its maximum and sum per head, its unnormalized outputs
      if (d == 0) {
        part[r] = M;
        part[G + r] = L;
      }
      part[2 * G + idx] = sum;
      continue;
    }
    // A row that keeps no key (or is padding) gets 0, as the reference writes it.
    store_from_float(a.o, a.dtype, row_at(a.os, p, p.h * G + r % G, d, r / G), L > 0.f ? sum / L : 0.f);
  }
}

// kG query heads per KV head, kL lanes a key (8 values of a row each: D <= 8 kL), 16-bit q and o
// (kHalf: fp16, else bf16), K and V of q's dtype or with kFp8 e4m3 times their descales, kVec:
// 16-byte loads (8-byte ones of fp8 rows). The per-thread arrays have constant sizes, so they stay
// in registers.
template <int kG, int kL, bool kHalf, bool kVec, bool kFp8>
__global__ void __launch_bounds__(kThreads) sdpa_decode_kernel(DecodeArgs a) {
  constexpr int kSlots = kThreads / kL, kRow = 8 * kL;
  __shared__ float sm_m[kSlots][kG], sm_l[kSlots][kG];
  __shared__ int64_t sm_page_k[kStagedPages], sm_page_v[kStagedPages];
  __shared__ float sm_acc[kSlots * kG * kRow];  // 1024 kG floats
  const BlockPos pos = block_pos(a, blockIdx.x, a.splits);
  const int64_t b = pos.b, h = pos.h;
  const int slot = threadIdx.x / kL, part_lane = threadIdx.x % kL;
  constexpr int64_t G = kG;
  const int64_t D = a.dim, d0 = 8 * part_lane;
  const int64_t dn = D - d0 < 0 ? 0 : (D - d0 < 8 ? D - d0 : 8);  // this lane's values of a row
  int64_t lo = 0, hi = -1;
  kept_keys(a, pos, lo, hi);

  const auto* qp = static_cast<const uint16_t*>(a.q);
  float q[kG][8], acc[kG][8], m[kG], l[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
    const uint4 u =
        dn > 0 ? load8<kVec>(qp + row_at(a.qs, pos, h * G + g, d0), dn, a.qs.s[3]) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      acc[g][e] = 0.f;
      q[g][e] = value<kHalf>(u, e) * a.scale;
    }
  }
  // The chunk's page-table entries, staged in shared memory where they fit: one round of loads,
  // then no key waits for its page's entry.
  const int64_t first_slot = lo / a.page_size;
  const int64_t n_slots = hi >= lo ? hi / a.page_size - first_slot + 1 : 0;
  const bool staged = n_slots <= kStagedPages;
  if (staged) {
    for (int64_t i = threadIdx.x; i < n_slots; i += kThreads) {
      sm_page_k[i] = page_of(a.table_k, a.tks, a.pages_k, a.max_pages_k, b, first_slot + i);
      sm_page_v[i] = page_of(a.table_v, a.tvs, a.pages_v, a.max_pages_v, b, first_slot + i);
    }
    __syncthreads();
  }
  // Every thread takes the same number of turns (the shuffles need the whole warp): a slot past
  // the last key scores nothing. A slot takes its keys in increasing order, kT at a time.
  for (int64_t j0 = lo; j0 <= hi; j0 += kT * kSlots) {
    uint4 kx[kT], vx[kT];
    float ksc[kT], vsc[kT];  // the keys' descales (kFp8)
    bool valid[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int64_t j = j0 + slot + t * kSlots;
      // The key's pages (-1: none, or a table entry outside the pool: the key counts as masked) and
      // its row in them. 32-bit division: the builder keeps keys and pages under 2^31.
      int64_t pk = -1, pv = -1, r = 0;
      if (j <= hi) {
        const auto jj = static_cast<uint32_t>(j), ps32 = static_cast<uint32_t>(a.page_size);
        const int64_t slot_j = jj / ps32;
        r = j - slot_j * a.page_size;
        pk = staged ? sm_page_k[slot_j - first_slot]
                    : page_of(a.table_k, a.tks, a.pages_k, a.max_pages_k, b, slot_j);
        pv = staged ? sm_page_v[slot_j - first_slot]
                    : page_of(a.table_v, a.tvs, a.pages_v, a.max_pages_v, b, slot_j);
      }
      const int64_t kb = row_base(pk, a.ks, h, r), vb = row_base(pv, a.vs, h, r);
      valid[t] = kb >= 0 && vb >= 0;
      const bool in = valid[t] && dn > 0;
      kx[t] = in ? load_kv<kFp8, kVec>(a.k, kb + d0 * a.ks.s[3], dn, a.ks.s[3]) : make_uint4(0, 0, 0, 0);
      vx[t] = in ? load_kv<kFp8, kVec>(a.v, vb + d0 * a.vs.s[3], dn, a.vs.s[3]) : make_uint4(0, 0, 0, 0);
      if constexpr (kFp8) {
        ksc[t] = valid[t] ? a.dk[row_base(pk, a.dks, h, r)] : 0.f;
        vsc[t] = valid[t] ? a.dv[row_base(pv, a.dvs, h, r)] : 0.f;
      }
    }
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      float kf[8], vf[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        kf[e] = kv_value<kFp8, kHalf>(kx[t], e);
        vf[e] = kv_value<kFp8, kHalf>(vx[t], e);
        if constexpr (kFp8) {
          kf[e] *= ksc[t];
          vf[e] *= vsc[t];
        }
      }
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(q[g][e], kf[e], s);  // zeros past the row
#pragma unroll
        for (int o = kL / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (!valid[t]) continue;  // the key's kL lanes alike; no shuffle follows
        const float m_new = fmaxf(m[g], s);
        const float corr = __expf(m[g] - m_new), p = __expf(s - m_new);  // exp(-inf) = 0
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(acc[g][e], corr, p * vf[e]);
        m[g] = m_new;
      }
    }
  }
  // The slots' partial softmax sums, combined in slot order.
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    if (part_lane == 0) {
      sm_m[slot][g] = m[g];
      sm_l[slot][g] = l[g];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sm_acc[(slot * kG + g) * kRow + d0 + e] = acc[g][e];
  }
  __syncthreads();
  finish_block(
      a, pos, kSlots, kG, [&](int s, int64_t g) { return sm_m[s][g]; },
      [&](int s, int64_t g) { return sm_l[s][g]; },
      [&](int s, int64_t g, int64_t d) { return sm_acc[(s * kG + g) * kRow + d]; });
}

// The tensor-core form (sdpa_decode_mma_kernel): one warp's scores of 16 keys for the group's (up to
// 8) query heads as S = Q K^T, m16n8k16 MMAs (heads the rows, rows 8-15 zero; keys the columns, two
// n8 tiles), then O += P V with P straight from S's accumulators. K and V go from global memory to
// the operand registers without shared memory: a dot product's order over D is free, so each lane
// loads a contiguous piece of a key's row (16 bytes) and the same piece of q, and V's 8-dim tiles
// take every (D / 8)-th dim, so a lane's dims of a row are contiguous too.
template <bool kF16>
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  if constexpr (kF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// Two floats as one register of 16-bit operands (lo in the low half): fp16 (kF16) or bf16.
template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}
// Two e4m3 values (the low 16 bits of w) as two fp16 ones (exact: e4m3 lies inside fp16).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t w) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(r.x) | static_cast<uint32_t>(r.y) << 16;
}
template <int kN>
__device__ __forceinline__ void load_words(uint32_t (&w)[kN], const void* p, bool in) {
  static_assert(kN == 2 || kN % 4 == 0, "8 or 16n bytes");
  if constexpr (kN == 2) {
    const uint2 u = in ? __ldg(static_cast<const uint2*>(p)) : make_uint2(0, 0);
    w[0] = u.x;
    w[1] = u.y;
  } else {
#pragma unroll
    for (int i = 0; i < kN / 4; ++i) {
      const uint4 u = in ? __ldg(static_cast<const uint4*>(p) + i) : make_uint4(0, 0, 0, 0);
      w[4 * i] = u.x;
      w[4 * i + 1] = u.y;
      w[4 * i + 2] = u.z;
      w[4 * i + 3] = u.w;
    }
  }
}

// kD a multiple of 64 (64 is the one instantiated: at 128 the kernel measured slower than the CUDA-core
// one, the builder's mma_shapes_); q and o 16-bit (kHalf: fp16, else bf16); K and V of q's dtype, or
// with kFp8 e4m3 times their descales. The MMAs take bf16 for bf16 K and V, fp16 otherwise: an FP8 cache's
// values are exact in fp16, q is scaled by a power of two per row into fp16's range (its largest value to
// [2^14, 2^15)), and P by the descale of V's row over the tile's largest magnitude (at most 1 in magnitude:
// a descale may be negative), that largest applied to the tile's product in fp32. Needs 16-key tiles inside
// one page (page size a multiple of 16), 16-byte aligned rows. The A operand's 16 rows: without kMulti the
// group's heads of one query row (rows past the group zero), with kMulti (prompts) a.row_tile = 16 / group
// query rows of them, row r being query row p.i + r / group's head r % group, each row masked by its own
// kept keys.
template <int kD, bool kHalf, bool kFp8, bool kMulti>
__global__ void __launch_bounds__(kThreads) sdpa_decode_mma_kernel(DecodeArgs a) {
  constexpr int kWarps = kThreads / 32, kSteps = kD / 16, kTiles = kD / 8;
  constexpr bool kF16 = kHalf || kFp8;
  constexpr int kKWords = kFp8 ? kD / 16 : kD / 8;   // a lane's words of a K row
  constexpr int kVWords = kFp8 ? kD / 32 : kD / 16;  // a lane's words of a V row: kTiles values
  static_assert(kD % 64 == 0, "whole 64-value pieces of a row (the FP8 loads)");
  constexpr int kNT = 2;                          // 16-key tiles a warp loads at once
  constexpr int kR = kMulti ? 2 : 1;              // A rows a lane holds: g, and g + 8 with kMulti
  constexpr int kRows = kMulti ? 16 : kMaxGroup;  // A rows the block merges
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ float sm_m[kWarps][kRows], sm_l[kWarps][kRows];
  __shared__ float sm_acc[kWarps][kRows][kD];
  const BlockPos pos = block_pos(a, blockIdx.x, a.splits);
  const int64_t b = pos.b, h = pos.h, G = a.group;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // the MMA's group (a row of A and C, a key or dim of B) and thread
  // The block's keys: the union of its rows' (the loop's bounds, alike in every lane), and each of
  // this lane's rows' own.
  int64_t lo = 0, hi = -1, rlo[kR], rhi[kR], rdi[kR], rhead[kR];
  bool rin[kR];
  if constexpr (kMulti) {
    lo = INT64_MAX;
    for (int64_t di = 0; di < a.row_tile; ++di) {
      int64_t l0, h0;
      kept_keys(a, pos.b, pos.i + di, pos.split, l0, h0);
      if (l0 <= h0) {
        lo = l0 < lo ? l0 : lo;
        hi = h0 > hi ? h0 : hi;
      }
    }
    if (lo > hi) lo = 0;
  } else {
    kept_keys(a, pos, lo, hi);
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const int mr = g + 8 * r;
    rdi[r] = kMulti ? mr / G : 0;
    rhead[r] = kMulti ? mr % G : mr;
    rin[r] = kMulti ? rdi[r] < a.row_tile && pos.i + rdi[r] < a.rows : mr < G;
    rlo[r] = lo;
    rhi[r] = rin[r] ? hi : -1;
    if (kMulti && rin[r]) kept_keys(a, pos.b, pos.i + rdi[r], pos.split, rlo[r], rhi[r]);
  }

  // q as A operands (the same pieces of each row as the K loads below): qa[s][r] = {cols 2t, 2t + 8}.
  uint32_t qa[kSteps][kR][2];
  float qscale[kR];  // scores in the log2 domain
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    qscale[r] = a.scale * kLog2e;
    const auto* qrow = static_cast<const uint16_t*>(a.q) + row_at(a.qs, pos, h * G + rhead[r], 0, rdi[r]);
    const bool in = rin[r];
    if constexpr (!kFp8) {
#pragma unroll
      for (int i = 0; i < kD / 32; ++i) {
        uint32_t w[4];
        load_words(w, qrow + 32 * i + 8 * t, in);
        qa[2 * i][r][0] = w[0];
        qa[2 * i][r][1] = w[1];
        qa[2 * i + 1][r][0] = w[2];
        qa[2 * i + 1][r][1] = w[3];
      }
    } else {
      float v[kD / 4];
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kD / 64; ++i) {
        uint32_t w[8];
        load_words(w, qrow + 64 * i + 16 * t, in);
#pragma unroll
        for (int e = 0; e < 16; ++e) {
          v[16 * i + e] = bits_to_float<kHalf>(e % 2 ? w[e / 2] >> 16 : w[e / 2] & 0xffffu);
          amax = fmaxf(amax, fabsf(v[16 * i + e]));
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      int e2 = 0;
      if (amax > 0.f && amax <= 3.0e38f) {
        frexpf(amax, &e2);  // amax < 2^e2
        e2 = 15 - e2;
        e2 = e2 > 100 ? 100 : e2;
      }
      const float up = ldexpf(1.f, e2);
      qscale[r] = ldexpf(qscale[r], -e2);
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        const int e = 16 * (s / 4) + 4 * (s % 4);
        qa[s][r][0] = pack2<true>(v[e] * up, v[e + 1] * up);
        qa[s][r][1] = pack2<true>(v[e + 2] * up, v[e + 3] * up);
      }
    }
  }
  auto a_row1 = [&](int s, int c) { return kMulti ? qa[s][kR - 1][c] : 0u; };  // A rows g + 8

  float m[kR], l[kR];  // each row's running maximum (log2 domain) and this lane's share of its sum
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
  }
  float acc[kTiles][4];
#pragma unroll
  for (int i = 0; i < kTiles; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
  const auto* kbase = static_cast<const uint8_t*>(a.k);
  const auto* vbase = static_cast<const uint8_t*>(a.v);
  constexpr int64_t kElem = kFp8 ? 1 : 2;
  const int64_t first = hi >= lo ? lo - lo % 16 : 0;
  for (int64_t base = first + 16 * kNT * warp; base <= hi; base += 16 * kNT * kWarps) {
    uint32_t kw[kNT][2][kKWords], vw[kNT][4][kVWords];
    float dk[kNT][4], dv[kNT][4];  // an FP8 cache's descales of the keys of the V rows
    bool keep[kNT][4];
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const int64_t key0 = base + 16 * n;
      const int64_t slot =
          key0 <= hi ? static_cast<int64_t>(static_cast<uint32_t>(key0) / static_cast<uint32_t>(a.page_size))
                     : a.max_pages_k;
      const int64_t pk = page_of(a.table_k, a.tks, a.pages_k, a.max_pages_k, b, slot);
      const int64_t pv = page_of(a.table_v, a.tvs, a.pages_v, a.max_pages_v, b, slot);
      const int64_t r0 = key0 - slot * a.page_size;
      auto kept = [&](int64_t key) { return key >= lo && key <= hi; };
#pragma unroll
      for (int j = 0; j < 2; ++j) {  // K rows of keys g and g + 8
        const int64_t r = r0 + g + 8 * j;
        const bool in = pk >= 0 && kept(key0 + g + 8 * j);
        const int64_t off = in ? row_base(pk, a.ks, h, r) : 0;
        // 16 bytes of the row from value 32 i + 8 t (fp8: 64 i + 16 t).
#pragma unroll
        for (int i = 0; i < kKWords / 4; ++i) {
          uint32_t w[4];
          load_words(w, kbase + (off + (kFp8 ? 64 : 32) * i + (kFp8 ? 16 : 8) * t) * kElem, in);
#pragma unroll
          for (int u = 0; u < 4; ++u) kw[n][j][4 * i + u] = w[u];
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // V rows of keys 2t, 2t + 1, 2t + 8, 2t + 9: dims [kTiles g, +kTiles)
        // A key without both pages, or kept by none of the block's rows, scores -inf and reads no V
        // row (a NaN there would survive p = 0).
        const int jj = 2 * t + (j % 2) + 8 * (j / 2);
        const bool in = pk >= 0 && pv >= 0 && kept(key0 + jj);
        keep[n][j] = in;
        const int64_t off = in ? row_base(pv, a.vs, h, r0 + jj) : 0;
        load_words(vw[n][j], vbase + (off + kTiles * g) * kElem, in);
        if constexpr (kFp8) {
          dk[n][j] = in ? a.dk[row_base(pk, a.dks, h, r0 + jj)] : 0.f;
          dv[n][j] = in ? a.dv[row_base(pv, a.dvs, h, r0 + jj)] : 0.f;
        }
      }
    }
#pragma unroll
    for (int n = 0; n < kNT; ++n) {
      const int64_t key0 = base + 16 * n;
      float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t b00, b01, b10, b11;
        if constexpr (kFp8) {
          b00 = e4m3x2_to_f16x2(kw[n][0][s]);
          b01 = e4m3x2_to_f16x2(kw[n][0][s] >> 16);
          b10 = e4m3x2_to_f16x2(kw[n][1][s]);
          b11 = e4m3x2_to_f16x2(kw[n][1][s] >> 16);
        } else {
          b00 = kw[n][0][2 * s];
          b01 = kw[n][0][2 * s + 1];
          b10 = kw[n][1][2 * s];
          b11 = kw[n][1][2 * s + 1];
        }
        mma16816<kF16>(s0, qa[s][0][0], a_row1(s, 0), qa[s][0][1], a_row1(s, 1), b00, b01);
        mma16816<kF16>(s1, qa[s][0][0], a_row1(s, 0), qa[s][0][1], a_row1(s, 1), b10, b11);
      }
      // Row r's scores of keys 2t, 2t + 1, 2t + 8, 2t + 9 (the V rows this lane loaded).
      float p[kR][4], corr[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float sc[4] = {s0[2 * r], s0[2 * r + 1], s1[2 * r], s1[2 * r + 1]};
        float tmax = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int64_t key = key0 + 2 * t + (j % 2) + 8 * (j / 2);
          if constexpr (kFp8) sc[j] *= dk[n][j];
          sc[j] = keep[n][j] && (!kMulti || (key >= rlo[r] && key <= rhi[r])) ? sc[j] * qscale[r] : -INFINITY;
          tmax = fmaxf(tmax, sc[j]);
        }
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));
        const float m_new = fmaxf(m[r], tmax);
        const float mu = m_new == -INFINITY ? 0.f : m_new;
        corr[r] = fast_exp2(m[r] - mu);  // 0 while m is -inf
#pragma unroll
        for (int j = 0; j < 4; ++j) p[r][j] = fast_exp2(sc[j] - mu);
        l[r] = l[r] * corr[r] + ((p[r][0] + p[r][1]) + (p[r][2] + p[r][3]));
        m[r] = m_new;
      }
      float vmax = 1.f;
      if constexpr (kFp8) {  // P times V's descales over the tile's largest magnitude (0 for a masked key)
        vmax = fmaxf(fmaxf(fabsf(dv[n][0]), fabsf(dv[n][1])), fmaxf(fabsf(dv[n][2]), fabsf(dv[n][3])));
        vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 1));
        vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, 2));
        const float inv = vmax > 0.f ? 1.f / vmax : 0.f;
#pragma unroll
        for (int r = 0; r < kR; ++r)
#pragma unroll
          for (int j = 0; j < 4; ++j) p[r][j] *= dv[n][j] * inv;
      }
      const uint32_t pa0 = pack2<kF16>(p[0][0], p[0][1]), pa2 = pack2<kF16>(p[0][2], p[0][3]);
      const uint32_t pa1 = kMulti ? pack2<kF16>(p[kR - 1][0], p[kR - 1][1]) : 0u;
      const uint32_t pa3 = kMulti ? pack2<kF16>(p[kR - 1][2], p[kR - 1][3]) : 0u;
      const float corr1 = corr[kR - 1];
#pragma unroll
      for (int i = 0; i < kTiles; ++i) {
        uint32_t b0, b1;  // keys (2t, 2t + 1) and (2t + 8, 2t + 9) at dim kTiles g + i
        if constexpr (kFp8) {
          const int sel = (i % 4) | (4 + i % 4) << 4;
          b0 = e4m3x2_to_f16x2(__byte_perm(vw[n][0][i / 4], vw[n][1][i / 4], sel));
          b1 = e4m3x2_to_f16x2(__byte_perm(vw[n][2][i / 4], vw[n][3][i / 4], sel));
        } else {
          const int sel = i % 2 ? 0x7632 : 0x5410;
          b0 = __byte_perm(vw[n][0][i / 2], vw[n][1][i / 2], sel);
          b1 = __byte_perm(vw[n][2][i / 2], vw[n][3][i / 2], sel);
        }
        if constexpr (kFp8) {
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          mma16816<true>(d, pa0, pa1, pa2, pa3, b0, b1);
          acc[i][0] = fmaf(d[0], vmax, acc[i][0] * corr[0]);
          acc[i][1] = fmaf(d[1], vmax, acc[i][1] * corr[0]);
          if constexpr (kMulti) {
            acc[i][2] = fmaf(d[2], vmax, acc[i][2] * corr1);
            acc[i][3] = fmaf(d[3], vmax, acc[i][3] * corr1);
          }
        } else {
          acc[i][0] *= corr[0];
          acc[i][1] *= corr[0];
          if constexpr (kMulti) {
            acc[i][2] *= corr1;
            acc[i][3] *= corr1;
          }
          mma16816<kF16>(acc[i], pa0, pa1, pa2, pa3, b0, b1);
        }
      }
    }
  }
  // The warps meet in shared memory (dims in their places: tile i's column c is dim kTiles c + i),
  // maxima in the natural-log domain as finish_block takes them.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int mr = g + 8 * r;
    if (!rin[r]) continue;
    if (t == 0) {
      sm_m[warp][mr] = m[r] * 0.6931471805599453f;
      sm_l[warp][mr] = l[r];
    }
#pragma unroll
    for (int i = 0; i < kTiles; ++i) {
      sm_acc[warp][mr][kTiles * (2 * t) + i] = acc[i][2 * r];
      sm_acc[warp][mr][kTiles * (2 * t + 1) + i] = acc[i][2 * r + 1];
    }
  }
  __syncthreads();
  finish_block(
      a, pos, kWarps, kMulti ? a.row_tile * G : G, [&](int s, int64_t r) { return sm_m[s][r]; },
      [&](int s, int64_t r) { return sm_l[s][r]; },
      [&](int s, int64_t r, int64_t d) { return sm_acc[s][r][d]; });
}

// The split blocks of one (sequence, KV head) merged, over the splits in order: o = sum_s acc_s
// e^(M_s - M) / sum_s L_s e^(M_s - M), M the largest M_s (a split that kept no key: M_s = -inf).
// Every split's maxima and sums are loaded at once (a thread each), each head's factors e^(M_s - M)
// are computed once into shared memory, and a value's kSum partials are loaded together before they
// are added in split order: the same sums, in the same order, as one thread looping over the splits.
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(DecodeArgs a) {
  constexpr int kSum = 8;
  __shared__ float sm_f[kMaxChunks][kMaxGroup], sm_ls[kMaxChunks][kMaxGroup], sm_l[kMaxGroup];
  const BlockPos pos = block_pos(a, blockIdx.x, 1);
  const int64_t bh = blockIdx.x, h = pos.h, G = a.group, D = a.dim;
  const int64_t S = a.splits, pf = part_floats(G, D);
  const float* part = a.part + bh * S * pf;
  for (int64_t t = threadIdx.x; t < S * G; t += kThreads) {
    const int64_t s = t / G, g = t % G;
    sm_f[s][g] = part[s * pf + g];
    sm_ls[s][g] = part[s * pf + G + g];
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int g = static_cast<int>(threadIdx.x);
    float M = -INFINITY;
    for (int64_t s = 0; s < S; ++s) M = fmaxf(M, sm_f[s][g]);
    float L = 0.f;
    for (int64_t s = 0; s < S; ++s) {
      const float f = M > -INFINITY ? __expf(sm_f[s][g] - M) : 0.f;  // a split that kept no key: 0
      sm_f[s][g] = f;
      L += sm_ls[s][g] * f;
    }
    sm_l[g] = L;
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < G * D; idx += kThreads) {
    const int64_t g = idx / D, d = idx % D;
    float sum = 0.f;
    for (int64_t s0 = 0; s0 < S; s0 += kSum) {
      float v[kSum];
#pragma unroll
      for (int u = 0; u < kSum; ++u) v[u] = s0 + u < S ? part[(s0 + u) * pf + 2 * G + idx] : 0.f;
#pragma unroll
      for (int u = 0; u < kSum; ++u)
        if (s0 + u < S) sum += v[u] * sm_f[s0 + u][g];
    }
    const float L = sm_l[g];
    store_from_float(a.o, a.dtype, row_at(a.os, pos, h * G + g, d), L > 0.f ? sum / L : 0.f);
  }
}

// The kernel for kG heads a group at kL lanes a key (4 to 32; 8 heads of more than 128 values are
// refused by the builder: a group's values are at most 1024).
template <int kG, bool kHalf, bool kVec, bool kFp8>
void launch_lanes(int lanes, unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  switch (lanes) {
    case 4:
      sdpa_decode_kernel<kG, 4, kHalf, kVec, kFp8><<<grid, kThreads, 0, st>>>(a);
      break;
    case 8:
      sdpa_decode_kernel<kG, 8, kHalf, kVec, kFp8><<<grid, kThreads, 0, st>>>(a);
      break;
    case 16:
      sdpa_decode_kernel<kG, 16, kHalf, kVec, kFp8><<<grid, kThreads, 0, st>>>(a);
      break;
    default:
      if constexpr (kG < 8) sdpa_decode_kernel<kG, 32, kHalf, kVec, kFp8><<<grid, kThreads, 0, st>>>(a);
      break;
  }
}

template <bool kHalf, bool kVec, bool kFp8>
void launch_group(int lanes, unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  switch (a.group) {  // the builder accepts powers of two up to 8
    case 1:
      launch_lanes<1, kHalf, kVec, kFp8>(lanes, grid, st, a);
      break;
    case 2:
      launch_lanes<2, kHalf, kVec, kFp8>(lanes, grid, st, a);
      break;
    case 4:
      launch_lanes<4, kHalf, kVec, kFp8>(lanes, grid, st, a);
      break;
    default:
      launch_lanes<8, kHalf, kVec, kFp8>(lanes, grid, st, a);
      break;
  }
}

template <bool kFp8>
void launch_dtype(bool vec, bool half, int lanes, unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  if (vec && half) {
    launch_group<true, true, kFp8>(lanes, grid, st, a);
  } else if (vec) {
    launch_group<false, true, kFp8>(lanes, grid, st, a);
  } else if (half) {
    launch_group<true, false, kFp8>(lanes, grid, st, a);
  } else {
    launch_group<false, false, kFp8>(lanes, grid, st, a);
  }
}

// The tensor-core kernel (sdpa_decode_mma_kernel), one query row a block or a tile: head dim 64 only
// (the builder's mma_shapes_).
template <bool kHalf, bool kFp8, bool kMulti>
void launch_mma_dim(unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  sdpa_decode_mma_kernel<64, kHalf, kFp8, kMulti><<<grid, kThreads, 0, st>>>(a);
}
template <bool kHalf, bool kFp8>
void launch_mma(unsigned grid, cudaStream_t st, const DecodeArgs& a) {
  if (a.row_tile > 1) {
    launch_mma_dim<kHalf, kFp8, true>(grid, st, a);
  } else {
    launch_mma_dim<kHalf, kFp8, false>(grid, st, a);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

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
    if (fp8_) {
      a.dk = static_cast<const float*>(ptrs[7]);
      a.dv = static_cast<const float*>(ptrs[8]);
    }
    a.o = ptrs[fp8_ ? 9 : 7];
    if (blocks_ == 0) return Status::Ok();
    const auto st = static_cast<cudaStream_t>(stream);
    auto kv_aligned = [&](const void* p) { return fp8_ ? aligned8(p) : aligned16(p); };
    const bool vec = vec_shapes_ && aligned16(a.q) && kv_aligned(a.k) && kv_aligned(a.v);
    const bool half = a.dtype == static_cast<int>(DType::kFP16);
    const bool mma = mma_shapes_ && aligned16(a.q) && aligned16(a.k) && aligned16(a.v);
    // Prompts on tensor cores: 16 / group query rows a block (the A operand's 16 rows).
    a.row_tile = mma && a.rows > 1 ? 16 / a.group : 1;
    const auto grid =
        static_cast<unsigned>(blocks_ / a.rows * ((a.rows + a.row_tile - 1) / a.row_tile) * a.splits);
    if (mma) {
      if (fp8_) {
        half ? launch_mma<true, true>(grid, st, a) : launch_mma<false, true>(grid, st, a);
      } else {
        half ? launch_mma<true, false>(grid, st, a) : launch_mma<false, false>(grid, st, a);
      }
    } else if (fp8_) {
      launch_dtype<true>(vec, half, lanes_, grid, st, a);
    } else {
      launch_dtype<false>(vec, half, lanes_, grid, st, a);
    }
    FUSEBOX_RETURN_IF_ERROR(
        common::cuda_status(cudaGetLastError(), where_, " paged decode attention kernel launch"));
    if (a.splits == 1) return Status::Ok();
    decode_combine_kernel<<<static_cast<unsigned>(blocks_), kThreads, 0, st>>>(a);
    return common::cuda_status(cudaGetLastError(), where_, " decode attention combine launch");
  }

  DecodeArgs args_;
  int64_t blocks_ = 0;       // (sequence, query row, KV head) triples
  int lanes_ = 4;            // lanes a key: a power of two >= D / 8, at least 4
  bool fp8_ = false;         // an FP8 cache: e4m3 K and V, their descales after the page tables
  bool vec_shapes_ = false;  // rows of 8 values on 16-byte boundaries (the pointers checked at launch)
  bool mma_shapes_ = false;  // the tensor-core kernel's shapes (the pointers checked at launch)
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
  const DType kv_dtype = a.fp8_kv ? DType::kFP8E4M3 : q->dtype;
  if ((q->dtype != DType::kBF16 && q->dtype != DType::kFP16) || k->dtype != kv_dtype ||
      v->dtype != kv_dtype || o.dtype != q->dtype)
    return nullptr;
  // An FP8 cache's descales: [1,1,1,1] (strides 0: one value) or one per row of the pool.
  const ResolvedTensor *dk = a.fp8_kv ? in("descale_k") : nullptr, *dv = a.fp8_kv ? in("descale_v") : nullptr;
  if (a.fp8_kv) {
    if (!dk || !dv) return nullptr;
    for (const ResolvedTensor* t : {dk, dv})
      if (t->is_virtual || t->scalar_value || t->dims.size() != 4 || t->dtype != DType::kFP32) return nullptr;
  }
  for (const ResolvedTensor* t : {lq, lkv, tk, tv})
    if (t->dtype != DType::kInt32) return nullptr;
  const int64_t B = q->dims[0], H = q->dims[1], Sq = q->dims[2], D = q->dims[3];
  const int64_t KVH = k->dims[1], P = k->dims[2];
  const int64_t group = KVH >= 1 && H % KVH == 0 ? H / KVH : 0;
  if (Sq < 1 || group < 1 || group > kMaxGroup || (group & (group - 1)) != 0 || D < 1 || D > kMaxDim ||
      (H / KVH) * D > kMaxGroupValues || v->dims[1] != KVH || v->dims[2] != P || v->dims[3] != D ||
      k->dims[3] != D || o.dims != std::vector<int64_t>{B, H, Sq, D} || tv->dims[2] != tk->dims[2] ||
      lq->dims[0] != B || lkv->dims[0] != B || tk->dims[0] != B || tv->dims[0] != B ||
      sdpa_kv_length(a, k->dims) >= (int64_t{1} << 31))
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
  if (a.fp8_kv) {
    // One value for the tensor: strides 0. One per row: [pages, KVH, P, 1] (the validator's shapes).
    auto descale_strides = [](const ResolvedTensor& t, const ResolvedTensor& pool) {
      Strides4 s;
      if (t.dims == std::vector<int64_t>{1, 1, 1, 1}) return s;
      std::vector<int64_t> per_row = pool.dims;
      per_row.back() = 1;
      if (t.dims != per_row) return Strides4{{-1, -1, -1, -1}};
      return strides4(t);
    };
    d.dks = descale_strides(*dk, *k);
    d.dvs = descale_strides(*dv, *v);
    if (d.dks.s[0] < 0 || d.dvs.s[0] < 0) return nullptr;
    kern->fp8_ = true;
  }
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
  d.rows = Sq;
  kern->blocks_ = B * Sq * KVH;
  // Chunks by the pool's longest sequence only, so a sequence's sums run in the same order whatever
  // the batch (the serving engine's buckets share one pool).
  d.chunk = std::max(kMinChunk, (d.max_kv + kMaxChunks - 1) / kMaxChunks);
  d.chunk = (d.chunk + kMinChunk - 1) / kMinChunk * kMinChunk;  // whole 16-key tiles
  d.splits = std::max<int64_t>(1, (d.max_kv + d.chunk - 1) / d.chunk);
  // Several query rows (a prompt over the cache): a block per row is parallel enough, and split
  // partials would grow with the rows; each block takes all its row's keys.
  if (Sq > 1) d.splits = 1;
  if (kern->blocks_ * d.splits >= (int64_t{1} << 31)) return nullptr;  // past a grid's x
  while (8 * kern->lanes_ < D) kern->lanes_ *= 2;
  auto rows16 = [](const Strides4& t) {
    return t.s[3] == 1 && t.s[0] % 8 == 0 && t.s[1] % 8 == 0 && t.s[2] % 8 == 0;
  };
  kern->vec_shapes_ = D % 8 == 0 && rows16(d.qs) && rows16(d.ks) && rows16(d.vs);
  // The tensor-core kernel: 16-key tiles inside a page, every row on a 16-byte boundary.
  auto rows_of_16_bytes = [&](const Strides4& t) {
    return a.fp8_kv ? t.s[3] == 1 && t.s[0] % 16 == 0 && t.s[1] % 16 == 0 && t.s[2] % 16 == 0 : rows16(t);
  };
  // Head dim 64 only: at 128 the tensor-core kernel (two blocks an SM at 208 registers, one 16-key
  // tile a warp in flight) took 1.70 ms on example sdpa_paged_decode where the CUDA-core one took
  // 0.73 (H100, session 38).
  kern->mma_shapes_ =
      D == 64 && P % 16 == 0 && rows16(d.qs) && rows_of_16_bytes(d.ks) && rows_of_16_bytes(d.vs);
  kern->tensors_ = {q->name, k->name, v->name, lq->name, lkv->name, tk->name, tv->name};
  if (a.fp8_kv) kern->tensors_.insert(kern->tensors_.end(), {dk->name, dv->name});
  kern->tensors_.push_back(o.name);
  return kern;
}

}  // namespace fusebox::kernels
