// fusebox kernels layer: layernorm and rmsnorm forward (include/fusebox/ops/norm.h)
// for bf16 or fp16 x and y with fp32 scale and bias, the mixed-precision form
// training code uses, where cuDNN 9.19 serves the graph with one slow engine
// (native_kernel.cpp says when fusebox takes it, with the measurements).
//
// One block per row. A row's values stay in registers between the passes:
// the sum, then the sum of squared deviations from the mean (two passes, not
// E[x^2] - E[x]^2, which loses digits), then y. Eight 16-bit values per load
// (16 bytes) when every row, the scale and the bias are 16-byte aligned and
// the row length is a multiple of 8, else one value per load. Accumulation,
// statistics and the affine step in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "norm.h"

namespace fusebox::kernels {

namespace {

constexpr int kMaxRowDims = 8;

// Where row r of a tensor starts: the row dims (x's leading dims) with that
// tensor's strides. The normalized elements of a row are dense and laid out
// alike in x, y, scale and bias (norm_kernel_shape checks it), so element k
// of a row is at its start + k.
struct RowIndex {
  int rank = 0;
  int64_t dims[kMaxRowDims] = {};
  int64_t x[kMaxRowDims] = {}, y[kMaxRowDims] = {}, mean[kMaxRowDims] = {}, inv[kMaxRowDims] = {};
};

struct NormArgs {
  const void* x = nullptr;
  const float* scale = nullptr;
  const float* bias = nullptr;  // null: none
  void* y = nullptr;
  float* mean = nullptr;  // null: not asked for
  float* inv = nullptr;   // null: not asked for
  int64_t n = 0;          // normalized elements per row
  float epsilon = 0;
  RowIndex rows;
};

template <typename T>
struct Vec;  // conversions of 16-bit pairs
template <>
struct Vec<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static __device__ float2 to_float2(T2 v) { return __bfloat1622float2(v); }
  static __device__ T2 from_float2(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Vec<__half> {
  using T2 = __half2;
  static __device__ float2 to_float2(T2 v) { return __half22float2(v); }
  static __device__ T2 from_float2(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ float to_float(__half v) { return __half2float(v); }
  static __device__ __half from_float(float v) { return __float2half_rn(v); }
};

// The sum over the block; every thread gets it. `shared` holds 32 floats.
__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
  __syncthreads();  // `shared` may still be read from the previous sum
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// VEC values per load (8 or 1), VPT loads per thread: the row is n = VEC * (loads < VPT * blockDim.x).
template <typename T, int VEC, int VPT, bool kRms>
__global__ void __launch_bounds__(1024) norm_fwd(NormArgs a) {
  __shared__ float shared[32];
  int64_t r = blockIdx.x, xo = 0, yo = 0, mo = 0, io = 0;
  for (int d = a.rows.rank - 1; d >= 0; --d) {
    const int64_t i = r % a.rows.dims[d];
    r /= a.rows.dims[d];
    xo += i * a.rows.x[d];
    yo += i * a.rows.y[d];
    mo += i * a.rows.mean[d];
    io += i * a.rows.inv[d];
  }
  const T* x = static_cast<const T*>(a.x) + xo;
  T* y = static_cast<T*>(a.y) + yo;
  const int64_t loads = a.n / VEC;
  float v[VPT][VEC];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j < loads) {
      if constexpr (VEC == 8) {
        const uint4 raw = __ldg(reinterpret_cast<const uint4*>(x) + j);
        const auto* p2 = reinterpret_cast<const typename Vec<T>::T2*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 f = Vec<T>::to_float2(p2[k]);
          v[i][2 * k] = f.x;
          v[i][2 * k + 1] = f.y;
        }
      } else {
        v[i][0] = Vec<T>::to_float(x[j]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < VEC; ++k) v[i][k] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < VEC; ++k) sum += kRms ? v[i][k] * v[i][k] : v[i][k];
  }
  const float inv_n = 1.f / static_cast<float>(a.n);
  float mean = 0.f, var;
  if constexpr (kRms) {
    var = block_sum(sum, shared) * inv_n;
  } else {
    mean = block_sum(sum, shared) * inv_n;
    float sq = 0.f;
#pragma unroll
    for (int i = 0; i < VPT; ++i) {
      const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
      if (j < loads) {
#pragma unroll
        for (int k = 0; k < VEC; ++k) sq += (v[i][k] - mean) * (v[i][k] - mean);
      }
    }
    var = block_sum(sq, shared) * inv_n;
  }
  const float inv = rsqrtf(var + a.epsilon);
  if (threadIdx.x == 0) {
    if (a.mean) a.mean[mo] = mean;
    if (a.inv) a.inv[io] = inv;
  }
#pragma unroll
  for (int i = 0; i < VPT; ++i) {
    const int64_t j = threadIdx.x + static_cast<int64_t>(i) * blockDim.x;
    if (j >= loads) continue;
    float out[VEC];
    if constexpr (VEC == 8) {
      const float4* s4 = reinterpret_cast<const float4*>(a.scale) + 2 * j;
      const float4 s0 = __ldg(s4), s1 = __ldg(s4 + 1);
      const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
      float b[8] = {};
      if (a.bias) {
        const float4* b4 = reinterpret_cast<const float4*>(a.bias) + 2 * j;
        const float4 b0 = __ldg(b4), b1 = __ldg(b4 + 1);
        b[0] = b0.x, b[1] = b0.y, b[2] = b0.z, b[3] = b0.w, b[4] = b1.x, b[5] = b1.y, b[6] = b1.z,
        b[7] = b1.w;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = (v[i][k] - mean) * inv * s[k] + b[k];
      uint4 raw;
      auto* p2 = reinterpret_cast<typename Vec<T>::T2*>(&raw);
#pragma unroll
      for (int k = 0; k < 4; ++k) p2[k] = Vec<T>::from_float2(out[2 * k], out[2 * k + 1]);
      reinterpret_cast<uint4*>(y)[j] = raw;
    } else {
      out[0] = (v[i][0] - mean) * inv * __ldg(a.scale + j) + (a.bias ? __ldg(a.bias + j) : 0.f);
      y[j] = Vec<T>::from_float(out[0]);
    }
  }
}

using Launch = void (*)(NormArgs);

template <typename T, int VEC, bool kRms>
Launch pick(int vpt) {
  switch (vpt) {
    case 1:
      return norm_fwd<T, VEC, 1, kRms>;
    case 2:
      return norm_fwd<T, VEC, 2, kRms>;
    case 4:
      return norm_fwd<T, VEC, 4, kRms>;
    case 8:
      return norm_fwd<T, VEC, 8, kRms>;
    default:
      return norm_fwd<T, VEC, 16, kRms>;
  }
}

template <typename T>
Launch pick(int vec, int vpt, bool rms) {
  if (vec == 8) return rms ? pick<T, 8, true>(vpt) : pick<T, 8, false>(vpt);
  return rms ? pick<T, 1, true>(vpt) : pick<T, 1, false>(vpt);
}

class NormKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    NormArgs a = args_;
    size_t i = 0;
    a.x = ptrs[i++];
    a.scale = static_cast<const float*>(ptrs[i++]);
    if (has_bias_) a.bias = static_cast<const float*>(ptrs[i++]);
    a.y = ptrs[i++];
    if (has_mean_) a.mean = static_cast<float*>(ptrs[i++]);
    if (has_inv_) a.inv = static_cast<float*>(ptrs[i++]);
    if (rows_ == 0 || a.n == 0) return Status::Ok();
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec8 =
        rows_aligned8_ && aligned(a.x) && aligned(a.y) && aligned(a.scale) && (!a.bias || aligned(a.bias));
    const int vec = vec8 ? 8 : 1;
    const int64_t loads = a.n / vec;
    // About four loads per thread, at most 1024 threads; then the fewest loads per thread that cover the row.
    const int threads = static_cast<int>(std::clamp<int64_t>((loads / 4 + 31) / 32 * 32, 32, 1024));
    int vpt = 1;
    while (static_cast<int64_t>(vpt) * threads < loads) vpt *= 2;
    if (vpt > 16)
      return Internal(where_ + " row of " + std::to_string(a.n) + " values is too long for the kernel");
    const bool half = dtype_ == DType::kFP16;
    Launch f = half ? pick<__half>(vec, vpt, rms_) : pick<__nv_bfloat16>(vec, vpt, rms_);
    f<<<static_cast<unsigned>(rows_), threads, 0, static_cast<cudaStream_t>(stream_ptr)>>>(a);
    return common::cuda_status(cudaGetLastError(), where_, " kernel launch");
  }

  NormArgs args_;
  DType dtype_ = DType::kBF16;
  int64_t rows_ = 0;
  bool rms_ = false, has_bias_ = false, has_mean_ = false, has_inv_ = false, rows_aligned8_ = false;
};

// The normalized dims (index >= row_dims) with extent > 1, sorted by x's stride.
// Null when they are not dense (stride 1, then each the product of the ones before).
bool dense_block(const ResolvedTensor& x, int row_dims, std::vector<int>* order) {
  for (int d = row_dims; d < static_cast<int>(x.dims.size()); ++d)
    if (x.dims[d] > 1) order->push_back(d);
  std::sort(order->begin(), order->end(), [&](int a, int b) { return x.strides[a] < x.strides[b]; });
  int64_t expect = 1;
  for (int d : *order) {
    if (x.strides[d] != expect) return false;
    expect *= x.dims[d];
  }
  return true;
}

bool same_block(const ResolvedTensor& t, const ResolvedTensor& x, const std::vector<int>& order) {
  if (t.dims.size() != x.dims.size()) return false;
  for (int d : order)
    if (t.dims[d] != x.dims[d] || t.strides[d] != x.strides[d]) return false;
  return true;
}

}  // namespace

std::shared_ptr<const NativeKernel> make_norm_kernel(const ResolvedGraph& g, const ResolvedOp& op, bool rms,
                                                     double epsilon) {
  auto tensor = [&](const std::map<std::string, int>& m, const char* role) {
    return role_tensor(g, m, role);
  };
  const ResolvedTensor* x = tensor(op.inputs, "x");
  const ResolvedTensor* scale = tensor(op.inputs, "scale");
  const ResolvedTensor* bias = tensor(op.inputs, "bias");
  const ResolvedTensor* y = tensor(op.outputs, "y");
  const ResolvedTensor* mean = tensor(op.outputs, "mean");
  const ResolvedTensor* inv = tensor(op.outputs, "inv_variance");
  if (!x || !scale || !y) return nullptr;
  // The form this kernel serves: 16-bit x and y alike, fp32 scale and bias and statistics, every tensor in
  // memory.
  if ((x->dtype != DType::kBF16 && x->dtype != DType::kFP16) || y->dtype != x->dtype) return nullptr;
  if (scale->dtype != DType::kFP32 || (bias && bias->dtype != DType::kFP32)) return nullptr;
  for (const ResolvedTensor* t : {x, scale, bias, y, mean, inv}) {
    if (t && (t->is_virtual || t->scalar_value)) return nullptr;
    if (t && t != x && t != scale && t != bias && t->dtype != DType::kFP32 && t != y) return nullptr;
  }
  const int64_t row_dims = norm_row_dims(x->dims, scale->dims);
  if (row_dims < 1 || row_dims > kMaxRowDims) return nullptr;
  std::vector<int> order;
  if (!dense_block(*x, static_cast<int>(row_dims), &order)) return nullptr;
  for (const ResolvedTensor* t : {scale, bias, y})
    if (t && !same_block(*t, *x, order)) return nullptr;
  int64_t n = 1, rows = 1;
  for (int d : order) n *= x->dims[d];
  for (int64_t d = 0; d < row_dims; ++d) rows *= x->dims[d];
  if (n > 16 * 1024 || rows > 0x7fffffff) return nullptr;  // one block per row, the row in registers

  auto k = std::make_shared<NormKernel>();
  const char* op_name = rms ? "rmsnorm" : "layernorm";
  k->name_ = std::string("fusebox_") + op_name;
  k->where_ = common::op_where(op_name, op.name);
  k->rms_ = rms;
  k->dtype_ = x->dtype;
  k->rows_ = rows;
  k->has_bias_ = bias != nullptr;
  k->has_mean_ = mean != nullptr && !rms;
  k->has_inv_ = inv != nullptr;
  k->args_.n = n;
  k->args_.epsilon = static_cast<float>(epsilon);
  k->args_.rows.rank = static_cast<int>(row_dims);
  bool aligned8 = n % 8 == 0;
  for (int64_t d = 0; d < row_dims; ++d) {
    k->args_.rows.dims[d] = x->dims[d];
    k->args_.rows.x[d] = x->strides[d];
    k->args_.rows.y[d] = y->strides[d];
    k->args_.rows.mean[d] = mean ? mean->strides[d] : 0;
    k->args_.rows.inv[d] = inv ? inv->strides[d] : 0;
    if (x->dims[d] > 1) aligned8 = aligned8 && x->strides[d] % 8 == 0 && y->strides[d] % 8 == 0;
  }
  k->rows_aligned8_ = aligned8;
  k->tensors_ = {x->name, scale->name};
  if (bias) k->tensors_.push_back(bias->name);
  k->tensors_.push_back(y->name);
  if (k->has_mean_) k->tensors_.push_back(mean->name);
  if (k->has_inv_) k->tensors_.push_back(inv->name);
  return k;
}

}  // namespace fusebox::kernels
