// shape_override_between() (src/cudnn/shape_override.cpp, issue 35 part 3): what a plan built for
// one shape of a symbolic graph must be told at execute to serve another shape, and the shapes it
// refuses (served by a build instead). Pure: no cuDNN call, no GPU.
#include "shape_override.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "fusebox/plan.h"
#include "test_util.h"

namespace fusebox::cudnn {
namespace {

ResolvedGraph at(const std::string& json, const ShapeValues& shape) {
  auto spec = parse_graph_json(json);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto bound = bind_shape(*spec, shape);
  EXPECT_TRUE(bound.ok()) << bound.status().ToString();
  auto g = resolve(*bound);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

int64_t uid_of(const ResolvedGraph& g, const std::string& name) { return g.tensors[g.find_tensor(name)].uid; }

// As examples/graphs/matmul_bias_gelu_dyn.json.
const char* kMatmul = R"({"name": "mm_dyn", "io_dtype": "bf16",
  "symbols": {"B": {"min": 1, "max": 64, "default": 4}, "M": {"min": 16, "max": 2048, "default": 512}},
  "tensors": [{"name": "a", "dims": ["B", "M", 256]}, {"name": "w", "dims": [1, 256, 128]},
              {"name": "bias", "dims": [1, 1, 128]}, {"name": "y"}],
  "ops": [{"op": "matmul", "name": "gemm", "inputs": {"a": "a", "b": "w"}, "outputs": {"y": "p"}},
          {"op": "bias_add", "name": "ba", "inputs": {"x": "p", "bias": "bias"}, "outputs": {"y": "q"}},
          {"op": "gelu_tanh", "name": "act", "inputs": {"x": "q"}, "outputs": {"y": "y"}}]})";

TEST(ShapeOverride, OnlyTheTensorsWhoseDimsChangeAreOverriddenWithTheirDenseStrides) {
  const ResolvedGraph built = at(kMatmul, {{"B", 4}, {"M", 512}});
  const ResolvedGraph g = at(kMatmul, {{"B", 2}, {"M", 96}});
  auto o = shape_override_between(built, g);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->uids.size(), 2u);  // a and y; w and bias keep their dims, p and q are virtual
  EXPECT_EQ(o->shapes.size(), 2u);
  EXPECT_EQ(o->strides.size(), 2u);
  for (size_t i = 0; i < o->uids.size(); ++i) {
    const bool is_a = o->uids[i] == uid_of(g, "a");
    ASSERT_TRUE(is_a || o->uids[i] == uid_of(g, "y")) << o->uids[i];
    const int64_t n = is_a ? 256 : 128;
    EXPECT_EQ(o->shapes[i], (std::vector<int64_t>{2, 96, n}));
    EXPECT_EQ(o->strides[i], (std::vector<int64_t>{96 * n, n, 1}));
  }
  // The same shape: nothing to override.
  auto same = shape_override_between(built, at(kMatmul, {{"B", 4}, {"M", 512}}));
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->uids.empty());
}

TEST(ShapeOverride, AnotherGraphIsRefused) {
  const ResolvedGraph built = at(kMatmul, {{"B", 4}, {"M", 512}});
  std::string other = kMatmul;
  other.replace(other.find("gelu_tanh"), 9, "relu");
  auto o = shape_override_between(built, at(other, {{"B", 4}, {"M", 64}}));
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("not the symbolic graph"), std::string::npos) << o.status().message();
  // A graph without symbols never takes an override.
  auto plain = parse_graph_json(R"({"name": "p", "tensors": [{"name": "x", "dims": [4, 8]}, {"name": "y"}],
      "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(plain.ok());
  auto pg = resolve(*plain);
  ASSERT_TRUE(pg.ok());
  EXPECT_FALSE(shape_override_between(*pg, *pg).ok());
}

TEST(ShapeOverride, AnAttributeTakenFromADimRefusesTheShape) {
  // No attn_scale: the default 1/sqrt(D) is resolved from the head dim, a symbol here, and a
  // plan holds the value of the shape it was built for.
  const char* sdpa = R"({"name": "attn_dyn", "io_dtype": "bf16",
    "symbols": {"S": {"min": 16, "max": 512, "default": 128}, "D": {"min": 64, "max": 128, "default": 64}},
    "tensors": [{"name": "q", "dims": [1, 4, "S", "D"]}, {"name": "k", "dims": [1, 4, "S", "D"]},
                {"name": "v", "dims": [1, 4, "S", "D"]}, {"name": "o"}],
    "ops": [{"op": "sdpa_fwd", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v"},
             "outputs": {"o": "o"}}]})";
  const ResolvedGraph built = at(sdpa, {{"S", 128}, {"D", 64}});
  auto other_s = shape_override_between(built, at(sdpa, {{"S", 256}, {"D", 64}}));
  ASSERT_TRUE(other_s.ok()) << other_s.status().ToString();
  EXPECT_EQ(other_s->uids.size(), 4u);
  auto other_d = shape_override_between(built, at(sdpa, {{"S", 128}, {"D", 128}}));
  ASSERT_FALSE(other_d.ok());
  EXPECT_NE(other_d.status().message().find("[sdpa_fwd 'attn'] has other attributes"), std::string::npos)
      << other_d.status().message();
}

TEST(ShapeOverride, FoldedMatmulBatchDimsAreOverriddenAsLowered) {
  // Two batch dims are lowered folded to one (ops/matmul_fold.h): the overrides must be what
  // cuDNN's graph holds, rank 3.
  const char* mm4 = R"({"name": "mm4", "io_dtype": "bf16",
    "symbols": {"B": {"min": 1, "max": 8, "default": 2}},
    "tensors": [{"name": "a", "dims": ["B", 4, 64, 32]}, {"name": "b", "dims": ["B", 4, 32, 48]}, {"name": "y"}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})";
  auto o = shape_override_between(at(mm4, {{"B", 2}}), at(mm4, {{"B", 3}}));
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  ASSERT_EQ(o->uids.size(), 3u);
  for (const auto& dims : o->shapes) {
    ASSERT_EQ(dims.size(), 3u);
    EXPECT_EQ(dims[0], 12);
  }
}

TEST(ShapeOverride, AnOverrideBuildSaysSoAndOnlyItServesOtherShapes) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  // The conv has precompiled engines, which build deviceless (the matmul's are runtime-compiled).
  const char* conv = R"({"name": "conv_dyn", "io_dtype": "bf16", "symbols": {"N": {"min": 1, "max": 64}},
    "tensors": [{"name": "x", "dims": ["N", 64, 28, 28], "layout": "nhwc"},
                {"name": "w", "dims": [64, 64, 3, 3], "layout": "nhwc"},
                {"name": "b", "dims": [1, 64, 1, 1], "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
    "ops": [{"op": "conv_fprop", "name": "conv", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "c"},
             "padding": [1, 1]},
            {"op": "bias_add", "name": "bias", "inputs": {"x": "c", "bias": "b"}, "outputs": {"y": "z"}},
            {"op": "relu", "name": "act", "inputs": {"x": "z"}, "outputs": {"y": "y"}}]})";
  const ResolvedGraph g = at(conv, {{"N", 3}});
  BuildOptions o;
  o.dynamic_shape = true;
  o.override_shapes = true;
  BuildReport rep;
  auto plan = build_plan(g, *target, o, &rep);
  EXPECT_TRUE(rep.override_shapes);
  if (plan.ok()) {
    EXPECT_TRUE(plan->serves_other_shapes());
    EXPECT_FALSE(plan->shape_overridden());
    EXPECT_TRUE(plan->serialize().ok()) << "the override-enabled build is an ordinary plan for its shape";
  } else {
    std::printf("[ note ] deviceless override-enabled build refused: %s\n", plan.status().message().c_str());
  }
  // Without override shapes (or without dynamic shapes) no plan claims other shapes.
  for (bool dynamic : {true, false}) {
    BuildOptions plain;
    plain.dynamic_shape = dynamic;
    plain.override_shapes = !dynamic;
    BuildReport r;
    auto p = build_plan(g, *target, plain, &r);
    EXPECT_FALSE(r.override_shapes);
    if (p.ok()) EXPECT_FALSE(p->serves_other_shapes());
  }
}

}  // namespace
}  // namespace fusebox::cudnn
