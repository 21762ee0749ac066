// fusebox's engine rules (src/cudnn/engine_rules.cpp): each applies to the
// pattern of its evidence case and not to the same graph in the layout or
// dtype the rule asks for (which the H200 ran right, 2026-12-04).
#include "engine_rules.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace fusebox::cudnn {
namespace {

GraphSpec load_spec(const std::string& rel) {
  auto spec = load_graph_file(testing::source_dir() + "/" + rel);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

std::vector<std::string> rules_for(const GraphSpec& spec) {
  auto g = resolve(spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  std::vector<std::string> names;
  if (g.ok()) {
    for (const auto& b : engine_bars_for(*g)) names.push_back(b.rule + ":" + b.pattern);
  }
  return names;
}

TensorSpec& tensor(GraphSpec& s, const std::string& name) {
  for (auto& t : s.tensors) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return s.tensors[0];
}

TEST(EngineRules, LayernormParamsInAnotherLayoutThanX) {
  GraphSpec s = load_spec("tests/cases/wrong-values/layernorm_fp16_over_chw_nhwc.json");
  EXPECT_EQ(rules_for(s), std::vector<std::string>{"layernorm-params-in-x-layout:eng1"});
  tensor(s, "scale").layout = "nhwc";
  tensor(s, "bias").layout = "nhwc";
  EXPECT_TRUE(rules_for(s).empty());  // y in another layout is fine (the H200 ran it right)
  // A [B,S,H] layernorm with [1,1,H] parameters spans one dim: no layout to disagree on.
  EXPECT_TRUE(rules_for(load_spec("examples/graphs/small/layernorm_bsh_small.json")).empty());
}

TEST(EngineRules, BatchnormBwdDxInAnotherDtypeThanX) {
  GraphSpec s = load_spec("tests/cases/wrong-values/batchnorm_bwd_fp16_fp32params_nhwc.json");
  EXPECT_EQ(rules_for(s), std::vector<std::string>{"batchnorm-bwd-dx-in-x-dtype:eng0"});
  tensor(s, "dx").dtype = DType::kFP16;
  EXPECT_TRUE(rules_for(s).empty());
}

TEST(EngineRules, DgradDreluWithANonChannelsLastOutput) {
  GraphSpec s = load_spec("tests/cases/wrong-values/conv_dgrad_drelu_fp16_nhwc_stride2.json");
  EXPECT_EQ(rules_for(s), std::vector<std::string>{"dgrad-drelu-channels-last-output:eng8"});
  tensor(s, "dz").layout = "nhwc";
  EXPECT_TRUE(rules_for(s).empty());
}

TEST(EngineRules, SdpaFp8BwdWithAQueryLengthNotAMultipleOf64) {
  for (const char* c : {"tests/cases/wrong-values/sdpa_fp8_bwd_s100.json",
                        "tests/cases/wrong-values/sdpa_fp8_bwd_gqa_s100.json",
                        "tests/cases/wrong-values/sdpa_fp8_bwd_causal_sq100_skv256.json"}) {
    GraphSpec s = load_spec(c);
    EXPECT_EQ(rules_for(s), std::vector<std::string>{"sdpa-fp8-bwd-ragged-sq:eng6"}) << c;
  }
  // Sq a multiple of 64 (every example; the sweep's seven such graphs ran right).
  EXPECT_TRUE(rules_for(load_spec("examples/graphs/small/sdpa_fp8_bwd_small.json")).empty());
}

TEST(EngineRules, PointwiseAloneBroadcastingOverTwoDims) {
  GraphSpec s = load_spec("tests/cases/wrong-values/pointwise_bias_over_two_dims.json");
  EXPECT_EQ(rules_for(s), std::vector<std::string>{"pointwise-broadcast-over-two-dims:eng1"});
  // Over one dim of size > 1 (x [2,8,27] + [1,8,27] or [2,1,27]): right on the H100.
  tensor(s, "in4").dims = {2, 8, 1};
  tensor(s, "in9").dims = {2, 1, 27};
  EXPECT_TRUE(rules_for(s).empty());
  // x [1,16,27] + [1,1,27]: the size-1 dim of x is no broadcast.
  tensor(s, "x").dims = {1, 16, 27};
  tensor(s, "in4").dims = {1, 1, 27};
  tensor(s, "in9").dims = {1, 1, 27};
  EXPECT_TRUE(rules_for(s).empty());
  // Rank 2, a broadcast: eng1 gets it wrong, but the lowering folds it to rank 3 with one broadcast
  // dim (ops/pointwise_fold.h), so no bar.
  tensor(s, "x").dims = {16, 27};
  tensor(s, "in4").dims = {16, 27};
  tensor(s, "in9").dims = {1, 27};
  EXPECT_TRUE(rules_for(s).empty());
  // b [1, 8, 1] over [2, 8, 27]: two broadcast dims apart, no fold.
  tensor(s, "x").dims = {2, 8, 27};
  tensor(s, "in4").dims = {2, 8, 27};
  tensor(s, "in9").dims = {1, 8, 1};
  EXPECT_EQ(rules_for(s), std::vector<std::string>{"pointwise-broadcast-over-two-dims:eng1"});
}

TEST(EngineRules, AMatmulEpilogueBiasIsNoPointwiseOnlyGraph) {
  // A matmul's [1,1,N] bias runs right in its epilogue (every matmul example and sweep graph).
  for (const auto& path : testing::example_graphs()) {
    if (path.find("matmul_bias") == std::string::npos) continue;
    auto spec = load_graph_file(path);
    ASSERT_TRUE(spec.ok()) << path;
    EXPECT_TRUE(rules_for(*spec).empty()) << path;
  }
}

TEST(EngineRules, MaxPoolBarsEng3OnlyInADynamicShapeBuild) {
  GraphSpec s = load_spec("tests/rules/max_pool_dynamic_fp16_nhwc.json");
  auto bound = bind_shape(s, {{"N", 4}});
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  auto g = resolve(*bound);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  std::vector<std::string> dynamic, fixed;
  for (const auto& b : engine_bars_for(*g, true)) dynamic.push_back(b.rule + ":" + b.pattern);
  for (const auto& b : engine_bars_for(*g, false)) fixed.push_back(b.rule + ":" + b.pattern);
  EXPECT_EQ(dynamic, std::vector<std::string>{"max-pool-dynamic-shape:eng3"});
  EXPECT_TRUE(fixed.empty());
  std::string why;
  EXPECT_TRUE(engine_barred("eng3_k24=0", engine_bars_for(*g, true), {}, &why));
  EXPECT_NE(why.find("cudaErrorMisalignedAddress"), std::string::npos) << why;
  EXPECT_FALSE(engine_barred("eng30", engine_bars_for(*g, true), {}, nullptr));
}

TEST(EngineRules, NoRuleForTheExamples) {
  for (const auto& path : testing::example_graphs()) {
    auto spec = load_graph_file(path);
    ASSERT_TRUE(spec.ok()) << path;
    auto g = resolve(*spec);
    if (!g.ok()) continue;  // symbolic examples resolve at a shape elsewhere
    EXPECT_TRUE(engine_bars_for(*g).empty()) << path;
  }
}

TEST(EngineRules, BarredNamesAndExclusions) {
  const std::vector<EngineBar> bars = {{"r", "eng8", "why"}};
  std::string why;
  EXPECT_TRUE(engine_barred("eng8", bars, {}, &why));
  EXPECT_NE(why.find("fusebox rule 'r'"), std::string::npos);
  EXPECT_TRUE(engine_barred("eng8_k2=1", bars, {}, &why));
  EXPECT_FALSE(engine_barred("eng80", bars, {}, &why));
  EXPECT_FALSE(engine_barred("eng1_k24=8", bars, {}, &why));
  EXPECT_TRUE(engine_barred("eng1_k24=8", {}, {"eng1_k24=8"}, &why));
  EXPECT_EQ(why, "failed the plan check earlier");
  EXPECT_FALSE(engine_barred("eng1_k24=80", {}, {"eng1_k24=8"}, &why));  // exclusions are exact names
}

}  // namespace
}  // namespace fusebox::cudnn
