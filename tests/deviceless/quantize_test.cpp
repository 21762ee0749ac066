// Row-wise FP8 quantization's host rule (kernels/quantize.h; the GPU kernel is checked against it
// in tests/gpu/quantize_gpu_test.cpp) and the serving engine's weight quantizer (lm_graphs.h):
// the scale is the row's largest magnitude over 448, the values round to e4m3, a row of zeros
// keeps scale 1, and per-channel weights are quantized by output column, stored column-major.
#include "kernels/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fusebox/dtype.h"
#include "lm_graphs.h"

namespace fusebox {
namespace {

float e4m3(uint8_t b) { return fp8_bits_to_float(b, DType::kFP8E4M3); }

TEST(QuantizeFp8, RowScaleIsTheLargestMagnitudeOver448) {
  const std::vector<float> x = {0.5f, -3.5f, 7.f, 1.f,  // amax 7: scale 1/64, q 32, -224, 448, 64
                                0.f,  0.f,   0.f, 0.f,  // zeros: scale 1
                                0.3f, -0.1f, 0.f, 0.2f};
  std::vector<uint8_t> q(x.size());
  std::vector<float> s(3);
  kernels::quantize_rows_fp8_host(x.data(), 3, 4, q.data(), s.data());
  EXPECT_FLOAT_EQ(s[0], 7.f / 448.f);
  EXPECT_EQ(e4m3(q[0]), 32.f);
  EXPECT_EQ(e4m3(q[1]), -224.f);
  EXPECT_EQ(e4m3(q[2]), 448.f);
  EXPECT_EQ(e4m3(q[3]), 64.f);
  EXPECT_EQ(s[1], 1.f);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(e4m3(q[static_cast<size_t>(i)]), 0.f);
  // Each value back within e4m3's half step (1/16 relative), the largest exactly.
  for (int i = 8; i < 12; ++i) {
    const float back = e4m3(q[static_cast<size_t>(i)]) * s[2];
    EXPECT_NEAR(back, x[static_cast<size_t>(i)], std::fabs(x[static_cast<size_t>(i)]) / 16 + 1e-7);
  }
  EXPECT_FLOAT_EQ(e4m3(q[8]) * s[2], 0.3f);
}

TEST(QuantizeFp8, WeightsByOutputChannelColumnMajorOrPerTensor) {
  // w [k = 2, p = 3] row-major.
  const std::vector<float> w = {1.f,  10.f, -0.25f,  //
                                -2.f, 5.f,  0.125f};
  const serve::Fp8Weight c = serve::quantize_weight(w, 2, 3, false);
  ASSERT_EQ(c.q.size(), 6u);
  ASSERT_EQ(c.scale.size(), 3u);
  EXPECT_FLOAT_EQ(c.scale[0], 2.f / 448.f);
  EXPECT_FLOAT_EQ(c.scale[1], 10.f / 448.f);
  EXPECT_FLOAT_EQ(c.scale[2], 0.25f / 448.f);
  // q [p][k]: channel 0 = (1, -2) -> (224, -448); channel 1 = (10, 5) -> (448, 224).
  EXPECT_EQ(e4m3(c.q[0]), 224.f);
  EXPECT_EQ(e4m3(c.q[1]), -448.f);
  EXPECT_EQ(e4m3(c.q[2]), 448.f);
  EXPECT_EQ(e4m3(c.q[3]), 224.f);
  EXPECT_EQ(e4m3(c.q[4]), -448.f);
  EXPECT_EQ(e4m3(c.q[5]), 224.f);
  const serve::Fp8Weight t = serve::quantize_weight(w, 2, 3, true);
  for (float s : t.scale) EXPECT_FLOAT_EQ(s, 10.f / 448.f);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j) {
      const float v = w[static_cast<size_t>(i * 3 + j)];
      const float back = e4m3(t.q[static_cast<size_t>(j * 2 + i)]) * t.scale[static_cast<size_t>(j)];
      EXPECT_NEAR(back, v, std::fabs(v) / 16 + 1e-6) << i << "," << j;
    }
  // A small channel keeps its precision per channel, not per tensor.
  EXPECT_FLOAT_EQ(e4m3(c.q[4]) * c.scale[2], -0.25f);
}

}  // namespace
}  // namespace fusebox
