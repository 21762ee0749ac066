// fusebox kernels layer: writing new keys or values into a paged KV pool (issue 34), the layout
// of fusebox's paged SDPA (fusebox/ops/sdpa.h: pool [num_pages, H, page_size, D]; key j of
// sequence b is row j % page_size of page page_table[b, j / page_size]). The serving engine's
// decode and prefill steps write their K and V with it. No cuDNN here.
#pragma once

#include <cstdint>
#include <vector>

#include "fusebox/status.h"

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
};

// Enqueues the copy on `stream` (a cudaStream_t); capturable in a CUDA graph. The sizes are
// checked here (InvalidArgument naming the one at fault); the tables' values on the device.
Status write_kv_pages(const KvWrite& w, void* stream);

// The same on the host, on host copies of every buffer (the tests' reference; src2 and pool2 are
// not read: call it once for each copy): returns the number of rows left out.
int64_t write_kv_pages_host(const KvWrite& w, std::vector<uint8_t>& pool,
                            const std::vector<int32_t>& page_table, const std::vector<int32_t>& start,
                            const std::vector<int32_t>& count);

}  // namespace fusebox::kernels
