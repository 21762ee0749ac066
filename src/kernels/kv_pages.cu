// fusebox: the paged KV write (kernels/kv_pages.h): one thread per element of the new rows.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/kv_pages.h"

namespace fusebox::kernels {
namespace {

// The destination element of row (b, t), or -1 when the row is padding (t >= count) or out of
// its table or pool (then *bad is set).
__host__ __device__ inline int64_t dest_row(const KvWrite& w, const int32_t* table, const int32_t* start,
                                            const int32_t* count, int64_t b, int64_t t, bool* bad) {
  *bad = false;
  if (t >= count[b]) return -1;
  const int64_t pos = static_cast<int64_t>(start[b]) + t;
  const int64_t slot = pos < 0 ? -1 : pos / w.page_size;
  if (slot < 0 || slot >= w.max_pages) {
    *bad = true;
    return -1;
  }
  const int64_t page = table[b * w.max_pages + slot];
  if (page < 0 || page >= w.num_pages) {
    *bad = true;
    return -1;
  }
  return page * w.heads * w.page_size + pos % w.page_size;  // (page, h = 0, row): add h * page_size
}

__global__ void kv_write_kernel(KvWrite w) {
  const int64_t one = w.batch * w.heads * w.tokens * w.dim;
  const int64_t total = w.src2 ? 2 * one : one;
  for (int64_t f = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; f < total;
       f += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool second = f >= one;
    const int64_t e = second ? f - one : f;
    const int64_t* ss = second ? w.src2_strides : w.src_strides;
    const int64_t d = e % w.dim;
    const int64_t t = (e / w.dim) % w.tokens;
    const int64_t h = (e / (w.dim * w.tokens)) % w.heads;
    const int64_t b = e / (w.dim * w.tokens * w.heads);
    bool bad = false;
    const int64_t row = dest_row(w, w.page_table, w.start, w.count, b, t, &bad);
    if (row < 0) {
      if (bad && d == 0 && h == 0 && !second && w.bad_rows) atomicAdd(w.bad_rows, 1);
      continue;
    }
    const int64_t dst = (row + h * w.page_size) * w.dim + d;
    const int64_t src = b * ss[0] + h * ss[1] + t * ss[2] + d * ss[3];
    const void* from = second ? w.src2 : w.src;
    void* to = second ? w.pool2 : w.pool;
    if (w.elem_bytes == 2) {
      static_cast<uint16_t*>(to)[dst] = static_cast<const uint16_t*>(from)[src];
    } else {
      static_cast<uint32_t*>(to)[dst] = static_cast<const uint32_t*>(from)[src];
    }
  }
}

// A 16-bit source value (fp16 with `half`, else bf16) as float.
__host__ __device__ inline float source_value(uint16_t bits, bool half) {
  if (half) return __half2float(__ushort_as_half(bits));
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
__host__ __device__ inline uint8_t to_e4m3(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// The FP8 form: a warp a row of D values (lane l takes values l, l + 32, ...), its largest magnitude
// by shuffles, then the e4m3 values and the row's descale.
__global__ void kv_write_fp8_kernel(KvWrite w) {
  const int64_t one = w.batch * w.heads * w.tokens, rows = w.src2 ? 2 * one : one;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t f = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; f < rows; f += warps) {
    const bool second = f >= one;
    const int64_t e = second ? f - one : f;
    const int64_t t = e % w.tokens, h = (e / w.tokens) % w.heads, b = e / (w.tokens * w.heads);
    bool bad = false;
    const int64_t row = dest_row(w, w.page_table, w.start, w.count, b, t, &bad);
    if (row < 0) {  // the same for the warp's lanes
      if (bad && lane == 0 && h == 0 && !second && w.bad_rows) atomicAdd(w.bad_rows, 1);
      continue;
    }
    const int64_t* ss = second ? w.src2_strides : w.src_strides;
    const auto* from =
        static_cast<const uint16_t*>(second ? w.src2 : w.src) + b * ss[0] + h * ss[1] + t * ss[2];
    float amax = 0.f;
    for (int64_t d = lane; d < w.dim; d += 32)
      amax = fmaxf(amax, fabsf(source_value(from[d * ss[3]], w.src_half)));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const Fp8Row r = fp8_row_scale(amax);
    const int64_t dst = row + h * w.page_size;  // the row's index in [num_pages, H, page_size]
    auto* to = static_cast<uint8_t*>(second ? w.pool2 : w.pool) + dst * w.dim;
    for (int64_t d = lane; d < w.dim; d += 32)
      to[d] = to_e4m3(source_value(from[d * ss[3]], w.src_half) * r.inv);
    if (lane == 0) (second ? w.fp8_scale2 : w.fp8_scale)[dst] = r.descale;
  }
}

Status check(const KvWrite& w) {
  auto bad = [](const std::string& what) { return InvalidArgument("write_kv_pages: " + what); };
  if (w.batch < 0 || w.heads < 1 || w.tokens < 0 || w.dim < 1) {
    return bad("the rows are [" + std::to_string(w.batch) + ", " + std::to_string(w.heads) + ", " +
               std::to_string(w.tokens) + ", " + std::to_string(w.dim) + "]: B, T >= 0 and H, D >= 1");
  }
  if (w.elem_bytes != 2 && w.elem_bytes != 4) {
    return bad("elements of " + std::to_string(w.elem_bytes) +
               " bytes: 2 (bf16, fp16) or 4 (fp32) are taken");
  }
  if (w.num_pages < 1 || w.page_size < 1 || w.max_pages < 1) {
    return bad("the pool has " + std::to_string(w.num_pages) + " pages of " + std::to_string(w.page_size) +
               " rows and tables of " + std::to_string(w.max_pages) + " entries: each must be >= 1");
  }
  for (int i = 0; i < 4; ++i) {
    if (w.src_strides[i] < 0 || w.src2_strides[i] < 0)
      return bad("negative source stride " + std::to_string(std::min(w.src_strides[i], w.src2_strides[i])));
  }
  if ((w.src2 == nullptr) != (w.pool2 == nullptr)) return bad("src2 and pool2 come together");
  if (w.fp8_scale && w.elem_bytes != 2)
    return bad("an FP8 cache is written from 16-bit rows (bf16 or fp16), not " +
               std::to_string(w.elem_bytes) + "-byte ones");
  if (w.fp8_scale && w.src2 && !w.fp8_scale2)
    return bad("the second copy's FP8 descales (fp8_scale2) are null");
  return Status::Ok();
}

}  // namespace

Status write_kv_pages(const KvWrite& w, void* stream) {
  FUSEBOX_RETURN_IF_ERROR(check(w));
  const int64_t total = w.batch * w.heads * w.tokens * w.dim * (w.src2 ? 2 : 1);
  if (total == 0) return Status::Ok();
  if (!w.src || !w.pool || !w.page_table || !w.start || !w.count) {
    return InvalidArgument("write_kv_pages: a null device pointer");
  }
  const int threads = 256;
  if (w.fp8_scale) {  // a warp a row
    const int64_t blocks = (total / w.dim * 32 + threads - 1) / threads;
    kv_write_fp8_kernel<<<static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8), threads, 0,
                          static_cast<cudaStream_t>(stream)>>>(w);
  } else {
    const int64_t blocks = (total + threads - 1) / threads;
    kv_write_kernel<<<static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8), threads, 0,
                      static_cast<cudaStream_t>(stream)>>>(w);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string("write_kv_pages: ") + cudaGetErrorString(err));
  }
  return Status::Ok();
}

namespace {

// Calls fn(b, t, h, dst) for each row the write stores (dst: its index in [num_pages, H, page_size]),
// on host copies of the tables; returns the rows left out (outside their table or the pool).
template <typename Fn>
int64_t for_each_host_row(const KvWrite& w, const std::vector<int32_t>& page_table,
                          const std::vector<int32_t>& start, const std::vector<int32_t>& count, Fn&& fn) {
  int64_t left_out = 0;
  for (int64_t b = 0; b < w.batch; ++b) {
    for (int64_t t = 0; t < w.tokens; ++t) {
      bool bad = false;
      const int64_t row = dest_row(w, page_table.data(), start.data(), count.data(), b, t, &bad);
      if (bad) ++left_out;
      if (row < 0) continue;
      for (int64_t h = 0; h < w.heads; ++h) fn(b, t, h, row + h * w.page_size);
    }
  }
  return left_out;
}

}  // namespace

int64_t write_kv_pages_host(const KvWrite& w, std::vector<uint8_t>& pool,
                            const std::vector<int32_t>& page_table, const std::vector<int32_t>& start,
                            const std::vector<int32_t>& count) {
  const auto* src = static_cast<const uint8_t*>(w.src);
  return for_each_host_row(w, page_table, start, count, [&](int64_t b, int64_t t, int64_t h, int64_t dst) {
    for (int64_t d = 0; d < w.dim; ++d) {
      const int64_t s =
          b * w.src_strides[0] + h * w.src_strides[1] + t * w.src_strides[2] + d * w.src_strides[3];
      std::memcpy(pool.data() + (dst * w.dim + d) * w.elem_bytes, src + s * w.elem_bytes,
                  static_cast<size_t>(w.elem_bytes));
    }
  });
}

int64_t write_kv_pages_fp8_host(const KvWrite& w, std::vector<uint8_t>& pool, std::vector<float>& scales,
                                const std::vector<int32_t>& page_table, const std::vector<int32_t>& start,
                                const std::vector<int32_t>& count) {
  const auto* src = static_cast<const uint16_t*>(w.src);
  std::vector<float> x(static_cast<size_t>(w.dim));
  return for_each_host_row(w, page_table, start, count, [&](int64_t b, int64_t t, int64_t h, int64_t dst) {
    const uint16_t* from = src + b * w.src_strides[0] + h * w.src_strides[1] + t * w.src_strides[2];
    for (int64_t d = 0; d < w.dim; ++d)
      x[static_cast<size_t>(d)] = source_value(from[d * w.src_strides[3]], w.src_half);
    scales[static_cast<size_t>(dst)] = quantize_fp8_row(x.data(), w.dim, pool.data() + dst * w.dim);
  });
}

float quantize_fp8_row(const float* x, int64_t n, uint8_t* q) {
  float amax = 0.f;
  for (int64_t d = 0; d < n; ++d) amax = std::fmax(amax, std::fabs(x[d]));
  const Fp8Row r = fp8_row_scale(amax);
  for (int64_t d = 0; d < n; ++d) q[d] = to_e4m3(x[d] * r.inv);
  return r.descale;
}

}  // namespace fusebox::kernels
