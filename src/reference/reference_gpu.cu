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
#include <optional>

#include "fusebox/reference.h"
#include "reference/tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::product;

bool gpu_reference_available() { return true; }

namespace {

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

__device__ __forceinline__ float load_as_float(const void* p, int dtype, int64_t off) {
  switch (static_cast<DType>(dtype)) {
    case DType::kFP32: return static_cast<const float*>(p)[off];
    case DType::kBF16: {
      const unsigned int b = static_cast<const unsigned short*>(p)[off];
      return __uint_as_float(b << 16);
    }
    case DType::kFP16: return __half2float(__ushort_as_half(static_cast<const unsigned short*>(p)[off]));
    case DType::kFP8E4M3: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[off], __NV_E4M3);
      return __half2float(__half(h));
    }
    case DType::kFP8E5M2: {
      __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(p)[off], __NV_E5M2);
      return __half2float(__half(h));
    }
    case DType::kInt32: return static_cast<float>(static_cast<const int*>(p)[off]);
    case DType::kInt64: return static_cast<float>(static_cast<const long long*>(p)[off]);
  }
  return 0.0f;
}

__device__ __forceinline__ float load_at(const DevTensor& t, int64_t off) {
  return t.ptr ? load_as_float(t.ptr, t.dtype, off) : t.scalar;
}

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

// ---------------------------------------------------------------- sdpa_fwd

// One block per (b, h, query row); keys in chunks of kSdpaChunk whose scores
// live in shared memory, with an online (flash-attention style) softmax: the
// running max m, sum l and output accumulators are rescaled per chunk. Each
// thread owns output dims d = tid, tid + 128 (Dv <= 256).
constexpr int kSdpaThreads = 128, kSdpaChunk = 1024, kSdpaMaxDvPerThread = 2;

struct SdpaArgs {
  DevTensor q, k, v;  // rank 4, logical [B,H,S,D] strides
  int64_t B, Hq, Hk, Sq, Skv, D, Dv;
  float scale;
  int causal;  // top-left: row i sees keys j <= i
};

// Block-wide max (is_max) or sum over kSdpaThreads threads; every thread gets the result.
__device__ float sdpa_block_reduce(float x, bool is_max, float* red) {
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // red may still be read by a previous call
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kSdpaThreads / 32; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

__global__ void __launch_bounds__(kSdpaThreads) sdpa_fwd_kernel(SdpaArgs a, float* o, float* stats) {
  extern __shared__ float smem[];
  float* qs = smem;          // D values of this query row
  float* ps = smem + a.D;    // scores, then probabilities, of one key chunk
  __shared__ float red[kSdpaThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t i = row % a.Sq, bh = row / a.Sq, h = bh % a.Hq, b = bh / a.Hq;
  const int64_t hk = h / (a.Hq / a.Hk);
  const int tid = threadIdx.x;
  const int64_t qoff = b * a.q.strides[0] + h * a.q.strides[1] + i * a.q.strides[2];
  const int64_t koff = b * a.k.strides[0] + hk * a.k.strides[1];
  const int64_t voff = b * a.v.strides[0] + hk * a.v.strides[1];
  for (int64_t d = tid; d < a.D; d += kSdpaThreads) qs[d] = load_at(a.q, qoff + d * a.q.strides[3]);
  const int64_t n = (a.causal && i + 1 < a.Skv) ? i + 1 : a.Skv;
  float m = -INFINITY, l = 0.0f;
  float acc[kSdpaMaxDvPerThread] = {};
  for (int64_t j0 = 0; j0 < n; j0 += kSdpaChunk) {
    const int cnt = static_cast<int>(n - j0 < kSdpaChunk ? n - j0 : kSdpaChunk);
    __syncthreads();  // qs loaded; ps of the previous chunk consumed
    float local_max = -INFINITY;
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const int64_t kr = koff + (j0 + jj) * a.k.strides[2];
      float dot = 0.0f;
      for (int64_t d = 0; d < a.D; ++d) dot += qs[d] * load_at(a.k, kr + d * a.k.strides[3]);
      const float sc = dot * a.scale;
      ps[jj] = sc;
      local_max = fmaxf(local_max, sc);
    }
    const float new_m = fmaxf(m, sdpa_block_reduce(local_max, true, red));
    const float corr = expf(m - new_m);  // 0 on the first chunk (m = -inf)
    float local_sum = 0.0f;
    for (int jj = tid; jj < cnt; jj += kSdpaThreads) {
      const float p = expf(ps[jj] - new_m);
      ps[jj] = p;
      local_sum += p;
    }
    l = l * corr + sdpa_block_reduce(local_sum, false, red);  // its __syncthreads publish ps
    m = new_m;
#pragma unroll
    for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
      const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
      if (d >= a.Dv) continue;
      float sum = 0.0f;
      for (int jj = 0; jj < cnt; ++jj) sum += ps[jj] * load_at(a.v, voff + (j0 + jj) * a.v.strides[2] + d * a.v.strides[3]);
      acc[r] = acc[r] * corr + sum;
    }
  }
#pragma unroll
  for (int r = 0; r < kSdpaMaxDvPerThread; ++r) {
    const int64_t d = tid + static_cast<int64_t>(r) * kSdpaThreads;
    if (d < a.Dv) o[row * a.Dv + d] = n > 0 ? acc[r] / l : 0.0f;
  }
  if (stats && tid == 0) stats[row] = n > 0 ? m + logf(l) : -INFINITY;
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

  Status RunSdpa(const ResolvedOp& op, const SdpaFwdAttrs& attrs) {
    std::vector<Located> in;
    for (const char* role : {"q", "k", "v"}) {
      auto it = op.inputs.find(role);
      if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
      FUSEBOX_ASSIGN_OR_RETURN(Located l, Get(op, role, it->second));
      if (l.dims.size() != 4) return InvalidArgument(op_where(op) + "input '" + role + "' must have rank 4");
      in.push_back(l);
    }
    SdpaArgs a{};
    a.q = in[0].t, a.k = in[1].t, a.v = in[2].t;
    a.B = in[0].dims[0], a.Hq = in[0].dims[1], a.Sq = in[0].dims[2], a.D = in[0].dims[3];
    a.Hk = in[1].dims[1], a.Skv = in[1].dims[2], a.Dv = in[2].dims[3];
    if (in[1].dims[0] != a.B || in[2].dims[0] != a.B || in[1].dims[3] != a.D || in[2].dims[1] != a.Hk ||
        in[2].dims[2] != a.Skv || a.Hk < 1 || a.Hq % a.Hk != 0)
      return InvalidArgument(op_where(op) + "inconsistent shapes: q " + dims_string(in[0].dims) + ", k " +
                             dims_string(in[1].dims) + ", v " + dims_string(in[2].dims));
    if (a.Dv > kSdpaThreads * kSdpaMaxDvPerThread)
      return NotSupported(op_where(op) + "the GPU reference handles Dv <= 256");
    a.scale = static_cast<float>(attrs.attn_scale ? *attrs.attn_scale : 1.0 / std::sqrt(static_cast<double>(a.D)));
    a.causal = attrs.causal ? 1 : 0;
    auto oit = op.outputs.find("o");
    if (oit == op.outputs.end()) return InvalidArgument(op_where(op) + "has no output 'o'");
    FUSEBOX_ASSIGN_OR_RETURN(float* o, Destination(op, oit->second));
    located_[oit->second] = pending_;
    float* stats = nullptr;
    if (attrs.generate_stats) {
      auto sit = op.outputs.find("stats");
      if (sit == op.outputs.end()) return InvalidArgument(op_where(op) + "has no output 'stats'");
      FUSEBOX_ASSIGN_OR_RETURN(stats, Destination(op, sit->second));
      located_[sit->second] = pending_;
    }
    const int64_t rows = a.B * a.Hq * a.Sq;
    if (rows <= 0) return Status::Ok();
    if (rows > 2147483647) return NotSupported(op_where(op) + "the GPU reference handles B*Hq*Sq < 2^31");
    const size_t shmem = static_cast<size_t>(a.D + kSdpaChunk) * sizeof(float);
    sdpa_fwd_kernel<<<static_cast<unsigned>(rows), kSdpaThreads, shmem, stream_>>>(a, o, stats);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    return Status::Ok();
  }

  Status RunOp(const ResolvedOp& op) {
    if (const auto* sdpa = std::get_if<SdpaFwdAttrs>(&op.attrs)) return RunSdpa(op, *sdpa);
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
  std::map<std::string, float*> d_out;
  for (int i : g.output_tensors()) {
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
