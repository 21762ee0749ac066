// The paged KV write's host twin (kernels/kv_pages.h; the GPU kernel is checked against it in
// tests/gpu/kv_pages_gpu_test.cpp): rows land at the page and row the paged SDPA reads them from,
// padding rows are not written, rows outside their table or the pool are counted and skipped,
// and the source is read through its strides.
#include "kernels/kv_pages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "fusebox/dtype.h"

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

// The FP8 form (KvWrite::fp8_scale): each bf16 row stored as e4m3 with a descale, its largest value
// landing on 448 (e4m3's largest), every value back within e4m3's rounding (1/16 of itself, or its
// row's 2^-9 quantum near zero), a row of zeros with descale 1, at the rows the bf16 form uses.
TEST(KvPages, Fp8RowsKeepTheirValuesWithinE4m3Rounding) {
  KvWrite w;
  w.batch = 1, w.heads = 2, w.tokens = 3, w.dim = 16;
  const int64_t strides[4] = {2 * 3 * 16, 3 * 16, 16, 1};  // dense [B, H, T, D]
  std::memcpy(w.src_strides, strides, sizeof strides);
  w.elem_bytes = 2;
  w.num_pages = 2, w.page_size = 4, w.max_pages = 2;
  std::vector<float> x(2 * 3 * 16);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.37f * static_cast<float>(i)) * (i % 16 == 3 ? 9.f : 1.f);
  for (int d = 0; d < 16; ++d) x[static_cast<size_t>(48 + 16 + d)] = 0.f;  // head 1, token 1: zeros
  std::vector<uint16_t> src(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    uint32_t b;
    std::memcpy(&b, &x[i], 4);
    src[i] = static_cast<uint16_t>(b >> 16);  // bf16 (truncated)
    const uint32_t back = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&x[i], &back, 4);
  }
  w.src = src.data();
  const std::vector<int32_t> table = {1, 0}, start = {2},
                             count = {3};  // positions 2, 3 on page 1; 4 on page 0
  std::vector<uint8_t> pool(static_cast<size_t>(2 * 2 * 4 * 16), 0);
  std::vector<float> scales(static_cast<size_t>(2 * 2 * 4), 0.f);
  ASSERT_EQ(write_kv_pages_fp8_host(w, pool, scales, table, start, count), 0);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 3; ++t) {
      const int64_t pos = 2 + t, page = table[static_cast<size_t>(pos / 4)];
      const int64_t row = (page * 2 + h) * 4 + pos % 4;
      const float* want = x.data() + (h * 3 + t) * 16;
      float amax = 0.f;
      for (int d = 0; d < 16; ++d) amax = std::max(amax, std::fabs(want[d]));
      const float descale = scales[static_cast<size_t>(row)];
      if (amax == 0.f) {
        EXPECT_EQ(descale, 1.f) << "a row of zeros";
        continue;
      }
      EXPECT_FLOAT_EQ(descale, amax / 448.f);
      float largest = 0.f;
      for (int d = 0; d < 16; ++d) {
        const float q = fp8_bits_to_float(pool[static_cast<size_t>(row * 16 + d)], DType::kFP8E4M3);
        largest = std::max(largest, std::fabs(q));
        EXPECT_NEAR(q * descale, want[d], std::fabs(want[d]) / 16 + descale * 0.002f)
            << "h " << h << " t " << t << " d " << d;
      }
      EXPECT_EQ(largest, 448.f);
    }
  EXPECT_EQ(scales[static_cast<size_t>((1 * 2 + 0) * 4 + 0)], 0.f) << "position 0 was not written";
}

}  // namespace
}  // namespace fusebox::kernels
