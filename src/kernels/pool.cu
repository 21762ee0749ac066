// fusebox kernels layer: pooling (include/fusebox/ops/pool.h) where cuDNN
// 9.19's resample engines are slow or wrong (native_kernel.cpp says when
// fusebox takes it, with the measurements): the global average pool, and
// max_pool and avg_pool with any window (window_pool, below).
//
// Global average pool, y[n, c] = mean over the spatial positions of x[n, c, ...]: a block of 32 channels x 8
// slices of the spatial positions: the 32 threads of a warp read 32 neighbouring channels at one position
// (coalesced in NHWC), each slice sums every 8th position, and the block adds the slices. Any dtypes (bf16,
// fp16, fp32) and strides; the sum in fp32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "pool.h"

namespace fusebox::kernels {

namespace {

constexpr int kChannels = 32, kSlices = 8;

struct PoolArgs {
  int64_t n = 0, c = 0, positions = 0;
  int spatial_rank = 0;
  int64_t sdims[3] = {1, 1, 1}, sstrides[3] = {0, 0, 0};  // x's spatial dims and strides
  int64_t xn = 0, xc = 0, yn = 0, yc = 0;                 // batch and channel strides of x and y
  int xdtype = 0, ydtype = 0;
  const void* x = nullptr;
  void* y = nullptr;
};

__global__ void __launch_bounds__(kChannels* kSlices) global_avg_pool(PoolArgs a) {
  __shared__ float partial[kSlices][kChannels];
  const int lane = threadIdx.x % kChannels, slice = threadIdx.x / kChannels;
  const int64_t n = blockIdx.y, c = static_cast<int64_t>(blockIdx.x) * kChannels + lane;
  float sum = 0.f;
  if (c < a.c) {
    const int64_t base = n * a.xn + c * a.xc;
    for (int64_t s = slice; s < a.positions; s += kSlices) {
      int64_t rest = s, off = base;
      for (int d = a.spatial_rank - 1; d >= 0; --d) {
        off += (rest % a.sdims[d]) * a.sstrides[d];
        rest /= a.sdims[d];
      }
      sum += load_as_float(a.x, a.xdtype, off);
    }
  }
  partial[slice][lane] = sum;
  __syncthreads();
  if (slice == 0 && c < a.c) {
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kSlices; ++k) total += partial[k][lane];
    store_from_float(a.y, a.ydtype, n * a.yn + c * a.yc, total / static_cast<float>(a.positions));
  }
}

// ---- max_pool and avg_pool with any window, stride and padding (rank 4 or 5).

struct WindowArgs {
  int64_t n = 0, c = 0;
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, win[3] = {1, 1, 1}, str[3] = {1, 1, 1}, pad[3] = {0, 0, 0};
  int64_t xs[5] = {}, ys[5] = {};  // strides of x and y: N, C, D, H, W
  int xdtype = 0, ydtype = 0;
  bool is_max = true, include_pad = true;
  const void* x = nullptr;
  void* y = nullptr;
};

// One output value per thread (VEC 1, any dtypes and strides), or eight
// neighbouring channels of one output position (VEC 8: 16-bit x and y of one
// dtype, channels innermost and 16-byte aligned). Channels vary fastest
// across threads, so that NHWC reads are coalesced.
template <int VEC>
__global__ void window_pool(WindowArgs a) {
  const int64_t cv = a.c / VEC;
  const int64_t total = a.n * cv * a.out[0] * a.out[1] * a.out[2];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    const int64_t c = (rest % cv) * VEC;
    rest /= cv;
    const int64_t ow = rest % a.out[2];
    rest /= a.out[2];
    const int64_t oh = rest % a.out[1];
    rest /= a.out[1];
    const int64_t od = rest % a.out[0];
    const int64_t n = rest / a.out[0];
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; ++k) acc[k] = a.is_max ? -INFINITY : 0.f;
    int64_t covered = 0;
    const int64_t base = n * a.xs[0] + c * a.xs[1];
    for (int64_t kd = 0; kd < a.win[0]; ++kd) {
      const int64_t id = od * a.str[0] - a.pad[0] + kd;
      if (id < 0 || id >= a.in[0]) continue;
      for (int64_t kh = 0; kh < a.win[1]; ++kh) {
        const int64_t ih = oh * a.str[1] - a.pad[1] + kh;
        if (ih < 0 || ih >= a.in[1]) continue;
        for (int64_t kw = 0; kw < a.win[2]; ++kw) {
          const int64_t iw = ow * a.str[2] - a.pad[2] + kw;
          if (iw < 0 || iw >= a.in[2]) continue;
          const int64_t off = base + id * a.xs[2] + ih * a.xs[3] + iw * a.xs[4];
          ++covered;
          if constexpr (VEC == 8) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4*>(static_cast<const char*>(a.x) + off * 2));
            float v[8];
            if (static_cast<DType>(a.xdtype) == DType::kBF16) {
              const auto* p2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                const float2 f = __bfloat1622float2(p2[k]);
                v[2 * k] = f.x, v[2 * k + 1] = f.y;
              }
            } else {
              const auto* p2 = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
              for (int k = 0; k < 4; ++k) {
                const float2 f = __half22float2(p2[k]);
                v[2 * k] = f.x, v[2 * k + 1] = f.y;
              }
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[k] = a.is_max ? fmaxf(acc[k], v[k]) : acc[k] + v[k];
          } else {
            const float v = load_as_float(a.x, a.xdtype, off);
            acc[0] = a.is_max ? fmaxf(acc[0], v) : acc[0] + v;
          }
        }
      }
    }
    // padding < window (resolve): every window covers an element of x.
    const float div =
        a.is_max ? 1.f : static_cast<float>(a.include_pad ? a.win[0] * a.win[1] * a.win[2] : covered);
    const int64_t yoff = n * a.ys[0] + c * a.ys[1] + od * a.ys[2] + oh * a.ys[3] + ow * a.ys[4];
    if constexpr (VEC == 8) {
      uint4 raw;
      if (static_cast<DType>(a.ydtype) == DType::kBF16) {
        auto* p2 = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) p2[k] = __floats2bfloat162_rn(acc[2 * k] / div, acc[2 * k + 1] / div);
      } else {
        auto* p2 = reinterpret_cast<__half2*>(&raw);
#pragma unroll
        for (int k = 0; k < 4; ++k) p2[k] = __floats2half2_rn(acc[2 * k] / div, acc[2 * k + 1] / div);
      }
      *reinterpret_cast<uint4*>(static_cast<char*>(a.y) + yoff * 2) = raw;
    } else {
      store_from_float(a.y, a.ydtype, yoff, acc[0] / div);
    }
  }
}

class WindowPoolKernel final : public KernelBase {
 public:
  WindowPoolKernel() { name_ = "fusebox_pool"; }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    WindowArgs a = args_;
    a.x = ptrs[0];
    a.y = ptrs[1];
    auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec8 = vec8_layout_ && aligned(a.x) && aligned(a.y);
    const int64_t total = a.n * (a.c / (vec8 ? 8 : 1)) * a.out[0] * a.out[1] * a.out[2];
    if (total == 0) return Status::Ok();
    constexpr int kThreads = 256;
    const int blocks = grid_stride_blocks(total, kThreads);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (vec8) {
      window_pool<8><<<blocks, kThreads, 0, stream>>>(a);
    } else {
      window_pool<1><<<blocks, kThreads, 0, stream>>>(a);
    }
    return common::cuda_status(cudaGetLastError(), where_, " kernel launch");
  }

  WindowArgs args_;
  bool vec8_layout_ = false;
};

class GlobalAvgPoolKernel final : public KernelBase {
 public:
  GlobalAvgPoolKernel() { name_ = "fusebox_global_avg_pool"; }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    PoolArgs a = args_;
    a.x = ptrs[0];
    a.y = ptrs[1];
    if (a.n == 0 || a.c == 0) return Status::Ok();
    const dim3 grid(static_cast<unsigned>((a.c + kChannels - 1) / kChannels), static_cast<unsigned>(a.n));
    global_avg_pool<<<grid, kChannels * kSlices, 0, static_cast<cudaStream_t>(stream_ptr)>>>(a);
    return common::cuda_status(cudaGetLastError(), where_, " kernel launch");
  }

  PoolArgs args_;
};

}  // namespace

std::shared_ptr<const NativeKernel> make_global_avg_pool_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                                const PoolAttrs& a) {
  if (a.mode != PoolMode::kAvg) return nullptr;
  const ResolvedTensor& x = g.tensors[static_cast<size_t>(op.inputs.at("x"))];
  const ResolvedTensor& y = g.tensors[static_cast<size_t>(op.outputs.at("y"))];
  if (x.is_virtual || y.is_virtual || x.dims.size() < 3 || x.dims.size() > 5 ||
      y.dims.size() != x.dims.size())
    return nullptr;
  auto floating = [](DType t) { return t == DType::kBF16 || t == DType::kFP16 || t == DType::kFP32; };
  if (!floating(x.dtype) || !floating(y.dtype)) return nullptr;
  const size_t rank = x.dims.size();
  for (size_t d = 2; d < rank; ++d) {
    const size_t s = d - 2;
    const bool whole = a.global || (s < a.window.size() && a.window[s] == x.dims[d] &&
                                    (s >= a.padding.size() || a.padding[s] == 0));
    if (!whole || y.dims[d] != 1) return nullptr;
  }
  if (x.dims[0] > 65535 || y.dims[0] != x.dims[0] || y.dims[1] != x.dims[1]) return nullptr;
  auto k = std::make_shared<GlobalAvgPoolKernel>();
  k->where_ = common::op_where(a.global ? "global_avg_pool" : "avg_pool", op.name);
  PoolArgs& p = k->args_;
  p.n = x.dims[0];
  p.c = x.dims[1];
  p.positions = 1;
  p.spatial_rank = static_cast<int>(rank - 2);
  for (size_t d = 2; d < rank; ++d) {
    p.sdims[d - 2] = x.dims[d];
    p.sstrides[d - 2] = x.strides[d];
    p.positions *= x.dims[d];
  }
  p.xn = x.strides[0];
  p.xc = x.strides[1];
  p.yn = y.strides[0];
  p.yc = y.strides[1];
  p.xdtype = static_cast<int>(x.dtype);
  p.ydtype = static_cast<int>(y.dtype);
  k->tensors_ = {x.name, y.name};
  return k;
}

}  // namespace fusebox::kernels

namespace fusebox::kernels {

std::shared_ptr<const NativeKernel> make_window_pool_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                            const PoolAttrs& a) {
  const ResolvedTensor& x = g.tensors[static_cast<size_t>(op.inputs.at("x"))];
  const ResolvedTensor& y = g.tensors[static_cast<size_t>(op.outputs.at("y"))];
  auto floating = [](DType t) { return t == DType::kBF16 || t == DType::kFP16 || t == DType::kFP32; };
  if (x.is_virtual || y.is_virtual || !floating(x.dtype) || !floating(y.dtype)) return nullptr;
  const size_t rank = x.dims.size(), sp = rank - 2;
  if ((rank != 4 && rank != 5) || y.dims.size() != rank || a.window.size() != sp || a.stride.size() != sp ||
      a.padding.size() != sp)
    return nullptr;
  auto k = std::make_shared<WindowPoolKernel>();
  k->where_ = common::op_where(a.mode == PoolMode::kMax ? "max_pool" : "avg_pool", op.name);
  WindowArgs& p = k->args_;
  p.n = x.dims[0];
  p.c = x.dims[1];
  const size_t off = 3 - sp;
  for (size_t i = 0; i < sp; ++i) {
    p.in[off + i] = x.dims[2 + i];
    p.out[off + i] = y.dims[2 + i];
    p.win[off + i] = a.window[i];
    p.str[off + i] = a.stride[i];
    p.pad[off + i] = a.padding[i];
  }
  p.xs[0] = x.strides[0], p.xs[1] = x.strides[1];
  p.ys[0] = y.strides[0], p.ys[1] = y.strides[1];
  for (size_t i = 0; i < sp; ++i) {
    p.xs[2 + off + i] = x.strides[2 + i];
    p.ys[2 + off + i] = y.strides[2 + i];
  }
  p.xdtype = static_cast<int>(x.dtype);
  p.ydtype = static_cast<int>(y.dtype);
  p.is_max = a.mode == PoolMode::kMax;
  p.include_pad = a.count_include_pad;
  // Eight channels per thread: 16-bit x and y of one dtype, channels innermost, every other stride a multiple
  // of 8.
  bool vec8 = (x.dtype == DType::kBF16 || x.dtype == DType::kFP16) && y.dtype == x.dtype && p.c % 8 == 0 &&
              x.strides[1] == 1 && y.strides[1] == 1;
  for (size_t d = 0; d < rank; ++d)
    if (d != 1) vec8 = vec8 && x.strides[d] % 8 == 0 && y.strides[d] % 8 == 0;
  k->vec8_layout_ = vec8;
  k->tensors_ = {x.name, y.name};
  return k;
}

}  // namespace fusebox::kernels
