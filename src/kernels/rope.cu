// fusebox kernels layer: rotary position embedding, forward and backward
// (include/fusebox/ops/rope.h). Memory-bound: each thread takes one rotated
// pair (two values of x, one angle) or one passed-through value of every head,
// through the tensors' strides, in fp32; sincosf is the accurate one (angles
// reach thousands of radians at long positions). A position outside freqs gives NaN.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "rope.h"

namespace fusebox::kernels {

namespace {

struct RopeShape {
  int64_t nh = 0, ns = 0, d = 0, lead = 0, half = 0, np = 0;
  bool interleaved = false;
  float scale = 1.f, sign = 1.f;
  int64_t head_groups = 1, heads_per_group = 0;  // the heads a thread loops over: one group of them
};

// One thread per (batch, position, unit of the row, group of heads) looping over the group's heads: a
// unit is one passed-through value or one rotated pair (two values of x, one angle). The angle's
// sincosf and the index arithmetic are done once for every head of the group (the row's heads share
// the position), and a warp reads and writes consecutive units of one row per head. Where the rows
// are many (training) a group is every head; where they are few (a decode step: one row of 40
// heads, 32 pairs each) the heads are split into groups so that the launch still has about 128k
// threads: one thread looping over 40 heads made a 1-row call take 13 us on an H100 (session 36),
// for 10 KB. A value's arithmetic is the same whatever the grouping. I: the index type of the work
// items, 32-bit where the work fits (the usual case). Measured on an H100 (2026-12-06, the 125M
// training step, q of 32x12x1024x64 bf16): one thread per pair and head took 149 us a call, set
// by the divisions and the sincosf repeated per head, where moving the 100 MB takes about 33 us.
template <typename I>
__global__ void rope_kernel(const void* x, int x_dtype, Strides4 xs, const float* freqs, Strides4 fs,
                            const int* offset, int64_t offset_stride, void* y, int y_dtype, Strides4 ys,
                            RopeShape sh, I total) {
  const I units = static_cast<I>(sh.lead + sh.half);  // per row: passed-through values, then pairs
  const I ns = static_cast<I>(sh.ns);
  const I groups = static_cast<I>(sh.head_groups);
  for (I u = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; u < total;
       u += static_cast<I>(gridDim.x) * blockDim.x) {
    const I k = u % units, rest = u / units;
    const I g = rest % groups, row = rest / groups;
    const I s = row % ns, b = row / ns;
    const int h0 = static_cast<int>(g * static_cast<I>(sh.heads_per_group));
    const int h1 = static_cast<int>(h0 + sh.heads_per_group < sh.nh ? h0 + sh.heads_per_group : sh.nh);
    const int64_t xb = b * xs.s[0] + s * xs.s[2];
    const int64_t yb = b * ys.s[0] + s * ys.s[2];
    const int64_t pos = (offset ? static_cast<int64_t>(offset[b * offset_stride]) : 0) + s;
    const bool inside = pos >= 0 && pos < sh.np;
    const float nan = __int_as_float(0x7fc00000);
    if (k < sh.lead) {
      const float scale = inside ? sh.scale : nan;
#pragma unroll 4
      for (int h = h0; h < h1; ++h) {
        const float v = load_as_float(x, x_dtype, xb + h * xs.s[1] + k * xs.s[3]);
        store_from_float(y, y_dtype, yb + h * ys.s[1] + k * ys.s[3], scale * v);
      }
      continue;
    }
    const int64_t i = k - sh.lead;
    const int64_t jl = sh.lead + (sh.interleaved ? 2 * i : i);
    const int64_t ju = sh.lead + (sh.interleaved ? 2 * i + 1 : i + sh.half);
    float c = nan, sn = nan;
    if (inside) {
      sincosf(freqs[pos * fs.s[2] + i * fs.s[3]], &sn, &c);
      c *= sh.scale;
      sn *= sh.sign * sh.scale;
    }
    const int64_t xl = xb + jl * xs.s[3], xu = xb + ju * xs.s[3];
    const int64_t yl = yb + jl * ys.s[3], yu = yb + ju * ys.s[3];
#pragma unroll 4
    for (int h = h0; h < h1; ++h) {
      const float vl = load_as_float(x, x_dtype, xl + h * xs.s[1]);
      const float vu = load_as_float(x, x_dtype, xu + h * xs.s[1]);
      store_from_float(y, y_dtype, yl + h * ys.s[1], fmaf(vl, c, -vu * sn));
      store_from_float(y, y_dtype, yu + h * ys.s[1], fmaf(vu, c, vl * sn));
    }
  }
}

class RopeKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    const void* x = ptrs[0];
    const auto* freqs = static_cast<const float*>(ptrs[1]);
    const auto* offset = has_offset_ ? static_cast<const int*>(ptrs[2]) : nullptr;
    void* y = ptrs[has_offset_ ? 3 : 2];
    if (total_ == 0) return Status::Ok();
    constexpr int kThreads = 256;
    const int blocks = grid_stride_blocks(total_, kThreads);
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    // 32-bit indices while the last grid-stride step cannot overflow them.
    if (total_ + static_cast<int64_t>(blocks) * kThreads < (int64_t{1} << 31))
      rope_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(x, x_dtype_, xs_, freqs, fs_, offset,
                                                            offset_stride_, y, y_dtype_, ys_, shape_,
                                                            static_cast<int32_t>(total_));
    else
      rope_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(x, x_dtype_, xs_, freqs, fs_, offset,
                                                            offset_stride_, y, y_dtype_, ys_, shape_, total_);
    return common::cuda_status(cudaGetLastError(), where_, " rope kernel launch");
  }

  bool has_offset_ = false;
  int x_dtype_ = 0, y_dtype_ = 0;
  int64_t offset_stride_ = 1, total_ = 0;
  Strides4 xs_, fs_, ys_;
  RopeShape shape_;
};

}  // namespace

Result<std::shared_ptr<const NativeKernel>> make_rope_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                             const RopeAttrs& a) {
  auto k = std::make_shared<RopeKernel>();
  const char* type = a.backward ? "rope_bwd" : "rope";
  k->name_ = std::string("fusebox_") + type;
  k->where_ = common::op_where(type, op.name);
  const ResolvedTensor& x = g.tensors[op.inputs.at(a.backward ? "dy" : "x")];
  const ResolvedTensor& freqs = g.tensors[op.inputs.at("freqs")];
  const ResolvedTensor& y = g.tensors[op.outputs.at(a.backward ? "dx" : "y")];
  if (y.is_virtual)
    return InvalidArgument(k->where_ + " output '" + (a.backward ? "dx" : "y") + "' ('" + y.name +
                           "') must be a graph output");
  k->x_dtype_ = static_cast<int>(x.dtype);
  k->y_dtype_ = static_cast<int>(y.dtype);
  k->xs_ = strides4(x);
  k->ys_ = strides4(y);
  k->fs_ = strides4(freqs);
  const int64_t d = x.dims.at(3), r = a.rope_dim ? a.rope_dim : d;
  k->shape_ = RopeShape{x.dims.at(1),
                        x.dims.at(2),
                        d,
                        d - r,
                        r / 2,
                        freqs.dims.at(2),
                        a.layout == RopeLayout::kInterleaved,
                        static_cast<float>(a.scale),
                        a.backward ? -1.f : 1.f};
  // The heads: a loop, split into groups where the rows are too few to fill the GPU on their own.
  const int64_t nh = k->shape_.nh, items = x.dims.at(0) * x.dims.at(2) * (k->shape_.lead + k->shape_.half);
  constexpr int64_t kWantThreads = int64_t{1} << 17;
  const int64_t want =
      items > 0 ? std::clamp<int64_t>((kWantThreads + items - 1) / items, 1, std::max<int64_t>(nh, 1)) : 1;
  k->shape_.heads_per_group = std::max<int64_t>((nh + want - 1) / want, 1);
  k->shape_.head_groups =
      std::max<int64_t>((nh + k->shape_.heads_per_group - 1) / k->shape_.heads_per_group, 1);
  k->total_ = items * k->shape_.head_groups;
  k->tensors_ = {x.name, freqs.name};
  k->has_offset_ = a.offset;
  if (a.offset) {
    const ResolvedTensor& off = g.tensors[op.inputs.at("offset")];
    k->offset_stride_ = off.strides.at(0);
    k->tensors_.push_back(off.name);
  }
  k->tensors_.push_back(y.name);
  return std::shared_ptr<const NativeKernel>(std::move(k));
}

}  // namespace fusebox::kernels
