// fusebox kernels layer: the embedding lookup, y[n, :] = table[ids[n], :] + add[n % P, :]
// (include/fusebox/ops/embedding.h). Memory-bound: each thread moves 8 values
// (16 bytes of bf16) when every row is 16-byte aligned and bf16, else one value
// of any supported dtype. An id outside [0, V) reads nothing and writes a NaN row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "embedding.h"
#include "kernel_base.h"

namespace fusebox::kernels {

namespace {

struct Rows {
  int64_t stride = 0;  // elements between rows
  int dtype = 0;       // static_cast<int>(DType)
};

// One value per thread, any dtypes and row strides.
__global__ void embedding_any(const int* ids, int64_t ids_stride, const void* table, Rows t, const void* add,
                              Rows a, int64_t p, void* y, Rows yr, int64_t n, int64_t v, int64_t h) {
  const int64_t total = n * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, c = i % h;
    const int id = ids[r * ids_stride];
    float out = __int_as_float(0x7fc00000);  // NaN
    if (id >= 0 && id < v) {
      out = load_as_float(table, t.dtype, id * t.stride + c);
      if (add) out += load_as_float(add, a.dtype, (r % p) * a.stride + c);
    }
    store_from_float(y, yr.dtype, r * yr.stride + c, out);
  }
}

// Eight bf16 values (16 bytes) per thread; strides in units of 8 values.
__global__ void embedding_bf16x8(const int* ids, int64_t ids_stride, const uint4* table, int64_t t8,
                                 const uint4* add, int64_t a8, int64_t p, uint4* y, int64_t y8, int64_t n,
                                 int64_t v, int64_t h8) {
  const int64_t total = n * h8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h8, c = i % h8;
    const int id = __ldg(ids + r * ids_stride);
    uint4 out;
    if (id >= 0 && id < v) {
      out = __ldg(table + id * t8 + c);
      if (add) {
        const uint4 b = __ldg(add + (r % p) * a8 + c);
        auto* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
        const auto* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 x = __bfloat1622float2(o2[k]), z = __bfloat1622float2(b2[k]);
          o2[k] = __floats2bfloat162_rn(x.x + z.x, x.y + z.y);
        }
      }
    } else {
      const unsigned nan2 = 0x7fc07fc0u;  // two bf16 NaNs
      out = make_uint4(nan2, nan2, nan2, nan2);
    }
    y[r * y8 + c] = out;
  }
}

// embedding_bwd, atomic: every (n, h) adds dy[n, h] into dtable[ids[n], h] (zeroed first).
__global__ void embedding_bwd_zero(float* dtable, int64_t stride, int64_t v, int64_t h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < v * h;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dtable[(i / h) * stride + i % h] = 0.0f;
}
__global__ void embedding_bwd_atomic(const int* ids, int64_t ids_stride, const void* dy, Rows d,
                                     float* dtable, int64_t t_stride, int64_t n, int64_t v, int64_t h) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n * h;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, c = i % h;
    const int id = __ldg(ids + r * ids_stride);
    if (id >= 0 && id < v)
      atomicAdd(dtable + id * t_stride + c, load_as_float(dy, d.dtype, r * d.stride + c));
  }
}
// embedding_bwd, deterministic: one thread per column, the rows of dy in the order of n.
__global__ void embedding_bwd_columns(const int* ids, int64_t ids_stride, const void* dy, Rows d,
                                      float* dtable, int64_t t_stride, int64_t n, int64_t v, int64_t h) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < h;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t row = 0; row < v; ++row) dtable[row * t_stride + c] = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      const int id = __ldg(ids + r * ids_stride);
      if (id >= 0 && id < v) dtable[id * t_stride + c] += load_as_float(dy, d.dtype, r * d.stride + c);
    }
  }
}

class EmbeddingBwdKernel final : public KernelBase {
 public:
  EmbeddingBwdKernel() { name_ = "fusebox_embedding_bwd"; }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    const auto* ids = static_cast<const int*>(ptrs[0]);
    const void* dy = ptrs[1];
    auto* dtable = static_cast<float*>(ptrs[2]);
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (v_ * h_ == 0) return Status::Ok();
    constexpr int kThreads = 256;
    if (deterministic_) {
      embedding_bwd_columns<<<grid_stride_blocks(h_, 64), 64, 0, stream>>>(ids, ids_stride_, dy, dy_, dtable,
                                                                           t_stride_, n_, v_, h_);
    } else {
      embedding_bwd_zero<<<grid_stride_blocks(v_ * h_, kThreads), kThreads, 0, stream>>>(dtable, t_stride_,
                                                                                         v_, h_);
      if (n_ > 0)
        embedding_bwd_atomic<<<grid_stride_blocks(n_ * h_, kThreads), kThreads, 0, stream>>>(
            ids, ids_stride_, dy, dy_, dtable, t_stride_, n_, v_, h_);
    }
    return common::cuda_status(cudaGetLastError(), where_, " embedding_bwd kernel launch");
  }

  bool deterministic_ = false;
  int64_t n_ = 0, v_ = 0, h_ = 0, ids_stride_ = 1, t_stride_ = 0;
  Rows dy_;
};

class EmbeddingKernel final : public KernelBase {
 public:
  EmbeddingKernel() { name_ = "fusebox_embedding"; }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    const auto* ids = static_cast<const int*>(ptrs[0]);
    const void* table = ptrs[1];
    const void* add = has_add_ ? ptrs[2] : nullptr;
    void* y = ptrs[has_add_ ? 3 : 2];
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (n_ * h_ == 0) return Status::Ok();
    constexpr int kThreads = 256;
    auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    const bool vec = all_bf16_ && h_ % 8 == 0 && table_.stride % 8 == 0 && y_.stride % 8 == 0 &&
                     (!add || add_.stride % 8 == 0) && aligned(table) && aligned(y) && (!add || aligned(add));
    if (vec) {
      embedding_bf16x8<<<grid_stride_blocks(n_ * (h_ / 8), kThreads), kThreads, 0, stream>>>(
          ids, ids_stride_, static_cast<const uint4*>(table), table_.stride / 8,
          static_cast<const uint4*>(add), add_.stride / 8, p_, static_cast<uint4*>(y), y_.stride / 8, n_, v_,
          h_ / 8);
    } else {
      embedding_any<<<grid_stride_blocks(n_ * h_, kThreads), kThreads, 0, stream>>>(
          ids, ids_stride_, table, table_, add, add_, p_, y, y_, n_, v_, h_);
    }
    return common::cuda_status(cudaGetLastError(), where_, " embedding kernel launch");
  }

  bool has_add_ = false, all_bf16_ = false;
  int64_t n_ = 0, v_ = 0, h_ = 0, p_ = 1, ids_stride_ = 1;
  Rows table_, add_, y_;
};

}  // namespace

Result<std::shared_ptr<const NativeKernel>> make_embedding_kernel(const ResolvedGraph& g,
                                                                  const ResolvedOp& op,
                                                                  const EmbeddingAttrs& a) {
  if (a.backward) {
    auto k = std::make_shared<EmbeddingBwdKernel>();
    k->where_ = common::op_where("embedding_bwd", op.name);
    const ResolvedTensor& ids = g.tensors[op.inputs.at("ids")];
    const ResolvedTensor& dy = g.tensors[op.inputs.at("dy")];
    const ResolvedTensor& dt = g.tensors[op.outputs.at("dtable")];
    if (dt.is_virtual)
      return InvalidArgument(k->where_ + " output 'dtable' ('" + dt.name + "') must be a graph output");
    if (dt.dtype != DType::kFP32) return InvalidArgument(k->where_ + " writes an fp32 dtable");
    k->deterministic_ = a.deterministic;
    k->n_ = ids.dims.at(0);
    k->ids_stride_ = ids.strides.at(0);
    k->v_ = a.rows;
    k->h_ = dy.dims.at(1);
    k->t_stride_ = dt.strides.at(0);
    k->dy_ = Rows{dy.strides.at(0), static_cast<int>(dy.dtype)};
    k->tensors_ = {ids.name, dy.name, dt.name};
    return std::shared_ptr<const NativeKernel>(std::move(k));
  }
  auto k = std::make_shared<EmbeddingKernel>();
  k->where_ = common::op_where("embedding", op.name);
  const ResolvedTensor& ids = g.tensors[op.inputs.at("ids")];
  const ResolvedTensor& table = g.tensors[op.inputs.at("table")];
  const ResolvedTensor& y = g.tensors[op.outputs.at("y")];
  if (y.is_virtual)
    return InvalidArgument(k->where_ + " output 'y' ('" + y.name + "') must be a graph output");
  k->has_add_ = a.add;
  k->n_ = ids.dims.at(0);
  k->ids_stride_ = ids.strides.at(0);
  k->v_ = table.dims.at(0);
  k->h_ = table.dims.at(1);
  k->table_ = Rows{table.strides.at(0), static_cast<int>(table.dtype)};
  k->y_ = Rows{y.strides.at(0), static_cast<int>(y.dtype)};
  k->tensors_ = {ids.name, table.name};
  k->all_bf16_ = table.dtype == DType::kBF16 && y.dtype == DType::kBF16;
  if (a.add) {
    const ResolvedTensor& add = g.tensors[op.inputs.at("add")];
    k->p_ = add.dims.at(0);
    k->add_ = Rows{add.strides.at(0), static_cast<int>(add.dtype)};
    k->tensors_.push_back(add.name);
    k->all_bf16_ = k->all_bf16_ && add.dtype == DType::kBF16;
  }
  k->tensors_.push_back(y.name);
  return std::shared_ptr<const NativeKernel>(std::move(k));
}

}  // namespace fusebox::kernels
