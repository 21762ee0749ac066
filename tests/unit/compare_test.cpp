// Comparison of outputs with references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "fusebox/reference.h"

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

}  // namespace
}  // namespace fusebox
