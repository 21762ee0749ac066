// conv_dgrad, conv_wgrad and relu_bwd: the JSON format, validation messages,
// inference, identity, and the CPU references against hand-computed values
// and against the adjoint identities of the forward convolution:
//   <dgrad(dy, w), x> = <dy, fprop(x, w)> = <wgrad(dy, x), w>.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::channels_last;
using testing_util::GraphBuilder;
using testing_util::host_from;

// ---------------------------------------------------------------- references, by hand

const std::vector<double> kX3x3 = {1, 2, 3, 4, 5, 6, 7, 8, 9};
const std::vector<double> k2x2 = {1, 2, 3, 4};

std::vector<float> run_one(GraphBuilder& b, const std::map<std::string, HostTensor>& in,
                           const std::string& out) {
  auto r = reference_cpu(b.g, in);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->at(out) : std::vector<float>{};
}

// dy 1x1x2x2 (1..4) with w 1x1x2x2 (1..4) back onto x_dims.
std::vector<float> dgrad_tiny(ConvDgradAttrs attrs) {
  GraphBuilder b;
  const int dy = b.tensor("dy", {1, 1, 2, 2});
  const int w = b.tensor("w", {1, 1, 2, 2});
  const int dx = b.tensor("dx", attrs.x_dims);
  b.op_outputs("dgrad", attrs, {{"dy", dy}, {"w", w}}, {{"dx", dx}});
  return run_one(b, {{"dy", host_from(b.t(dy), k2x2)}, {"w", host_from(b.t(w), k2x2)}}, "dx");
}

TEST(ConvDgradReference, FullCorrelationByHand) {
  // dx[i][j] = sum over taps (r, s) with i = oh + r, j = ow + s of dy[oh][ow] * w[r][s].
  EXPECT_EQ(dgrad_tiny({{0, 0}, {1, 1}, {1, 1}, {1, 1, 3, 3}}),
            (std::vector<float>{1, 4, 4, 6, 20, 16, 9, 24, 16}));
}

TEST(ConvDgradReference, PaddingOneStrideTwoByHand) {
  // i = 2*oh - 1 + r: row 0 only from (oh 0, r 1), row 1 from (1, 0), row 2 from (1, 1).
  EXPECT_EQ(dgrad_tiny({{1, 1}, {2, 2}, {1, 1}, {1, 1, 3, 3}}),
            (std::vector<float>{4, 6, 8, 6, 4, 8, 12, 12, 16}));
}

TEST(ConvDgradReference, StrideTwoInputRowsNoTapReachesAreZero) {
  // x 5x5, 2x2 filter, stride 2: the forward never reads row 4 or column 4.
  const std::vector<float> dx = dgrad_tiny({{0, 0}, {2, 2}, {1, 1}, {1, 1, 5, 5}});
  ASSERT_EQ(dx.size(), 25u);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 5; ++j) {
      const float expect = (i == 4 || j == 4)
                               ? 0.0f
                               : static_cast<float>(k2x2[(i / 2) * 2 + j / 2] * k2x2[(i % 2) * 2 + j % 2]);
      EXPECT_EQ(dx[i * 5 + j], expect) << i << "," << j;
    }
}

TEST(ConvWgradReference, CorrelationOfXWithDyByHand) {
  GraphBuilder b;
  const int dy = b.tensor("dy", {1, 1, 2, 2});
  const int x = b.tensor("x", {1, 1, 3, 3});
  const int dw = b.tensor("dw", {1, 1, 2, 2});
  b.op_outputs("wgrad", ConvWgradAttrs{{}, {}, {}, {1, 1, 2, 2}}, {{"dy", dy}, {"x", x}}, {{"dw", dw}});
  // dw[r][s] = sum over (oh, ow) of dy[oh][ow] * x[oh + r][ow + s].
  EXPECT_EQ(run_one(b, {{"dy", host_from(b.t(dy), k2x2)}, {"x", host_from(b.t(x), kX3x3)}}, "dw"),
            (std::vector<float>{37, 47, 67, 77}));
}

TEST(ReluBwdReference, PassesDyWhereXIsPositive) {
  GraphBuilder b;
  const int dy = b.tensor("dy", {1, 1, 1, 4});
  const int x = b.tensor("x", {1, 1, 1, 4});
  const int y = b.tensor("y", {1, 1, 1, 4});
  b.op("drelu", PointwiseAttrs{PointwiseMode::kReluBwd}, {{"dy", dy}, {"x", x}}, y);
  EXPECT_EQ(
      run_one(b, {{"dy", host_from(b.t(dy), {1, 2, 3, 4})}, {"x", host_from(b.t(x), {-1, 0, 0.5, 2})}}, "y"),
      (std::vector<float>{0, 0, 3, 4}));
}

// ---------------------------------------------------------------- references, adjoint identities

struct Case {
  std::string name;
  std::vector<int64_t> x, w, pad, stride, dil;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<double> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> v(n);
  for (double& e : v) e = static_cast<float>(u(rng));  // exact in the fp32 tensors
  return v;
}

size_t count(const std::vector<int64_t>& dims) {
  size_t n = 1;
  for (int64_t d : dims) n *= static_cast<size_t>(d);
  return n;
}

double dot(const std::vector<float>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

class ConvAdjoint : public ::testing::TestWithParam<Case> {};

TEST_P(ConvAdjoint, DgradAndWgradAreTheForwardsAdjoints) {
  const Case& c = GetParam();
  ConvFpropAttrs f{c.pad, c.stride, c.dil};
  // The forward's output dims, from resolve().
  GraphSpec spec;
  spec.name = c.name;
  spec.io_dtype = DType::kFP32;
  spec.tensor("x", c.x);
  spec.tensor("w", c.w);
  spec.output(spec.conv_fprop("conv", "x", "w", f));
  auto rg = resolve(spec);
  ASSERT_TRUE(rg.ok()) << rg.status().ToString();
  const std::vector<int64_t> ydims = rg->tensors[rg->find_tensor("conv.y")].dims;

  std::mt19937 rng(1234);
  GraphBuilder b;
  // Channels-last inputs: the references read any layout in logical order.
  const int x = b.tensor("x", c.x, DType::kFP32, channels_last(c.x));
  const int w = b.tensor("w", c.w, DType::kFP32, channels_last(c.w));
  const int dy = b.tensor("dy", ydims, DType::kFP32, channels_last(ydims));
  const int y = b.tensor("y", ydims);
  const int dx = b.tensor("dx", c.x);
  const int dw = b.tensor("dw", c.w);
  b.op("fprop", f, {{"x", x}, {"w", w}}, y);
  b.op_outputs("dgrad", ConvDgradAttrs{c.pad, c.stride, c.dil, c.x}, {{"dy", dy}, {"w", w}}, {{"dx", dx}});
  b.op_outputs("wgrad", ConvWgradAttrs{c.pad, c.stride, c.dil, c.w}, {{"dy", dy}, {"x", x}}, {{"dw", dw}});
  const auto xv = random_values(count(c.x), rng);
  const auto wv = random_values(count(c.w), rng);
  const auto dyv = random_values(count(ydims), rng);
  auto r = reference_cpu(
      b.g, {{"x", host_from(b.t(x), xv)}, {"w", host_from(b.t(w), wv)}, {"dy", host_from(b.t(dy), dyv)}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double fwd = dot(r->at("y"), dyv);
  const double via_dgrad = dot(r->at("dx"), xv);
  const double via_wgrad = dot(r->at("dw"), wv);
  // The outputs are rounded to fp32 (2^-24 relative each): the sums agree to
  // about sqrt(elements) * 2^-24 * the terms' size, far inside 1e-5 of the scale.
  double scale = 0;
  for (float v : r->at("y")) scale += std::abs(v);
  ASSERT_GT(scale, 0);
  EXPECT_NEAR(via_dgrad, fwd, 1e-5 * scale) << c.name;
  EXPECT_NEAR(via_wgrad, fwd, 1e-5 * scale) << c.name;
  // A sum near zero would make the check weak.
  EXPECT_GT(std::abs(fwd), 1e-3 * scale / std::sqrt(static_cast<double>(r->at("y").size())));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ConvAdjoint,
    ::testing::Values(Case{"plain", {2, 3, 7, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
                      Case{"stride2_odd", {2, 4, 9, 8}, {5, 4, 3, 2}, {1, 0}, {2, 3}, {1, 1}},
                      Case{"dilation", {1, 2, 10, 9}, {3, 2, 3, 3}, {2, 1}, {1, 2}, {2, 3}},
                      Case{"grouped", {2, 6, 6, 6}, {4, 3, 3, 3}, {1, 1}, {2, 1}, {1, 1}},
                      Case{"depthwise", {1, 4, 5, 5}, {4, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
                      Case{"conv3d", {1, 4, 5, 6, 5}, {6, 2, 3, 2, 3}, {1, 0, 2}, {2, 1, 1}, {1, 2, 2}}),
    [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------- JSON and validation

std::string dgrad_doc(const std::string& op_fields, const std::string& dy = "[2, 32, 8, 8]",
                      const std::string& w = "[32, 16, 3, 3]") {
  return R"({"name": "g", "tensors": [
    {"name": "dy", "dims": )" +
         dy + R"(, "layout": "channels_last"},
    {"name": "w", "dims": )" +
         w + R"(, "layout": "channels_last"},
    {"name": "dx"}],
  "ops": [{"op": "conv_dgrad", "name": "dg", "inputs": {"dy": "dy", "w": "w"}, "outputs": {"dx": "dx"})" +
         op_fields + "}]}";
}

std::string wgrad_doc(const std::string& op_fields, const std::string& dy = "[2, 32, 8, 8]",
                      const std::string& x = "[2, 16, 15, 15]") {
  return R"({"name": "g", "tensors": [
    {"name": "dy", "dims": )" +
         dy + R"(, "layout": "channels_last"},
    {"name": "x", "dims": )" +
         x + R"(, "layout": "channels_last"},
    {"name": "dw"}],
  "ops": [{"op": "conv_wgrad", "name": "wg", "inputs": {"dy": "dy", "x": "x"}, "outputs": {"dw": "dw"})" +
         op_fields + "}]}";
}

Result<ResolvedGraph> resolve_text(const std::string& text) {
  auto spec = parse_graph_json(text, "graph.json");
  if (!spec.ok()) return spec.status();
  return resolve(*spec);
}

// The resolve() error of `text`; fails the test when it resolves.
std::string error_of(const std::string& text) {
  auto g = resolve_text(text);
  EXPECT_FALSE(g.ok()) << text;
  if (g.ok()) return "";
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument) << g.status().ToString();
  return g.status().message();
}

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

TEST(ConvDgradGraph, InfersDxFromXDimsWithDysLayout) {
  auto g = resolve_text(dgrad_doc(R"(, "x_dims": [2, 16, 15, 15], "padding": [1, 1], "stride": [2, 2])"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& dx = g->tensors[g->find_tensor("dx")];
  EXPECT_EQ(dx.dims, (std::vector<int64_t>{2, 16, 15, 15}));
  EXPECT_EQ(dx.strides, channels_last(dx.dims));  // like dy: nhwc
  EXPECT_TRUE(dx.is_output);
  EXPECT_EQ(dx.dtype, DType::kBF16);
  // The forward's multiply-adds: 2 * N*K*P*Q * C*R*S.
  EXPECT_EQ(g->flops(), 2.0 * 2 * 32 * 8 * 8 * 16 * 3 * 3);
  EXPECT_EQ(op_resolved_attrs_json(*g, g->ops[0]),
            R"({"padding":[1,1],"stride":[2,2],"dilation":[1,1],"x_dims":[2,16,15,15]})");
  EXPECT_HAS(describe(*g), "padding [1, 1], stride [2, 2], dilation [1, 1]");
}

TEST(ConvDgradGraph, XDimsIsPartOfTheIdentity) {
  // x 15 and 16 both give dy 8 with pad 1, stride 2, 3x3: different gradients.
  auto a = resolve_text(dgrad_doc(R"(, "x_dims": [2, 16, 15, 15], "padding": [1, 1], "stride": [2, 2])"));
  auto b = resolve_text(dgrad_doc(R"(, "x_dims": [2, 16, 16, 16], "padding": [1, 1], "stride": [2, 2])"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(graph_fingerprint(*a), graph_fingerprint(*b));
  EXPECT_HAS(a->canonical, "x_dims");
}

TEST(ConvDgradGraph, RoundTripsThroughJson) {
  auto spec =
      parse_graph_json(dgrad_doc(R"(, "x_dims": [2, 16, 15, 15], "padding": [1, 1], "stride": [2, 2])"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto back = parse_graph_json(graph_to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto a = resolve(*spec), b = resolve(*back);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->canonical, b->canonical);
}

TEST(ConvDgradGraph, ErrorsNameOpTensorAndWhatIsAccepted) {
  EXPECT_HAS(error_of(dgrad_doc("")),
             "[conv_dgrad 'dg'] needs 'x_dims': the forward input's dims [N, C, H, W]");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 15])")),
             "[conv_dgrad 'dg'] x_dims [2, 16, 15] has 3 values but input 'dy' has rank 4");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 0, 15])")),
             "x_dims[2] is 0: dims must be in [1, 2147483647]");
  // dx inconsistent with dy, w, padding and stride: says which y the forward would give.
  EXPECT_HAS(
      error_of(dgrad_doc(R"(, "x_dims": [2, 16, 17, 17], "padding": [1, 1], "stride": [2, 2])")),
      "[conv_dgrad 'dg'] input 'dy' ('dy') has dims [2, 32, 8, 8] but the forward convolution of x_dims "
      "[2, 16, 17, 17] with 'w' ('w') [32, 16, 3, 3] (padding [1, 1], stride [2, 2], dilation [1, 1]) gives "
      "y dims [2, 32, 9, 9]: dy must have the forward output's dims");
  EXPECT_HAS(
      error_of(dgrad_doc(R"(, "x_dims": [2, 16, 8, 8])", "[2, 32, 8, 8]", "[16, 16, 3, 3]")),
      "input 'w' ('w') has K=16 output channels but input 'dy' ('dy') has K=32 (dim 1): they must be equal");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [4, 16, 8, 8], "padding": [1, 1])")),
             "x_dims [4, 16, 8, 8] has N=4 but input 'dy' ('dy') has N=2: they must be equal");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 24, 8, 8], "padding": [1, 1])")),
             "input 'w' ('w') has C=16 but x_dims [2, 24, 8, 8] has C=24: the filter's dim 1 must equal x's "
             "channels, "
             "or divide them");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 8, 8], "padding": [1])")),
             "[conv_dgrad 'dg'] padding [1] has 1 values but the convolution has 2 spatial dims");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 8, 8], "stride": [0, 1])")),
             "stride[0] is 0: stride must be in [1, 2147483647]");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 1, 1])")),
             "is larger than the padded input of x_dims");
  EXPECT_HAS(error_of(dgrad_doc(R"(, "x_dims": [2, 16, 8, 8])", "[2, 32, 8, 8]", "[32, 16, 3, 3, 3]")),
             "input 'w' ('w') has rank 5 [32, 16, 3, 3, 3] but input 'dy' ('dy') has rank 4");
}

TEST(ConvDgradGraph, JsonRejectsFieldsOfOtherOps) {
  auto bad =
      parse_graph_json(dgrad_doc(R"(, "x_dims": [2, 16, 8, 8], "w_dims": [32, 16, 3, 3])"), "graph.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_HAS(bad.status().message(), "unknown field 'w_dims'");
  EXPECT_HAS(bad.status().message(), "x_dims");  // the accepted fields are listed
}

TEST(ConvWgradGraph, InfersDwFromWDimsWithXsLayout) {
  auto g = resolve_text(wgrad_doc(R"(, "w_dims": [32, 16, 3, 3], "padding": [1, 1], "stride": [2, 2])"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& dw = g->tensors[g->find_tensor("dw")];
  EXPECT_EQ(dw.dims, (std::vector<int64_t>{32, 16, 3, 3}));
  EXPECT_EQ(dw.strides, channels_last(dw.dims));  // KRSC, like x's nhwc
  EXPECT_EQ(g->flops(), 2.0 * 2 * 32 * 8 * 8 * 16 * 3 * 3);
  EXPECT_EQ(op_resolved_attrs_json(*g, g->ops[0]),
            R"({"padding":[1,1],"stride":[2,2],"dilation":[1,1],"w_dims":[32,16,3,3]})");
}

TEST(ConvWgradGraph, GroupedFromWDims) {
  auto g = resolve_text(wgrad_doc(R"(, "w_dims": [32, 4, 3, 3], "padding": [1, 1], "stride": [2, 2])"));
  ASSERT_TRUE(g.ok()) << g.status().ToString();  // 4 groups
  EXPECT_EQ(g->flops(), 2.0 * 2 * 32 * 8 * 8 * 4 * 3 * 3);
}

TEST(ConvWgradGraph, ErrorsNameOpTensorAndWhatIsAccepted) {
  EXPECT_HAS(error_of(wgrad_doc("")),
             "[conv_wgrad 'wg'] needs 'w_dims': the filter's dims [K, C/groups, R, S]");
  EXPECT_HAS(
      error_of(wgrad_doc(R"(, "w_dims": [32, 16, 5, 5], "padding": [1, 1], "stride": [2, 2])")),
      "[conv_wgrad 'wg'] input 'dy' ('dy') has dims [2, 32, 8, 8] but the forward convolution of input 'x' "
      "('x') [2, 16, 15, 15] with w_dims [32, 16, 5, 5] (padding [1, 1], stride [2, 2], dilation [1, 1]) "
      "gives y dims [2, 32, 7, 7]: dy must have the forward output's dims");
  EXPECT_HAS(error_of(wgrad_doc(R"(, "w_dims": [16, 16, 3, 3], "padding": [1, 1], "stride": [2, 2])")),
             "w_dims [16, 16, 3, 3] has K=16 output channels but input 'dy' ('dy') has K=32 (dim 1)");
  EXPECT_HAS(
      error_of(wgrad_doc(R"(, "w_dims": [32, 6, 3, 3], "padding": [1, 1], "stride": [2, 2])")),
      "[conv_wgrad 'wg'] w_dims [32, 6, 3, 3] has C=6 but input 'x' ('x') has C=16: the filter's dim 1 must "
      "equal x's channels, or divide them");
  EXPECT_HAS(error_of(wgrad_doc(R"(, "w_dims": [32, 16, 3, 3])", "[2, 32, 8, 8]", "[4, 16, 15, 15]")),
             "input 'x' ('x') has N=4 but input 'dy' ('dy') has N=2: they must be equal");
  EXPECT_HAS(error_of(wgrad_doc(R"(, "w_dims": [32, 16, 3, 3])", "[2, 32, 8, 8]", "[2, 16, 15, 15, 15]")),
             "input 'x' ('x') has rank 5 [2, 16, 15, 15, 15] but input 'dy' ('dy') has rank 4");
  EXPECT_HAS(error_of(wgrad_doc(R"(, "w_dims": [32, 16, 3, 3])", "[2, 32, 8]", "[2, 16, 15]")),
             "[conv_wgrad 'wg'] input 'dy' ('dy') has rank 3 [2, 32, 8]: conv_wgrad takes dy [N,K,P,Q] or "
             "[N,K,O,P,Q]");
}

TEST(ReluBwdGraph, RolesAndShape) {
  EXPECT_EQ(op_input_roles(PointwiseAttrs{PointwiseMode::kReluBwd}),
            (std::vector<std::string_view>{"dy", "x"}));
  EXPECT_EQ(parse_pointwise_mode("relu_bwd"), PointwiseMode::kReluBwd);
  GraphSpec s;
  s.name = "drelu";
  s.tensor("dy", {2, 8, 4, 4}, "nhwc");
  s.tensor("x", {2, 8, 4, 4}, "nhwc");
  s.output(s.pointwise("drelu", PointwiseMode::kReluBwd, "dy", "x"));
  auto g = resolve(s);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors[g->find_tensor("drelu.y")].dims, (std::vector<int64_t>{2, 8, 4, 4}));
  // x must broadcast into dy (the gradient's shape is the output's).
  GraphSpec bad = s;
  bad.tensors[0].dims = {2, 8, 1, 1};
  auto e = resolve(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_HAS(e.status().message(),
             "[relu_bwd 'drelu'] input 'x' ('x') [2, 8, 4, 4] does not broadcast into input 'dy'");
}

TEST(ConvBwdBuilder, DgradThenReluBwd) {
  GraphSpec s;
  s.name = "b";
  s.tensor("dy", {1, 16, 6, 6}, "nhwc");
  s.tensor("w", {16, 8, 3, 3}, "nhwc");
  s.tensor("r", {1, 8, 6, 6}, "nhwc");
  const std::string dx = s.conv_dgrad("dg", "dy", "w", ConvDgradAttrs{{1, 1}, {}, {}, {1, 8, 6, 6}});
  EXPECT_EQ(dx, "dg.dx");
  s.output(s.pointwise("drelu", PointwiseMode::kReluBwd, dx, "r"), "nhwc");
  auto g = resolve(s);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->tensors[g->find_tensor("dg.dx")].is_virtual);
}

}  // namespace
}  // namespace fusebox
