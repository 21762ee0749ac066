// fusebox: FP8 quantization. Row-wise (kernels/quantize.h, the serving engine's): one block per row,
// the row's largest magnitude by a block reduction, then each element divided by the scale and
// converted. Per tensor: the quantize op's kernel (quantize_op.h), below.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "fp8_pack.cuh"
#include "fusebox/dtype.h"
#include "kernel_base.h"
#include "kernels/quantize.h"
#include "packed16.cuh"
#include "quantize_op.h"

namespace fusebox::kernels {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline float row_scale(float amax) { return amax > 0.f ? amax / kE4M3Max : 1.f; }

__global__ void quantize_rows_kernel(Fp8Rows r) {
  __shared__ float part[kThreads];
  const int64_t row = blockIdx.x;
  const auto* x = static_cast<const __nv_bfloat16*>(r.x) + row * r.ld;
  float m = 0.f;
  for (int64_t c = threadIdx.x; c < r.cols; c += kThreads) m = fmaxf(m, fabsf(__bfloat162float(x[c])));
  part[threadIdx.x] = m;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] = fmaxf(part[threadIdx.x], part[threadIdx.x + s]);
    __syncthreads();
  }
  const float scale = row_scale(part[0]);
  if (threadIdx.x == 0) r.scale[row] = scale;
  auto* q = static_cast<__nv_fp8_e4m3*>(r.q) + row * r.cols;
  for (int64_t c = threadIdx.x; c < r.cols; c += kThreads)
    q[c] = __nv_fp8_e4m3(__fdiv_rn(__bfloat162float(x[c]), scale));  // saturating, nearest even
}

}  // namespace

Status quantize_rows_fp8(const Fp8Rows& r, void* stream) {
  if (r.rows < 0 || r.cols < 1 || r.ld < r.cols)
    return InvalidArgument("quantize_rows_fp8: rows " + std::to_string(r.rows) + ", cols " +
                           std::to_string(r.cols) + ", ld " + std::to_string(r.ld) +
                           ": rows >= 0, cols >= 1 and ld >= cols");
  if (r.rows == 0) return Status::Ok();
  if (!r.x || !r.q || !r.scale) return InvalidArgument("quantize_rows_fp8: a null device pointer");
  if (r.rows > (int64_t{1} << 31) - 1) return InvalidArgument("quantize_rows_fp8: over 2^31 rows");
  quantize_rows_kernel<<<static_cast<unsigned>(r.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(r);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return Status(StatusCode::kCudaError, std::string("quantize_rows_fp8: ") + cudaGetErrorString(err));
  return Status::Ok();
}

void quantize_rows_fp8_host(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float m = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = std::fmax(m, std::fabs(x[r * cols + c]));
    const float s = row_scale(m);
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c)
      q[r * cols + c] = float_to_fp8_bits(x[r * cols + c] / s, DType::kFP8E4M3);
  }
}

// ---- the quantize op (include/fusebox/ops/quantize.h): y = fp8(x * scale) in y's own layout,
// amax = max |x|. Three forms: x and y in one dense layout (a flat loop), y transposed against x
// over the two dims each is contiguous in (32 x 32 tiles through shared memory, both sides
// coalesced), anything else element by element.
namespace {

constexpr int kQRank = 8;
constexpr int kTile = 32;

struct QuantizeShape {
  int rank = 0;
  int64_t dims[kQRank] = {};
  int64_t xs[kQRank] = {}, ys[kQRank] = {};
  int64_t n = 0;
  int inner_x = -1, inner_y = -1;  // the transposed form: the dim x, and the dim y, is contiguous in
  int64_t batches = 1;             // the transposed form: the product of the other dims
  // The transposed form with 16-bit x: extents and strides let it take 8 elements a thread
  // (quantize_transpose8_kernel; the launch checks the pointers' alignment).
  bool by8 = false;
};

template <typename T>
__device__ __forceinline__ float to_f(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f(__half v) {
  return __half2float(v);
}

__device__ __forceinline__ float scale_of(const float* scale_ptr, float scale_value) {
  return scale_ptr ? *scale_ptr : scale_value;
}

template <typename T>
__global__ void quantize_flat_kernel(const T* x, unsigned char* y, int64_t n, const float* sp, float sv,
                                     bool e5m2, unsigned* amax) {
  const float s = scale_of(sp, sv);
  float m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = to_f(x[i]);
    m = fmaxf(m, fabsf(v));
    y[i] = to_fp8(v * s, e5m2);
  }
  if (amax) block_amax(m, amax);
}

// The flat form with 16-bit x, 8 elements a thread: one 16-byte load, one 8-byte store (x 16-byte
// and y 8-byte aligned, n a multiple of 8; the launch checks).
template <bool kHalf>
__global__ void quantize_flat8_kernel(const uint4* x, uint2* y, int64_t n8, const float* sp, float sv,
                                      bool e5m2, unsigned* amax) {
  const float s = scale_of(sp, sv);
  float m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = fp8x8<kHalf>(x[i], s, e5m2, m);
  }
  if (amax) block_amax(m, amax);
}

// The offsets in x and y of batch `b` (the dims other than inner_x and inner_y, row-major).
__device__ __forceinline__ void batch_offsets(const QuantizeShape& q, int64_t b, int64_t* xo, int64_t* yo) {
  *xo = 0;
  *yo = 0;
  for (int k = q.rank - 1; k >= 0; --k) {
    if (k == q.inner_x || k == q.inner_y) continue;
    const int64_t i = b % q.dims[k];
    b /= q.dims[k];
    *xo += i * q.xs[k];
    *yo += i * q.ys[k];
  }
}

// Blocks of kTile x 8 threads; block (bx, by, bz) covers y-contiguous indices [bx * 32, +32) and
// x-contiguous ones [by * 32, +32) of batch bz (a grid-stride loop over batches past 65535).
// `same` (or null): a second copy in x's own layout, written as x is read.
template <typename T>
__global__ void quantize_transpose_kernel(const T* x, unsigned char* y, unsigned char* same, QuantizeShape q,
                                          const float* sp, float sv, bool e5m2, unsigned* amax) {
  __shared__ float tile[kTile][kTile + 1];
  const float s = scale_of(sp, sv);
  const int64_t ny = q.dims[q.inner_y], nx = q.dims[q.inner_x];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile, i0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t sxj = q.xs[q.inner_y], syi = q.ys[q.inner_x];
  float m = 0.f;
  for (int64_t b = blockIdx.z; b < q.batches; b += gridDim.z) {
    int64_t xo, yo;
    batch_offsets(q, b, &xo, &yo);
    // Read along x's contiguous dim (threadIdx.x), rows of the y-contiguous dim.
    for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
      const int64_t i = i0 + threadIdx.x, j = j0 + r;
      float v = 0.f;
      if (i < nx && j < ny) {
        v = to_f(x[xo + i + j * sxj]);
        m = fmaxf(m, fabsf(v));
        if (same) same[xo + i + j * sxj] = to_fp8(v * s, e5m2);
      }
      tile[r][threadIdx.x] = v;
    }
    __syncthreads();
    // Write along y's contiguous dim (threadIdx.x).
    for (int r = threadIdx.y; r < kTile; r += blockDim.y) {
      const int64_t j = j0 + threadIdx.x, i = i0 + r;
      if (i < nx && j < ny) y[yo + j + i * syi] = to_fp8(tile[threadIdx.x][r] * s, e5m2);
    }
    __syncthreads();
  }
  if (amax) block_amax(m, amax);
}

// The transposed form with 16-bit x, 8 elements a thread both ways: 64 x 64 tiles, each row of x
// read as 16-byte loads (and, with `same`, its FP8 copy in x's layout stored as 8-byte stores at
// once), the FP8 bytes through shared memory, y written as 8-byte stores along its contiguous dim.
// Both extents, every stride other than the contiguous dims' and the pointers' offsets are
// multiples of 8 elements (the launch checks), so a chunk of 8 is all in range or all out.
constexpr int kTile8 = 64;

template <bool kHalf>
__global__ void __launch_bounds__(256)
    quantize_transpose8_kernel(const uint16_t* x, unsigned char* y, unsigned char* same, QuantizeShape q,
                               const float* sp, float sv, bool e5m2, unsigned* amax) {
  // Row stride 65 bytes: the write phase's column reads (8 rows apart per thread) land in
  // different banks.
  __shared__ unsigned char tile[kTile8][kTile8 + 1];
  const float s = scale_of(sp, sv);
  const int64_t ny = q.dims[q.inner_y], nx = q.dims[q.inner_x];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile8,
                i0 = static_cast<int64_t>(blockIdx.y) * kTile8;
  const int64_t sxj = q.xs[q.inner_y], syi = q.ys[q.inner_x];
  float m = 0.f;
  for (int64_t b = blockIdx.z; b < q.batches; b += gridDim.z) {
    int64_t xo, yo;
    batch_offsets(q, b, &xo, &yo);
    // Read: tile row r is x's row j0 + r, 8 chunks of 8 along x's contiguous dim.
    for (int e = threadIdx.x; e < kTile8 * 8; e += blockDim.x) {
      const int r = e / 8, c = (e % 8) * 8;
      const int64_t j = j0 + r, i = i0 + c;
      uint2 b = make_uint2(0, 0);
      if (j < ny && i < nx) {
        const int64_t at = xo + i + j * sxj;
        b = fp8x8<kHalf>(*reinterpret_cast<const uint4*>(x + at), s, e5m2, m);
        if (same) *reinterpret_cast<uint2*>(same + at) = b;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) tile[r][c + k] = fp8_byte(b, k);
    }
    __syncthreads();
    // Write: y's row i0 + r (x's column), 8 chunks of 8 along y's contiguous dim.
    for (int e = threadIdx.x; e < kTile8 * 8; e += blockDim.x) {
      const int r = e / 8, c = (e % 8) * 8;
      const int64_t i = i0 + r, j = j0 + c;
      if (i < nx && j < ny) {
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          lo |= static_cast<uint32_t>(tile[c + k][r]) << (8 * k);
          hi |= static_cast<uint32_t>(tile[c + 4 + k][r]) << (8 * k);
        }
        *reinterpret_cast<uint2*>(y + yo + j + i * syi) = make_uint2(lo, hi);
      }
    }
    __syncthreads();
  }
  if (amax) block_amax(m, amax);
}

// Whether the transposed form's extents and strides let it take 8 elements a thread
// (quantize_transpose8_kernel's terms, but for the pointers).
bool transpose8_shape(const QuantizeShape& q) {
  if (q.inner_x < 0 || q.dims[q.inner_x] % 8 != 0 || q.dims[q.inner_y] % 8 != 0) return false;
  for (int k = 0; k < q.rank; ++k) {
    if (k != q.inner_x && q.xs[k] % 8 != 0) return false;
    if (k != q.inner_y && q.ys[k] % 8 != 0) return false;
  }
  return true;
}

template <typename T>
__global__ void quantize_strided_kernel(const T* x, unsigned char* y, QuantizeShape q, const float* sp,
                                        float sv, bool e5m2, unsigned* amax) {
  const float s = scale_of(sp, sv);
  float m = 0.f;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < q.n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = o, xo = 0, yo = 0;
    for (int k = q.rank - 1; k >= 0; --k) {
      const int64_t i = rem % q.dims[k];
      rem /= q.dims[k];
      xo += i * q.xs[k];
      yo += i * q.ys[k];
    }
    const float v = to_f(x[xo]);
    m = fmaxf(m, fabsf(v));
    y[yo] = to_fp8(v * s, e5m2);
  }
  if (amax) block_amax(m, amax);
}

class QuantizeKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    int p = 0;
    const void* x = ptrs[p++];
    const float* sp = scale_by_value_ ? nullptr : static_cast<const float*>(ptrs[p++]);
    auto* y = static_cast<unsigned char*>(ptrs[p++]);
    unsigned* amax = has_amax_ ? static_cast<unsigned*>(ptrs[p++]) : nullptr;
    auto* y2 = has_y2_ ? static_cast<unsigned char*>(ptrs[p++]) : nullptr;
    if (amax) {
      const cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(float), stream);
      if (e != cudaSuccess) return common::cuda_status(e, where_, " amax reset");
    }
    if (q_[0].n == 0) return Status::Ok();
    switch (x_dtype_) {
      case DType::kBF16:
        run(static_cast<const __nv_bfloat16*>(x), y, y2, sp, amax, stream);
        break;
      case DType::kFP16:
        run(static_cast<const __half*>(x), y, y2, sp, amax, stream);
        break;
      default:
        run(static_cast<const float*>(x), y, y2, sp, amax, stream);
        break;
    }
    return common::cuda_status(cudaGetLastError(), where_, " quantize kernel launch");
  }

  enum class Form { kFlat, kTranspose, kStrided };

  template <typename T>
  void run(const T* x, unsigned char* y, unsigned char* y2, const float* sp, unsigned* amax,
           cudaStream_t stream) const {
    if (y2 && fused_ >= 0) {  // one pass: output fused_ transposed, the other in x's layout
      unsigned char* t = fused_ == 0 ? y : y2;
      unsigned char* same = fused_ == 0 ? y2 : y;
      one(x, t, same, q_[static_cast<size_t>(fused_)], Form::kTranspose, sp, amax, stream);
      return;
    }
    one(x, y, nullptr, q_[0], form_[0], sp, amax, stream);
    if (y2) one(x, y2, nullptr, q_[1], form_[1], sp, nullptr, stream);  // amax once
  }

  template <typename T>
  void one(const T* x, unsigned char* y, unsigned char* same, const QuantizeShape& q, Form form,
           const float* sp, unsigned* amax, cudaStream_t stream) const {
    constexpr bool k16 = sizeof(T) == 2;
    const bool packed = k16 && q.n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                        reinterpret_cast<uintptr_t>(y) % 8 == 0;
    if (form == Form::kFlat && packed) {
      quantize_flat8_kernel<std::is_same_v<T, __half>><<<grid_stride_blocks(q.n / 8, 256), 256, 0, stream>>>(
          reinterpret_cast<const uint4*>(x), reinterpret_cast<uint2*>(y), q.n / 8, sp, scale_, e5m2_, amax);
    } else if (form == Form::kFlat) {
      quantize_flat_kernel<T>
          <<<grid_stride_blocks(q.n, 256), 256, 0, stream>>>(x, y, q.n, sp, scale_, e5m2_, amax);
    } else if (form == Form::kTranspose && k16 && q.by8 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
               reinterpret_cast<uintptr_t>(y) % 8 == 0 && reinterpret_cast<uintptr_t>(same) % 8 == 0) {
      const dim3 grid(static_cast<unsigned>((q.dims[q.inner_y] + kTile8 - 1) / kTile8),
                      static_cast<unsigned>((q.dims[q.inner_x] + kTile8 - 1) / kTile8),
                      static_cast<unsigned>(std::min<int64_t>(q.batches, 65535)));
      quantize_transpose8_kernel<std::is_same_v<T, __half>><<<grid, 256, 0, stream>>>(
          reinterpret_cast<const uint16_t*>(x), y, same, q, sp, scale_, e5m2_, amax);
    } else if (form == Form::kTranspose) {
      const dim3 grid(static_cast<unsigned>((q.dims[q.inner_y] + kTile - 1) / kTile),
                      static_cast<unsigned>((q.dims[q.inner_x] + kTile - 1) / kTile),
                      static_cast<unsigned>(std::min<int64_t>(q.batches, 65535)));
      quantize_transpose_kernel<T>
          <<<grid, dim3(kTile, 8), 0, stream>>>(x, y, same, q, sp, scale_, e5m2_, amax);
    } else {
      quantize_strided_kernel<T>
          <<<grid_stride_blocks(q.n, 256), 256, 0, stream>>>(x, y, q, sp, scale_, e5m2_, amax);
    }
  }

  // By output (y, y2): its shape and form; fused_: the output written transposed by one pass that
  // also writes the other in x's layout (-1: none).
  QuantizeShape q_[2];
  Form form_[2] = {Form::kStrided, Form::kStrided};
  int fused_ = -1;
  DType x_dtype_ = DType::kBF16;
  bool e5m2_ = false, has_amax_ = false, has_y2_ = false, scale_by_value_ = false;
  float scale_ = 1.f;
};

// Output y's shape and form against x.
QuantizeKernel::Form plan_output(const ResolvedTensor& x, const ResolvedTensor& y, QuantizeShape& q) {
  q.rank = static_cast<int>(x.dims.size());
  q.n = 1;
  for (int i = 0; i < q.rank; ++i) {
    q.dims[i] = x.dims[static_cast<size_t>(i)];
    q.xs[i] = x.strides[static_cast<size_t>(i)];
    q.ys[i] = y.strides[static_cast<size_t>(i)];
    q.n *= q.dims[i];
  }
  const int cx = contiguous_dim(x), cy = contiguous_dim(y);
  if (dense(x) && dense(y) && x.strides == y.strides) return QuantizeKernel::Form::kFlat;
  if (dense(x) && dense(y) && cx >= 0 && cy >= 0 && cx != cy) {
    q.inner_x = cx;
    q.inner_y = cy;
    q.batches = q.n / (q.dims[cx] * q.dims[cy]);
    q.by8 = transpose8_shape(q);
    return QuantizeKernel::Form::kTranspose;
  }
  return QuantizeKernel::Form::kStrided;
}

}  // namespace

Result<std::shared_ptr<const NativeKernel>> make_quantize_kernel(const ResolvedGraph& g, const ResolvedOp& op,
                                                                 const QuantizeAttrs& a) {
  auto k = std::make_shared<QuantizeKernel>();
  k->name_ = "fusebox_quantize";
  k->where_ = common::op_where("quantize", op.name);
  const ResolvedTensor& x = g.tensors[static_cast<size_t>(op.inputs.at("x"))];
  const ResolvedTensor& s = g.tensors[static_cast<size_t>(op.inputs.at("scale"))];
  const ResolvedTensor& y = g.tensors[static_cast<size_t>(op.outputs.at("y"))];
  if (y.is_virtual)
    return InvalidArgument(k->where_ + " output 'y' ('" + y.name + "') must be a graph output");
  if (x.dims.size() > static_cast<size_t>(kQRank))
    return InvalidArgument(k->where_ + " x has rank " + std::to_string(x.dims.size()) + " (at most 8)");
  k->x_dtype_ = x.dtype;
  k->e5m2_ = y.dtype == DType::kFP8E5M2;
  k->has_amax_ = a.amax;
  k->has_y2_ = a.y2;
  k->scale_by_value_ = s.scalar_value.has_value();
  if (s.scalar_value) k->scale_ = static_cast<float>(*s.scalar_value);
  k->form_[0] = plan_output(x, y, k->q_[0]);
  const ResolvedTensor* y2 = a.y2 ? &g.tensors[static_cast<size_t>(op.outputs.at("y2"))] : nullptr;
  if (y2) {
    if (y2->is_virtual)
      return InvalidArgument(k->where_ + " output 'y2' ('" + y2->name + "') must be a graph output");
    k->form_[1] = plan_output(x, *y2, k->q_[1]);
    using F = QuantizeKernel::Form;
    if (k->form_[0] == F::kTranspose && k->form_[1] == F::kFlat) k->fused_ = 0;
    if (k->form_[0] == F::kFlat && k->form_[1] == F::kTranspose) k->fused_ = 1;
  }
  k->tensors_ = {x.name};
  if (!s.scalar_value) k->tensors_.push_back(s.name);
  k->tensors_.push_back(y.name);
  if (a.amax) {
    const ResolvedTensor& m = g.tensors[static_cast<size_t>(op.outputs.at("amax"))];
    if (m.is_virtual)
      return InvalidArgument(k->where_ + " output 'amax' ('" + m.name + "') must be a graph output");
    k->tensors_.push_back(m.name);
  }
  if (y2) k->tensors_.push_back(y2->name);
  return std::shared_ptr<const NativeKernel>(std::move(k));
}

}  // namespace fusebox::kernels
