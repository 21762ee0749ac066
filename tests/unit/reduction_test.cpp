// Reductions (reduce_sum, ...) and the FP8 matmul rules: resolve() shapes and
// errors, JSON round trip, canonical form, and the CPU reference against
// hand-computed values; the small examples resolve and run on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

constexpr auto expect_error = testing_util::expect_resolve_error;
using testing_util::host_from;

const ResolvedTensor& T(const ResolvedGraph& g, const std::string& name) {
  return g.tensors[g.find_tensor(name)];
}

GraphSpec reduce_graph(ReductionMode mode, std::vector<int64_t> x_dims, std::vector<int64_t> reduce_dims,
                       std::vector<int64_t> y_dims = {}) {
  GraphSpec g;
  g.name = "red";
  g.tensor("x", x_dims);
  TensorSpec y;
  y.name = "y";
  y.dims = std::move(y_dims);
  g.tensors.push_back(y);
  OpSpec op;
  op.name = "r";
  op.attrs = ReductionAttrs{mode, std::move(reduce_dims)};
  op.inputs = {{"x", "x"}};
  op.outputs = {{"y", "y"}};
  g.ops.push_back(op);
  return g;
}

TEST(Reduction, ShapeAndDefaultDtype) {
  auto r = resolve(reduce_graph(ReductionMode::kSum, {4, 16, 7, 7}, {0, 2, 3}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, (std::vector<int64_t>{1, 16, 1, 1}));
  EXPECT_EQ(T(*r, "y").dtype, DType::kFP32);  // io dtype bf16: reductions default to fp32
  EXPECT_DOUBLE_EQ(r->flops(), 4.0 * 16 * 7 * 7);
}

TEST(Reduction, NoDimsMeansEveryDimAndCanonicalAgrees) {
  auto all = resolve(reduce_graph(ReductionMode::kAmax, {2, 3, 5}, {}));
  auto listed = resolve(reduce_graph(ReductionMode::kAmax, {2, 3, 5}, {2, 0, 1}));
  ASSERT_TRUE(all.ok() && listed.ok());
  EXPECT_EQ(T(*all, "y").dims, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(all->canonical, listed->canonical);  // resolved to the same sorted list
  auto other = resolve(reduce_graph(ReductionMode::kMax, {2, 3, 5}, {}));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(all->canonical, other->canonical);  // the mode is part of the form
}

TEST(Reduction, Errors) {
  expect_error(reduce_graph(ReductionMode::kSum, {4, 16, 7, 7}, {0, 4}),
               {"[reduce_sum 'r'] reduce_dims [0, 4] names dim 4", "'x' ('x') [4, 16, 7, 7] has rank 4",
                "give dims from 0 to 3"});
  expect_error(reduce_graph(ReductionMode::kMax, {4, 16}, {1, 1}), {"[reduce_max 'r']", "names dim 1 twice"});
  // A declared y that does not match reduce_dims: say what the op produces and how to fix it.
  expect_error(reduce_graph(ReductionMode::kSum, {4, 16, 7, 7}, {0, 2, 3}, {1, 1, 7, 7}),
               {"[reduce_sum 'r'] output 'y' ('y') is declared with dims [1, 1, 7, 7] but the op produces "
                "[1, 16, 1, 1]",
                "set reduce_dims to the dims where y is 1"});
  GraphSpec g = reduce_graph(ReductionMode::kSum, {4, 16}, {0});
  g.tensors[1].dtype = DType::kFP8E4M3;
  expect_error(g,
               {"[reduce_sum 'r'] output 'y' ('y') has dtype fp8_e4m3", "fp32 (the default), bf16 or fp16"});
  GraphSpec gi = reduce_graph(ReductionMode::kSum, {4, 16}, {0});
  gi.tensors[0].dtype = DType::kInt32;
  expect_error(gi, {"[reduce_sum 'r'] input 'x' ('x') has dtype int32", "takes a floating x"});
}

TEST(Reduction, JsonRoundTrip) {
  const char* text = R"({"name": "j", "tensors": [{"name": "x", "dims": [2, 3, 4]}, {"name": "y"}],
    "ops": [{"op": "reduce_mean", "name": "m", "inputs": {"x": "x"}, "outputs": {"y": "y"}, "reduce_dims": [1]}]})";
  auto spec = parse_graph_json(text);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto back = parse_graph_json(graph_to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto r = resolve(*back);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, (std::vector<int64_t>{2, 1, 4}));
  const auto* a = std::get_if<ReductionAttrs>(&r->ops[0].attrs);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->mode, ReductionMode::kMean);
  auto bad = parse_graph_json(R"({"name": "j", "tensors": [{"name": "x", "dims": [2]}, {"name": "y"}],
    "ops": [{"op": "reduce_sum", "name": "m", "inputs": {"x": "x"}, "outputs": {"y": "y"}, "reduce_dims": 1}]})");
  EXPECT_FALSE(bad.ok());
}

TEST(Reduction, BuilderNamesOutput) {
  GraphSpec g;
  g.tensor("x", {3, 4});
  const std::string y = g.reduction("s", ReductionMode::kSum, "x", {1});
  g.output(y);
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, y).dims, (std::vector<int64_t>{3, 1}));
}

// x [1, 2, 3] = [[1, -4, 2], [3, 0.5, -1]], strided in memory (column-major) to
// check that the reference reads logical order.
TEST(Reduction, CpuReferenceByHand) {
  struct Case {
    ReductionMode mode;
    std::vector<int64_t> dims;
    std::vector<float> want;
  };
  const std::vector<Case> cases = {
      {ReductionMode::kSum, {2}, {-1.0f, 2.5f}},
      {ReductionMode::kMean, {1}, {2.0f, -1.75f, 0.5f}},
      {ReductionMode::kMax, {}, {3.0f}},
      {ReductionMode::kMin, {1, 2}, {-4.0f}},
      {ReductionMode::kAmax, {}, {4.0f}},
      {ReductionMode::kSum, {0}, {1.0f, -4.0f, 2.0f, 3.0f, 0.5f, -1.0f}},  // a size-1 dim: a copy
  };
  for (const Case& c : cases) {
    GraphSpec g = reduce_graph(c.mode, {1, 2, 3}, c.dims);
    g.tensors[0].dtype = DType::kFP32;
    g.tensors[0].layout = "col_major";
    auto r = resolve(g);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::map<std::string, HostTensor> in;
    in["x"] = host_from(T(*r, "x"), {1, -4, 2, 3, 0.5, -1});
    auto out = reference_cpu(*r, in);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->at("y"), c.want) << reduction_mode_name(c.mode);
  }
}

// ---------------------------------------------------------------- FP8 matmul rules

GraphSpec fp8_graph(DType a, DType b, std::optional<DType> acc, DType descale) {
  GraphSpec g;
  g.name = "fp8";
  g.tensor("a", {1, 16, 32}, "", a);
  g.tensor("b", {1, 32, 8}, "col_major", b);
  g.tensor("descale", {1, 1, 1}, "", descale);
  if (acc) {
    TensorSpec t;
    t.name = "acc";
    t.dtype = acc;
    t.is_virtual = true;
    g.tensors.push_back(t);
  }
  g.tensor("y", {}, "", DType::kBF16);
  g.tensors.back().dims.clear();
  OpSpec mm;
  mm.name = "gemm";
  mm.attrs = MatmulAttrs{};
  mm.inputs = {{"a", "a"}, {"b", "b"}};
  mm.outputs = {{"y", "acc"}};
  g.ops.push_back(mm);
  OpSpec sc;
  sc.name = "descale_a";
  sc.attrs = PointwiseAttrs{PointwiseMode::kScale};
  sc.inputs = {{"x", "acc"}, {"scale", "descale"}};
  sc.outputs = {{"y", "y"}};
  g.ops.push_back(sc);
  return g;
}

TEST(Fp8Matmul, AcceptedForm) {
  auto r = resolve(fp8_graph(DType::kFP8E4M3, DType::kFP8E5M2, std::nullopt, DType::kFP32));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "acc").dtype, DType::kFP32);
  EXPECT_EQ(T(*r, "y").dtype, DType::kBF16);
}

TEST(Fp8Matmul, Errors) {
  expect_error(fp8_graph(DType::kFP8E4M3, DType::kBF16, std::nullopt, DType::kFP32),
               {"[matmul 'gemm'] input 'b' ('b') is bf16 but input 'a' ('a') is fp8_e4m3",
                "takes fp8_e4m3 or fp8_e5m2 for both a and b"});
  expect_error(fp8_graph(DType::kFP8E4M3, DType::kFP8E4M3, DType::kBF16, DType::kFP32),
               {"[matmul 'gemm'] output 'y' ('acc') is bf16", "an FP8 matmul's product is fp32"});
  expect_error(fp8_graph(DType::kFP8E4M3, DType::kFP8E4M3, std::nullopt, DType::kBF16),
               {"[scale 'descale_a'] input 'scale' ('descale') is bf16 [1, 1, 1]",
                "must be an fp32 tensor with every dim 1"});
}

// Descales, bias, relu, amax before the output scale: the reference by hand.
TEST(Fp8Matmul, EpilogueReferenceByHand) {
  const std::string path =
      std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/fp8_matmul_bias_relu_amax_small.json";
  auto spec = load_graph_file(path);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  // Shrink to a 1x2 @ 2x2 product.
  for (auto& t : spec->tensors) {
    if (t.name == "a") t.dims = {1, 1, 2};
    if (t.name == "b") t.dims = {1, 2, 2};
    if (t.name == "bias") t.dims = {1, 1, 2};
  }
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, HostTensor> in;
  in["a"] = host_from(T(*r, "a"), {1.0, 2.0});
  in["b"] = host_from(T(*r, "b"), {0.5, -1.0, 1.5, -2.0});  // logical [[0.5, -1], [1.5, -2]]
  in["descale_a"] = host_from(T(*r, "descale_a"), {0.5});
  in["descale_b"] = host_from(T(*r, "descale_b"), {0.25});
  in["bias"] = host_from(T(*r, "bias"), {0.25, 0.5});
  in["scale_y"] = host_from(T(*r, "scale_y"), {64.0});
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // a @ b = [3.5, -5]; * 0.125 = [0.4375, -0.625]; + bias = [0.6875, -0.125]; relu = [0.6875, 0]
  EXPECT_EQ(out->at("y"), (std::vector<float>{44.0f, 0.0f}));
  EXPECT_EQ(out->at("amax_y"), (std::vector<float>{0.6875f}));  // before the output scale
}

// Every new small example resolves and its CPU reference runs.
TEST(ReductionExamples, SmallOnesRunOnTheCpu) {
  const std::string dir = std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/";
  for (const char* name :
       {"reduce_sum_bias_grad_small.json", "invalid_reduce_max_rows_small.json",
        "matmul_gelu_rowsum_small.json", "conv_relu_channel_sum_small.json",
        "fp8_matmul_bias_relu_amax_small.json", "fp8_matmul_e5m2_bf16_small.json",
        "matmul_rowbias_residual_small.json", "swiglu_gate_small.json", "swiglu_up_mul_small.json"}) {
    auto spec = load_graph_file(dir + name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status().ToString();
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    std::map<std::string, HostTensor> in;
    uint64_t seed = 7;
    for (const ResolvedTensor& t : r->tensors) {
      if (!t.is_input || t.scalar_value) continue;
      in[t.name] =
          t.values.empty() ? random_tensor(t, seed++, t.random_lo, t.random_hi) : host_from(t, t.values);
    }
    auto out = reference_cpu(*r, in);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status().ToString();
    for (const auto& [tensor, values] : *out)
      for (float v : values) ASSERT_TRUE(std::isfinite(v)) << name << " " << tensor;
  }
  // The two SwiGLU stages compose to silu(x @ Wg) * (x @ Wu); one graph holding both GEMMs resolves too
  // (cuDNN refuses it at the support check, not resolve()).
  auto one =
      load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/invalid_swiglu_one_graph.json");
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(resolve(*one).ok());
}

}  // namespace
}  // namespace fusebox
