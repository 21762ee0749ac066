// Pool ops (max_pool, avg_pool, global_avg_pool): resolve() rules and errors, JSON, canonical form, and the
// CPU reference against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

constexpr auto expect_error = testing_util::expect_resolve_error;
using testing_util::host_from;

std::vector<int64_t> V(std::initializer_list<int64_t> v) { return v; }

const ResolvedTensor& T(const ResolvedGraph& g, const std::string& name) {
  return g.tensors[g.find_tensor(name)];
}

GraphSpec pool_graph(PoolAttrs a, std::vector<int64_t> x = {2, 16, 9, 9}, DType dtype = DType::kBF16) {
  GraphSpec g;
  g.name = "pool";
  g.io_dtype = dtype;
  g.tensor("x", x, "channels_last");
  OpSpec op;
  op.name = "pool";
  op.attrs = a;
  op.inputs = {{"x", "x"}};
  op.outputs = {{"y", "y"}};
  g.ops.push_back(op);
  g.output("y", "channels_last");
  return g;
}

PoolAttrs max3x3s2p1() {
  PoolAttrs a;
  a.window = {3, 3};
  a.stride = {2, 2};
  a.padding = {1, 1};
  return a;
}

TEST(PoolResolve, MaxPoolResNetStemShape) {
  auto r = resolve(pool_graph(max3x3s2p1(), {32, 64, 112, 112}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({32, 64, 56, 56}));
  EXPECT_EQ(T(*r, "y").strides, V({56 * 56 * 64, 1, 56 * 64, 64}));  // x's NHWC order
  EXPECT_EQ(T(*r, "y").dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(r->flops(), 9.0 * 32 * 64 * 56 * 56);
  EXPECT_NE(describe(*r).find("max_pool(x=x) -> y [32, 64, 56, 56]"), std::string::npos) << describe(*r);
  EXPECT_NE(describe(*r).find("window [3, 3], stride [2, 2], padding [1, 1]"), std::string::npos);
}

TEST(PoolResolve, DefaultsStrideIsTheWindowAndPaddingZero) {
  PoolAttrs a;
  a.mode = PoolMode::kAvg;
  a.window = {2, 2};
  auto r = resolve(pool_graph(a, {1, 8, 7, 7}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({1, 8, 3, 3}));  // floor((7 - 2) / 2) + 1
  const std::string j = op_resolved_attrs_json(*r, r->ops[0]);
  EXPECT_NE(j.find("\"stride\":[2,2]"), std::string::npos) << j;
  EXPECT_NE(j.find("\"padding\":[0,0]"), std::string::npos) << j;
  EXPECT_NE(j.find("\"mode\":\"avg\""), std::string::npos) << j;
}

TEST(PoolResolve, ThreeSpatialDims) {
  PoolAttrs a;
  a.window = {2, 3, 3};
  a.stride = {2, 1, 1};
  a.padding = {0, 1, 1};
  auto r = resolve(pool_graph(a, {2, 4, 4, 6, 6}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({2, 4, 2, 6, 6}));
}

TEST(PoolResolve, GlobalAvgPoolTakesTheWholeSpatialExtent) {
  PoolAttrs a;
  a.mode = PoolMode::kAvg;
  a.global = true;
  auto r = resolve(pool_graph(a, {32, 2048, 7, 7}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({32, 2048, 1, 1}));
  const auto& ra = std::get<PoolAttrs>(r->ops[0].attrs);
  EXPECT_EQ(ra.window, V({7, 7}));
  EXPECT_EQ(ra.stride, V({7, 7}));
  EXPECT_EQ(ra.padding, V({0, 0}));
  EXPECT_EQ(op_type_name(r->ops[0].attrs), "global_avg_pool");
  // Lowered as avg_pool with that window: the same resolved attributes.
  PoolAttrs b;
  b.mode = PoolMode::kAvg;
  b.window = {7, 7};
  auto rb = resolve(pool_graph(b, {32, 2048, 7, 7}));
  ASSERT_TRUE(rb.ok()) << rb.status().ToString();
  EXPECT_EQ(op_resolved_attrs_json(*r, r->ops[0]), op_resolved_attrs_json(*rb, rb->ops[0]));

  a.window = {3, 3};
  expect_error(pool_graph(a, {32, 2048, 7, 7}),
               {"[global_avg_pool 'pool'] global_avg_pool takes no window", "use avg_pool"});
}

TEST(PoolResolve, ErrorsNameOpTensorAndWhatIsAccepted) {
  PoolAttrs big = max3x3s2p1();
  big.window = {5, 5};
  big.padding = {0, 0};
  expect_error(
      pool_graph(big, {1, 4, 3, 8}),
      {"[max_pool 'pool'] input 'x' ('x') [1, 4, 3, 8] has 3 in spatial dim 0 (3 with padding [0, 0]) "
       "but window[0] is 5",
       "the window must fit in the padded input; give window[0] <= 3 or more padding"});

  PoolAttrs pad = max3x3s2p1();
  pad.padding = {3, 1};
  expect_error(pool_graph(pad),
               {"[max_pool 'pool'] padding[0] is 3 but window[0] is 3",
                "every window must cover an element of x; give padding < window (at most 2)"});

  PoolAttrs none;
  expect_error(pool_graph(none),
               {"[max_pool 'pool'] has no window", "one size per spatial dim (2 for x", "e.g. [3, 3]"});

  PoolAttrs count = max3x3s2p1();
  count.stride = {2};
  expect_error(pool_graph(count),
               {"[max_pool 'pool'] stride [2] has 1 values but x [2, 16, 9, 9] has 2 spatial dims"});

  PoolAttrs zero = max3x3s2p1();
  zero.stride = {0, 2};
  expect_error(pool_graph(zero), {"stride[0] is 0: stride must be in [1, 2147483647]"});

  expect_error(
      pool_graph(max3x3s2p1(), {16, 9, 9}),
      {"[max_pool 'pool'] input 'x' ('x') has rank 3 [16, 9, 9]", "[N, C, H, W] or [N, C, D, H, W]"});

  GraphSpec ints = pool_graph(max3x3s2p1());
  ints.tensors[0].dtype = DType::kInt32;
  expect_error(ints, {"input 'x' ('x') has dtype int32", "bf16, fp16 or fp32 x"});
}

const char* kAvgJson = R"({
  "name": "avg",
  "tensors": [{"name": "x", "dims": [2, 8, 10, 10], "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
  "ops": [{"op": "avg_pool", "name": "p", "window": [3, 3], "stride": [2, 2], "padding": [1, 1],
           "count_include_pad": false, "inputs": {"x": "x"}, "outputs": {"y": "y"}}]
})";

TEST(PoolJson, ParsesRoundTripsAndCanonicalFormHoldsTheMode) {
  auto spec = parse_graph_json(kAvgJson, "avg.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& a = std::get<PoolAttrs>(spec->ops[0].attrs);
  EXPECT_EQ(a.mode, PoolMode::kAvg);
  EXPECT_FALSE(a.count_include_pad);
  auto again = parse_graph_json(graph_to_json(*spec), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(graph_to_json(*again), graph_to_json(*spec));

  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({2, 8, 5, 5}));
  std::string include = kAvgJson;
  include.replace(include.find("false"), 5, "true");
  std::string max = kAvgJson;
  max.replace(max.find("\"avg_pool\""), 10, "\"max_pool\"");
  max.erase(max.find("\"count_include_pad\": false,"), 27);
  std::vector<std::string> prints = {graph_fingerprint(*r)};
  for (const std::string& text : {include, max}) {
    auto s = parse_graph_json(text, "variant");
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto rr = resolve(*s);
    ASSERT_TRUE(rr.ok()) << rr.status().ToString();
    for (const std::string& p : prints) EXPECT_NE(graph_fingerprint(*rr), p) << text;
    prints.push_back(graph_fingerprint(*rr));
  }
}

TEST(PoolJson, FieldsEachOpAccepts) {
  // max_pool has no count_include_pad; global_avg_pool has no window.
  std::string max = kAvgJson;
  max.replace(max.find("\"avg_pool\""), 10, "\"max_pool\"");
  auto s = parse_graph_json(max, "max.json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("count_include_pad"), std::string::npos) << s.status().message();
  std::string global = kAvgJson;
  global.replace(global.find("\"avg_pool\""), 10, "\"global_avg_pool\"");
  global.erase(global.find("\"count_include_pad\": false,"), 27);
  s = parse_graph_json(global, "global.json");
  ASSERT_FALSE(s.ok());
  // Its geometry fields are unknown to it (the first one met is named).
  EXPECT_NE(s.status().message().find("unknown field"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("accepted fields are op, name, inputs, outputs, compute_dtype"),
            std::string::npos)
      << s.status().message();
}

// x [1, 1, 4, 4] holding 0..15 row by row.
std::map<std::string, std::vector<float>> run_pool(const PoolAttrs& a, std::vector<double> x_values = {}) {
  auto r = resolve(pool_graph(a, {1, 1, 4, 4}, DType::kFP32));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  if (x_values.empty())
    for (int i = 0; i < 16; ++i) x_values.push_back(i);
  auto out = reference_cpu(*r, {{"x", host_from(T(*r, "x"), x_values)}});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::map<std::string, std::vector<float>>{};
}

TEST(PoolReferenceCpu, MaxAndAverageByHand) {
  PoolAttrs m;
  m.window = {2, 2};
  EXPECT_EQ(run_pool(m)["y"], (std::vector<float>{5, 7, 13, 15}));

  // 3x3 stride 2 padding 1 on 4x4: windows at rows/cols {-1..1} and {1..3}.
  PoolAttrs p = max3x3s2p1();
  // Negative values: padding (-inf) is never the maximum.
  std::vector<double> neg;
  for (int i = 0; i < 16; ++i) neg.push_back(-1.0 - i);
  EXPECT_EQ(run_pool(p, neg)["y"], (std::vector<float>{-1, -2, -5, -6}));

  p.mode = PoolMode::kAvg;
  // Top-left window covers x[0..1][0..1] = 0, 1, 4, 5: sum 10; bottom-right
  // x[1..3][1..3]: 5+6+7+9+10+11+13+14+15 = 90; top-right x[0..1][1..3]:
  // 1+2+3+5+6+7 = 24; bottom-left x[1..3][0..1]: 4+5+8+9+12+13 = 51.
  auto inc = run_pool(p)["y"];
  ASSERT_EQ(inc.size(), 4u);
  EXPECT_FLOAT_EQ(inc[0], 10.0f / 9);
  EXPECT_FLOAT_EQ(inc[1], 24.0f / 9);
  EXPECT_FLOAT_EQ(inc[2], 51.0f / 9);
  EXPECT_FLOAT_EQ(inc[3], 90.0f / 9);
  p.count_include_pad = false;
  auto exc = run_pool(p)["y"];
  ASSERT_EQ(exc.size(), 4u);
  EXPECT_FLOAT_EQ(exc[0], 10.0f / 4);
  EXPECT_FLOAT_EQ(exc[1], 24.0f / 6);
  EXPECT_FLOAT_EQ(exc[2], 51.0f / 6);
  EXPECT_FLOAT_EQ(exc[3], 90.0f / 9);

  PoolAttrs g;
  g.mode = PoolMode::kAvg;
  g.global = true;
  auto gy = run_pool(g)["y"];
  ASSERT_EQ(gy.size(), 1u);
  EXPECT_FLOAT_EQ(gy[0], 7.5f);
}

TEST(PoolReferenceCpu, ReadsChannelsLastInput) {
  // x [1, 2, 2, 2] NHWC: channel c at (h, w) is 10*c + 2*h + w.
  PoolAttrs g;
  g.mode = PoolMode::kAvg;
  g.global = true;
  auto r = resolve(pool_graph(g, {1, 2, 2, 2}, DType::kFP32));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto out = reference_cpu(*r, {{"x", host_from(T(*r, "x"), {0, 1, 2, 3, 10, 11, 12, 13})}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->at("y"), (std::vector<float>{1.5f, 11.5f}));
}

TEST(PoolTolerance, TighterThanTheDefaultsPerMode) {
  // max_pool: half an ulp of y's dtype (it selects an element); avg_pool:
  // the output rounding plus a short fp32 sum (pool_cpu.cpp).
  auto max_bf16 = resolve(pool_graph(max3x3s2p1()));
  ASSERT_TRUE(max_bf16.ok()) << max_bf16.status().ToString();
  Tolerance t = tolerance_for(*max_bf16, "y");
  EXPECT_DOUBLE_EQ(t.rel_l2, 1.0 / 256);
  EXPECT_DOUBLE_EQ(t.max_abs_rel, 1.0 / 256);
  EXPECT_LT(t.max_abs_rel, default_tolerance(DType::kBF16).max_abs_rel);
  PoolAttrs avg = max3x3s2p1();
  avg.mode = PoolMode::kAvg;
  auto avg_fp16 = resolve(pool_graph(avg, {2, 16, 9, 9}, DType::kFP16));
  ASSERT_TRUE(avg_fp16.ok()) << avg_fp16.status().ToString();
  t = tolerance_for(*avg_fp16, "y");
  EXPECT_DOUBLE_EQ(t.rel_l2, 1.0 / 2048);
  EXPECT_DOUBLE_EQ(t.max_abs_rel, 2.0 / 2048);
  auto avg_fp32 = resolve(pool_graph(avg, {2, 16, 9, 9}, DType::kFP32));
  ASSERT_TRUE(avg_fp32.ok()) << avg_fp32.status().ToString();
  EXPECT_DOUBLE_EQ(tolerance_for(*avg_fp32, "y").max_abs_rel, 1e-5);
}

TEST(PoolExamples, Resolve) {
  for (const char* f : {"max_pool_resnet_stem.json", "global_avg_pool.json", "small/max_pool_small.json",
                        "small/avg_pool_small.json", "small/avg_pool_exclude_pad_small.json",
                        "small/global_avg_pool_small.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
  }
}

}  // namespace
}  // namespace fusebox
