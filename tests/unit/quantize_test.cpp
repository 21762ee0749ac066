// quantize (include/fusebox/ops/quantize.h): resolve() dtypes, layouts and errors, the JSON round
// trip, the CPU reference against values computed by hand (rounding, saturation, amax of x rather
// than of x * scale, a transposed y), and the refusal of a gradient rule.
#include <gtest/gtest.h>

#include "fusebox/autodiff.h"
#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::host_from;
using testing_util::resolve_json;

const ResolvedTensor& T(const ResolvedGraph& g, const std::string& name) {
  return g.tensors[g.find_tensor(name)];
}

std::string graph_json(const std::string& y_extra = "", bool amax = true,
                       const std::string& x_dims = "[1, 2, 3]", const std::string& scale_dims = "[1, 1, 1]") {
  return R"({"name": "q", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": )" +
         x_dims + R"(}, {"name": "s", "dims": )" + scale_dims + R"(, "dtype": "fp32"}, {"name": "y")" +
         y_extra + "}" + (amax ? R"(, {"name": "m", "dtype": "fp32"})" : "") + R"(],
    "ops": [{"op": "quantize", "name": "cast", "inputs": {"x": "x", "scale": "s"}, "outputs": {"y": "y")" +
         (amax ? R"(, "amax": "m")" : "") + "}}]}";
}

TEST(Quantize, YIsE4M3ByDefaultInItsOwnLayoutAndAmaxIsOneValue) {
  auto r = resolve_json(graph_json());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dtype, DType::kFP8E4M3);
  EXPECT_EQ(T(*r, "y").strides, (std::vector<int64_t>{6, 3, 1}));
  EXPECT_EQ(T(*r, "m").dims, (std::vector<int64_t>{1, 1, 1}));
  auto t = resolve_json(graph_json(R"(, "dtype": "fp8_e5m2", "layout": "col_major")"));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(T(*t, "y").dtype, DType::kFP8E5M2);
  EXPECT_EQ(T(*t, "y").strides, (std::vector<int64_t>{6, 1, 2}));  // the transposed copy
  auto no_amax = resolve_json(graph_json("", false));
  ASSERT_TRUE(no_amax.ok()) << no_amax.status().ToString();
  EXPECT_EQ(no_amax->ops[0].outputs.count("amax"), 0u);
}

TEST(Quantize, ErrorsNameTheTensorAndWhatIsAccepted) {
  auto bf16_out = resolve_json(graph_json(R"(, "dtype": "bf16")"));
  ASSERT_FALSE(bf16_out.ok());
  EXPECT_NE(bf16_out.status().message().find("quantize writes y in fp8_e4m3 or fp8_e5m2"), std::string::npos)
      << bf16_out.status().message();
  auto two_scales = resolve_json(graph_json("", true, "[1, 2, 3]", "[1, 1, 3]"));
  ASSERT_FALSE(two_scales.ok());
  EXPECT_NE(two_scales.status().message().find("one scale for the whole tensor"), std::string::npos)
      << two_scales.status().message();
}

TEST(Quantize, JsonRoundTripKeepsTheAmaxOutput) {
  for (bool amax : {true, false}) {
    auto spec = parse_graph_json(graph_json("", amax));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto back = parse_graph_json(graph_to_json(*spec));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    auto a = resolve(*spec);
    auto b = resolve(*back);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->canonical, b->canonical);
  }
}

TEST(Quantize, CpuReferenceRoundsSaturatesAndTakesAmaxOfX) {
  // x * 4 in e4m3: 0.3 * 4 = 1.2 -> 1.25 (spacing 0.125 in [1, 2)); -5 * 4 = -20; 200 * 4 = 800
  // saturates to 448; 0.01 * 4 = 0.04 -> 0.0390625 (spacing 2^-8 in [2^-5, 2^-4): 10 units);
  // amax is max |x| = 200, not 800 nor 448.
  auto r = resolve_json(graph_json());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, HostTensor> in;
  in["x"] = host_from(T(*r, "x"), {0.3, -5, 200, 0.01, 0, -0.3});
  in["s"] = host_from(T(*r, "s"), {4});
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->at("y"), (std::vector<float>{1.25f, -20.f, 448.f, 0.0390625f, 0.f, -1.25f}));
  EXPECT_EQ(out->at("m"), (std::vector<float>{200.f}));
  // e5m2 saturates at 57344 and has 2 mantissa bits: 1.2 -> 1.25, 800 -> 768.
  auto e5 = resolve_json(graph_json(R"(, "dtype": "fp8_e5m2")"));
  ASSERT_TRUE(e5.ok()) << e5.status().ToString();
  in["x"] = host_from(T(*e5, "x"), {0.3, -5, 200, 1e5, 0, -0.3});
  auto out5 = reference_cpu(*e5, in);
  ASSERT_TRUE(out5.ok()) << out5.status().ToString();
  EXPECT_EQ(out5->at("y"), (std::vector<float>{1.25f, -20.f, 768.f, 57344.f, 0.f, -1.25f}));
}

TEST(Quantize, ATransposedYHoldsTheSameValuesInItsOwnLayout) {
  auto row = resolve_json(graph_json());
  auto col = resolve_json(graph_json(R"(, "layout": "col_major")"));
  ASSERT_TRUE(row.ok() && col.ok());
  const std::vector<double> xs{0.5, -1, 2, 3, -4, 6};
  for (const ResolvedGraph* g : {&*row, &*col}) {
    std::map<std::string, HostTensor> in;
    in["x"] = host_from(T(*g, "x"), xs);
    in["s"] = host_from(T(*g, "s"), {1});
    auto out = reference_cpu(*g, in);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    // Outputs are logical row-major whatever y's layout: the layout is where the kernel writes.
    EXPECT_EQ(out->at("y"), (std::vector<float>{0.5f, -1.f, 2.f, 3.f, -4.f, 6.f}));
  }
}

TEST(Quantize, ASecondCopyHoldsYsValuesInItsOwnLayoutAndYsDtype) {
  auto r = resolve_json(R"({"name": "q2", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 2, 3]}, {"name": "s", "scalar": 2.0, "dtype": "fp32"},
      {"name": "y", "dtype": "fp8_e5m2"}, {"name": "yt", "layout": "col_major"}],
    "ops": [{"op": "quantize", "name": "cast", "inputs": {"x": "x", "scale": "s"},
             "outputs": {"y": "y", "y2": "yt"}}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "yt").dtype, DType::kFP8E5M2) << "y2 takes y's dtype";
  EXPECT_EQ(T(*r, "yt").strides, (std::vector<int64_t>{6, 1, 2}));
  std::map<std::string, HostTensor> in;
  in["x"] = host_from(T(*r, "x"), {0.3, -5, 200, 1e5, 0, -0.3});
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->at("y"), (std::vector<float>{0.625f, -10.f, 384.f, 57344.f, 0.f, -0.625f}));
  EXPECT_EQ(out->at("yt"), out->at("y"));
  auto bad = resolve_json(R"({"name": "q3", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 2, 3]}, {"name": "s", "scalar": 2.0, "dtype": "fp32"},
      {"name": "y", "dtype": "fp8_e5m2"}, {"name": "yt", "dtype": "fp8_e4m3"}],
    "ops": [{"op": "quantize", "name": "cast", "inputs": {"x": "x", "scale": "s"},
             "outputs": {"y": "y", "y2": "yt"}}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("a second copy of y"), std::string::npos) << bad.status().message();
}

TEST(Quantize, HasNoGradientRuleAndSaysWhatToDoInstead) {
  auto fwd = resolve_json(graph_json("", false));
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto bwd = derive_backward(*fwd);
  ASSERT_FALSE(bwd.ok());
  EXPECT_NE(bwd.status().message().find("train.fp8"), std::string::npos) << bwd.status().message();
}

}  // namespace
}  // namespace fusebox
