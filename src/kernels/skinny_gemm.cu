// fusebox kernels layer: the few-row matmul on tensor cores (skinny_gemm.h). Bound by reading the
// weights once: a block streams a [32 x 128] tile of w (and the rows' [M x 32] slice of a) per step
// into shared memory with 16-byte cp.async copies, three steps in flight, and each of its 8 warps
// multiplies its 16 columns for every row tile (WMMA 16x16x16, fp32 sums). The epilogue runs once
// per output value, in fp32, before the one rounding to y's dtype.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "common/pointwise_math.cuh"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "skinny_gemm.h"

namespace fusebox::kernels {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kTN = 16 * kWarps, kTK = 32, kStages = 3, kMaxTiles = 4;  // 64 rows
constexpr int64_t kMinRows = 9, kMaxRows = 16 * kMaxTiles;
constexpr int kMaxSplits = 8;  // a cluster's blocks (the portable limit)
constexpr int kTargetBlocks = 256;
// Shared-memory rows padded by 8 values (16 bytes): the WMMA loads' rows start on other banks.
constexpr int kLdw = kTN + 8, kLda = kTK + 8, kLdc = kTN + 4;
constexpr int kWStage = kTK * kLdw, kAStage = 16 * kMaxTiles * kLda;  // 16-bit values
constexpr int kSmemBytes = kStages * (kWStage + kAStage) * 2;
static_assert(kSmemBytes >= 16 * kMaxTiles * kLdc * 4, "the fp32 sums reuse the stages' shared memory");
static_assert(kSmemBytes <= 48 * 1024, "static shared memory");

struct SkinnyArgs : FewRowShape {
  const void *a = nullptr, *w = nullptr, *e = nullptr;
  void* y = nullptr;
  int64_t k_slice = 0;  // K rows a split (a multiple of kTK)
  int splits = 1;
};

// A 16-byte copy into shared memory that does not wait; `in` false: 16 zero bytes (nothing read).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool in) {
  const auto s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// y[m, col] from its product z: the epilogue, then y's dtype.
__device__ __forceinline__ void finish(const SkinnyArgs& p, int64_t m, int64_t col, float z) {
  if (p.epi == GemvEpi::kUnary) {
    z = common::pointwise_apply(p.mode, z, 0.f);
  } else if (p.epi == GemvEpi::kBinary) {
    const float e = load_as_float(p.e, p.e_dtype, m * p.lde + col);
    z = p.product_second ? common::pointwise_apply(p.mode, e, z) : common::pointwise_apply(p.mode, z, e);
  }
  store_from_float(p.y, p.y_dtype, m * p.ldy + col, z);
}

// kMT row tiles of 16 (M <= 16 kMT), fp16 (kHalf) or bf16, kCluster: the K splits of a column tile
// are one cluster (sm_90), added through distributed shared memory; else one split.
template <int kMT, bool kHalf, bool kCluster>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(SkinnyArgs p) {
  using T = std::conditional_t<kHalf, __half, __nv_bfloat16>;
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(128) unsigned char smem[kSmemBytes];
  T* const sw = reinterpret_cast<T*>(smem);
  T* const sa = sw + kStages * kWStage;
  const int tid = threadIdx.x, warp = tid / 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTN;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * p.k_slice;
  const int64_t k_end = k_begin + p.k_slice < p.k ? k_begin + p.k_slice : p.k;
  const int steps = k_end > k_begin ? static_cast<int>((k_end - k_begin + kTK - 1) / kTK) : 0;
  const auto* a = static_cast<const T*>(p.a);
  const auto* w = static_cast<const T*>(p.w);

  // Step `step`'s tiles into stage `stage`: kTK rows of kTN columns of w, the rows' kTK values of a
  // (K, N and the row strides are multiples of 8, so a 16-byte chunk is wholly inside or outside).
  auto load_stage = [&](int step, int stage) {
    const int64_t k0 = k_begin + static_cast<int64_t>(step) * kTK;
    constexpr int kWChunks = kTK * kTN / 8, kAChunks = kMT * 16 * kTK / 8;
#pragma unroll
    for (int c = tid; c < kWChunks; c += kThreads) {
      const int r = c / (kTN / 8), cc = c % (kTN / 8) * 8;
      const int64_t kr = k0 + r, col = n0 + cc;
      const bool in = kr < k_end && col < p.n;
      cp_async16(sw + stage * kWStage + r * kLdw + cc, in ? w + kr * p.ldw + col : w, in);
    }
    for (int c = tid; c < kAChunks; c += kThreads) {
      const int r = c / (kTK / 8), cc = c % (kTK / 8) * 8;
      const int64_t kc = k0 + cc;
      const bool in = r < p.m && kc < k_end;
      cp_async16(sa + stage * kAStage + r * kLda + cc, in ? a + r * p.lda + kc : a, in);
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kMT];
#pragma unroll
  for (int t = 0; t < kMT; ++t) wmma::fill_fragment(acc[t], 0.f);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) load_stage(s, s);
    cp_async_commit();
  }
  for (int t = 0; t < steps; ++t) {
    cp_async_wait<kStages - 2>();  // step t's copies landed (this thread's)
    __syncthreads();               // everyone's, and everyone is done with step t - 1's stage
    if (t + kStages - 1 < steps) load_stage(t + kStages - 1, (t + kStages - 1) % kStages);
    cp_async_commit();
    const T* ws = sw + (t % kStages) * kWStage;
    const T* as = sa + (t % kStages) * kAStage;
#pragma unroll
    for (int kk = 0; kk < kTK; kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, ws + kk * kLdw + warp * 16, kLdw);
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, as + mt * 16 * kLda + kk, kLda);
        wmma::mma_sync(acc[mt], fa, fb, acc[mt]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  // The block's sums, [16 kMT, kTN] fp32, over the stages.
  auto* const sc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
    wmma::store_matrix_sync(sc + mt * 16 * kLdc + warp * 16, acc[mt], kLdc, wmma::mem_row_major);
  const int rows = p.m < 16 * kMT ? static_cast<int>(p.m) : 16 * kMT;
  if constexpr (!kCluster) {
    __syncthreads();
    for (int idx = tid; idx < rows * kTN; idx += kThreads) {
      const int m = idx / kTN, c = idx % kTN;
      if (n0 + c < p.n) finish(p, m, n0 + c, sc[m * kLdc + c]);
    }
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every split's sums in its block's shared memory
    // This block's share of the tile's values, each the splits' sums added in split order.
    const int total = rows * kTN, S = p.splits, share = (total + S - 1) / S;
    const int lo = static_cast<int>(cluster.block_rank()) * share;
    const int hi = lo + share < total ? lo + share : total;
    for (int idx = lo + tid; idx < hi; idx += kThreads) {
      const int m = idx / kTN, c = idx % kTN;
      float z = 0.f;
      for (int s = 0; s < S; ++s) z += cluster.map_shared_rank(sc, s)[m * kLdc + c];
      if (n0 + c < p.n) finish(p, m, n0 + c, z);
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
#endif
  }
}

template <int kMT, bool kHalf>
cudaError_t launch_tiles(bool cluster, unsigned tiles, cudaStream_t st, const SkinnyArgs& p) {
  if (!cluster) {
    skinny_gemm_kernel<kMT, kHalf, false><<<dim3(tiles, 1), kThreads, 0, st>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(tiles, static_cast<unsigned>(p.splits));
  cfg.blockDim = dim3(kThreads);
  cfg.stream = st;
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = static_cast<unsigned>(p.splits);
  attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, skinny_gemm_kernel<kMT, kHalf, true>, p);
}

template <bool kHalf>
cudaError_t launch_dtype(int row_tiles, bool cluster, unsigned tiles, cudaStream_t st, const SkinnyArgs& p) {
  switch (row_tiles) {
    case 1:
      return launch_tiles<1, kHalf>(cluster, tiles, st, p);
    case 2:
      return launch_tiles<2, kHalf>(cluster, tiles, st, p);
    case 3:
      return launch_tiles<3, kHalf>(cluster, tiles, st, p);
    default:
      return launch_tiles<4, kHalf>(cluster, tiles, st, p);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether the current device runs thread-block clusters (sm_90 and later).
bool device_has_clusters() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return false;
  return major >= 9;
}

class SkinnyGemmKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream) const override {
    SkinnyArgs p = args_;
    p.a = ptrs[0];
    p.w = ptrs[1];
    if (p.epi == GemvEpi::kBinary) p.e = ptrs[2];
    p.y = ptrs[p.epi == GemvEpi::kBinary ? 3 : 2];
    if (!aligned16(p.a) || !aligned16(p.w)) return fallback_->launch(ptrs, stream);
    const bool cluster = p.splits > 1 && device_has_clusters();
    if (!cluster) {  // one block takes all of K
      p.splits = 1;
      p.k_slice = (p.k + kTK - 1) / kTK * kTK;
    }
    const auto st = static_cast<cudaStream_t>(stream);
    const cudaError_t err = half_ ? launch_dtype<true>(row_tiles_, cluster, tiles_, st, p)
                                  : launch_dtype<false>(row_tiles_, cluster, tiles_, st, p);
    return common::cuda_status(err, where_, " few-row tensor-core matmul kernel launch");
  }

  SkinnyArgs args_;
  int row_tiles_ = 1;
  unsigned tiles_ = 1;
  bool half_ = false;
  std::shared_ptr<const NativeKernel> fallback_;  // fusebox_gemv, for pointers off 16-byte boundaries
};

}  // namespace

std::shared_ptr<const NativeKernel> make_skinny_gemm_kernel(const GemvForm& f) {
  if (f.scale || f.w2 || f.epi == GemvEpi::kGated || f.m < kMinRows || f.m > kMaxRows ||
      (f.a->dtype != DType::kBF16 && f.a->dtype != DType::kFP16) || f.k % 8 != 0 || f.n % 8 != 0 ||
      f.lda % 8 != 0 || f.ldw % 8 != 0)
    return nullptr;
  auto fallback = make_gemv_kernel(f, nullptr);
  if (!fallback) return nullptr;
  auto kern = std::make_shared<SkinnyGemmKernel>();
  kern->name_ = kSkinnyGemmName;
  kern->where_ = common::op_where("matmul", f.mm->name);
  kern->fallback_ = std::move(fallback);
  SkinnyArgs& p = kern->args_;
  static_cast<FewRowShape&>(p) = few_row_shape(f);
  kern->row_tiles_ = static_cast<int>((f.m + 15) / 16);
  const int64_t tiles = (f.n + kTN - 1) / kTN, steps = (f.k + kTK - 1) / kTK;
  // K splits (sm_90 clusters): powers of two up to 8 while the grid is under about 256 blocks and
  // each split keeps at least 4 steps; chosen from N and K alone.
  int64_t splits = 1;
  while (splits < kMaxSplits && tiles * splits < kTargetBlocks && steps / (splits * 2) >= 4) splits *= 2;
  p.k_slice = (steps + splits - 1) / splits * kTK;
  p.splits = static_cast<int>((f.k + p.k_slice - 1) / p.k_slice);
  kern->tiles_ = static_cast<unsigned>(tiles);
  kern->half_ = f.a->dtype == DType::kFP16;
  kern->tensors_ = gemv_tensor_names(f);
  return kern;
}

}  // namespace fusebox::kernels
