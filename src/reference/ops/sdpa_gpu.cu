// fusebox: the GPU references of sdpa_fwd, sdpa_bwd and sdpa_fp8_fwd (and
// the driver side of sdpa_fp8_bwd, whose kernels are ops/sdpa_fp8_bwd_gpu.cu).
// fp32 accumulation; semantics: fusebox/ops/sdpa.h.
#include <cuda_runtime.h>

#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "ops/sdpa_dropout.h"
#include "ops/sdpa_fp8_bwd.h"
#include "ops/sdpa_mask.h"
#include "ops/sdpa_paged.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

// One block per query row (forward, dq) or key row (dk/dv); keys (rows) in
// chunks of kSdpaChunk whose scores live in shared memory. Each thread owns
// head dims d = tid, tid + 128 of the accumulators (D, Dv <= 256). Masks are
// the kept intervals of sdpa_mask.h, so masked pairs cost nothing.
constexpr int kSdpaThreads = 128, kSdpaChunk = 1024, kSdpaMaxDvPerThread = 2;

// What every sdpa kernel needs to form a score and its mask.
struct SdpaArgs {
  DevTensor q, k, v;               // rank 4, logical [B,H,S,D] strides
  DevTensor bias;                  // ptr == nullptr: no bias; strides 0 along broadcast dims
  const int* seq_len_q = nullptr;  // int32 [B,1,1,1] with padding, else nullptr
  const int* seq_len_kv = nullptr;
  int64_t seq_len_q_stride = 0, seq_len_kv_stride = 0;
  const float* slopes = nullptr;  // ALiBi slope per query head, else nullptr
  SdpaMaskParams mask;
  int64_t B, Hq, Hk, Sq, Skv, D, Dv;
  float scale;  // attn_scale
  // Dropout: cuDNN's keep-mask M [B,Hq,Sq,Skv] (ptr == nullptr: no dropout) and 1 / (1 - p).
  DevTensor dropout_mask;
  float dropout_scale = 1.0f;
  DevTensor sink;        // attention sinks: fp32 [1,Hq,1,1] (ptr == nullptr: none)
  DevTensor block_mask;  // uint8 [B,Hq,ceil(Sq/128),ceil(ceil(Skv/128)/8)] (ptr == nullptr: none)
};

// The fp8 scales (device scalars) and amax outputs of sdpa_fp8_fwd.
struct SdpaFp8Args {
  DevTensor descale_q, descale_k, descale_v, descale_s, scale_s, scale_o;
  float* amax_s;
  float* amax_o;
};

// The backward's extra inputs and its per-row Di = do . o.
struct SdpaBwdArgs {
  DevTensor o, dout, stats;
  float* di;  // [B*Hq*Sq], written by the dq kernel, read by the dk/dv kernel
};

__device__ __forceinline__ int64_t sdpa_len_q(const SdpaArgs& a, int64_t b) {
  return a.seq_len_q ? a.seq_len_q[b * a.seq_len_q_stride] : a.Sq;
}
__device__ __forceinline__ int64_t sdpa_len_kv(const SdpaArgs& a, int64_t b) {
  return a.seq_len_kv ? a.seq_len_kv[b * a.seq_len_kv_stride] : a.Skv;
}

// The score of (b, h, i, j) from q_i . k_j: scale * dot [+ bias] [+ alibi].
__device__ __forceinline__ float sdpa_score(const SdpaArgs& a, float scale, float dot, int64_t b, int64_t h,
                                            int64_t i, int64_t j) {
  float s = dot * scale;
  if (a.bias.ptr)
    s += load_at(a.bias, b * a.bias.strides[0] + h * a.bias.strides[1] + i * a.bias.strides[2] +
                             j * a.bias.strides[3]);
  if (a.slopes) s += a.slopes[h] * static_cast<float>(j - i);
  return s;
}

// Dropout's factor M / (1 - p) of (b, h, i, j); 1 without dropout.
__device__ __forceinline__ float sdpa_dropout(const SdpaArgs& a, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!a.dropout_mask.ptr) return 1.0f;
  const DevTensor& m = a.dropout_mask;
  return load_at(m, b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j * m.strides[3]) *
         a.dropout_scale;
}

// Whether the block mask keeps (b, h, i, j): the bit of key j's tile in the
// byte of i's tile row (SdpaOptions::block_mask, sdpa_block_keeps() on the
// host); true without one.
constexpr int64_t kTile = 128;
static_assert(kTile == kSdpaBlockTile, "the block mask's tile");
__device__ __forceinline__ bool sdpa_tile_keeps(const SdpaArgs& a, int64_t b, int64_t h, int64_t i,
                                                int64_t j) {
  if (!a.block_mask.ptr) return true;
  const DevTensor& m = a.block_mask;
  const float byte = load_at(
      m, b * m.strides[0] + h * m.strides[1] + (i / kTile) * m.strides[2] + (j / kTile / 8) * m.strides[3]);
  return ((static_cast<unsigned>(byte) >> ((j / kTile) % 8)) & 1u) != 0;
}

// Scores of keys [j0, j0 + cnt) of row (b, h, i) into ps (-inf where the block
// mask drops the key); returns this thread's max.
__device__ float sdpa_chunk_scores(const SdpaArgs& a, float scale, const float* qs, int64_t b, int64_t h,
                                   int64_t hk, int64_t i, int64_t j0, int cnt, float* ps) {
  float local_max = -INFINITY;
  for (int jj = threadIdx.x; jj < cnt; jj += kSdpaThreads) {
    if (!sdpa_tile_keeps(a, b, h, i, j0 + jj)) {
      ps[jj] = -INFINITY;
      continue;
    }
    const float dot = dot_row(qs, a.k, row_offset(a.k, b, hk, j0 + jj), a.D);
    ps[jj] = sdpa_score(a, scale, dot, b, h, i, j0 + jj);
    local_max = fmaxf(local_max, ps[jj]);
  }
  return local_max;
}

// sdpa_fwd (kFp8 false): one pass with an online (flash-attention style)
// softmax, the running max m, sum l and accumulators rescaled per chunk;
// dropout scales each P after it entered l (P' = P * M / (1 - p)).
// sdpa_fp8_fwd (kFp8 true): P must be normalized before its e4m3 rounding, so
// a first pass finds m and l, and a second forms P, rounds and accumulates.
// Padded rows get o = 0, stats = 0; rows that keep no key o = 0, stats = -inf
// (as the CPU reference).
template <bool kFp8>
__global__ void __launch_bounds__(kSdpaThreads)
    sdpa_fwd_kernel(SdpaArgs a, SdpaFp8Args f8, float* o, float* stats) {
  extern __shared__ float smem[];
  float* qs = smem;        // D values of this query row
  float* ps = smem + a.D;  // scores, then probabilities, of one key chunk
  __shared__ float red[kSdpaThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % a.Sq, bh = row / a.Sq, h = bh % a.Hq, b = bh / a.Hq;
  const int64_t hk = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x;
  const int64_t qoff = row_offset(a.q, b, h, i);
  for (int64_t d = tid; d < a.D; d += kSdpaThreads) qs[d] = load_at(a.q, qoff + d * a.q.strides[3]);
  const int64_t lq = sdpa_len_q(a, b);
  int64_t lo, hi;
  sdpa_kept_keys(a.mask, i, lq, sdpa_len_kv(a, b), &lo, &hi);
  const float scale = kFp8 ? a.scale * load_at(f8.descale_q, 0) * load_at(f8.descale_k, 0) : a.scale;
  const int64_t voff = b * a.v.strides[0] + hk * a.v.strides[1];
  // An attention sink starts the running softmax as one more logit without a value.
  const bool sink = a.sink.ptr != nullptr;
  float m = sink ? load_at(a.sink, h * a.sink.strides[1]) : -INFINITY, l = sink ? 1.0f : 0.0f;
  float acc[kSdpaMaxDvPerThread] = {};
  // Accumulates ps[0, cnt) @ v rows [j0, j0 + cnt) into acc, after scaling acc by corr.
  auto accumulate = [&](int64_t j0, int cnt, float corr) {
#pragma unroll
    for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
      const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
      if (d >= a.Dv) continue;
      float sum = 0.0f;
      for (int jj = 0; jj < cnt; ++jj)
        sum += ps[jj] * load_at(a.v, voff + (j0 + jj) * a.v.strides[2] + d * a.v.strides[3]);
      acc[r] = acc[r] * corr + sum;
    }
  };
  for (int64_t j0 = lo; j0 <= hi; j0 += kSdpaChunk) {
    const int cnt = static_cast<int>(hi + 1 - j0 < kSdpaChunk ? hi + 1 - j0 : kSdpaChunk);
    __syncthreads();  // qs loaded; ps of the previous chunk consumed
    const float local_max = sdpa_chunk_scores(a, scale, qs, b, h, hk, i, j0, cnt, ps);
    const float new_m = fmaxf(m, block_reduce<kSdpaThreads>(local_max, true, red));
    // 0 on the first chunk (m = -inf); 1 while every key so far was masked
    // (a block mask can drop a whole chunk: -inf - -inf would be NaN).
    const float corr = new_m == -INFINITY ? 1.0f : expf(m - new_m);
    float local_sum = 0.0f;
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const float p = ps[jj] == -INFINITY ? 0.0f : expf(ps[jj] - new_m);
      ps[jj] = p * sdpa_dropout(a, b, h, i, j0 + jj);
      local_sum += p;
    }
    l = l * corr + block_reduce<kSdpaThreads>(local_sum, false, red);  // its __syncthreads publish ps
    m = new_m;
    if (!kFp8) accumulate(j0, cnt, corr);
  }
  const bool kept = lo <= hi && m != -INFINITY;  // a block mask may drop every key of the interval
  float p_max = 0.0f;
  if (kFp8 && kept) {
    const float lse = m + logf(l), scale_s = load_at(f8.scale_s, 0);
    for (int64_t j0 = lo; j0 <= hi; j0 += kSdpaChunk) {
      const int cnt = static_cast<int>(hi + 1 - j0 < kSdpaChunk ? hi + 1 - j0 : kSdpaChunk);
      __syncthreads();  // ps of the previous chunk consumed
      sdpa_chunk_scores(a, scale, qs, b, h, hk, i, j0, cnt, ps);
      for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
        const float p = expf(ps[jj] - lse) * sdpa_dropout(a, b, h, i, j0 + jj);  // P' (amax_s after dropout)
        p_max = fmaxf(p_max, p);
        ps[jj] = round_fp8(p * scale_s);
      }
      __syncthreads();
      accumulate(j0, cnt, 1.0f);
    }
  }
  const float out_scale = kFp8 ? load_at(f8.descale_s, 0) * load_at(f8.descale_v, 0) : 1.0f;
  float o_max = 0.0f;
#pragma unroll
  for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
    if (d >= a.Dv) continue;
    // fp8: acc is P8 @ v already normalized; otherwise divide by the running sum.
    const float out = !kept ? 0.0f : kFp8 ? out_scale * acc[r] : acc[r] / l;
    o_max = fmaxf(o_max, fabsf(out));
    o[row * a.Dv + d] = kFp8 ? out * load_at(f8.scale_o, 0) : out;
  }
  if (stats && tid == 0) stats[row] = i >= lq ? 0.0f : (kept || sink) ? m + logf(l) : -INFINITY;
  if (kFp8) {
    p_max = block_reduce<kSdpaThreads>(p_max, true, red);
    o_max = block_reduce<kSdpaThreads>(o_max, true, red);
    if (tid == 0) {
      atomic_max_nonneg(f8.amax_s, p_max);
      atomic_max_nonneg(f8.amax_o, o_max);
    }
  }
}

// sdpa_bwd, one block per query row: Di = do_i . o_i, then over the kept keys
// P = exp(s - stats_i), dS = P * (F * do_i . v_j - Di), dq_i = scale * sum dS k_j
// (F = M / (1 - p) with dropout, else 1).
__global__ void __launch_bounds__(kSdpaThreads) sdpa_bwd_dq_kernel(SdpaArgs a, SdpaBwdArgs w, float* dq) {
  extern __shared__ float smem[];
  float* qs = smem;         // D
  float* dos = smem + a.D;  // Dv
  float* ds = dos + a.Dv;   // dS of one key chunk
  __shared__ float red[kSdpaThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % a.Sq, bh = row / a.Sq, h = bh % a.Hq, b = bh / a.Hq;
  const int64_t hk = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x;
  const int64_t qoff = row_offset(a.q, b, h, i), dooff = row_offset(w.dout, b, h, i),
                ooff = row_offset(w.o, b, h, i);
  for (int64_t d = tid; d < a.D; d += kSdpaThreads) qs[d] = load_at(a.q, qoff + d * a.q.strides[3]);
  float di_part = 0.0f;
  for (int64_t d = tid; d < a.Dv; d += kSdpaThreads) {
    dos[d] = load_at(w.dout, dooff + d * w.dout.strides[3]);
    di_part += dos[d] * load_at(w.o, ooff + d * w.o.strides[3]);
  }
  const float di = block_reduce<kSdpaThreads>(di_part, false, red);  // its __syncthreads publish qs, dos
  if (tid == 0) w.di[row] = di;
  const float lse = load_at(w.stats, row_offset(w.stats, b, h, i));
  int64_t lo, hi;
  sdpa_kept_keys(a.mask, i, sdpa_len_q(a, b), sdpa_len_kv(a, b), &lo, &hi);
  float acc[kSdpaMaxDvPerThread] = {};
  for (int64_t j0 = lo; j0 <= hi; j0 += kSdpaChunk) {
    const int cnt = static_cast<int>(hi + 1 - j0 < kSdpaChunk ? hi + 1 - j0 : kSdpaChunk);
    __syncthreads();  // ds of the previous chunk consumed
    sdpa_chunk_scores(a, a.scale, qs, b, h, hk, i, j0, cnt, ds);
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const float p = expf(ds[jj] - lse);
      const float dp =
          dot_row(dos, a.v, row_offset(a.v, b, hk, j0 + jj), a.Dv) * sdpa_dropout(a, b, h, i, j0 + jj);
      ds[jj] = p * (dp - di);
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
      const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
      if (d >= a.D) continue;
      const int64_t kbase = row_offset(a.k, b, hk, j0) + d * a.k.strides[3];
      for (int jj = 0; jj < cnt; ++jj) acc[r] += ds[jj] * load_at(a.k, kbase + jj * a.k.strides[2]);
    }
  }
#pragma unroll
  for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
    if (d < a.D) dq[row * a.D + d] = a.scale * acc[r];
  }
}

// sdpa_bwd, one block per key row j of kv head hk: over the group's query
// heads and the rows that keep j, recomputes P and dS (with Di from the dq
// kernel) and sums dk_j = scale * sum dS q_i and dv_j = sum P' do_i (P' = P F).
__global__ void __launch_bounds__(kSdpaThreads)
    sdpa_bwd_dkdv_kernel(SdpaArgs a, SdpaBwdArgs w, float* dk, float* dv) {
  extern __shared__ float smem[];
  float* ks = smem;             // D
  float* vs = smem + a.D;       // Dv
  float* ps = vs + a.Dv;        // P of one row chunk
  float* ds = ps + kSdpaChunk;  // dS of one row chunk
  const int64_t key = blockIdx.x;
  const int64_t j = key % a.Skv, bhk = key / a.Skv, hk = bhk % a.Hk, b = bhk / a.Hk;
  const int tid = threadIdx.x;
  const int64_t koff = row_offset(a.k, b, hk, j), voff = row_offset(a.v, b, hk, j);
  for (int64_t d = tid; d < a.D; d += kSdpaThreads) ks[d] = load_at(a.k, koff + d * a.k.strides[3]);
  for (int64_t d = tid; d < a.Dv; d += kSdpaThreads) vs[d] = load_at(a.v, voff + d * a.v.strides[3]);
  int64_t lo, hi;
  sdpa_kept_rows(a.mask, j, sdpa_len_q(a, b), sdpa_len_kv(a, b), &lo, &hi);
  float acc_k[kSdpaMaxDvPerThread] = {}, acc_v[kSdpaMaxDvPerThread] = {};
  const int64_t group = a.Hq / a.Hk;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
    for (int64_t i0 = lo; i0 <= hi; i0 += kSdpaChunk) {
      const int cnt = static_cast<int>(hi + 1 - i0 < kSdpaChunk ? hi + 1 - i0 : kSdpaChunk);
      __syncthreads();  // ks, vs loaded; ps, ds of the previous chunk consumed
      for (int ii = tid; ii < cnt; ii += kSdpaThreads) {
        const int64_t i = i0 + ii, row = (b * a.Hq + h) * a.Sq + i;
        const float dot = dot_row(ks, a.q, row_offset(a.q, b, h, i), a.D);
        const float p =
            expf(sdpa_score(a, a.scale, dot, b, h, i, j) - load_at(w.stats, row_offset(w.stats, b, h, i)));
        const float f = sdpa_dropout(a, b, h, i, j);
        const float dp = dot_row(vs, w.dout, row_offset(w.dout, b, h, i), a.Dv) * f;
        ps[ii] = p * f;
        ds[ii] = p * (dp - w.di[row]);
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
        const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
        if (d < a.D) {
          const int64_t qbase = row_offset(a.q, b, h, i0) + d * a.q.strides[3];
          for (int ii = 0; ii < cnt; ++ii) acc_k[r] += ds[ii] * load_at(a.q, qbase + ii * a.q.strides[2]);
        }
        if (d < a.Dv) {
          const int64_t dobase = row_offset(w.dout, b, h, i0) + d * w.dout.strides[3];
          for (int ii = 0; ii < cnt; ++ii)
            acc_v[r] += ps[ii] * load_at(w.dout, dobase + ii * w.dout.strides[2]);
        }
      }
    }
#pragma unroll
  for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
    if (d < a.D) dk[key * a.D + d] = a.scale * acc_k[r];
    if (d < a.Dv) dv[key * a.Dv + d] = acc_v[r];
  }
}

// sdpa_bwd with attention sinks, one block per query head h (after the dq
// kernel wrote Di): dsink[h] = -sum over b and the rows i < len_q(b) of
// exp(sink[h] - stats[b,h,i]) * Di (the CPU reference's sdpa_backward).
__global__ void __launch_bounds__(kSdpaThreads)
    sdpa_bwd_dsink_kernel(SdpaArgs a, SdpaBwdArgs w, float* dsink) {
  __shared__ float red[kSdpaThreads / 32];
  const int64_t h = blockIdx.x;
  const float sink = load_at(a.sink, h * a.sink.strides[1]);
  float part = 0.0f;
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t lq = sdpa_len_q(a, b);
    for (int64_t i = threadIdx.x; i < lq; i += kSdpaThreads) {
      const int64_t row = (b * a.Hq + h) * a.Sq + i;
      part += expf(sink - load_at(w.stats, row_offset(w.stats, b, h, i))) * w.di[row];
    }
  }
  const float total = block_reduce<kSdpaThreads>(part, false, red);
  if (threadIdx.x == 0) dsink[h] = -total;
}

// Checks an int32 [B,1,1,1] length input and that every length is in [0, full]
// (copied to the host once: a bad length would make the kernels read out of bounds).
Result<const int*> seq_lens(GpuOpContext& ctx, const ResolvedOp& op, const char* role, const Located& l,
                            int64_t B, int64_t full) {
  if (l.t.dtype != static_cast<int>(DType::kInt32) || !l.t.ptr || l.dims != std::vector<int64_t>{B, 1, 1, 1})
    return InvalidArgument(op_where(op) + "input '" + role + "' must be an int32 tensor [" +
                           std::to_string(B) + ", 1, 1, 1] in memory; got dims " + dims_string(l.dims));
  std::vector<int> host(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    FUSEBOX_CUDA_RETURN(op_where(op),
                        cudaMemcpyAsync(&host[b], static_cast<const int*>(l.t.ptr) + b * l.t.strides[0],
                                        sizeof(int), cudaMemcpyDeviceToHost, ctx.stream()));
  FUSEBOX_CUDA_RETURN(op_where(op), cudaStreamSynchronize(ctx.stream()));
  for (int64_t b = 0; b < B; ++b)
    if (host[b] < 0 || host[b] > full)
      return InvalidArgument(op_where(op) + "input '" + role + "' holds " + std::to_string(host[b]) +
                             " for batch " + std::to_string(b) + ": each length must be an integer in [0, " +
                             std::to_string(full) + "]");
  return static_cast<const int*>(l.t.ptr);
}

// Paged K/V: dense[b, h, j, :] = pool[table[b, j / page_size], h, j % page_size, :]
// into fp32 [B, H, Skv, D], one thread per element (the table checked on the host first).
__global__ void sdpa_gather_pages_kernel(DevTensor pool, DevTensor table, int64_t B, int64_t H, int64_t Skv,
                                         int64_t D, float* dense) {
  const int64_t n = B * H * Skv * D, page_size = pool.dims[2];
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % D, j = (e / D) % Skv, h = (e / (D * Skv)) % H, b = e / (D * Skv * H);
    const int64_t page =
        static_cast<const int*>(table.ptr)[b * table.strides[0] + (j / page_size) * table.strides[2]];
    dense[e] = load_at(pool, page * pool.strides[0] + h * pool.strides[1] +
                                 (j % page_size) * pool.strides[2] + d * pool.strides[3]);
  }
}

// The dense fp32 cache of pool `pool_role` as each sequence sees it through
// table `table_role`; `located` becomes it (dims [B, H, Skv, D]).
Status gather_pages(GpuOpContext& ctx, const ResolvedOp& op, const SdpaOptions& o,
                    std::map<std::string, Located>& in, const char* pool_role, const char* table_role) {
  const Located &pool = in[pool_role], &table = in[table_role];
  const int64_t B = in["q"].dims[0];
  if (table.dims.size() != 4 || table.dims[0] != B || table.dims[1] != 1 || table.dims[3] != 1 ||
      table.t.dtype != static_cast<int>(DType::kInt32) || !table.t.ptr || !pool.t.ptr || !o.max_seq_len_kv)
    return InvalidArgument(op_where(op) + "input '" + table_role + "' must be an int32 page table [" +
                           std::to_string(B) + ", 1, max_pages, 1] in memory; got dims " +
                           dims_string(table.dims));
  const int64_t H = pool.dims[1], page_size = pool.dims[2], D = pool.dims[3], max_pages = table.dims[2];
  const int64_t Skv = *o.max_seq_len_kv;
  if (Skv > max_pages * page_size)
    return InvalidArgument(op_where(op) + "max_seq_len_kv " + std::to_string(Skv) + " exceeds the " +
                           std::to_string(max_pages) + " pages of " + std::to_string(page_size) +
                           " keys of input '" + table_role + "'");
  // Every entry checked on the host before the kernel uses it as an address.
  std::vector<int> host(static_cast<size_t>(B * max_pages));
  for (int64_t b = 0; b < B; ++b)
    FUSEBOX_CUDA_RETURN(op_where(op),
                        cudaMemcpy2DAsync(host.data() + b * max_pages, sizeof(int),
                                          static_cast<const int*>(table.t.ptr) + b * table.t.strides[0],
                                          table.t.strides[2] * sizeof(int), sizeof(int), max_pages,
                                          cudaMemcpyDeviceToHost, ctx.stream()));
  FUSEBOX_CUDA_RETURN(op_where(op), cudaStreamSynchronize(ctx.stream()));
  const std::string& name = ctx.graph().tensors[op.inputs.at(table_role)].name;
  FUSEBOX_RETURN_IF_ERROR(check_page_table(op, table_role, name, std::vector<float>(host.begin(), host.end()),
                                           B, max_pages, pool.dims[0]));
  FUSEBOX_ASSIGN_OR_RETURN(float* dense, ctx.temporary(B * H * Skv * D));
  sdpa_gather_pages_kernel<<<grid_for(B * H * Skv * D, 256), 256, 0, ctx.stream()>>>(pool.t, table.t, B, H,
                                                                                     Skv, D, dense);
  FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  Located g;
  g.dims = {B, H, Skv, D};
  g.t.ptr = dense;
  g.t.dtype = static_cast<int>(DType::kFP32);
  g.t.rank = 4;
  const int64_t strides[4] = {H * Skv * D, Skv * D, D, 1};
  for (int r = 0; r < 4; ++r) g.t.dims[r] = g.dims[r], g.t.strides[r] = strides[r];
  in[pool_role] = g;
  return Status::Ok();
}

// An FP8 K/V cache (SdpaFwdAttrs::fp8_kv): x (rank 4) times its descale s, one value ([1,1,1,1]) or
// one per row of x's last dim, into dense fp32 `out` of x's dims.
__global__ void sdpa_descale_kernel(DevTensor x, DevTensor s, bool single, float* out) {
  const int64_t D = x.dims[3], n = x.dims[0] * x.dims[1] * x.dims[2] * D;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i / D, idx[3];
    const int64_t d = i % D;
    for (int k = 2; k >= 0; --k) {
      idx[k] = r % x.dims[k];
      r /= x.dims[k];
    }
    const int64_t xo =
        idx[0] * x.strides[0] + idx[1] * x.strides[1] + idx[2] * x.strides[2] + d * x.strides[3];
    const int64_t so = single ? 0 : idx[0] * s.strides[0] + idx[1] * s.strides[1] + idx[2] * s.strides[2];
    out[i] = load_at(x, xo) * load_at(s, so);
  }
}

// `role` (k or v) replaced by itself times input `scale_role`, dense fp32.
Status descale_input(GpuOpContext& ctx, const ResolvedOp& op, std::map<std::string, Located>& in,
                     const char* role, const char* scale_role) {
  const Located &x = in[role], &s = in[scale_role];
  std::vector<int64_t> per_row = x.dims;
  per_row.back() = 1;
  const bool single = s.dims == std::vector<int64_t>{1, 1, 1, 1};
  if (!x.t.ptr || !s.t.ptr || (!single && s.dims != per_row))
    return InvalidArgument(op_where(op) + "input '" + scale_role + "' " + dims_string(s.dims) +
                           " must be in memory, [1, 1, 1, 1] or " + dims_string(per_row));
  const int64_t n = x.dims[0] * x.dims[1] * x.dims[2] * x.dims[3];
  FUSEBOX_ASSIGN_OR_RETURN(float* dense, ctx.temporary(n));
  sdpa_descale_kernel<<<grid_for(n, 256), 256, 0, ctx.stream()>>>(x.t, s.t, single, dense);
  FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  Located g;
  g.dims = x.dims;
  g.t.ptr = dense;
  g.t.dtype = static_cast<int>(DType::kFP32);
  g.t.rank = 4;
  const int64_t strides[4] = {x.dims[1] * x.dims[2] * x.dims[3], x.dims[2] * x.dims[3], x.dims[3], 1};
  for (int r = 0; r < 4; ++r) g.t.dims[r] = g.dims[r], g.t.strides[r] = strides[r];
  in[role] = g;
  return Status::Ok();
}

enum class SdpaKind { kFwd, kBwd, kFp8Fwd, kFp8Bwd };

// sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd (and sdpa_fp8_bwd: ops/sdpa_fp8_bwd_gpu.cu).
Status run_sdpa(GpuOpContext& ctx, const ResolvedOp& op, const SdpaOptions& o, SdpaKind kind,
                bool fp8_kv = false) {
  const cudaStream_t stream = ctx.stream();
  const bool dropout = o.dropout && *o.dropout > 0;
  std::string mask_name;
  if (dropout) {
    FUSEBOX_ASSIGN_OR_RETURN(mask_name, sdpa_dropout_mask_name(ctx.graph(), op, ctx.device_inputs()));
  }
  std::map<std::string, Located> in;
  for (std::string_view r : op_input_roles(op.attrs)) {
    const std::string role(r);
    FUSEBOX_ASSIGN_OR_RETURN(in[role], ctx.in(role));
    if (in[role].dims.size() != 4)
      return InvalidArgument(op_where(op) + "input '" + role + "' must have rank 4");
  }
  if (fp8_kv) {
    FUSEBOX_RETURN_IF_ERROR(descale_input(ctx, op, in, "k", "descale_k"));
    FUSEBOX_RETURN_IF_ERROR(descale_input(ctx, op, in, "v", "descale_v"));
  }
  if (o.paged) {
    FUSEBOX_RETURN_IF_ERROR(gather_pages(ctx, op, o, in, "k", "page_table_k"));
    FUSEBOX_RETURN_IF_ERROR(gather_pages(ctx, op, o, in, "v", "page_table_v"));
  }
  SdpaArgs a{};
  a.q = in["q"].t, a.k = in["k"].t, a.v = in["v"].t;
  const std::vector<int64_t>&qd = in["q"].dims, &kd = in["k"].dims, &vd = in["v"].dims;
  a.B = qd[0], a.Hq = qd[1], a.Sq = qd[2], a.D = qd[3];
  a.Hk = kd[1], a.Skv = kd[2], a.Dv = vd[3];
  if (kd[0] != a.B || vd[0] != a.B || kd[3] != a.D || vd[1] != a.Hk || vd[2] != a.Skv || a.Hk < 1 ||
      a.Hq % a.Hk != 0)
    return InvalidArgument(op_where(op) + "inconsistent shapes: q " + dims_string(qd) + ", k " +
                           dims_string(kd) + ", v " + dims_string(vd));
  if (a.D > kSdpaThreads * kSdpaMaxDvPerThread || a.Dv > kSdpaThreads * kSdpaMaxDvPerThread)
    return NotSupported(op_where(op) + "the GPU reference handles D, Dv <= 256");
  a.scale = static_cast<float>(o.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(a.D))));
  a.mask = sdpa_mask_params(o);
  if (o.padding) {
    FUSEBOX_ASSIGN_OR_RETURN(a.seq_len_q, seq_lens(ctx, op, "seq_len_q", in["seq_len_q"], a.B, a.Sq));
    FUSEBOX_ASSIGN_OR_RETURN(a.seq_len_kv, seq_lens(ctx, op, "seq_len_kv", in["seq_len_kv"], a.B, a.Skv));
    a.seq_len_q_stride = in["seq_len_q"].t.strides[0];
    a.seq_len_kv_stride = in["seq_len_kv"].t.strides[0];
  }
  if (o.bias) {
    const std::vector<int64_t>& bd = in["bias"].dims;
    if ((bd[0] != 1 && bd[0] != a.B) || (bd[1] != 1 && bd[1] != a.Hq) || bd[2] != a.Sq || bd[3] != a.Skv)
      return InvalidArgument(op_where(op) + "input 'bias' has dims " + dims_string(bd) +
                             " but q and k need [B or 1, Hq or 1, Sq, Skv]");
    a.bias = broadcast_to(in["bias"], {a.B, a.Hq, a.Sq, a.Skv});
  }
  if (o.alibi) {
    const std::vector<double> slopes = alibi_slopes(a.Hq);
    const std::vector<float> host(slopes.begin(), slopes.end());
    FUSEBOX_ASSIGN_OR_RETURN(float* dev, ctx.temporary(a.Hq));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float),
                                                      cudaMemcpyHostToDevice, stream));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaStreamSynchronize(stream));  // `host` dies here
    a.slopes = dev;
  }
  if (o.sink) {
    const std::vector<int64_t>& sd = in["sink_token"].dims;
    if (sd != std::vector<int64_t>{1, a.Hq, 1, 1} ||
        in["sink_token"].t.dtype != static_cast<int>(DType::kFP32))
      return InvalidArgument(op_where(op) + "input 'sink_token' must be fp32 [1, " + std::to_string(a.Hq) +
                             ", 1, 1]; got dims " + dims_string(sd));
    a.sink = in["sink_token"].t;
  }
  if (o.block_mask) {
    const std::vector<int64_t> want = sdpa_block_mask_dims(a.B, a.Hq, a.Sq, a.Skv);
    if (in["block_mask"].dims != want)
      return InvalidArgument(op_where(op) + "input 'block_mask' has dims " +
                             dims_string(in["block_mask"].dims) + " but q and k need " + dims_string(want));
    a.block_mask = in["block_mask"].t;
  }
  if (dropout) {
    // cuDNN's dumped keep-mask, read as the graph tensor says (fp32, dense [B,Hq,Sq,Skv]).
    FUSEBOX_ASSIGN_OR_RETURN(const Located m, ctx.tensor("dropout_mask", ctx.graph().find_tensor(mask_name)));
    if (m.dims != std::vector<int64_t>{a.B, a.Hq, a.Sq, a.Skv} || !m.t.ptr)
      return InvalidArgument(op_where(op) + "'dropout_mask' tensor '" + mask_name + "' has dims " +
                             dims_string(m.dims) +
                             " but q and k need [B, Hq, Sq, Skv] = " + dims_string({a.B, a.Hq, a.Sq, a.Skv}));
    a.dropout_mask = m.t;
    a.dropout_scale = static_cast<float>(1.0 / (1.0 - *o.dropout));
  }
  std::map<std::string, float*> out;
  for (std::string_view r : op_output_roles(op.attrs)) {
    const std::string role(r);
    if (role == "dropout_mask") continue;  // cuDNN's RNG dump: an input here, never written
    auto it = op.outputs.find(role);
    if (it == op.outputs.end()) return InvalidArgument(op_where(op) + "has no output '" + role + "'");
    FUSEBOX_ASSIGN_OR_RETURN(out[role], ctx.destination(it->second));
  }
  const int64_t rows = a.B * a.Hq * a.Sq, keys = a.B * a.Hk * a.Skv;
  if (rows > 2147483647 || keys > 2147483647)
    return NotSupported(op_where(op) + "the GPU reference handles B*Hq*Sq and B*Hk*Skv < 2^31");
  const size_t row_smem = static_cast<size_t>(a.D + a.Dv + kSdpaChunk) * sizeof(float);
  auto stats_out = [&]() { return out.count("stats") ? out["stats"] : nullptr; };

  if (kind == SdpaKind::kFp8Bwd)  // ops/sdpa_fp8_bwd_gpu.cu
    return sdpa_fp8_bwd_gpu(op_where(op), in, a, out, stream);
  if (kind == SdpaKind::kBwd) {
    SdpaBwdArgs w{};
    w.o = in["o"].t, w.dout = in["do"].t, w.stats = in["stats"].t;
    FUSEBOX_ASSIGN_OR_RETURN(w.di, ctx.temporary(rows));
    if (rows > 0) {
      sdpa_bwd_dq_kernel<<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream>>>(a, w, out["dq"]);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    }
    if (keys > 0) {
      const size_t key_smem = static_cast<size_t>(a.D + a.Dv + 2 * kSdpaChunk) * sizeof(float);
      sdpa_bwd_dkdv_kernel<<<static_cast<unsigned>(keys), kSdpaThreads, key_smem, stream>>>(a, w, out["dk"],
                                                                                            out["dv"]);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    }
    if (out.count("dsink_token")) {
      if (rows == 0) {
        FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(out["dsink_token"], 0,
                                                          static_cast<size_t>(a.Hq) * sizeof(float), stream));
      } else {
        sdpa_bwd_dsink_kernel<<<static_cast<unsigned>(a.Hq), kSdpaThreads, 0, stream>>>(a, w,
                                                                                        out["dsink_token"]);
        FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
      }
    }
    return Status::Ok();
  }
  SdpaFp8Args f8{};
  if (kind == SdpaKind::kFp8Fwd) {
    f8.descale_q = in["descale_q"].t, f8.descale_k = in["descale_k"].t, f8.descale_v = in["descale_v"].t;
    f8.descale_s = in["descale_s"].t, f8.scale_s = in["scale_s"].t, f8.scale_o = in["scale_o"].t;
    f8.amax_s = out["amax_s"], f8.amax_o = out["amax_o"];
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(f8.amax_s, 0, sizeof(float), stream));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(f8.amax_o, 0, sizeof(float), stream));
    if (rows > 0)
      sdpa_fwd_kernel<true>
          <<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream>>>(a, f8, out["o"], stats_out());
  } else if (rows > 0) {
    sdpa_fwd_kernel<false>
        <<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream>>>(a, f8, out["o"], stats_out());
  }
  FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& a) {
  return run_sdpa(ctx, op, a, SdpaKind::kFwd, a.fp8_kv);
}
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& a) {
  return run_sdpa(ctx, op, a, SdpaKind::kBwd);
}
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& a) {
  return run_sdpa(ctx, op, a, SdpaKind::kFp8Fwd);
}
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& a) {
  return run_sdpa(ctx, op, a, SdpaKind::kFp8Bwd);
}

}  // namespace fusebox::reference_detail
