// fusebox: naive GPU reference of sdpa_fp8_bwd (semantics: sdpa_fp8_bwd.h),
// fp32 accumulation with cuDNN's two fp8 roundings (P8, dS8) emulated.
// Two kernels like reference_gpu.cu's sdpa_bwd: one block per query row (Di,
// dq, amax_dp, amax_dq), then one block per key row of a kv head (dk, dv over
// the group's query heads). Keys (rows) go in chunks whose dS8 (and P8) live
// in shared memory; each thread owns head dims d = tid, tid + 128 (D, Dv <= 256).
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>

#include "common/cuda_status.h"
#include "gpu_util.cuh"
#include "ops/sdpa_fp8_bwd.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

constexpr int kThreads = 128, kChunk = 1024, kMaxPerThread = 2;
using Tensor = SdpaFp8BwdDevTensor;

__device__ __forceinline__ int64_t len_q(const SdpaFp8BwdGpuArgs& a, int64_t b) {
  return a.seq_len_q ? a.seq_len_q[b * a.seq_len_q_stride] : a.sh.Sq;
}
__device__ __forceinline__ int64_t len_kv(const SdpaFp8BwdGpuArgs& a, int64_t b) {
  return a.seq_len_kv ? a.seq_len_kv[b * a.seq_len_kv_stride] : a.sh.Skv;
}

__device__ __forceinline__ float dropout_factor(const SdpaFp8BwdGpuArgs& a, int64_t b, int64_t h, int64_t i,
                                                int64_t j) {
  if (!a.dropout_mask.ptr) return 1.0f;
  const Tensor& m = a.dropout_mask;
  return load_at(m, b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j * m.strides[3]) *
         a.dropout_scale;
}

// The 12 factors, read once per block.
struct Scales {
  float descale_q, descale_k, descale_v, descale_o, descale_do, descale_s, descale_dp, scale_s, scale_dq,
      scale_dk, scale_dv, scale_dp;
};
__device__ Scales read_scales(const SdpaFp8BwdGpuArgs& a) {
  Scales s;
  float* f = &s.descale_q;
  for (int n = 0; n < 12; ++n) f[n] = load_at(a.scales[n], 0);
  return s;
}

// One block per query row: Di, then over the kept keys dS (amax_dp) and
// dS8, accumulating dq = descale_dp * descale_k * sum dS8 k8.
__global__ void __launch_bounds__(kThreads)
    fp8_bwd_dq_kernel(SdpaFp8BwdGpuArgs a, float* di_out, float* dq, float* amax_dq, float* amax_dp) {
  extern __shared__ float smem[];
  const SdpaFp8BwdShape& sh = a.sh;
  float* qs = smem;         // D
  float* dos = qs + sh.D;   // Dv
  float* ds = dos + sh.Dv;  // dS8 of one key chunk
  __shared__ float red[kThreads / 32];
  const Scales sc = read_scales(a);
  const bool ds_e5m2 = a.dout.dtype == static_cast<int>(DType::kFP8E5M2);
  const int64_t row = blockIdx.x;
  const int64_t i = row % sh.Sq, bh = row / sh.Sq, h = bh % sh.Hq, b = bh / sh.Hq, hk = h / (sh.Hq / sh.Hk);
  const int tid = threadIdx.x;
  const int64_t qoff = row_offset(a.q, b, h, i), dooff = row_offset(a.dout, b, h, i),
                ooff = row_offset(a.o, b, h, i);
  for (int64_t d = tid; d < sh.D; d += kThreads) qs[d] = load_at(a.q, qoff + d * a.q.strides[3]);
  float di_part = 0.0f;
  for (int64_t d = tid; d < sh.Dv; d += kThreads) {
    dos[d] = load_at(a.dout, dooff + d * a.dout.strides[3]);
    di_part += dos[d] * load_at(a.o, ooff + d * a.o.strides[3]);
  }
  const float di = block_reduce<kThreads>(di_part, false, red) * sc.descale_do * sc.descale_o;
  if (tid == 0) di_out[row] = di;
  const float lse = load_at(a.stats, row_offset(a.stats, b, h, i));
  const float score_scale = a.attn_scale * sc.descale_q * sc.descale_k,
              dp_scale = sc.descale_do * sc.descale_v;
  int64_t lo, hi;
  sdpa_kept_keys(a.mask, i, len_q(a, b), len_kv(a, b), &lo, &hi);
  if (lo < 0) lo = 0;
  if (hi > sh.Skv - 1) hi = sh.Skv - 1;
  float acc[kMaxPerThread] = {};
  float dp_max = 0.0f;
  for (int64_t j0 = lo; j0 <= hi; j0 += kChunk) {
    const int cnt = static_cast<int>(hi + 1 - j0 < kChunk ? hi + 1 - j0 : kChunk);
    __syncthreads();  // qs, dos loaded; ds of the previous chunk consumed
    for (int jj = tid; jj < cnt; jj += kThreads) {
      const int64_t j = j0 + jj;
      const float s = score_scale * dot_row(qs, a.k, row_offset(a.k, b, hk, j), sh.D);
      const float p = expf(s - lse);
      const float dp = dot_row(dos, a.v, row_offset(a.v, b, hk, j), sh.Dv) * dp_scale;
      const float dsv = p * (dropout_factor(a, b, h, i, j) * dp - di) * a.attn_scale;
      dp_max = fmaxf(dp_max, fabsf(dsv));
      ds[jj] = round_fp8(dsv * sc.scale_dp, ds_e5m2);
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kMaxPerThread; ++r) {
      const int64_t d = tid + static_cast<int64_t>(r) * kThreads;
      if (d >= sh.D) continue;
      const int64_t kbase = row_offset(a.k, b, hk, j0) + d * a.k.strides[3];
      for (int jj = 0; jj < cnt; ++jj) acc[r] += ds[jj] * load_at(a.k, kbase + jj * a.k.strides[2]);
    }
  }
  float dq_max = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kThreads;
    if (d >= sh.D) continue;
    const float x = acc[r] * sc.descale_dp * sc.descale_k;
    dq_max = fmaxf(dq_max, fabsf(x));
    dq[row * sh.D + d] = x * sc.scale_dq;
  }
  dq_max = block_reduce<kThreads>(dq_max, true, red);
  dp_max = block_reduce<kThreads>(dp_max, true, red);
  if (tid == 0) {
    atomic_max_nonneg(amax_dq, dq_max);
    atomic_max_nonneg(amax_dp, dp_max);
  }
}

// One block per key row j of kv head hk: over the group's query heads and the
// rows that keep j, P8 and dS8 (with Di from the dq kernel), accumulating
// dk = descale_dp * descale_q * sum dS8 q8 and dv = descale_s * descale_do * sum P8 do8.
__global__ void __launch_bounds__(kThreads)
    fp8_bwd_dkdv_kernel(SdpaFp8BwdGpuArgs a, const float* di, float* dk, float* dv, float* amax_dk,
                        float* amax_dv) {
  extern __shared__ float smem[];
  const SdpaFp8BwdShape& sh = a.sh;
  float* ks = smem;         // D
  float* vs = ks + sh.D;    // Dv
  float* ps = vs + sh.Dv;   // P8 of one row chunk
  float* ds = ps + kChunk;  // dS8 of one row chunk
  __shared__ float red[kThreads / 32];
  const Scales sc = read_scales(a);
  const bool ds_e5m2 = a.dout.dtype == static_cast<int>(DType::kFP8E5M2);
  const bool p_e5m2 = a.q.dtype == static_cast<int>(DType::kFP8E5M2);
  const int64_t key = blockIdx.x;
  const int64_t j = key % sh.Skv, bhk = key / sh.Skv, hk = bhk % sh.Hk, b = bhk / sh.Hk;
  const int tid = threadIdx.x;
  const int64_t koff = row_offset(a.k, b, hk, j), voff = row_offset(a.v, b, hk, j);
  for (int64_t d = tid; d < sh.D; d += kThreads) ks[d] = load_at(a.k, koff + d * a.k.strides[3]);
  for (int64_t d = tid; d < sh.Dv; d += kThreads) vs[d] = load_at(a.v, voff + d * a.v.strides[3]);
  const float score_scale = a.attn_scale * sc.descale_q * sc.descale_k,
              dp_scale = sc.descale_do * sc.descale_v;
  int64_t lo, hi;
  sdpa_kept_rows(a.mask, j, len_q(a, b), len_kv(a, b), &lo, &hi);
  if (lo < 0) lo = 0;
  if (hi > sh.Sq - 1) hi = sh.Sq - 1;
  float acc_k[kMaxPerThread] = {}, acc_v[kMaxPerThread] = {};
  const int64_t group = sh.Hq / sh.Hk;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
    for (int64_t i0 = lo; i0 <= hi; i0 += kChunk) {
      const int cnt = static_cast<int>(hi + 1 - i0 < kChunk ? hi + 1 - i0 : kChunk);
      __syncthreads();  // ks, vs loaded; ps, ds of the previous chunk consumed
      for (int ii = tid; ii < cnt; ii += kThreads) {
        const int64_t i = i0 + ii, row = (b * sh.Hq + h) * sh.Sq + i;
        const float s = score_scale * dot_row(ks, a.q, row_offset(a.q, b, h, i), sh.D);
        const float p = expf(s - load_at(a.stats, row_offset(a.stats, b, h, i)));
        const float f = dropout_factor(a, b, h, i, j);
        const float dp = dot_row(vs, a.dout, row_offset(a.dout, b, h, i), sh.Dv) * dp_scale;
        ps[ii] = round_fp8(p * f * sc.scale_s, p_e5m2);
        ds[ii] = round_fp8(p * (f * dp - di[row]) * a.attn_scale * sc.scale_dp, ds_e5m2);
      }
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kMaxPerThread; ++r) {
        const int64_t d = tid + static_cast<int64_t>(r) * kThreads;
        if (d < sh.D) {
          const int64_t qbase = row_offset(a.q, b, h, i0) + d * a.q.strides[3];
          for (int ii = 0; ii < cnt; ++ii) acc_k[r] += ds[ii] * load_at(a.q, qbase + ii * a.q.strides[2]);
        }
        if (d < sh.Dv) {
          const int64_t dobase = row_offset(a.dout, b, h, i0) + d * a.dout.strides[3];
          for (int ii = 0; ii < cnt; ++ii)
            acc_v[r] += ps[ii] * load_at(a.dout, dobase + ii * a.dout.strides[2]);
        }
      }
    }
  float k_max = 0.0f, v_max = 0.0f;
#pragma unroll
  for (int r = 0; r < kMaxPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kThreads;
    if (d < sh.D) {
      const float x = acc_k[r] * sc.descale_dp * sc.descale_q;
      k_max = fmaxf(k_max, fabsf(x));
      dk[key * sh.D + d] = x * sc.scale_dk;
    }
    if (d < sh.Dv) {
      const float x = acc_v[r] * sc.descale_s * sc.descale_do;
      v_max = fmaxf(v_max, fabsf(x));
      dv[key * sh.Dv + d] = x * sc.scale_dv;
    }
  }
  k_max = block_reduce<kThreads>(k_max, true, red);
  v_max = block_reduce<kThreads>(v_max, true, red);
  if (tid == 0) {
    atomic_max_nonneg(amax_dk, k_max);
    atomic_max_nonneg(amax_dv, v_max);
  }
}

using common::cuda_status;

#define FP8_BWD_CUDA(expr) FUSEBOX_RETURN_IF_ERROR(cuda_status((expr), where, #expr))

}  // namespace

Status sdpa_fp8_bwd_gpu_launch(const std::string& where, const SdpaFp8BwdGpuArgs& a, float* dq, float* dk,
                               float* dv, float* amax_dq, float* amax_dk, float* amax_dv, float* amax_dp,
                               void* stream_ptr) {
  const SdpaFp8BwdShape& sh = a.sh;
  if (!dq || !dk || !dv) return InvalidArgument(where + "needs the dq, dk and dv output buffers");
  if (sh.D > kThreads * kMaxPerThread || sh.Dv > kThreads * kMaxPerThread)
    return NotSupported(where + "the GPU reference handles D, Dv <= 256");
  const int64_t rows = sh.B * sh.Hq * sh.Sq, keys = sh.B * sh.Hk * sh.Skv;
  if (rows > 2147483647 || keys > 2147483647)
    return NotSupported(where + "the GPU reference handles B*Hq*Sq and B*Hk*Skv < 2^31");
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  for (float* p : {amax_dq, amax_dk, amax_dv, amax_dp})
    if (p) FP8_BWD_CUDA(cudaMemsetAsync(p, 0, sizeof(float), stream));
  float* di = nullptr;
  FP8_BWD_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&di),
                               static_cast<size_t>(rows > 0 ? rows : 1) * sizeof(float), stream));
  Status st = Status::Ok();
  if (rows > 0) {
    const size_t smem = static_cast<size_t>(sh.D + sh.Dv + kChunk) * sizeof(float);
    fp8_bwd_dq_kernel<<<static_cast<unsigned>(rows), kThreads, smem, stream>>>(a, di, dq, amax_dq, amax_dp);
    st = cuda_status(cudaGetLastError(), where, "fp8_bwd_dq_kernel");
  }
  if (st.ok() && keys > 0) {
    const size_t smem = static_cast<size_t>(sh.D + sh.Dv + 2 * kChunk) * sizeof(float);
    fp8_bwd_dkdv_kernel<<<static_cast<unsigned>(keys), kThreads, smem, stream>>>(a, di, dk, dv, amax_dk,
                                                                                 amax_dv);
    st = cuda_status(cudaGetLastError(), where, "fp8_bwd_dkdv_kernel");
  }
  const Status freed = cuda_status(cudaFreeAsync(di, stream), where, "cudaFreeAsync");
  return st.ok() ? freed : st;
}

}  // namespace fusebox::reference_detail
