// fusebox kernels layer: writing new keys or values into a paged KV pool (issue 34), the layout
// of fusebox's paged SDPA (fusebox/ops/sdpa.h: pool [num_pages, H, page_size, D]; key j of
// sequence b is row j % page_size of page page_table[b, j / page_size]). The serving engine's
// decode and prefill steps write their K and V with it. No cuDNN here.
#pragma once

#include <cstdint>
#include <vector>

#include "fusebox/status.h"

#ifdef __CUDACC__
#define FUSEBOX_KV_HOST_DEVICE __host__ __device__
#else
#define FUSEBOX_KV_HOST_DEVICE
#endif

namespace fusebox::kernels {

struct KvWrite {
  // The new rows: [B, H, T, D] at `src` with these element strides (any layout, e.g. a view of
  // the QKV projection's [B, T, 3, H, D] output), elements of `elem_bytes` (2 or 4) bytes.
  const void* src = nullptr;
  int64_t batch = 0, heads = 0, tokens = 0, dim = 0;
  int64_t src_strides[4] = {0, 0, 0, 0};
  int elem_bytes = 2;
  // The pool, dense [num_pages, H, page_size, D], and int32 tables on the device:
  // page_table [B, max_pages]; start[b] the position of sequence b's first new row; count[b] how
  // many of its T rows are real (the rest, batch padding, are not written).
  void* pool = nullptr;
  int64_t num_pages = 0, page_size = 0, max_pages = 0;
  const int32_t* page_table = nullptr;
  const int32_t* start = nullptr;
  const int32_t* count = nullptr;
  // Optional (device, one int32, not reset here): incremented for each row whose position falls
  // outside its table or whose page is outside the pool; such rows are not written.
  int32_t* bad_rows = nullptr;
  // Optional: a second copy in the same launch (the values beside the keys), rows of the same
  // shape from `src2` (its own strides) into `pool2`, at the same pages.
  const void* src2 = nullptr;
  int64_t src2_strides[4] = {0, 0, 0, 0};
  void* pool2 = nullptr;
  // An FP8 cache (fp8_scale set; the source 16-bit, fp16 with src_half, else bf16): each row of D
  // values x is written as e4m3(x * 448 / max|x|) and its descale max|x| / 448 (1 for a row of
  // zeros) into fp8_scale at [page, h, row] of a dense [num_pages, H, page_size] fp32 array
  // (fp8_scale2 for the second copy): the descales sdpa_fwd's FP8 cache reads (SdpaFwdAttrs::fp8_kv).
  float* fp8_scale = nullptr;
  float* fp8_scale2 = nullptr;
  bool src_half = false;
};

// The factor into e4m3 and the descale of one row of D values whose largest magnitude is `amax`:
// the FP8 cache's rounding, the same on the host and the device.
struct Fp8Row {
  float inv = 1.f, descale = 1.f;
};
FUSEBOX_KV_HOST_DEVICE inline Fp8Row fp8_row_scale(float amax) {
  Fp8Row r;
  if (amax > 0.f && amax < 3.0e38f) {
    r.inv = 448.f / amax;
    r.descale = amax / 448.f;
  }
  return r;
}

// Enqueues the copy on `stream` (a cudaStream_t); capturable in a CUDA graph. The sizes are
// checked here (InvalidArgument naming the one at fault); the tables' values on the device.
Status write_kv_pages(const KvWrite& w, void* stream);

// The same on the host, on host copies of every buffer (the tests' reference; src2 and pool2 are
// not read: call it once for each copy): returns the number of rows left out.
int64_t write_kv_pages_host(const KvWrite& w, std::vector<uint8_t>& pool,
                            const std::vector<int32_t>& page_table, const std::vector<int32_t>& start,
                            const std::vector<int32_t>& count);
// One row of `n` values quantized for an FP8 cache on the host, as the device kernel rounds it: its
// e4m3 bytes into `q`, its descale returned (fp8_row_scale).
float quantize_fp8_row(const float* x, int64_t n, uint8_t* q);
// The FP8 form on the host (w.fp8_scale's layout, `scales` the host copy): the tests' and the
// reference engine's; rows left out counted as above.
int64_t write_kv_pages_fp8_host(const KvWrite& w, std::vector<uint8_t>& pool, std::vector<float>& scales,
                                const std::vector<int32_t>& page_table, const std::vector<int32_t>& start,
                                const std::vector<int32_t>& count);

}  // namespace fusebox::kernels
