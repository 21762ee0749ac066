#include "fusebox/graph.h"

#include <gtest/gtest.h>

#include "reference_test_util.h"

using namespace fusebox;

namespace {

// resolve() fails with InvalidArgument naming every needle (reference_test_util.h).
constexpr auto expect_error = testing_util::expect_resolve_error;

std::vector<int64_t> V(std::initializer_list<int64_t> v) { return v; }

// x [N,C,H,W] conv w [K,C,R,S] -> output tensor y.
GraphSpec conv_graph(std::vector<int64_t> x, std::vector<int64_t> w, ConvFpropAttrs attrs) {
  GraphSpec g;
  g.name = "conv";
  g.tensor("x", x, "channels_last");
  g.tensor("w", w, "channels_last");
  std::string y = g.conv_fprop("conv1", "x", "w", std::move(attrs));
  g.output(y, "channels_last");
  return g;
}

}  // namespace

TEST(Layout, NhwcStrides) {
  auto s = layout_strides({16, 64, 56, 56}, "nhwc");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, V({200704, 1, 3584, 64}));
  EXPECT_EQ(*layout_strides({16, 64, 56, 56}, "nchw"), V({200704, 3136, 56, 1}));
  EXPECT_EQ(*layout_strides({2, 3, 4, 5, 6}, "ndhwc"), V({360, 1, 90, 18, 3}));
  EXPECT_EQ(*layout_strides({2, 3, 4}, "row_major"), V({12, 4, 1}));
  EXPECT_EQ(*layout_strides({2, 3, 4}, "col_major"), V({12, 1, 3}));
  EXPECT_FALSE(layout_strides({2, 3, 4}, "nhwc").ok());
  auto bad = layout_strides({2, 3}, "nwhc");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("nhwc"), std::string::npos);  // lists accepted layouts
}

TEST(Layout, DenseStridesLike) {
  EXPECT_EQ(dense_strides_like({16, 64, 28, 28}, {200704, 1, 3584, 64}), V({50176, 1, 1792, 64}));
  EXPECT_EQ(dense_strides_like({2, 3, 4}, {}), V({12, 4, 1}));
  EXPECT_EQ(dense_strides_like({2, 3, 4}, {12, 1, 3}), V({12, 1, 3}));
}

TEST(OpNames, RoundTrip) {
  for (auto name : {"add", "sub", "mul", "bias_add", "scale", "relu", "gelu_tanh", "gelu_erf", "silu",
                    "sigmoid", "tanh"}) {
    auto m = parse_pointwise_mode(name);
    ASSERT_TRUE(m.has_value()) << name;
    EXPECT_EQ(pointwise_mode_name(*m), name);
    EXPECT_EQ(op_type_name(PointwiseAttrs{*m}), name);
  }
  EXPECT_FALSE(parse_pointwise_mode("gelu").has_value());
  EXPECT_EQ(op_type_name(ConvFpropAttrs{}), "conv_fprop");
  EXPECT_EQ(op_type_name(MatmulAttrs{}), "matmul");
  EXPECT_TRUE(pointwise_is_unary(PointwiseMode::kSilu));
  EXPECT_FALSE(pointwise_is_unary(PointwiseMode::kScale));
  EXPECT_EQ(op_input_roles(PointwiseAttrs{PointwiseMode::kBiasAdd}),
            (std::vector<std::string_view>{"x", "bias"}));
  EXPECT_EQ(op_input_roles(ConvFpropAttrs{}), (std::vector<std::string_view>{"x", "w"}));
}

struct ConvCase {
  std::vector<int64_t> x, w;
  ConvFpropAttrs attrs;
  std::vector<int64_t> y;
};

TEST(Resolve, ConvOutputDims) {
  std::vector<ConvCase> cases = {
      {{16, 64, 56, 56}, {64, 64, 3, 3}, {{1, 1}, {1, 1}, {1, 1}}, {16, 64, 56, 56}},
      {{2, 8, 10, 10}, {16, 8, 3, 3}, {{1, 1}, {2, 2}, {1, 1}}, {2, 16, 5, 5}},
      {{1, 3, 224, 224}, {64, 3, 7, 7}, {{3, 3}, {2, 2}, {}}, {1, 64, 112, 112}},
      {{1, 4, 10, 12}, {2, 4, 3, 3}, {{0, 0}, {1, 1}, {2, 2}}, {1, 2, 6, 8}},  // dilation 2: eff. filter 5
      {{1, 4, 7, 7}, {2, 4, 3, 3}, {{}, {}, {}}, {1, 2, 5, 5}},                // defaults
      {{1, 4, 9, 8}, {2, 4, 3, 2}, {{1, 0}, {3, 2}, {1, 1}}, {1, 2, 3, 4}},
      {{2, 4, 6, 6, 6}, {8, 4, 3, 3, 3}, {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}}, {2, 8, 6, 6, 6}},
  };
  for (const auto& c : cases) {
    auto r = resolve(conv_graph(c.x, c.w, c.attrs));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto& y = r->tensors[r->find_tensor("conv1.y")];
    EXPECT_EQ(y.dims, c.y);
    EXPECT_TRUE(y.is_output);
    const auto& a = std::get<ConvFpropAttrs>(r->ops[0].attrs);
    EXPECT_EQ(a.padding.size(), c.x.size() - 2);
    EXPECT_EQ(a.dilation.size(), c.x.size() - 2);
  }
}

TEST(Resolve, ConvDefaultsFilledAndStridesFollowInput) {
  auto r = resolve(conv_graph({1, 4, 7, 7}, {2, 4, 3, 3}, {}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& a = std::get<ConvFpropAttrs>(r->ops[0].attrs);
  EXPECT_EQ(a.padding, V({0, 0}));
  EXPECT_EQ(a.stride, V({1, 1}));
  EXPECT_EQ(a.dilation, V({1, 1}));
  const auto& y = r->tensors[r->find_tensor("conv1.y")];
  EXPECT_EQ(y.strides, *layout_strides({1, 2, 5, 5}, "nhwc"));
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 1 * 2 * 5 * 5 * 4 * 3 * 3);
  EXPECT_DOUBLE_EQ(r->bytes_moved(), 2.0 * (4 * 49 + 2 * 4 * 9 + 2 * 25));
}

TEST(Resolve, GroupedConv) {
  // 64 channels in 4 groups of 16; 32 filters, 8 per group.
  auto r = resolve(conv_graph({2, 64, 9, 9}, {32, 16, 3, 3}, {{1, 1}, {2, 2}, {}}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& y = r->tensors[r->find_tensor("conv1.y")];
  EXPECT_EQ(y.dims, V({2, 32, 5, 5}));
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 2 * 32 * 5 * 5 * 16 * 3 * 3);  // C/G MACs per output
}

TEST(Resolve, ConvErrors) {
  // w's C must equal x's or divide it (grouped), and K must split into the groups.
  expect_error(conv_graph({16, 64, 56, 56}, {64, 48, 3, 3}, {}),
               {"conv1", "C=48", "C=64", "'w'", "'x'", "divide"});
  expect_error(conv_graph({16, 64, 56, 56}, {63, 32, 3, 3}, {}), {"conv1", "K=63", "2 groups", "multiple"});
  expect_error(conv_graph({1, 4, 7}, {2, 4, 3}, {}), {"conv1", "rank 3"});
  expect_error(conv_graph({1, 4, 7, 7}, {2, 4, 3}, {}), {"conv1", "'w'", "rank"});
  expect_error(conv_graph({1, 4, 7, 7}, {2, 4, 3, 3}, {{1}, {}, {}}), {"conv1", "padding", "2 spatial"});
  expect_error(conv_graph({1, 4, 7, 7}, {2, 4, 3, 3}, {{}, {0, 1}, {}}), {"conv1", "stride[0] is 0"});
  expect_error(conv_graph({1, 4, 7, 7}, {2, 4, 3, 3}, {{-1, 0}, {}, {}}), {"conv1", "padding[0] is -1"});
  expect_error(conv_graph({1, 4, 2, 7}, {2, 4, 5, 3}, {}), {"conv1", "(2 + 2*0 - 1*(5-1) - 1)"});
  expect_error(conv_graph({1, 4, 7, -4}, {2, 4, 3, 3}, {}), {"'x'", "dim 3 is -4", ">= 1"});
  expect_error(conv_graph({1, 4, 7, 3000000000}, {2, 4, 3, 3}, {}), {"'x'", "dim 3"});
}

TEST(Resolve, MatmulBroadcast) {
  GraphSpec g;
  g.tensor("a", {4, 32, 16});
  g.tensor("b", {1, 16, 24});
  g.output(g.matmul("mm", "a", "b"));
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& y = r->tensors[r->find_tensor("mm.y")];
  EXPECT_EQ(y.dims, V({4, 32, 24}));
  EXPECT_EQ(y.strides, V({768, 24, 1}));
  EXPECT_EQ(y.dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 4 * 32 * 24 * 16);

  GraphSpec g2;
  g2.tensor("a", {1, 2, 5, 3});
  g2.tensor("b", {6, 1, 3, 7});
  g2.output(g2.matmul("mm", "a", "b"));
  auto r2 = resolve(g2);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->tensors[r2->find_tensor("mm.y")].dims, V({6, 2, 5, 7}));
}

TEST(Resolve, MatmulErrors) {
  auto mm = [](std::vector<int64_t> a, std::vector<int64_t> b) {
    GraphSpec g;
    g.tensor("A", a);
    g.tensor("B", b);
    g.output(g.matmul("gemm", "A", "B"));
    return g;
  };
  expect_error(mm({1, 4, 5}, {1, 6, 7}), {"[matmul 'gemm']", "K=5", "K=6", "'A'", "'B'"});
  expect_error(mm({4, 5}, {5, 7}), {"gemm", "rank >= 3"});
  expect_error(mm({2, 4, 5}, {3, 5, 7}), {"gemm", "batch dim 0"});
  expect_error(mm({1, 4, 5}, {1, 1, 5, 7}), {"gemm", "same rank"});
}

TEST(Resolve, PointwiseBroadcastAndBias) {
  GraphSpec g;
  g.tensor("a", {4, 1, 3});
  g.tensor("b", {1, 5, 3});
  g.output(g.pointwise("add1", PointwiseMode::kAdd, "a", "b"));
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[r->find_tensor("add1.y")].dims, V({4, 5, 3}));

  GraphSpec bad;
  bad.tensor("x", {1, 5, 3});
  bad.tensor("bias", {4, 1, 3});
  bad.output(bad.pointwise("badd", PointwiseMode::kBiasAdd, "x", "bias"));
  expect_error(bad, {"[bias_add 'badd']", "'bias'", "broadcast into"});

  GraphSpec rank;
  rank.tensor("a", {4, 3});
  rank.tensor("b", {1, 4, 3});
  rank.output(rank.pointwise("m", PointwiseMode::kMul, "a", "b"));
  expect_error(rank, {"[mul 'm']", "rank"});

  GraphSpec nob;
  nob.tensor("a", {4, 3});
  nob.tensor("b", {5, 3});
  nob.output(nob.pointwise("s", PointwiseMode::kSub, "a", "b"));
  expect_error(nob, {"[sub 's']", "do not broadcast"});
}

TEST(Resolve, ScalarGetsConsumerRank) {
  GraphSpec g;
  g.tensor("a", {8, 16, 4});
  g.tensor("b", {8, 4, 32});
  std::string alpha = g.scalar("alpha", 0.125);
  std::string y = g.pointwise("act", PointwiseMode::kRelu,
                              g.pointwise("scale", PointwiseMode::kScale, g.matmul("mm", "a", "b"), alpha));
  g.output(y);
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& s = r->tensors[r->find_tensor("alpha")];
  EXPECT_EQ(s.dims, V({1, 1, 1}));
  EXPECT_EQ(s.strides, V({1, 1, 1}));
  EXPECT_EQ(s.dtype, DType::kFP32);
  EXPECT_FALSE(s.is_input);
  EXPECT_EQ(r->input_tensors().size(), 2u);
  EXPECT_EQ(r->output_tensors().size(), 1u);
  EXPECT_EQ(r->tensors[r->find_tensor("mm.y")].dtype, DType::kFP32);  // virtual: intermediate dtype
  EXPECT_TRUE(r->tensors[r->find_tensor("mm.y")].is_virtual);
  EXPECT_EQ(r->tensors[r->find_tensor("act.y")].dtype, DType::kBF16);
  // bytes: a, b, y in bf16; the scalar is by value
  EXPECT_DOUBLE_EQ(r->bytes_moved(), 2.0 * (8 * 16 * 4 + 8 * 4 * 32 + 8 * 16 * 32));
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 8 * 16 * 32 * 4 + 2.0 * 8 * 16 * 32);
  std::string d = describe(*r);
  EXPECT_NE(d.find("scalar"), std::string::npos);
  EXPECT_NE(d.find("virtual"), std::string::npos);
  EXPECT_NE(d.find("mm: matmul(a=a, b=b) -> mm.y [8, 16, 32]"), std::string::npos) << d;
}

TEST(Resolve, ScalarErrors) {
  GraphSpec g;
  g.tensor("x", {2, 3});
  g.scalar("s", 2.0);
  g.tensors.back().is_virtual = true;
  g.output(g.pointwise("sc", PointwiseMode::kScale, "x", "s"));
  expect_error(g, {"'s'", "scalar", "virtual"});

  GraphSpec g2;
  g2.scalar("s", 2.0);
  g2.tensor("w", {1, 2, 3, 3});
  g2.output(g2.conv_fprop("c", "s", "w", {}));
  expect_error(g2, {"[conv_fprop 'c']", "'s'", "scalar"});
}

TEST(Resolve, TopologicalOrderIsStable) {
  GraphSpec g;
  g.tensor("x", {2, 3});
  g.tensor("y", {});
  // declared out of order: act consumes what neg... produces
  OpSpec relu{"act", PointwiseAttrs{PointwiseMode::kRelu}, {{"x", "t"}}, {{"y", "y"}}, {}};
  OpSpec tanh_op{"first", PointwiseAttrs{PointwiseMode::kTanh}, {{"x", "x"}}, {{"y", "t"}}, {}};
  g.ops = {relu, tanh_op};
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->ops.size(), 2u);
  EXPECT_EQ(r->ops[0].name, "first");
  EXPECT_EQ(r->ops[1].name, "act");
  EXPECT_EQ(r->tensors[r->find_tensor("y")].dims, V({2, 3}));
  EXPECT_TRUE(r->tensors[r->find_tensor("y")].is_output);
  EXPECT_TRUE(r->tensors[r->find_tensor("t")].is_virtual);
}

TEST(Resolve, StructuralErrors) {
  auto base = [] {
    GraphSpec g;
    g.tensor("x", {2, 3});
    g.output(g.pointwise("act", PointwiseMode::kRelu, "x"));
    return g;
  };
  ASSERT_TRUE(resolve(base()).ok());
  {
    auto g = base();
    g.tensor("x", {2, 3});
    expect_error(g, {"'x'", "twice"});
  }
  {
    auto g = base();
    g.ops.push_back(g.ops[0]);
    g.ops.back().outputs["y"] = "z";
    expect_error(g, {"'act'", "twice"});
  }
  {
    auto g = base();
    g.ops[0].name = "";
    expect_error(g, {"ops[0]", "empty"});
  }
  {
    auto g = base();
    g.ops[0].inputs["bias"] = "x";
    expect_error(g, {"[relu 'act']", "unknown input role 'bias'", "takes inputs x"});
  }
  {
    auto g = base();
    g.ops[0].inputs.clear();
    expect_error(g, {"[relu 'act']", "missing input 'x'"});
  }
  {
    auto g = base();
    g.ops[0].inputs["x"] = "nope";
    expect_error(g, {"[relu 'act']", "'nope'", "neither declared"});
  }
  {
    auto g = base();
    g.pointwise("act2", PointwiseMode::kTanh, "x");
    g.ops.back().outputs["y"] = "act.y";
    expect_error(g, {"'act.y'", "also produced by", "act2"});
  }
  {
    GraphSpec g;
    g.tensor("x", {2, 3});
    OpSpec a{"a", PointwiseAttrs{PointwiseMode::kAdd}, {{"a", "x"}, {"b", "q"}}, {{"y", "p"}}, {}};
    OpSpec b{"b", PointwiseAttrs{PointwiseMode::kRelu}, {{"x", "p"}}, {{"y", "q"}}, {}};
    g.ops = {a, b};
    g.output("p");
    expect_error(g, {"cycle", "'a'", "'b'"});
  }
  {
    GraphSpec g;
    g.tensor("x", {2, 3});
    g.pointwise("act", PointwiseMode::kRelu, "x");
    expect_error(g, {"graph has no output"});
  }
  {
    auto g = base();
    g.tensor("unused", {4});
    expect_error(g, {"'unused'", "no op uses"});
  }
  {
    auto g = base();
    g.tensors[0].dims = {};
    expect_error(g, {"'x'", "no dims"});
  }
  {
    auto g = base();
    g.tensors[0].dims = {2, 3, 1, 1, 1, 1, 1, 1, 1};
    expect_error(g, {"'x'", "rank 9"});
  }
  {
    auto g = base();
    g.tensors[0].dims = {2147483647, 2147483647, 2147483647};
    expect_error(g, {"'x'", "2^62"});
  }
  {
    auto g = base();
    g.tensors[0].strides = {3};
    expect_error(g, {"'x'", "strides"});
  }
  {
    auto g = base();
    g.tensors[0].strides = {0, 1};
    expect_error(g, {"'x'", "stride 0 is 0"});
  }
  {
    auto g = base();
    g.tensors[0].dims = {2, 3, 4, 5};
    g.tensors[0].layout = "nhwc";
    g.tensors[0].strides = {60, 20, 5, 1};
    expect_error(g, {"'x'", "disagree", "nhwc"});
  }
  {
    auto g = base();
    g.tensors[1].dims = {3, 2};
    expect_error(g, {"[relu 'act']", "[3, 2]", "[2, 3]"});
  }
  {
    GraphSpec g;
    g.tensor("x", {2, 3});
    g.output(g.pointwise("act", PointwiseMode::kRelu, "x"));
    g.pointwise("dead", PointwiseMode::kTanh, "x");
    expect_error(g, {"[tanh 'dead']", "virtual", "no op uses"});
  }
}

TEST(Resolve, ExplicitStridesAndDtypes) {
  GraphSpec g;
  g.io_dtype = DType::kFP16;
  g.compute_dtype = DType::kFP32;
  g.tensor("x", {2, 3}, "", DType::kFP32);
  g.tensors.back().strides = {1, 2};
  g.output(g.pointwise("act", PointwiseMode::kSigmoid, "x"));
  g.ops.back().compute_dtype = DType::kFP16;
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& y = r->tensors[r->find_tensor("act.y")];
  EXPECT_EQ(y.strides, V({1, 2}));  // dense, like x (column-major)
  EXPECT_EQ(y.dtype, DType::kFP16);
  EXPECT_EQ(r->tensors[0].dtype, DType::kFP32);
  EXPECT_EQ(r->ops[0].compute_dtype, DType::kFP16);
  EXPECT_EQ(r->tensors[0].storage_elements(), 6);
  EXPECT_EQ(r->tensors[0].storage_bytes(), 24);
}
