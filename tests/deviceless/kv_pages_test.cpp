// The paged KV write's host twin (kernels/kv_pages.h; the GPU kernel is checked against it in
// tests/gpu/kv_pages_gpu_test.cpp): rows land at the page and row the paged SDPA reads them from,
// padding rows are not written, rows outside their table or the pool are counted and skipped,
// and the source is read through its strides.
#include "kernels/kv_pages.h"

#include <gtest/gtest.h>

#include <cstring>

namespace fusebox::kernels {
namespace {

TEST(KvPages, RowsLandWhereThePagedAttentionReadsThem) {
  // B=2, H=2, T=3, D=2 fp32 rows, src stored [B, T, H, D] (a bshd view): strides [12, 2, 4, 1].
  std::vector<float> src(2 * 3 * 2 * 2);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(100 + i);
  KvWrite w;
  w.src = src.data();
  w.batch = 2, w.heads = 2, w.tokens = 3, w.dim = 2;
  const int64_t strides[4] = {12, 2, 4, 1};
  std::memcpy(w.src_strides, strides, sizeof strides);
  w.elem_bytes = 4;
  w.num_pages = 5, w.page_size = 2, w.max_pages = 3;
  const std::vector<int32_t> table = {4, 1, 0,   // sequence 0: positions 0-1 on page 4, 2-3 on page 1
                                      2, 3, 0};  // sequence 1
  const std::vector<int32_t> start = {1, 4};     // sequence 0 writes positions 1..3, sequence 1 4..5
  const std::vector<int32_t> count = {3, 2};     // sequence 1's third row is padding
  std::vector<uint8_t> pool(static_cast<size_t>(5 * 2 * 2 * 2 * 4), 0);
  EXPECT_EQ(write_kv_pages_host(w, pool, table, start, count), 0);
  auto at = [&](int64_t page, int64_t h, int64_t row, int64_t d) {
    float v;
    std::memcpy(&v, pool.data() + (((page * 2 + h) * 2 + row) * 2 + d) * 4, 4);
    return v;
  };
  auto s = [&](int64_t b, int64_t h, int64_t t, int64_t d) { return src[b * 12 + t * 4 + h * 2 + d]; };
  // Sequence 0, t = 0 -> position 1: page 4 row 1; t = 1, 2 -> positions 2, 3: page 1 rows 0, 1.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 2; ++d) {
      EXPECT_EQ(at(4, h, 1, d), s(0, h, 0, d));
      EXPECT_EQ(at(1, h, 0, d), s(0, h, 1, d));
      EXPECT_EQ(at(1, h, 1, d), s(0, h, 2, d));
      // Sequence 1, positions 4, 5: table slot 2 -> page 0 rows 0, 1; the padding row is not written.
      EXPECT_EQ(at(0, h, 0, d), s(1, h, 0, d));
      EXPECT_EQ(at(0, h, 1, d), s(1, h, 1, d));
      EXPECT_EQ(at(4, h, 0, d), 0.f) << "position 0 of sequence 0 was not among the new rows";
    }
  // A row past its table, and a table entry outside the pool: counted, not written.
  const std::vector<int32_t> bad_table = {4, 1, 9, 2, 3, 0};
  const std::vector<int32_t> far = {5, 0};  // sequence 0 at positions 5.. -> slot 2 (page 9), then slot 3
  std::vector<uint8_t> pool2(pool.size(), 0);
  EXPECT_EQ(write_kv_pages_host(w, pool2, bad_table, far, count), 3);
}

}  // namespace
}  // namespace fusebox::kernels
