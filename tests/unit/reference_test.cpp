// CPU reference: each op against hand-computed values.
#include "fusebox/reference.h"

#include <gtest/gtest.h>

#include <cmath>

#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::channels_last;
using testing_util::GraphBuilder;
using testing_util::host_from;

const std::vector<double> kX3x3 = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const std::vector<double> kW2x2 = {1, 2, 3, 4};

// 1x1x3x3 input (1..9) with a 1x1x2x2 filter (1..4).
std::vector<float> conv_tiny(ConvFpropAttrs attrs, std::vector<int64_t> y_dims) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 1, 3, 3});
  const int w = b.tensor("w", {1, 1, 2, 2});
  const int y = b.tensor("y", y_dims);
  b.op("conv", attrs, {{"x", x}, {"w", w}}, y);
  std::map<std::string, HostTensor> in = {{"x", host_from(b.t(x), kX3x3)}, {"w", host_from(b.t(w), kW2x2)}};
  auto r = reference_cpu(b.g, in);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->at("y") : std::vector<float>{};
}

TEST(ReferenceCpu, ConvNoPadding) {
  EXPECT_EQ(conv_tiny({{0, 0}, {1, 1}, {1, 1}}, {1, 1, 2, 2}), (std::vector<float>{37, 47, 67, 77}));
}

TEST(ReferenceCpu, ConvEmptyAttrsMeanDefaults) {
  EXPECT_EQ(conv_tiny({}, {1, 1, 2, 2}), (std::vector<float>{37, 47, 67, 77}));
}

TEST(ReferenceCpu, ConvPaddingOneStrideTwo) {
  // Padded input rows/cols -1..3; output (i, j) covers input rows 2i-1..2i, cols 2j-1..2j.
  EXPECT_EQ(conv_tiny({{1, 1}, {2, 2}, {1, 1}}, {1, 1, 2, 2}), (std::vector<float>{4, 18, 36, 77}));
}

TEST(ReferenceCpu, ConvPaddingOneStrideOne) {
  const std::vector<float> y = conv_tiny({{1, 1}, {1, 1}, {1, 1}}, {1, 1, 4, 4});
  ASSERT_EQ(y.size(), 16u);
  EXPECT_EQ(y[0], 4);   // x(0,0)*w(1,1)
  EXPECT_EQ(y[5], 37);  // the unpadded (0,0) window
  EXPECT_EQ(y[15], 9);  // x(2,2)*w(0,0)
  EXPECT_EQ(y[3], 9);   // x(0,2)*w(1,0)
}

TEST(ReferenceCpu, ConvDilationTwo) {
  // Taps x(0,0), x(0,2), x(2,0), x(2,2): 1*1 + 3*2 + 7*3 + 9*4.
  EXPECT_EQ(conv_tiny({{0, 0}, {1, 1}, {2, 2}}, {1, 1, 1, 1}), (std::vector<float>{64}));
}

TEST(ReferenceCpu, ConvRejectsWrongOutputDims) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 1, 3, 3});
  const int w = b.tensor("w", {1, 1, 2, 2});
  const int y = b.tensor("y", {1, 1, 3, 3});
  b.op("conv", ConvFpropAttrs{}, {{"x", x}, {"w", w}}, y);
  auto r = reference_cpu(b.g, {{"x", host_from(b.t(x), kX3x3)}, {"w", host_from(b.t(w), kW2x2)}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("conv_fprop 'conv'"), std::string::npos) << r.status().message();
}

TEST(ReferenceCpu, ConvMissingInputIsAnError) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 1, 3, 3});
  const int w = b.tensor("w", {1, 1, 2, 2});
  const int y = b.tensor("y", {1, 1, 2, 2});
  b.op("conv", ConvFpropAttrs{}, {{"x", x}, {"w", w}}, y);
  auto r = reference_cpu(b.g, {{"x", host_from(b.t(x), kX3x3)}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'w'"), std::string::npos) << r.status().message();
}

// The same logical values in NCHW and NHWC storage give identical results.
TEST(ReferenceCpu, ConvLayoutDoesNotChangeLogicalResult) {
  auto run = [](bool nhwc) {
    GraphBuilder b;
    const std::vector<int64_t> xd = {2, 3, 5, 6}, wd = {4, 3, 3, 3}, yd = {2, 4, 3, 3};
    const int x = b.tensor("x", xd, DType::kBF16, nhwc ? channels_last(xd) : std::vector<int64_t>{});
    const int w = b.tensor("w", wd, DType::kBF16, nhwc ? channels_last(wd) : std::vector<int64_t>{});
    const int y = b.tensor("y", yd, DType::kBF16, nhwc ? channels_last(yd) : std::vector<int64_t>{});
    b.op("conv", ConvFpropAttrs{{1, 1}, {2, 2}, {1, 1}}, {{"x", x}, {"w", w}}, y);
    std::map<std::string, HostTensor> in = {{"x", random_tensor(b.t(x), 7)}, {"w", random_tensor(b.t(w), 7)}};
    auto r = reference_cpu(b.g, in);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->at("y") : std::vector<float>{};
  };
  const std::vector<float> a = run(false), b = run(true);
  ASSERT_EQ(a.size(), 2u * 4 * 3 * 3);
  EXPECT_EQ(a, b);
  bool nonzero = false;
  for (float v : a) nonzero = nonzero || v != 0;
  EXPECT_TRUE(nonzero);
}

// Grouped conv (3 groups of 2 channels, 2 filters per group) against a direct loop.
TEST(ReferenceCpu, GroupedConvMatchesLoop) {
  GraphBuilder b;
  const int64_t N = 2, C = 6, H = 5, W = 4, K = 6, G = 3, Cg = C / G, Kg = K / G, R = 3, S = 3;
  const int64_t OH = H, OW = W;  // padding 1, stride 1
  const int x = b.tensor("x", {N, C, H, W});
  const int w = b.tensor("w", {K, Cg, R, S});
  const int y = b.tensor("y", {N, K, OH, OW});
  b.op("gconv", ConvFpropAttrs{{1, 1}, {1, 1}, {1, 1}}, {{"x", x}, {"w", w}}, y);
  HostTensor hx = random_tensor(b.t(x), 3), hw = random_tensor(b.t(w), 4);
  auto r = reference_cpu(b.g, {{"x", hx}, {"w", hw}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<float>& got = r->at("y");
  ASSERT_EQ(static_cast<int64_t>(got.size()), N * K * OH * OW);
  int64_t i = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow, ++i) {
          const int64_t g = k / Kg;  // filter k reads input channels g*Cg .. g*Cg+Cg-1
          double acc = 0;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t rr = 0; rr < R; ++rr)
              for (int64_t s = 0; s < S; ++s) {
                const int64_t ih = oh - 1 + rr, iw = ow - 1 + s;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += hx.at({n, g * Cg + c, ih, iw}) * hw.at({k, c, rr, s});
              }
          EXPECT_NEAR(got[i], acc, 1e-5) << "at " << i;
        }
}

// 3-D conv against a direct loop, with padding, stride and dilation per dim.
TEST(ReferenceCpu, Conv3dMatchesLoop) {
  GraphBuilder b;
  const int64_t N = 1, C = 2, D = 4, H = 5, W = 5, K = 3, T = 2, R = 3, S = 2;
  const int64_t pd = 1, ph = 0, pw = 1, sd = 1, sh = 2, sw = 1, dd = 2, dh = 1, dw = 1;
  const int64_t OD = (D + 2 * pd - dd * (T - 1) - 1) / sd + 1, OH = (H + 2 * ph - dh * (R - 1) - 1) / sh + 1,
                OW = (W + 2 * pw - dw * (S - 1) - 1) / sw + 1;
  const int x = b.tensor("x", {N, C, D, H, W});
  const int w = b.tensor("w", {K, C, T, R, S});
  const int y = b.tensor("y", {N, K, OD, OH, OW});
  b.op("conv3d", ConvFpropAttrs{{pd, ph, pw}, {sd, sh, sw}, {dd, dh, dw}}, {{"x", x}, {"w", w}}, y);
  HostTensor hx = random_tensor(b.t(x), 1), hw = random_tensor(b.t(w), 1);
  auto r = reference_cpu(b.g, {{"x", hx}, {"w", hw}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<float>& got = r->at("y");
  ASSERT_EQ(static_cast<int64_t>(got.size()), N * K * OD * OH * OW);
  int64_t i = 0;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t od = 0; od < OD; ++od)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow, ++i) {
          double acc = 0;
          for (int64_t c = 0; c < C; ++c)
            for (int64_t t = 0; t < T; ++t)
              for (int64_t rr = 0; rr < R; ++rr)
                for (int64_t s = 0; s < S; ++s) {
                  const int64_t id = od * sd - pd + t * dd, ih = oh * sh - ph + rr * dh,
                                iw = ow * sw - pw + s * dw;
                  if (id < 0 || id >= D || ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                  acc += hx.at({0, c, id, ih, iw}) * hw.at({k, c, t, rr, s});
                }
          EXPECT_NEAR(got[i], acc, 1e-5) << "at " << i;
        }
}

TEST(ReferenceCpu, MatmulBroadcastsBatchAgainstLoop) {
  GraphBuilder b;
  const int64_t B = 3, M = 4, K = 5, N = 6;
  const int a = b.tensor("a", {B, M, K});
  // b stored column-major within each matrix, shared by every batch.
  const int bb = b.tensor("b", {1, K, N}, DType::kFP32, {K * N, 1, K});
  const int y = b.tensor("y", {B, M, N});
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  HostTensor ha = random_tensor(b.t(a), 3), hb = random_tensor(b.t(bb), 3);
  auto r = reference_cpu(b.g, {{"a", ha}, {"b", hb}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const std::vector<float>& got = r->at("y");
  ASSERT_EQ(got.size(), static_cast<size_t>(B * M * N));
  for (int64_t bi = 0; bi < B; ++bi)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += ha.at({bi, m, k}) * hb.at({0, k, n});
        EXPECT_NEAR(got[(bi * M + m) * N + n], acc, 1e-6);
      }
}

TEST(ReferenceCpu, MatmulRejectsMismatchedK) {
  GraphBuilder b;
  const int a = b.tensor("a", {1, 2, 3});
  const int bb = b.tensor("b", {1, 4, 2});
  const int y = b.tensor("y", {1, 2, 2});
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  auto r = reference_cpu(b.g, {{"a", random_tensor(b.t(a), 1)}, {"b", random_tensor(b.t(bb), 1)}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

std::vector<float> run_unary(PointwiseMode mode, const std::vector<double>& xs) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, static_cast<int64_t>(xs.size())});
  const int y = b.tensor("y", {1, static_cast<int64_t>(xs.size())});
  b.op("pw", PointwiseAttrs{mode}, {{"x", x}}, y);
  auto r = reference_cpu(b.g, {{"x", host_from(b.t(x), xs)}});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->at("y") : std::vector<float>(xs.size(), NAN);
}

TEST(ReferenceCpu, UnaryPointwiseKnownValues) {
  const std::vector<double> xs = {-2, -0.5, 0, 1, 2};
  EXPECT_EQ(run_unary(PointwiseMode::kRelu, xs), (std::vector<float>{0, 0, 0, 1, 2}));
  EXPECT_NEAR(run_unary(PointwiseMode::kGeluTanh, {1.0})[0], 0.8411920, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kGeluErf, {1.0})[0], 0.8413447, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kGeluErf, {-1.0})[0], -0.1586553, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kSilu, {1.0})[0], 0.7310586, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kSilu, {-2.0})[0], -0.2384058, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kSigmoid, {0.0})[0], 0.5, 1e-7);
  EXPECT_NEAR(run_unary(PointwiseMode::kSigmoid, {2.0})[0], 0.8807971, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kTanh, {1.0})[0], 0.7615942, 1e-6);
  EXPECT_NEAR(run_unary(PointwiseMode::kTanh, {-0.5})[0], -0.4621172, 1e-6);
  EXPECT_EQ(run_unary(PointwiseMode::kGeluTanh, {0.0})[0], 0.0f);
}

TEST(ReferenceCpu, BinaryPointwiseBroadcast) {
  // a [1,2,3], b [1,1,3] (broadcast over dim 1).
  const std::vector<double> av = {1, 2, 3, 4, 5, 6}, bv = {10, 20, 30};
  auto run = [&](PointwiseMode mode, std::vector<int64_t> bdims, const std::vector<double>& bvals) {
    GraphBuilder g;
    const int a = g.tensor("a", {1, 2, 3});
    const int b = g.tensor("b", bdims);
    const int y = g.tensor("y", {1, 2, 3});
    const bool xb = mode == PointwiseMode::kBiasAdd || mode == PointwiseMode::kScale;
    const std::string r0 = xb ? "x" : "a", r1 = mode == PointwiseMode::kBiasAdd ? "bias"
                                                : mode == PointwiseMode::kScale ? "scale"
                                                                                : "b";
    g.op("pw", PointwiseAttrs{mode}, {{r0, a}, {r1, b}}, y);
    auto r = reference_cpu(g.g, {{"a", host_from(g.t(a), av)}, {"b", host_from(g.t(b), bvals)}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->at("y") : std::vector<float>{};
  };
  EXPECT_EQ(run(PointwiseMode::kAdd, {1, 1, 3}, bv), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(run(PointwiseMode::kSub, {1, 1, 3}, bv), (std::vector<float>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ(run(PointwiseMode::kMul, {1, 1, 3}, bv), (std::vector<float>{10, 40, 90, 40, 100, 180}));
  // bias [1,2,1]: one value per row.
  EXPECT_EQ(run(PointwiseMode::kBiasAdd, {1, 2, 1}, {100, 200}),
            (std::vector<float>{101, 102, 103, 204, 205, 206}));
  // scale by a one-element tensor.
  EXPECT_EQ(run(PointwiseMode::kScale, {1, 1, 1}, {0.5}), (std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3}));
}

TEST(ReferenceCpu, ScaleByValueScalarNeedsNoInput) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 2, 2, 1});
  const int s = b.scalar("alpha", -3.0);
  const int y = b.tensor("y", {1, 2, 2, 1});
  b.op("scale", PointwiseAttrs{PointwiseMode::kScale}, {{"x", x}, {"scale", s}}, y);
  auto r = reference_cpu(b.g, {{"x", host_from(b.t(x), {1, 2, 3, 4})}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->at("y"), (std::vector<float>{-3, -6, -9, -12}));
}

TEST(ReferenceCpu, BroadcastMismatchIsAnError) {
  GraphBuilder b;
  const int a = b.tensor("a", {1, 2, 3});
  const int c = b.tensor("b", {1, 2, 2});
  const int y = b.tensor("y", {1, 2, 3});
  b.op("add", PointwiseAttrs{PointwiseMode::kAdd}, {{"a", a}, {"b", c}}, y);
  auto r = reference_cpu(b.g, {{"a", random_tensor(b.t(a), 1)}, {"b", random_tensor(b.t(c), 1)}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("broadcast"), std::string::npos) << r.status().message();
}

// conv -> bias_add (virtual) -> relu: only the non-virtual output comes back,
// and it equals relu(conv + bias).
TEST(ReferenceCpu, ChainKeepsVirtualIntermediatesOut) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 1, 3, 3});
  const int w = b.tensor("w", {1, 1, 2, 2});
  const int c = b.tensor("conv_out", {1, 1, 2, 2}, DType::kFP32, {}, /*is_virtual=*/true);
  const int bias = b.tensor("bias", {1, 1, 1, 1});
  const int ba = b.tensor("biased", {1, 1, 2, 2}, DType::kFP32, {}, true);
  const int y = b.tensor("y", {1, 1, 2, 2}, DType::kBF16);
  b.op("conv", ConvFpropAttrs{}, {{"x", x}, {"w", w}}, c);
  b.op("bias", PointwiseAttrs{PointwiseMode::kBiasAdd}, {{"x", c}, {"bias", bias}}, ba);
  b.op("relu", PointwiseAttrs{PointwiseMode::kRelu}, {{"x", ba}}, y);
  auto r = reference_cpu(b.g, {{"x", host_from(b.t(x), kX3x3)},
                               {"w", host_from(b.t(w), kW2x2)},
                               {"bias", host_from(b.t(bias), {-50})}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size(), 1u);
  EXPECT_EQ(r->at("y"), (std::vector<float>{0, 0, 17, 27}));
}

TEST(ReferenceCpu, UnknownPointwiseModeIsNotSupported) {
  GraphBuilder b;
  const int x = b.tensor("x", {1, 4});
  const int y = b.tensor("y", {1, 4});
  b.op("odd", PointwiseAttrs{static_cast<PointwiseMode>(99)}, {{"x", x}}, y);
  auto r = reference_cpu(b.g, {{"x", random_tensor(b.t(x), 1)}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("'odd'"), std::string::npos) << r.status().message();
}

// Large enough to take the multi-threaded path; checks a few entries.
TEST(ReferenceCpu, ThreadedMatmulMatchesLoop) {
  GraphBuilder b;
  const int64_t M = 128, K = 96, N = 80;
  const int a = b.tensor("a", {1, M, K}, DType::kBF16);
  const int bb = b.tensor("b", {1, K, N}, DType::kBF16);
  const int y = b.tensor("y", {1, M, N});
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  HostTensor ha = random_tensor(b.t(a), 9), hb = random_tensor(b.t(bb), 9);
  auto r = reference_cpu(b.g, {{"a", ha}, {"b", hb}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int64_t m : {int64_t{0}, M / 2, M - 1})
    for (int64_t n : {int64_t{0}, N / 3, N - 1}) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += ha.at({0, m, k}) * hb.at({0, k, n});
      EXPECT_NEAR(r->at("y")[m * N + n], acc, 1e-5);
    }
}

}  // namespace
}  // namespace fusebox
