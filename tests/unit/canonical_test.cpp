// The canonical form and fingerprint (src/graph/canonical.cpp): exact
// numbers, independent of names and declaration order, versioned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "fusebox/graph.h"

using namespace fusebox;

namespace {

ResolvedGraph must_resolve(const GraphSpec& spec) {
  auto r = resolve(spec);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ResolvedGraph{};
}

// y = relu(conv(x, w) + b) * s with a by-value scale s.
GraphSpec conv_scale(double scale) {
  GraphSpec g;
  g.name = "conv_scale";
  g.tensor("x", {2, 8, 6, 6}, "nhwc");
  g.tensor("w", {8, 8, 3, 3}, "nhwc");
  g.tensor("b", {1, 8, 1, 1}, "nhwc");
  g.scalar("s", scale);
  std::string c = g.conv_fprop("conv", "x", "w", ConvFpropAttrs{{1, 1}, {1, 1}, {1, 1}});
  std::string a = g.pointwise("bias", PointwiseMode::kBiasAdd, c, "b");
  std::string r = g.pointwise("act", PointwiseMode::kRelu, a);
  std::string y = g.pointwise("scale", PointwiseMode::kScale, r, "s");
  g.output(y, "nhwc");
  return g;
}

GraphSpec sdpa(double attn_scale) {
  GraphSpec g;
  g.name = "sdpa";
  g.tensor("q", {1, 2, 16, 64}, "bhsd");
  g.tensor("k", {1, 2, 16, 64}, "bhsd");
  g.tensor("v", {1, 2, 16, 64}, "bhsd");
  SdpaFwdAttrs a;
  a.attn_scale = attn_scale;
  a.causal = true;
  g.sdpa_fwd("attn", "q", "k", "v", a);
  return g;
}

}  // namespace

TEST(CanonicalForm, IsVersionedAndExact) {
  ResolvedGraph g = must_resolve(conv_scale(0.1));
  const std::string c = canonical_form(g);
  EXPECT_EQ(c.rfind("fusebox-canonical-form=" + std::to_string(kCanonicalFormVersion) + "\n", 0), 0u) << c;
  // 0.1 printed exactly (shortest round trip), not as 0.100000.
  EXPECT_NE(c.find("value=0.1"), std::string::npos) << c;
  EXPECT_EQ(c, g.canonical);  // computed once by resolve()
  EXPECT_EQ(graph_fingerprint(g).size(), 16u);
}

TEST(CanonicalForm, LastBitOfAScalarChangesTheFingerprint) {
  const double s = 0.123456789;
  const double s_next = std::nextafter(s, 1.0);
  ASSERT_NE(s, s_next);
  ResolvedGraph a = must_resolve(conv_scale(s));
  ResolvedGraph b = must_resolve(conv_scale(s_next));
  EXPECT_NE(graph_fingerprint(a), graph_fingerprint(b));
  // describe() rounds to 6 digits and cannot tell them apart: the form must.
  EXPECT_EQ(describe(a), describe(b));
}

TEST(CanonicalForm, LastBitOfAttnScaleChangesTheFingerprint) {
  const double s = 0.125;
  ResolvedGraph a = must_resolve(sdpa(s));
  ResolvedGraph b = must_resolve(sdpa(std::nextafter(s, 1.0)));
  EXPECT_NE(graph_fingerprint(a), graph_fingerprint(b));
  // The default scale, 1/sqrt(D), is the same graph as writing it out.
  GraphSpec d = sdpa(0);
  std::get<SdpaFwdAttrs>(d.ops[0].attrs).attn_scale.reset();
  EXPECT_EQ(graph_fingerprint(must_resolve(d)), graph_fingerprint(must_resolve(sdpa(1.0 / std::sqrt(64.0)))));
}

TEST(CanonicalForm, OrderAndNamesDoNotMatter) {
  const GraphSpec base = conv_scale(0.5);
  ResolvedGraph a = must_resolve(base);
  // Reverse tensors and ops, rename the graph, the ops and the virtual tensors.
  GraphSpec other = base;
  other.name = "renamed";
  std::reverse(other.tensors.begin(), other.tensors.end());
  std::reverse(other.ops.begin(), other.ops.end());
  std::map<std::string, std::string> rename;
  for (auto& op : other.ops) {
    op.name = "op_" + op.name + "_x";
    for (auto& [role, out] : op.outputs) {
      bool declared = false;
      for (const auto& t : other.tensors) declared = declared || t.name == out;
      if (!declared) rename[out] = "tmp_" + out;
    }
  }
  for (auto& op : other.ops) {
    for (auto& [role, name] : op.inputs)
      if (rename.count(name)) name = rename[name];
    for (auto& [role, name] : op.outputs)
      if (rename.count(name)) name = rename[name];
  }
  ResolvedGraph b = must_resolve(other);
  EXPECT_EQ(canonical_form(a), canonical_form(b));
  EXPECT_EQ(graph_fingerprint(a), graph_fingerprint(b));
  // Equal forms bind alike: every non-virtual tensor has the same uid in both.
  for (const auto& t : a.tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    const int j = b.find_tensor(t.name);
    ASSERT_GE(j, 0) << t.name;
    EXPECT_EQ(t.uid, b.tensors[j].uid) << t.name;
    EXPECT_GT(t.uid, 0) << t.name;
  }
}

TEST(CanonicalForm, ShuffledExamplesKeepTheirFingerprint) {
  namespace fs = std::filesystem;
  std::mt19937 rng(7);
  int checked = 0;
  for (const auto& dir : {fs::path(FUSEBOX_SOURCE_DIR) / "examples/graphs",
                          fs::path(FUSEBOX_SOURCE_DIR) / "examples/graphs/small"}) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json" || e.path().filename().string().rfind("invalid_", 0) == 0) continue;
      auto spec = load_graph_file(e.path().string());
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      ResolvedGraph a = must_resolve(*spec);
      for (int trial = 0; trial < 3; ++trial) {
        GraphSpec s = *spec;
        std::shuffle(s.tensors.begin(), s.tensors.end(), rng);
        std::shuffle(s.ops.begin(), s.ops.end(), rng);
        ResolvedGraph b = must_resolve(s);
        EXPECT_EQ(graph_fingerprint(a), graph_fingerprint(b)) << e.path();
        // Graph outputs come out in the same canonical op order.
        ASSERT_EQ(a.ops.size(), b.ops.size());
        for (size_t i = 0; i < a.ops.size(); ++i) EXPECT_EQ(a.ops[i].name, b.ops[i].name) << e.path();
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

TEST(CanonicalForm, WhatChangesThePlanChangesTheFingerprint) {
  const std::string base = graph_fingerprint(must_resolve(conv_scale(0.5)));
  {  // a dim
    GraphSpec g = conv_scale(0.5);
    g.tensors[0].dims = {4, 8, 6, 6};
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
  {  // a layout
    GraphSpec g = conv_scale(0.5);
    g.tensors[0].layout = "nchw";
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
  {  // a dtype
    GraphSpec g = conv_scale(0.5);
    g.io_dtype = DType::kFP16;
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
  {  // an attribute
    GraphSpec g = conv_scale(0.5);
    std::get<ConvFpropAttrs>(g.ops[0].attrs).padding = {0, 0};
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
  {  // an op's compute dtype
    GraphSpec g = conv_scale(0.5);
    g.ops[1].compute_dtype = DType::kFP16;
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
  {  // the activation
    GraphSpec g = conv_scale(0.5);
    g.ops[2].attrs = PointwiseAttrs{PointwiseMode::kTanh};
    EXPECT_NE(graph_fingerprint(must_resolve(g)), base);
  }
}

TEST(CanonicalForm, SwappedInputsOfANonCommutativeOpDiffer) {
  auto sub = [](bool swap) {
    GraphSpec g;
    g.tensor("a", {1, 4, 4}, "", DType::kFP32);
    g.tensor("b", {1, 4, 4}, "", DType::kFP16);
    std::string y = swap ? g.pointwise("s", PointwiseMode::kSub, "b", "a")
                         : g.pointwise("s", PointwiseMode::kSub, "a", "b");
    g.output(y);
    return g;
  };
  EXPECT_NE(graph_fingerprint(must_resolve(sub(false))), graph_fingerprint(must_resolve(sub(true))));
}
