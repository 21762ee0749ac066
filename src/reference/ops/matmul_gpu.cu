// fusebox: the GPU reference of matmul: a shared-memory tiled kernel (a
// 4096^3 GEMM must take milliseconds, not minutes), fp32 accumulation.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

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
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM,
                n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
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

Status launch_matmul(GpuOpContext& ctx, const ResolvedOp& op, const Located& a, const Located& b,
                     const std::vector<int64_t>& ydims, float* y) {
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
    FUSEBOX_CUDA_RETURN(
        op_where(op),
        cudaMemsetAsync(y, 0, static_cast<size_t>(batch * p.M * p.N) * sizeof(float), ctx.stream()));
    return Status::Ok();
  }
  const int64_t gx = (p.N + kTileN - 1) / kTileN, gy = (p.M + kTileM - 1) / kTileM;
  if (gy > 65535 || batch > 65535)
    return NotSupported(op_where(op) + "the GPU reference handles M <= 4194240 and batch <= 65535");
  dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(batch));
  matmul_kernel<<<grid, kThreads, 0, ctx.stream()>>>(p, y);
  FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  return Status::Ok();
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const MatmulAttrs&) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located a, ctx.in("a"));
  FUSEBOX_ASSIGN_OR_RETURN(const Located b, ctx.in("b"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  return launch_matmul(ctx, op, a, b, ctx.graph().tensors[yidx].dims, y);
}

}  // namespace fusebox::reference_detail
