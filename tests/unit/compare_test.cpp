// Comparison of outputs with references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fusebox/reference.h"
#include "fusebox/tensor.h"

namespace fusebox {
namespace {

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 1.0f + 0.001f * static_cast<float>(i);
  return v;
}

TEST(Compare, IdenticalPasses) {
  const std::vector<float> r = ramp(1000);
  const Comparison c = compare("y", r, r, default_tolerance(DType::kBF16));
  EXPECT_TRUE(c.pass) << c.ToString();
  EXPECT_EQ(c.rel_l2, 0);
  EXPECT_EQ(c.max_abs, 0);
  EXPECT_EQ(c.non_finite, 0);
  EXPECT_EQ(c.elements, 1000);
}

TEST(Compare, FlagsNaNAndInf) {
  const std::vector<float> r = ramp(100);
  std::vector<float> a = r;
  a[17] = std::numeric_limits<float>::quiet_NaN();
  Comparison c = compare("y", r, a, default_tolerance(DType::kBF16));
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.non_finite, 1);
  EXPECT_EQ(c.worst_index, 17);
  EXPECT_NE(c.ToString().find("non-finite"), std::string::npos) << c.ToString();
  a[17] = r[17];
  a[3] = -std::numeric_limits<float>::infinity();
  c = compare("y", r, a, Tolerance{1e9, 1e9});
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.non_finite, 1);
}

TEST(Compare, OneElementOffByTenPercentFails) {
  const std::vector<float> r = ramp(1000);
  std::vector<float> a = r;
  a[500] *= 1.1f;
  const Comparison c = compare("y", r, a, default_tolerance(DType::kBF16));
  // rel_l2 alone is small (one element of 1000); the max check catches it.
  EXPECT_LT(c.rel_l2, 1e-2);
  EXPECT_FALSE(c.pass) << c.ToString();
  EXPECT_EQ(c.worst_index, 500);
  EXPECT_NEAR(c.max_abs, 0.15, 1e-3);
}

TEST(Compare, SmallNoisePassesUnderBf16) {
  const std::vector<float> r = ramp(1000);
  std::vector<float> a = r;
  for (size_t i = 0; i < a.size(); ++i) a[i] *= (i % 2 ? 1.003f : 0.997f);
  EXPECT_TRUE(compare("y", r, a, default_tolerance(DType::kBF16)).pass);
  EXPECT_FALSE(compare("y", r, a, Tolerance{1e-4, 1e-4}).pass);
}

TEST(Compare, AllZeroReference) {
  const std::vector<float> r(10, 0.0f);
  EXPECT_TRUE(compare("y", r, r, default_tolerance(DType::kFP32)).pass);
  std::vector<float> a = r;
  a[2] = 0.5f;
  const Comparison c = compare("y", r, a, default_tolerance(DType::kFP32));
  EXPECT_FALSE(c.pass);
  EXPECT_TRUE(std::isfinite(c.rel_l2));
}

TEST(Compare, SizeMismatchFails) {
  const Comparison c = compare("y", ramp(10), ramp(9), Tolerance{1, 1});
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.ToString().find("size mismatch"), std::string::npos) << c.ToString();
}

TEST(Compare, IntegersMustBeExact) {
  const std::vector<float> r = {1, 2, 3};
  EXPECT_TRUE(compare("i", r, r, default_tolerance(DType::kInt32)).pass);
  EXPECT_FALSE(compare("i", r, {1, 2, 4}, default_tolerance(DType::kInt32)).pass);
}

TEST(Compare, TolerancesOrderedByPrecision) {
  const Tolerance bf16 = default_tolerance(DType::kBF16), fp16 = default_tolerance(DType::kFP16),
                  e4m3 = default_tolerance(DType::kFP8E4M3), e5m2 = default_tolerance(DType::kFP8E5M2);
  EXPECT_GT(bf16.rel_l2, fp16.rel_l2);
  EXPECT_GT(e4m3.rel_l2, bf16.rel_l2);
  EXPECT_GT(e5m2.rel_l2, e4m3.rel_l2);
}

// An fp8 output saturates at its largest finite value: a reference beyond it is compared as the
// clamp (the output's own cast), counted and said; a NaN or an output clamped lower still fails.
TEST(Compare, SaturatingFp8OutputsCompareWithTheClampedReference) {
  std::vector<float> r = ramp(100);
  for (size_t i = 0; i < r.size(); ++i) r[i] *= (i % 10 == 0) ? 600.f : 300.f;  // 10 values past 448
  std::vector<float> a = r;
  for (float& x : a) x = std::min(x, 448.f);
  Tolerance tol{7e-2, 2.5e-1, 448};
  Comparison c = compare("y", r, a, tol);
  EXPECT_TRUE(c.pass) << c.ToString();
  EXPECT_EQ(c.saturated, 10);
  EXPECT_NE(c.ToString().find("saturating"), std::string::npos) << c.ToString();
  EXPECT_FALSE(compare("y", r, a, Tolerance{7e-2, 2.5e-1}).pass) << "without the clamp";
  for (float& x : a) x = std::min(x, 300.f);
  EXPECT_FALSE(compare("y", r, a, tol).pass) << "clamped below the dtype's range";
  a[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(compare("y", r, a, tol).pass);
  EXPECT_EQ(default_tolerance(DType::kFP8E4M3).saturate_at, 0) << "set by tolerance_for, per output";
}

TEST(Compare, ToStringIsOneLine) {
  const std::vector<float> r = ramp(100);
  std::vector<float> a = r;
  a[0] += 0.001f;
  const std::string s = compare("y", r, a, default_tolerance(DType::kBF16)).ToString();
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_EQ(s.rfind("y: rel_l2=", 0), 0u) << s;
  EXPECT_NE(s.find("over 100 elements: PASS (tol rel_l2<=1e-02, max<=4e-02)"), std::string::npos) << s;
}

// An output compared as stored (bf16, fp16, fp32; in place where its logical order is its storage
// order, NHWC with H = W = 1 included, converted otherwise) gives exactly the comparison of its
// float copy, over several 2^20-element stretches: the same sums, the first worst element, the
// first non-finite one and the counts.
TEST(Compare, AnOutputAsStoredComparesAsItsFloatCopy) {
  const int64_t rows = 3000, cols = 1000;  // 3e6 elements: three stretches
  std::vector<float> reference(static_cast<size_t>(rows * cols));
  uint64_t s = 7;
  auto next = [&] { return s = s * 6364136223846793005ULL + 1442695040888963407ULL, s >> 40; };
  for (float& r : reference) r = static_cast<float>(next() % 2000) / 1000.f - 1.f;
  struct Layout {
    std::vector<int64_t> dims, strides;
  };
  for (const DType t : {DType::kBF16, DType::kFP16, DType::kFP32}) {
    for (const Layout& l :
         {Layout{{rows, cols}, {cols, 1}}, Layout{{rows, cols, 1, 1}, {cols, 1, cols, cols}},
          Layout{{rows, cols}, {1, rows}}}) {
      HostTensor out;
      out.dtype = t;
      out.dims = l.dims;
      out.strides = l.strides;
      out.data.resize(static_cast<size_t>(rows * cols) * dtype_size_bytes(t));
      // Logical element i: the reference plus noise, two equal worst errors, one NaN, one inf.
      for (int64_t i = 0; i < rows * cols; ++i) {
        double v = reference[static_cast<size_t>(i)] + (static_cast<double>(next() % 200) - 100) * 1e-5;
        if (i == 1500000 || i == 2500000) v = reference[static_cast<size_t>(i)] + 0.5;
        if (i == 2100000) v = std::numeric_limits<double>::quiet_NaN();
        if (i == 2900000) v = std::numeric_limits<double>::infinity();
        const int64_t r = i / cols, c = i % cols;
        store_element(out.data.data() + (r * l.strides[0] + c * l.strides[1]) * dtype_size_bytes(t), t, v);
      }
      const Comparison stored = compare("y", reference, out, default_tolerance(t));
      const Comparison copied = compare("y", reference, out.to_float_logical(), default_tolerance(t));
      SCOPED_TRACE(std::string(dtype_name(t)) + " strides " + std::to_string(l.strides[0]));
      EXPECT_EQ(stored.elements, rows * cols);
      EXPECT_EQ(stored.rel_l2, copied.rel_l2);
      EXPECT_EQ(stored.max_abs, copied.max_abs);
      EXPECT_EQ(stored.max_abs_rel, copied.max_abs_rel);
      EXPECT_EQ(stored.non_finite, 2);
      EXPECT_EQ(copied.non_finite, 2);
      EXPECT_EQ(stored.worst_index, 2100000);  // the first non-finite element
      EXPECT_EQ(copied.worst_index, 2100000);
      EXPECT_FALSE(stored.pass);
      EXPECT_EQ(stored.ToString(), copied.ToString());
      // Without the NaN and the inf: the first of the two largest errors is the worst.
      for (int64_t i : {int64_t{2100000}, int64_t{2900000}}) {
        const int64_t r = i / cols, c = i % cols;
        store_element(out.data.data() + (r * l.strides[0] + c * l.strides[1]) * dtype_size_bytes(t), t,
                      reference[static_cast<size_t>(i)]);
      }
      const Comparison clean = compare("y", reference, out, default_tolerance(t));
      EXPECT_EQ(clean.non_finite, 0);
      EXPECT_EQ(clean.worst_index, 1500000);
      EXPECT_EQ(clean.rel_l2, compare("y", reference, out.to_float_logical(), default_tolerance(t)).rel_l2);
    }
  }
}

}  // namespace
}  // namespace fusebox
