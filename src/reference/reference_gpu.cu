// fusebox: naive GPU reference. fp32 accumulation; one thread per output
// element for conv and pointwise ops, a shared-memory tiled kernel for matmul
// (a 4096^3 GEMM must take milliseconds, not minutes). Inputs are read in
// their graph dtype and strides; tensors produced by ops live in fp32,
// logical row-major buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <optional>
#include <string_view>

#include "fusebox/reference.h"
#include "reference/gpu_util.cuh"
#include "reference/sdpa_dropout.h"
#include "reference/sdpa_fp8_bwd.h"
#include "reference/sdpa_mask.h"
#include "reference/tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::product;

bool gpu_reference_available() { return true; }

namespace {

using namespace reference_detail::gpu;

constexpr int kMaxRank = 8;

// How a kernel reads one tensor: pointer, dtype and strides (in elements).
// Passed by value; dims are left-padded with 1s to the kernel's rank.
struct DevTensor {
  const void* ptr = nullptr;
  int dtype = 0;  // static_cast<int>(DType)
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  float scalar = 0;  // used when ptr == nullptr (a by-value scalar)
};

// ---------------------------------------------------------------- pointwise

struct PointwiseArgs {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t count;
  int mode;  // static_cast<int>(PointwiseMode)
  int binary;
  DevTensor in0, in1;  // strides already 0 along broadcast dims
};

__device__ float apply_pointwise(int mode, float a, float b) {
  switch (static_cast<PointwiseMode>(mode)) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd: return a + b;
    case PointwiseMode::kSub: return a - b;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale: return a * b;
    case PointwiseMode::kRelu: return a > 0.0f ? a : 0.0f;
    case PointwiseMode::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
    }
    case PointwiseMode::kGeluErf: return 0.5f * a * (1.0f + erff(a * 0.7071067811865476f));
    case PointwiseMode::kSilu: return a / (1.0f + expf(-a));
    case PointwiseMode::kSigmoid: return 1.0f / (1.0f + expf(-a));
    case PointwiseMode::kTanh: return tanhf(a);
  }
  return a;
}

__global__ void pointwise_kernel(PointwiseArgs args, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < args.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, off0 = 0, off1 = 0;
    for (int d = args.rank - 1; d >= 0; --d) {
      const int64_t c = rem % args.out_dims[d];
      rem /= args.out_dims[d];
      off0 += c * args.in0.strides[d];
      off1 += c * args.in1.strides[d];
    }
    const float a = load_at(args.in0, off0);
    const float b = args.binary ? load_at(args.in1, off1) : 0.0f;
    y[i] = apply_pointwise(args.mode, a, b);
  }
}

// ---------------------------------------------------------------- conv

struct ConvArgs {
  DevTensor x, w;  // rank 5 (N, C, D, H, W) / (K, C, T, R, S), spatial padded with 1s
  int64_t N, C, K, Cg, Kg;
  int64_t in_sp[3], f_sp[3], out_sp[3];
  int64_t pad[3], str[3], dil[3];
  int64_t count;
};

__global__ void conv_fprop_kernel(ConvArgs a, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i;
    const int64_t ow = rem % a.out_sp[2]; rem /= a.out_sp[2];
    const int64_t oh = rem % a.out_sp[1]; rem /= a.out_sp[1];
    const int64_t od = rem % a.out_sp[0]; rem /= a.out_sp[0];
    const int64_t k = rem % a.K;
    const int64_t n = rem / a.K;
    const int64_t g = k / a.Kg;
    float acc = 0.0f;
    for (int64_t c = 0; c < a.Cg; ++c) {
      const int64_t xc = g * a.Cg + c;
      for (int64_t t = 0; t < a.f_sp[0]; ++t) {
        const int64_t id = od * a.str[0] - a.pad[0] + t * a.dil[0];
        if (id < 0 || id >= a.in_sp[0]) continue;
        for (int64_t r = 0; r < a.f_sp[1]; ++r) {
          const int64_t ih = oh * a.str[1] - a.pad[1] + r * a.dil[1];
          if (ih < 0 || ih >= a.in_sp[1]) continue;
          for (int64_t s = 0; s < a.f_sp[2]; ++s) {
            const int64_t iw = ow * a.str[2] - a.pad[2] + s * a.dil[2];
            if (iw < 0 || iw >= a.in_sp[2]) continue;
            const int64_t xo = n * a.x.strides[0] + xc * a.x.strides[1] + id * a.x.strides[2] +
                               ih * a.x.strides[3] + iw * a.x.strides[4];
            const int64_t wo = k * a.w.strides[0] + c * a.w.strides[1] + t * a.w.strides[2] +
                               r * a.w.strides[3] + s * a.w.strides[4];
            acc += load_at(a.x, xo) * load_at(a.w, wo);
          }
        }
      }
    }
    y[i] = acc;
  }
}

// ---------------------------------------------------------------- matmul

// 64x64 output tile per block, 16-deep k slices, 256 threads each computing 4x4.
constexpr int kTileM = 64, kTileN = 64, kTileK = 16, kThreads = 256;

struct MatmulArgs {
  DevTensor a, b;  // strides for [batch..., M, K] / [batch..., K, N], batch strides 0 where broadcast
  int batch_rank;
  int64_t batch_dims[kMaxRank];
  int64_t M, N, K;
};

__global__ void __launch_bounds__(kThreads) matmul_kernel(MatmulArgs p, float* y) {
  __shared__ float As[kTileK][kTileM + 4];
  __shared__ float Bs[kTileK][kTileN + 4];
  const int r = p.a.rank;  // a.rank == b.rank == batch_rank + 2
  // Batch offsets (broadcast dims have stride 0).
  int64_t rem = blockIdx.z, aoff = 0, boff = 0;
  for (int d = p.batch_rank - 1; d >= 0; --d) {
    const int64_t c = rem % p.batch_dims[d];
    rem /= p.batch_dims[d];
    aoff += c * p.a.strides[d];
    boff += c * p.b.strides[d];
  }
  const int64_t a_sm = p.a.strides[r - 2], a_sk = p.a.strides[r - 1];
  const int64_t b_sk = p.b.strides[r - 2], b_sn = p.b.strides[r - 1];
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM, n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < p.K; k0 += kTileK) {
    // Each thread loads 4 elements of the A tile (64x16) and 4 of the B tile (16x64).
    for (int l = threadIdx.x; l < kTileM * kTileK; l += kThreads) {
      const int mm = l / kTileK, kk = l % kTileK;
      const int64_t gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < p.M && gk < p.K) ? load_at(p.a, aoff + gm * a_sm + gk * a_sk) : 0.0f;
    }
    for (int l = threadIdx.x; l < kTileK * kTileN; l += kThreads) {
      const int kk = l / kTileN, nn = l % kTileN;
      const int64_t gk = k0 + kk, gn = n0 + nn;
      Bs[kk][nn] = (gk < p.K && gn < p.N) ? load_at(p.b, boff + gk * b_sk + gn * b_sn) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kTileK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
  float* yb = y + static_cast<int64_t>(blockIdx.z) * p.M * p.N;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t gm = m0 + ty + 16 * i;
    if (gm >= p.M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gn = n0 + tx + 16 * j;
      if (gn < p.N) yb[gm * p.N + gn] = acc[i][j];
    }
  }
}

// ---------------------------------------------------------------- sdpa

// One block per query row (forward, dq) or key row (dk/dv); keys (rows) in
// chunks of kSdpaChunk whose scores live in shared memory. Each thread owns
// head dims d = tid, tid + 128 of the accumulators (D, Dv <= 256). Masks are
// the kept intervals of sdpa_mask.h, so masked pairs cost nothing.
constexpr int kSdpaThreads = 128, kSdpaChunk = 1024, kSdpaMaxDvPerThread = 2;

// What every sdpa kernel needs to form a score and its mask.
struct SdpaArgs {
  DevTensor q, k, v;  // rank 4, logical [B,H,S,D] strides
  DevTensor bias;     // ptr == nullptr: no bias; strides 0 along broadcast dims
  const int* seq_len_q = nullptr;  // int32 [B,1,1,1] with padding, else nullptr
  const int* seq_len_kv = nullptr;
  int64_t seq_len_q_stride = 0, seq_len_kv_stride = 0;
  const float* slopes = nullptr;  // ALiBi slope per query head, else nullptr
  reference_detail::SdpaMaskParams mask;
  int64_t B, Hq, Hk, Sq, Skv, D, Dv;
  float scale;  // attn_scale
  // Dropout: cuDNN's keep-mask M [B,Hq,Sq,Skv] (ptr == nullptr: no dropout) and 1 / (1 - p).
  DevTensor dropout_mask;
  float dropout_scale = 1.0f;
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
  if (a.bias.ptr) s += load_at(a.bias, b * a.bias.strides[0] + h * a.bias.strides[1] + i * a.bias.strides[2] +
                                           j * a.bias.strides[3]);
  if (a.slopes) s += a.slopes[h] * static_cast<float>(j - i);
  return s;
}

// Dropout's factor M / (1 - p) of (b, h, i, j); 1 without dropout.
__device__ __forceinline__ float sdpa_dropout(const SdpaArgs& a, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!a.dropout_mask.ptr) return 1.0f;
  const DevTensor& m = a.dropout_mask;
  return load_at(m, b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j * m.strides[3]) * a.dropout_scale;
}

// Scores of keys [j0, j0 + cnt) of row (b, h, i) into ps; returns this thread's max.
__device__ float sdpa_chunk_scores(const SdpaArgs& a, float scale, const float* qs, int64_t b, int64_t h,
                                   int64_t hk, int64_t i, int64_t j0, int cnt, float* ps) {
  float local_max = -INFINITY;
  for (int jj = threadIdx.x; jj < cnt; jj += kSdpaThreads) {
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
  reference_detail::sdpa_kept_keys(a.mask, i, lq, sdpa_len_kv(a, b), &lo, &hi);
  const float scale = kFp8 ? a.scale * load_at(f8.descale_q, 0) * load_at(f8.descale_k, 0) : a.scale;
  const int64_t voff = b * a.v.strides[0] + hk * a.v.strides[1];
  float m = -INFINITY, l = 0.0f;
  float acc[kSdpaMaxDvPerThread] = {};
  // Accumulates ps[0, cnt) @ v rows [j0, j0 + cnt) into acc, after scaling acc by corr.
  auto accumulate = [&](int64_t j0, int cnt, float corr) {
#pragma unroll
    for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
      const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
      if (d >= a.Dv) continue;
      float sum = 0.0f;
      for (int jj = 0; jj < cnt; ++jj) sum += ps[jj] * load_at(a.v, voff + (j0 + jj) * a.v.strides[2] + d * a.v.strides[3]);
      acc[r] = acc[r] * corr + sum;
    }
  };
  for (int64_t j0 = lo; j0 <= hi; j0 += kSdpaChunk) {
    const int cnt = static_cast<int>(hi + 1 - j0 < kSdpaChunk ? hi + 1 - j0 : kSdpaChunk);
    __syncthreads();  // qs loaded; ps of the previous chunk consumed
    const float local_max = sdpa_chunk_scores(a, scale, qs, b, h, hk, i, j0, cnt, ps);
    const float new_m = fmaxf(m, block_reduce<kSdpaThreads>(local_max, true, red));
    const float corr = expf(m - new_m);  // 0 on the first chunk (m = -inf)
    float local_sum = 0.0f;
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const float p = expf(ps[jj] - new_m);
      ps[jj] = p * sdpa_dropout(a, b, h, i, j0 + jj);
      local_sum += p;
    }
    l = l * corr + block_reduce<kSdpaThreads>(local_sum, false, red);  // its __syncthreads publish ps
    m = new_m;
    if (!kFp8) accumulate(j0, cnt, corr);
  }
  const bool kept = lo <= hi;
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
  if (stats && tid == 0) stats[row] = i >= lq ? 0.0f : kept ? m + logf(l) : -INFINITY;
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
  float* qs = smem;                // D
  float* dos = smem + a.D;         // Dv
  float* ds = dos + a.Dv;          // dS of one key chunk
  __shared__ float red[kSdpaThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % a.Sq, bh = row / a.Sq, h = bh % a.Hq, b = bh / a.Hq;
  const int64_t hk = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x;
  const int64_t qoff = row_offset(a.q, b, h, i), dooff = row_offset(w.dout, b, h, i), ooff = row_offset(w.o, b, h, i);
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
  reference_detail::sdpa_kept_keys(a.mask, i, sdpa_len_q(a, b), sdpa_len_kv(a, b), &lo, &hi);
  float acc[kSdpaMaxDvPerThread] = {};
  for (int64_t j0 = lo; j0 <= hi; j0 += kSdpaChunk) {
    const int cnt = static_cast<int>(hi + 1 - j0 < kSdpaChunk ? hi + 1 - j0 : kSdpaChunk);
    __syncthreads();  // ds of the previous chunk consumed
    sdpa_chunk_scores(a, a.scale, qs, b, h, hk, i, j0, cnt, ds);
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const float p = expf(ds[jj] - lse);
      const float dp = dot_row(dos, a.v, row_offset(a.v, b, hk, j0 + jj), a.Dv) * sdpa_dropout(a, b, h, i, j0 + jj);
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
__global__ void __launch_bounds__(kSdpaThreads) sdpa_bwd_dkdv_kernel(SdpaArgs a, SdpaBwdArgs w, float* dk, float* dv) {
  extern __shared__ float smem[];
  float* ks = smem;              // D
  float* vs = smem + a.D;        // Dv
  float* ps = vs + a.Dv;         // P of one row chunk
  float* ds = ps + kSdpaChunk;   // dS of one row chunk
  const int64_t key = blockIdx.x;
  const int64_t j = key % a.Skv, bhk = key / a.Skv, hk = bhk % a.Hk, b = bhk / a.Hk;
  const int tid = threadIdx.x;
  const int64_t koff = row_offset(a.k, b, hk, j), voff = row_offset(a.v, b, hk, j);
  for (int64_t d = tid; d < a.D; d += kSdpaThreads) ks[d] = load_at(a.k, koff + d * a.k.strides[3]);
  for (int64_t d = tid; d < a.Dv; d += kSdpaThreads) vs[d] = load_at(a.v, voff + d * a.v.strides[3]);
  int64_t lo, hi;
  reference_detail::sdpa_kept_rows(a.mask, j, sdpa_len_q(a, b), sdpa_len_kv(a, b), &lo, &hi);
  float acc_k[kSdpaMaxDvPerThread] = {}, acc_v[kSdpaMaxDvPerThread] = {};
  const int64_t group = a.Hq / a.Hk;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
    for (int64_t i0 = lo; i0 <= hi; i0 += kSdpaChunk) {
      const int cnt = static_cast<int>(hi + 1 - i0 < kSdpaChunk ? hi + 1 - i0 : kSdpaChunk);
      __syncthreads();  // ks, vs loaded; ps, ds of the previous chunk consumed
      for (int ii = tid; ii < cnt; ii += kSdpaThreads) {
        const int64_t i = i0 + ii, row = (b * a.Hq + h) * a.Sq + i;
        const float dot = dot_row(ks, a.q, row_offset(a.q, b, h, i), a.D);
        const float p = expf(sdpa_score(a, a.scale, dot, b, h, i, j) - load_at(w.stats, row_offset(w.stats, b, h, i)));
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
          for (int ii = 0; ii < cnt; ++ii) acc_v[r] += ps[ii] * load_at(w.dout, dobase + ii * w.dout.strides[2]);
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

// ---------------------------------------------------------------- host side

std::string op_where(const ResolvedOp& op) {
  std::string s = "[";  // appended piecewise: GCC 12 flags "[" + std::string(...) with a false -Wrestrict
  s.append(op_type_name(op.attrs)).append(" '").append(op.name).append("'] ");
  return s;
}

Status cuda_status(cudaError_t e, const std::string& where, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError,
                where + what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

#define FUSEBOX_CUDA_RETURN(where, expr) FUSEBOX_RETURN_IF_ERROR(cuda_status((expr), (where), #expr))

int grid_for(int64_t count, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((count + threads - 1) / threads, 1 << 20)));
}

// Where a tensor's values are on the device, and how to read them.
struct Located {
  DevTensor t;
  std::vector<int64_t> dims;
};

// Broadcasts `in` (dims d) to rank `rank` over `out_dims`: left-pads and zeroes
// the strides of size-1 dims (and of every dim for a one-element tensor).
DevTensor broadcast_to(const Located& in, const std::vector<int64_t>& out_dims) {
  DevTensor t = in.t;
  const int rank = static_cast<int>(out_dims.size());
  const int pad = rank - static_cast<int>(in.dims.size());
  const bool scalar = product(in.dims) == 1;
  t.rank = rank;
  for (int d = 0; d < rank; ++d) {
    const int src = d - pad;
    const int64_t dim = src >= 0 ? in.dims[src] : 1;
    t.dims[d] = dim;
    t.strides[d] = (scalar || dim == 1 || src < 0) ? 0 : in.t.strides[src];
  }
  return t;
}

class GpuReference {
 public:
  GpuReference(const ResolvedGraph& g, const std::map<std::string, const void*>& in,
               const std::map<std::string, float*>& out, cudaStream_t stream)
      : g_(g), inputs_(in), outputs_(out), stream_(stream), located_(g.tensors.size()) {}

  ~GpuReference() {
    for (float* p : temporaries_) cudaFreeAsync(p, stream_);  // stream-ordered after the kernels
  }

  Status Run() {
    for (const ResolvedOp& op : g_.ops) FUSEBOX_RETURN_IF_ERROR(RunOp(op));
    FUSEBOX_CUDA_RETURN("[reference_gpu] ", cudaStreamSynchronize(stream_));
    return Status::Ok();
  }

 private:
  Result<Located> Get(const ResolvedOp& op, const std::string& role, int idx) {
    if (idx < 0 || idx >= static_cast<int>(g_.tensors.size()))
      return InvalidArgument(op_where(op) + "input '" + role + "' refers to a tensor outside the graph");
    if (located_[idx]) return *located_[idx];
    const ResolvedTensor& t = g_.tensors[idx];
    if (t.dims.size() > kMaxRank)
      return NotSupported(op_where(op) + "tensor '" + t.name + "' has rank " + std::to_string(t.dims.size()) +
                          "; the GPU reference handles rank <= 8");
    Located l;
    l.dims = t.dims;
    l.t.rank = static_cast<int>(t.dims.size());
    l.t.dtype = static_cast<int>(t.dtype);
    for (size_t d = 0; d < t.dims.size(); ++d) {
      l.t.dims[d] = t.dims[d];
      l.t.strides[d] = d < t.strides.size() ? t.strides[d] : 0;
    }
    if (t.scalar_value) {
      l.t.ptr = nullptr;
      l.t.scalar = static_cast<float>(*t.scalar_value);
    } else {
      auto it = inputs_.find(t.name);
      if (it == inputs_.end() || !it->second)
        return InvalidArgument(op_where(op) + "input '" + role + "': no device pointer for tensor '" + t.name + "'");
      if (t.strides.size() != t.dims.size())
        return InvalidArgument(op_where(op) + "tensor '" + t.name + "' has no strides");
      l.t.ptr = it->second;
    }
    located_[idx] = l;
    return l;
  }

  // The fp32 buffer that receives tensor `idx`: the caller's for outputs, a temporary otherwise.
  Result<float*> Destination(const ResolvedOp& op, int idx) {
    const ResolvedTensor& t = g_.tensors[idx];
    if (t.dims.size() > kMaxRank)
      return NotSupported(op_where(op) + "output '" + t.name + "' has rank > 8");
    float* p = nullptr;
    if (!t.is_virtual) {
      auto it = outputs_.find(t.name);
      if (it == outputs_.end() || !it->second)
        return InvalidArgument(op_where(op) + "no device output buffer for tensor '" + t.name + "'");
      p = it->second;
    } else {
      const size_t bytes = std::max<size_t>(1, static_cast<size_t>(product(t.dims))) * sizeof(float);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaMallocAsync(reinterpret_cast<void**>(&p), bytes, stream_));
      temporaries_.push_back(p);
    }
    Located l;
    l.dims = t.dims;
    l.t.ptr = p;
    l.t.dtype = static_cast<int>(DType::kFP32);
    l.t.rank = static_cast<int>(t.dims.size());
    const std::vector<int64_t> s = reference_detail::dense_row_major(t.dims);
    for (size_t d = 0; d < t.dims.size(); ++d) l.t.dims[d] = t.dims[d], l.t.strides[d] = s[d];
    pending_ = l;
    return p;
  }

  // A device buffer of `count` floats, freed after the run.
  Result<float*> Temporary(const ResolvedOp& op, int64_t count) {
    float* p = nullptr;
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMallocAsync(reinterpret_cast<void**>(&p),
                                                      std::max<size_t>(1, static_cast<size_t>(count)) * sizeof(float),
                                                      stream_));
    temporaries_.push_back(p);
    return p;
  }

  // Checks an int32 [B,1,1,1] length input and that every length is in [0, full]
  // (copied to the host once: a bad length would make the kernels read out of bounds).
  Result<const int*> SeqLens(const ResolvedOp& op, const char* role, const Located& l, int64_t B, int64_t full) {
    if (l.t.dtype != static_cast<int>(DType::kInt32) || !l.t.ptr || l.dims != std::vector<int64_t>{B, 1, 1, 1})
      return InvalidArgument(op_where(op) + "input '" + role + "' must be an int32 tensor [" + std::to_string(B) +
                             ", 1, 1, 1] in memory; got dims " + dims_string(l.dims));
    std::vector<int> host(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      FUSEBOX_CUDA_RETURN(op_where(op), cudaMemcpyAsync(&host[b], static_cast<const int*>(l.t.ptr) + b * l.t.strides[0],
                                                        sizeof(int), cudaMemcpyDeviceToHost, stream_));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaStreamSynchronize(stream_));
    for (int64_t b = 0; b < B; ++b)
      if (host[b] < 0 || host[b] > full)
        return InvalidArgument(op_where(op) + "input '" + role + "' holds " + std::to_string(host[b]) + " for batch " +
                               std::to_string(b) + ": each length must be an integer in [0, " + std::to_string(full) +
                               "]");
    return static_cast<const int*>(l.t.ptr);
  }

  // sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd (and sdpa_fp8_bwd: sdpa_fp8_bwd_gpu.cu).
  Status RunSdpa(const ResolvedOp& op, const SdpaOptions& o) {
    const bool dropout = o.dropout && *o.dropout > 0;
    std::string mask_name;
    if (dropout) {
      FUSEBOX_ASSIGN_OR_RETURN(mask_name, reference_detail::sdpa_dropout_mask_name(g_, op, inputs_));
    }
    std::map<std::string, Located> in;
    for (std::string_view r : op_input_roles(op.attrs)) {
      const std::string role(r);
      auto it = op.inputs.find(role);
      if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
      FUSEBOX_ASSIGN_OR_RETURN(in[role], Get(op, role, it->second));
      if (in[role].dims.size() != 4) return InvalidArgument(op_where(op) + "input '" + role + "' must have rank 4");
    }
    SdpaArgs a{};
    a.q = in["q"].t, a.k = in["k"].t, a.v = in["v"].t;
    const std::vector<int64_t>&qd = in["q"].dims, &kd = in["k"].dims, &vd = in["v"].dims;
    a.B = qd[0], a.Hq = qd[1], a.Sq = qd[2], a.D = qd[3];
    a.Hk = kd[1], a.Skv = kd[2], a.Dv = vd[3];
    if (kd[0] != a.B || vd[0] != a.B || kd[3] != a.D || vd[1] != a.Hk || vd[2] != a.Skv || a.Hk < 1 || a.Hq % a.Hk != 0)
      return InvalidArgument(op_where(op) + "inconsistent shapes: q " + dims_string(qd) + ", k " + dims_string(kd) +
                             ", v " + dims_string(vd));
    if (a.D > kSdpaThreads * kSdpaMaxDvPerThread || a.Dv > kSdpaThreads * kSdpaMaxDvPerThread)
      return NotSupported(op_where(op) + "the GPU reference handles D, Dv <= 256");
    a.scale = static_cast<float>(o.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(a.D))));
    a.mask = reference_detail::sdpa_mask_params(o);
    if (o.padding) {
      FUSEBOX_ASSIGN_OR_RETURN(a.seq_len_q, SeqLens(op, "seq_len_q", in["seq_len_q"], a.B, a.Sq));
      FUSEBOX_ASSIGN_OR_RETURN(a.seq_len_kv, SeqLens(op, "seq_len_kv", in["seq_len_kv"], a.B, a.Skv));
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
      FUSEBOX_ASSIGN_OR_RETURN(float* dev, Temporary(op, a.Hq));
      FUSEBOX_CUDA_RETURN(op_where(op), cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(float),
                                                        cudaMemcpyHostToDevice, stream_));
      FUSEBOX_CUDA_RETURN(op_where(op), cudaStreamSynchronize(stream_));  // `host` dies here
      a.slopes = dev;
    }
    if (dropout) {
      // cuDNN's dumped keep-mask, read as the graph tensor says (fp32, dense [B,Hq,Sq,Skv]).
      FUSEBOX_ASSIGN_OR_RETURN(const Located m, Get(op, "dropout_mask", g_.find_tensor(mask_name)));
      if (m.dims != std::vector<int64_t>{a.B, a.Hq, a.Sq, a.Skv} || !m.t.ptr)
        return InvalidArgument(op_where(op) + "'dropout_mask' tensor '" + mask_name + "' has dims " +
                               dims_string(m.dims) + " but q and k need [B, Hq, Sq, Skv] = " +
                               dims_string({a.B, a.Hq, a.Sq, a.Skv}));
      a.dropout_mask = m.t;
      a.dropout_scale = static_cast<float>(1.0 / (1.0 - *o.dropout));
    }
    std::map<std::string, float*> out;
    for (std::string_view r : op_output_roles(op.attrs)) {
      const std::string role(r);
      if (role == "dropout_mask") continue;  // cuDNN's RNG dump: an input here, never written
      auto it = op.outputs.find(role);
      if (it == op.outputs.end()) return InvalidArgument(op_where(op) + "has no output '" + role + "'");
      FUSEBOX_ASSIGN_OR_RETURN(out[role], Destination(op, it->second));
      located_[it->second] = pending_;
    }
    const int64_t rows = a.B * a.Hq * a.Sq, keys = a.B * a.Hk * a.Skv;
    if (rows > 2147483647 || keys > 2147483647)
      return NotSupported(op_where(op) + "the GPU reference handles B*Hq*Sq and B*Hk*Skv < 2^31");
    const size_t row_smem = static_cast<size_t>(a.D + a.Dv + kSdpaChunk) * sizeof(float);
    auto stats_out = [&]() { return out.count("stats") ? out["stats"] : nullptr; };

    if (std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs))  // src/reference/sdpa_fp8_bwd_gpu.cu
      return reference_detail::sdpa_fp8_bwd_gpu(op_where(op), in, a, out, stream_);
    if (std::holds_alternative<SdpaBwdAttrs>(op.attrs)) {
      SdpaBwdArgs w{};
      w.o = in["o"].t, w.dout = in["do"].t, w.stats = in["stats"].t;
      FUSEBOX_ASSIGN_OR_RETURN(w.di, Temporary(op, rows));
      if (rows > 0) {
        sdpa_bwd_dq_kernel<<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream_>>>(a, w, out["dq"]);
        FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
      }
      if (keys > 0) {
        const size_t key_smem = static_cast<size_t>(a.D + a.Dv + 2 * kSdpaChunk) * sizeof(float);
        sdpa_bwd_dkdv_kernel<<<static_cast<unsigned>(keys), kSdpaThreads, key_smem, stream_>>>(a, w, out["dk"],
                                                                                                out["dv"]);
        FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
      }
      return Status::Ok();
    }
    SdpaFp8Args f8{};
    if (std::holds_alternative<SdpaFp8FwdAttrs>(op.attrs)) {
      f8.descale_q = in["descale_q"].t, f8.descale_k = in["descale_k"].t, f8.descale_v = in["descale_v"].t;
      f8.descale_s = in["descale_s"].t, f8.scale_s = in["scale_s"].t, f8.scale_o = in["scale_o"].t;
      f8.amax_s = out["amax_s"], f8.amax_o = out["amax_o"];
      FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(f8.amax_s, 0, sizeof(float), stream_));
      FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(f8.amax_o, 0, sizeof(float), stream_));
      if (rows > 0) sdpa_fwd_kernel<true><<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream_>>>(a, f8, out["o"], stats_out());
    } else if (rows > 0) {
      sdpa_fwd_kernel<false><<<static_cast<unsigned>(rows), kSdpaThreads, row_smem, stream_>>>(a, f8, out["o"], stats_out());
    }
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    return Status::Ok();
  }

  Status RunOp(const ResolvedOp& op) {
    if (const SdpaOptions* sdpa = sdpa_options(op.attrs)) return RunSdpa(op, *sdpa);
    auto yit = op.outputs.find("y");
    if (yit == op.outputs.end() || yit->second < 0 || yit->second >= static_cast<int>(g_.tensors.size()))
      return InvalidArgument(op_where(op) + "has no valid output 'y'");
    const int yidx = yit->second;
    const std::vector<int64_t>& ydims = g_.tensors[yidx].dims;
    std::vector<std::string> roles;
    for (std::string_view r : op_input_roles(op.attrs)) roles.emplace_back(r);
    std::vector<Located> in;
    for (const std::string& role : roles) {
      auto it = op.inputs.find(role);
      if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
      FUSEBOX_ASSIGN_OR_RETURN(Located l, Get(op, role, it->second));
      in.push_back(l);
    }
    FUSEBOX_ASSIGN_OR_RETURN(float* y, Destination(op, yidx));
    const int64_t count = product(ydims);

    if (const auto* conv = std::get_if<ConvFpropAttrs>(&op.attrs)) {
      FUSEBOX_RETURN_IF_ERROR(LaunchConv(op, *conv, in[0], in[1], ydims, y));
    } else if (std::holds_alternative<MatmulAttrs>(op.attrs)) {
      FUSEBOX_RETURN_IF_ERROR(LaunchMatmul(op, in[0], in[1], ydims, y));
    } else if (const auto* pw = std::get_if<PointwiseAttrs>(&op.attrs)) {
      if (static_cast<int>(pw->mode) < 0 || pw->mode > PointwiseMode::kTanh)
        return NotSupported(op_where(op) + "the GPU reference does not implement this pointwise mode");
      PointwiseArgs a{};
      a.rank = static_cast<int>(ydims.size());
      for (int d = 0; d < a.rank; ++d) a.out_dims[d] = ydims[d];
      a.count = count;
      a.mode = static_cast<int>(pw->mode);
      a.binary = in.size() == 2;
      for (size_t i = 0; i < in.size(); ++i) {
        const std::vector<int64_t> p(in[i].dims);
        if (product(p) != 1) {
          if (p.size() > ydims.size())
            return InvalidArgument(op_where(op) + "input '" + roles[i] + "' has more dims than the output");
          for (size_t d = 0; d < p.size(); ++d) {
            const int64_t od = ydims[ydims.size() - p.size() + d];
            if (p[d] != 1 && p[d] != od)
              return InvalidArgument(op_where(op) + "input '" + roles[i] + "' dims " + dims_string(p) +
                                     " do not broadcast to " + dims_string(ydims));
          }
        }
        (i == 0 ? a.in0 : a.in1) = broadcast_to(in[i], ydims);
      }
      if (count > 0) {
        pointwise_kernel<<<grid_for(count, 256), 256, 0, stream_>>>(a, y);
        FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
      }
    } else {
      return NotSupported(op_where(op) + "the GPU reference does not implement op '" +
                          std::string(op_type_name(op.attrs)) + "'");
    }
    located_[yidx] = pending_;
    return Status::Ok();
  }

  Status LaunchConv(const ResolvedOp& op, const ConvFpropAttrs& attrs, const Located& x, const Located& w,
                    const std::vector<int64_t>& ydims, float* y) {
    const size_t rank = x.dims.size();
    if (rank < 3 || rank > 5 || w.dims.size() != rank || ydims.size() != rank)
      return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5");
    const size_t ns = rank - 2;
    ConvArgs a{};
    // Spatial dims padded to 3 at the front (size 1, stride 0).
    auto to5 = [&](const Located& l) {
      DevTensor t = l.t;
      t.rank = 5;
      t.dims[0] = l.dims[0], t.strides[0] = l.t.strides[0];
      t.dims[1] = l.dims[1], t.strides[1] = l.t.strides[1];
      for (int j = 0; j < 3; ++j) {
        const int src = 2 + j - static_cast<int>(3 - ns);
        t.dims[2 + j] = src >= 2 ? l.dims[src] : 1;
        t.strides[2 + j] = src >= 2 ? l.t.strides[src] : 0;
      }
      return t;
    };
    a.x = to5(x);
    a.w = to5(w);
    for (int j = 0; j < 3; ++j) {
      a.in_sp[j] = a.x.dims[2 + j];
      a.f_sp[j] = a.w.dims[2 + j];
      a.out_sp[j] = 1;
      a.pad[j] = 0, a.str[j] = 1, a.dil[j] = 1;
    }
    for (size_t i = 0; i < ns; ++i) {
      const size_t j = 3 - ns + i;
      a.out_sp[j] = ydims[2 + i];
      if (i < attrs.padding.size()) a.pad[j] = attrs.padding[i];
      if (i < attrs.stride.size()) a.str[j] = attrs.stride[i];
      if (i < attrs.dilation.size()) a.dil[j] = attrs.dilation[i];
      if (a.str[j] < 1 || a.dil[j] < 1 || a.pad[j] < 0)
        return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
      const int64_t expect = (a.in_sp[j] + 2 * a.pad[j] - a.dil[j] * (a.f_sp[j] - 1) - 1) / a.str[j] + 1;
      if (expect != a.out_sp[j])
        return InvalidArgument(op_where(op) + "output dims " + dims_string(ydims) + " do not match the convolution");
    }
    a.N = x.dims[0], a.C = x.dims[1], a.K = w.dims[0], a.Cg = w.dims[1];
    if (a.Cg <= 0 || a.C % a.Cg != 0 || a.K % (a.C / a.Cg) != 0 || ydims[0] != a.N || ydims[1] != a.K)
      return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x.dims) + ", w " +
                             dims_string(w.dims) + ", y " + dims_string(ydims));
    a.Kg = a.K / (a.C / a.Cg);
    a.count = product(ydims);
    if (a.count > 0) {
      conv_fprop_kernel<<<grid_for(a.count, 256), 256, 0, stream_>>>(a, y);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    }
    return Status::Ok();
  }

  Status LaunchMatmul(const ResolvedOp& op, const Located& a, const Located& b, const std::vector<int64_t>& ydims,
                      float* y) {
    const size_t rank = ydims.size();
    if (rank < 2 || a.dims.size() < 2 || b.dims.size() < 2 || a.dims.size() > rank || b.dims.size() > rank)
      return InvalidArgument(op_where(op) + "matmul needs rank >= 2 with a, b no larger than y");
    MatmulArgs p{};
    // Batch dims broadcast like pointwise ones; the last two keep their strides.
    std::vector<int64_t> abd(ydims), bbd(ydims);
    const size_t pa = rank - a.dims.size(), pb = rank - b.dims.size();
    p.a = a.t;
    p.b = b.t;
    p.a.rank = p.b.rank = static_cast<int>(rank);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t ad = d >= pa ? a.dims[d - pa] : 1, bd = d >= pb ? b.dims[d - pb] : 1;
      const int64_t as = d >= pa ? a.t.strides[d - pa] : 0, bs = d >= pb ? b.t.strides[d - pb] : 0;
      p.a.dims[d] = ad, p.b.dims[d] = bd;
      const bool batch = d + 2 < rank;
      p.a.strides[d] = (batch && ad == 1) ? 0 : as;
      p.b.strides[d] = (batch && bd == 1) ? 0 : bs;
      if (batch && ((ad != 1 && ad != ydims[d]) || (bd != 1 && bd != ydims[d])))
        return InvalidArgument(op_where(op) + "batch dims do not broadcast: a " + dims_string(a.dims) + ", b " +
                               dims_string(b.dims) + " -> y " + dims_string(ydims));
    }
    p.M = p.a.dims[rank - 2], p.K = p.a.dims[rank - 1], p.N = p.b.dims[rank - 1];
    if (p.b.dims[rank - 2] != p.K || ydims[rank - 2] != p.M || ydims[rank - 1] != p.N)
      return InvalidArgument(op_where(op) + "shapes do not chain: a " + dims_string(a.dims) + " x b " +
                             dims_string(b.dims) + " -> y " + dims_string(ydims));
    p.batch_rank = static_cast<int>(rank) - 2;
    int64_t batch = 1;
    for (int d = 0; d < p.batch_rank; ++d) p.batch_dims[d] = ydims[d], batch *= ydims[d];
    if (batch <= 0 || p.M <= 0 || p.N <= 0) return Status::Ok();
    if (p.K == 0) {
      FUSEBOX_CUDA_RETURN(op_where(op),
                          cudaMemsetAsync(y, 0, static_cast<size_t>(batch * p.M * p.N) * sizeof(float), stream_));
      return Status::Ok();
    }
    const int64_t gx = (p.N + kTileN - 1) / kTileN, gy = (p.M + kTileM - 1) / kTileM;
    if (gy > 65535 || batch > 65535)
      return NotSupported(op_where(op) + "the GPU reference handles M <= 4194240 and batch <= 65535");
    dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(batch));
    matmul_kernel<<<grid, kThreads, 0, stream_>>>(p, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    return Status::Ok();
  }

  const ResolvedGraph& g_;
  const std::map<std::string, const void*>& inputs_;
  const std::map<std::string, float*>& outputs_;
  cudaStream_t stream_;
  std::vector<std::optional<Located>> located_;
  std::vector<float*> temporaries_;
  Located pending_;
};

}  // namespace

Status reference_gpu(const ResolvedGraph& g, const std::map<std::string, const void*>& device_inputs,
                     const std::map<std::string, float*>& device_outputs, void* stream) {
  try {
    GpuReference r(g, device_inputs, device_outputs, static_cast<cudaStream_t>(stream));
    return r.Run();
  } catch (const std::exception& e) {
    return Internal("[reference_gpu] unexpected exception: " + std::string(e.what()));
  }
}

Result<ReferenceOutputs> reference_gpu_host(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  const std::string where = "[reference_gpu] graph '" + g.name + "': ";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return Status(StatusCode::kNoDevice, where + "no CUDA GPU");
  }
  // Device buffers freed on every return.
  struct Buffers {
    std::vector<void*> ptrs;
    ~Buffers() {
      for (void* p : ptrs) cudaFree(p);
    }
    Status alloc(size_t bytes, const std::string& where, void** p) {
      FUSEBOX_CUDA_RETURN(where, cudaMalloc(p, std::max<size_t>(bytes, 1)));
      ptrs.push_back(*p);
      return Status::Ok();
    }
  } buffers;
  std::map<std::string, const void*> d_in;
  for (const auto& [name, h] : inputs) {
    void* p = nullptr;
    FUSEBOX_RETURN_IF_ERROR(buffers.alloc(h.data.size(), where + "input '" + name + "': ", &p));
    FUSEBOX_CUDA_RETURN(where, cudaMemcpy(p, h.data.data(), h.data.size(), cudaMemcpyHostToDevice));
    d_in[name] = p;
  }
  // Every output but the dropout masks (inputs to the reference, never computed).
  std::vector<bool> is_mask(g.tensors.size(), false);
  for (const ResolvedOp& op : g.ops) {
    auto m = op.outputs.find("dropout_mask");
    if (m != op.outputs.end() && m->second >= 0 && m->second < static_cast<int>(is_mask.size())) is_mask[m->second] = true;
  }
  std::map<std::string, float*> d_out;
  for (int i : g.output_tensors()) {
    if (is_mask[i]) continue;
    const ResolvedTensor& t = g.tensors[i];
    void* p = nullptr;
    FUSEBOX_RETURN_IF_ERROR(
        buffers.alloc(static_cast<size_t>(t.element_count()) * sizeof(float), where + "output '" + t.name + "': ", &p));
    d_out[t.name] = static_cast<float*>(p);
  }
  FUSEBOX_RETURN_IF_ERROR(reference_gpu(g, d_in, d_out, nullptr));
  ReferenceOutputs out;
  for (const auto& [name, p] : d_out) {
    std::vector<float> v(static_cast<size_t>(g.tensors[g.find_tensor(name)].element_count()));
    FUSEBOX_CUDA_RETURN(where, cudaMemcpy(v.data(), p, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    out[name] = std::move(v);
  }
  return out;
}

}  // namespace fusebox
