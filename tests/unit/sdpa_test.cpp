// sdpa_fwd: layouts, resolve(), JSON, flops and the CPU reference.
#include <gtest/gtest.h>

#include <cmath>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

// resolve() fails with InvalidArgument naming every needle (reference_test_util.h).
constexpr auto expect_error = testing_util::expect_resolve_error;

using testing_util::host_from;

std::vector<int64_t> V(std::initializer_list<int64_t> v) { return v; }

// q [B,Hq,Sq,D], k/v [B,Hk,Skv,D]; o (and stats) declared as graph outputs.
GraphSpec sdpa_graph(std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v,
                     SdpaFwdAttrs attrs, std::string layout = "") {
  GraphSpec g;
  g.name = "attn";
  g.tensor("q", q, layout);
  g.tensor("k", k, layout);
  g.tensor("v", v, layout);
  const std::string o = g.sdpa_fwd("attn", "q", "k", "v", attrs);
  g.output(o, layout);
  if (attrs.generate_stats) g.output("attn.stats");
  return g;
}

TEST(SdpaLayout, BshdStrides) {
  EXPECT_EQ(*layout_strides({4, 16, 8192, 128}, "bshd"), V({16777216, 128, 2048, 1}));
  EXPECT_EQ(*layout_strides({2, 3, 4, 5}, "bhsd"), V({60, 20, 5, 1}));
  EXPECT_FALSE(layout_strides({2, 3, 4}, "bshd").ok());
}

TEST(SdpaResolve, GqaWithStats) {
  SdpaFwdAttrs a;
  a.causal = true;
  a.generate_stats = true;
  auto r = resolve(sdpa_graph({2, 8, 16, 64}, {2, 2, 32, 64}, {2, 2, 32, 32}, a));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = r->tensors[r->find_tensor("attn.o")];
  EXPECT_EQ(o.dims, V({2, 8, 16, 32}));
  EXPECT_EQ(o.dtype, DType::kBF16);
  EXPECT_TRUE(o.is_output);
  const auto& st = r->tensors[r->find_tensor("attn.stats")];
  EXPECT_EQ(st.dims, V({2, 8, 16, 1}));
  EXPECT_EQ(st.strides, V({128, 16, 1, 1}));
  EXPECT_EQ(st.dtype, DType::kFP32);
  ASSERT_EQ(r->ops.size(), 1u);
  EXPECT_EQ(r->ops[0].outputs.size(), 2u);
  const auto& attrs = std::get<SdpaFwdAttrs>(r->ops[0].attrs);
  ASSERT_TRUE(attrs.attn_scale.has_value());
  EXPECT_DOUBLE_EQ(*attrs.attn_scale, 0.125);  // 1/sqrt(64)
  // causal, Sq=16 <= Skv=32: 16*17/2 unmasked pairs; 2*B*Hq*(D+Dv) each
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 2 * 8 * (16 * 17 / 2) * (64 + 32));
  EXPECT_NE(describe(*r).find("causal"), std::string::npos);
}

TEST(SdpaResolve, FlopsNonCausalAndCausalLongQuery) {
  auto r = resolve(sdpa_graph({1, 2, 8, 16}, {1, 2, 8, 16}, {1, 2, 8, 16}, {}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->flops(), 4.0 * 1 * 2 * 8 * 8 * 16);
  SdpaOptions causal;
  causal.causal = true;
  EXPECT_DOUBLE_EQ(sdpa_kept_pairs(causal, 4, 4), 10);
  EXPECT_DOUBLE_EQ(sdpa_kept_pairs(causal, 3, 5), 6);
  EXPECT_DOUBLE_EQ(sdpa_kept_pairs(causal, 5, 3), 1 + 2 + 3 + 3 + 3);
  EXPECT_DOUBLE_EQ(sdpa_kept_pairs(SdpaOptions{}, 5, 3), 15);
}

// sdpa_kept_pairs must agree with counting sdpa_keeps over every (i, j).
TEST(SdpaMask, KeptPairsMatchesKeepsEverywhere) {
  int checked = 0;
  for (int align = 0; align < 2; ++align)
    for (int right = -1; right <= 2; ++right)
      for (int left = 0; left <= 3; ++left)
        for (int64_t lq : {1, 3, 7})
          for (int64_t lkv : {1, 4, 7, 9}) {
            SdpaOptions o;
            o.alignment = align ? SdpaAlignment::kBottomRight : SdpaAlignment::kTopLeft;
            if (right >= 0) o.right_bound = right;
            if (left > 0) o.left_bound = left;
            double count = 0;
            for (int64_t i = 0; i < lq; ++i)
              for (int64_t j = 0; j < lkv; ++j) count += sdpa_keeps(o, i, j, lq, lkv) ? 1 : 0;
            EXPECT_DOUBLE_EQ(sdpa_kept_pairs(o, lq, lkv), count)
                << "align " << align << " right " << right << " left " << left << " lq " << lq << " lkv "
                << lkv;
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 4 * 4 * 3 * 4);
}

// Bottom-right causal with Sq < Skv: the last query row sees every key.
TEST(SdpaMask, BottomRightCausalAndWindow) {
  SdpaOptions o;
  o.causal = true;
  o.alignment = SdpaAlignment::kBottomRight;
  EXPECT_TRUE(sdpa_keeps(o, 1, 4, 2, 5));   // off = 3: row 1 sees j <= 4
  EXPECT_FALSE(sdpa_keeps(o, 0, 4, 2, 5));  // row 0 sees j <= 3
  EXPECT_TRUE(sdpa_keeps(o, 0, 3, 2, 5));
  o.left_bound = 2;  // window of 2 keys ending at the diagonal
  EXPECT_TRUE(sdpa_keeps(o, 1, 3, 2, 5));
  EXPECT_FALSE(sdpa_keeps(o, 1, 2, 2, 5));
  o.padding = true;  // keys past lkv and rows past lq are dropped
  EXPECT_FALSE(sdpa_keeps(o, 2, 3, 2, 5));
}

// The frontend's get_alibi_slope: powers of two, then the odd half-steps.
TEST(SdpaMask, AlibiSlopes) {
  const auto s8 = alibi_slopes(8);
  ASSERT_EQ(s8.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_NEAR(s8[h], std::pow(2.0, -(h + 1.0)), 1e-7);
  const auto s6 = alibi_slopes(6);  // n = 4: 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3
  ASSERT_EQ(s6.size(), 6u);
  EXPECT_NEAR(s6[0], 0.25, 1e-7);
  EXPECT_NEAR(s6[3], std::pow(2.0, -8), 1e-9);
  EXPECT_NEAR(s6[4], 0.5, 1e-7);
  EXPECT_NEAR(s6[5], 0.125, 1e-7);
}

TEST(SdpaResolve, BshdOutputFollowsQ) {
  auto r = resolve(sdpa_graph({2, 4, 8, 16}, {2, 4, 8, 16}, {2, 4, 8, 16}, {}, "bshd"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[r->find_tensor("q")].strides, V({512, 16, 64, 1}));
  EXPECT_EQ(r->tensors[r->find_tensor("attn.o")].strides, V({512, 16, 64, 1}));
  // Undeclared layout on o: like q's stride order.
  GraphSpec g = sdpa_graph({2, 4, 8, 16}, {2, 4, 8, 16}, {2, 4, 8, 16}, {}, "bshd");
  for (auto& t : g.tensors)
    if (t.name == "attn.o") t.layout.clear();
  auto r2 = resolve(g);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_EQ(r2->tensors[r2->find_tensor("attn.o")].strides, V({512, 16, 64, 1}));
}

TEST(SdpaResolve, BadShapesNameOpTensorAndRule) {
  expect_error(sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 32}, {2, 4, 8, 64}, {}),
               {"[sdpa_fwd 'attn']", "'k'", "D=32", "same head dim"});
  expect_error(sdpa_graph({2, 6, 8, 64}, {2, 4, 8, 64}, {2, 4, 8, 64}, {}),
               {"[sdpa_fwd 'attn']", "Hq=6", "Hk=4", "multiple of Hk"});
  expect_error(sdpa_graph({2, 4, 8, 264}, {2, 4, 8, 264}, {2, 4, 8, 264}, {}),
               {"[sdpa_fwd 'attn']", "264", "<= 256", "multiple of 8", "cuDNN 9.19"});
  expect_error(sdpa_graph({2, 4, 8, 12}, {2, 4, 8, 12}, {2, 4, 8, 12}, {}), {"12", "multiple of 8"});
  expect_error(sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 64}, {2, 4, 8, 20}, {}), {"Dv", "20"});
  expect_error(sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 64}, {2, 4, 9, 64}, {}), {"'v'", "Skv=9"});
  expect_error(sdpa_graph({2, 4, 8, 64}, {3, 4, 8, 64}, {3, 4, 8, 64}, {}), {"'k'", "B=3"});
  expect_error(sdpa_graph({4, 8, 64}, {4, 8, 64}, {4, 8, 64}, {}), {"'q'", "rank 3", "[B, Hq, Sq, D]"});
  {
    GraphSpec g = sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 64}, {2, 4, 8, 64}, {});
    for (auto& t : g.tensors) t.dtype = DType::kFP32;
    expect_error(g, {"'q'", "fp32", "bf16 or fp16"});
  }
  {
    // o declared virtual: sdpa writes to memory.
    GraphSpec g;
    g.tensor("q", {2, 4, 8, 64});
    g.tensor("k", {2, 4, 8, 64});
    g.tensor("v", {2, 4, 8, 64});
    const std::string o = g.sdpa_fwd("attn", "q", "k", "v");
    for (auto& t : g.tensors)
      if (t.name == o) t.is_virtual = true;
    expect_error(g, {"[sdpa_fwd 'attn']", "output 'o'", "declare it in 'tensors'"});
  }
  {
    SdpaFwdAttrs a;
    a.generate_stats = true;
    GraphSpec g = sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 64}, {2, 4, 8, 64}, a);
    for (auto& t : g.tensors)
      if (t.name == "attn.stats") t.dtype = DType::kBF16;
    expect_error(g, {"'stats'", "fp32"});
    // stats output named but generate_stats off
    g.ops[0].attrs = SdpaFwdAttrs{};
    expect_error(g, {"outputs must be", "generate_stats is off"});
  }
  {
    GraphSpec g = sdpa_graph({2, 4, 8, 64}, {2, 4, 8, 64}, {2, 4, 8, 64}, {});
    g.tensors[0].strides = {2048, 1, 256, 4};  // head dim not contiguous
    expect_error(g, {"'q'", "last dim", "stride 1"});
  }
}

const char* kSdpaJson = R"({
  "name": "sdpa", "io_dtype": "fp16",
  "tensors": [
    {"name": "q", "dims": [1, 4, 16, 64], "layout": "bshd"},
    {"name": "k", "dims": [1, 1, 32, 64], "layout": "bshd"},
    {"name": "v", "dims": [1, 1, 32, 64], "layout": "bshd"},
    {"name": "o"},
    {"name": "stats"}
  ],
  "ops": [
    {"op": "sdpa_fwd", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v"},
     "outputs": {"o": "o", "stats": "stats"}, "attn_scale": 0.088, "causal": true}
  ]
})";

TEST(SdpaJson, ParsesResolvesAndRoundTrips) {
  auto spec = parse_graph_json(kSdpaJson, "sdpa.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& a = std::get<SdpaFwdAttrs>(spec->ops[0].attrs);
  EXPECT_TRUE(a.causal);
  EXPECT_TRUE(a.generate_stats);
  ASSERT_TRUE(a.attn_scale.has_value());
  EXPECT_DOUBLE_EQ(*a.attn_scale, 0.088);
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[r->find_tensor("o")].dtype, DType::kFP16);
  EXPECT_EQ(r->tensors[r->find_tensor("o")].dims, V({1, 4, 16, 64}));
  EXPECT_EQ(r->tensors[r->find_tensor("stats")].dtype, DType::kFP32);
  EXPECT_EQ(r->output_tensors().size(), 2u);

  auto again = parse_graph_json(graph_to_json(*spec), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(graph_to_json(*again), graph_to_json(*spec));
  const auto& b = std::get<SdpaFwdAttrs>(again->ops[0].attrs);
  EXPECT_TRUE(b.causal && b.generate_stats);

  // Without a stats output, no stats; without attn_scale, 1/sqrt(D) after resolve.
  std::string no_stats = kSdpaJson;
  no_stats.replace(no_stats.find(", \"stats\": \"stats\""), std::string(", \"stats\": \"stats\"").size(), "");
  no_stats.replace(no_stats.find(",\n    {\"name\": \"stats\"}"),
                   std::string(",\n    {\"name\": \"stats\"}").size(), "");
  no_stats.replace(no_stats.find("\"attn_scale\": 0.088, "), std::string("\"attn_scale\": 0.088, ").size(),
                   "");
  auto ns = parse_graph_json(no_stats, "no_stats.json");
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_FALSE(std::get<SdpaFwdAttrs>(ns->ops[0].attrs).generate_stats);
  auto nr = resolve(*ns);
  ASSERT_TRUE(nr.ok()) << nr.status().ToString();
  EXPECT_DOUBLE_EQ(*std::get<SdpaFwdAttrs>(nr->ops[0].attrs).attn_scale, 0.125);
}

TEST(SdpaJson, Errors) {
  std::string bad = kSdpaJson;
  bad.replace(bad.find("\"causal\": true"), std::string("\"causal\": true").size(), "\"causal\": 1");
  auto r = parse_graph_json(bad, "bad.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("causal: expected true or false"), std::string::npos)
      << r.status().message();

  std::string unknown = kSdpaJson;
  unknown.replace(unknown.find("\"causal\": true"), std::string("\"causal\": true").size(),
                  "\"padding\": [1]");
  r = parse_graph_json(unknown, "unknown.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("attn_scale, causal"), std::string::npos) << r.status().message();
}

TEST(SdpaJson, ExamplesResolve) {
  for (const char* f : {"sdpa_fwd_causal.json", "small/sdpa_fwd_small.json", "sdpa_decode.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
    EXPECT_GT(r->flops(), 0);
  }
}

// ---------------------------------------------------------------- CPU reference

// q [1,1,2,1] = (1, 2), k [1,1,2,1] = (1, -1), v [1,1,2,1] = (3, 5), scale 1.
Result<ReferenceOutputs> tiny_sdpa(bool causal) {
  SdpaFwdAttrs a;
  a.attn_scale = 1.0;
  a.causal = causal;
  a.generate_stats = true;
  // D=1 is below what resolve() accepts (cuDNN's limits); the reference runs on
  // a hand-made resolved graph. fp16: 1, 2, -1, 3, 5 are exact.
  ResolvedGraph r;
  r.name = "tiny";
  for (const char* n : {"q", "k", "v"}) {
    ResolvedTensor t;
    t.name = n;
    t.dims = {1, 1, 2, 1};
    t.strides = {2, 2, 1, 1};
    t.dtype = DType::kFP16;
    t.is_input = true;
    r.tensors.push_back(t);
  }
  ResolvedTensor o = r.tensors[0], st = r.tensors[0];
  o.name = "o", o.is_input = false, o.is_output = true;
  st.name = "stats", st.is_input = false, st.is_output = true, st.dtype = DType::kFP32;
  r.tensors.push_back(o);
  r.tensors.push_back(st);
  ResolvedOp op;
  op.name = "attn";
  op.attrs = a;
  op.inputs = {{"q", 0}, {"k", 1}, {"v", 2}};
  op.outputs = {{"o", 3}, {"stats", 4}};
  r.ops.push_back(op);
  std::map<std::string, HostTensor> in = {{"q", host_from(r.tensors[0], {1, 2})},
                                          {"k", host_from(r.tensors[1], {1, -1})},
                                          {"v", host_from(r.tensors[2], {3, 5})}};
  return reference_cpu(r, in);
}

TEST(SdpaReferenceCpu, TinyByHand) {
  const double e = std::exp(1.0);
  auto r = tiny_sdpa(false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = r->at("o");
  const auto& st = r->at("stats");
  ASSERT_EQ(o.size(), 2u);
  ASSERT_EQ(st.size(), 2u);
  // row 0: scores (1, -1); row 1: scores (2, -2)
  EXPECT_NEAR(o[0], (3 * e + 5 / e) / (e + 1 / e), 1e-6);
  EXPECT_NEAR(o[1], (3 * e * e + 5 / (e * e)) / (e * e + 1 / (e * e)), 1e-6);
  EXPECT_NEAR(st[0], std::log(e + 1 / e), 1e-6);
  EXPECT_NEAR(st[1], std::log(e * e + 1 / (e * e)), 1e-6);
}

TEST(SdpaReferenceCpu, TinyCausalMasksTheFuture) {
  const double e = std::exp(1.0);
  auto r = tiny_sdpa(true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const auto& o = r->at("o");
  const auto& st = r->at("stats");
  // row 0 sees key 0 only: o = v0, stats = its score
  EXPECT_NEAR(o[0], 3.0, 1e-6);
  EXPECT_NEAR(st[0], 1.0, 1e-6);
  // row 1 sees both keys
  EXPECT_NEAR(o[1], (3 * e * e + 5 / (e * e)) / (e * e + 1 / (e * e)), 1e-6);
  EXPECT_NEAR(st[1], std::log(e * e + 1 / (e * e)), 1e-6);
}

// GQA: q heads read kv head h / (Hq/Hk); the same as MHA with k/v heads repeated.
// Also bshd inputs give the same values as bhsd ones.
TEST(SdpaReferenceCpu, GqaMatchesRepeatedKvAndLayoutsAgree) {
  const int64_t B = 2, Hq = 4, Hk = 2, S = 5, D = 8;
  SdpaFwdAttrs a;
  a.causal = true;
  a.generate_stats = true;
  auto gqa = resolve(sdpa_graph({B, Hq, S, D}, {B, Hk, S, D}, {B, Hk, S, D}, a));
  auto mha = resolve(sdpa_graph({B, Hq, S, D}, {B, Hq, S, D}, {B, Hq, S, D}, a));
  auto bshd = resolve(sdpa_graph({B, Hq, S, D}, {B, Hk, S, D}, {B, Hk, S, D}, a, "bshd"));
  ASSERT_TRUE(gqa.ok() && mha.ok() && bshd.ok());
  std::vector<double> q(B * Hq * S * D), kv(B * Hk * S * D), vv(B * Hk * S * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37 * i);
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::cos(0.23 * i), vv[i] = std::sin(0.11 * i + 1);
  // repeat kv heads: head h of the MHA graph is head h / 2 of the GQA one
  std::vector<double> k_rep, v_rep;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < S * D; ++i) {
        const size_t src = ((b * Hk + h / (Hq / Hk)) * S * D) + i;
        k_rep.push_back(kv[src]);
        v_rep.push_back(vv[src]);
      }
  auto run = [&](const ResolvedGraph& g, const std::vector<double>& k, const std::vector<double>& v) {
    std::map<std::string, HostTensor> in = {{"q", host_from(g.tensors[g.find_tensor("q")], q)},
                                            {"k", host_from(g.tensors[g.find_tensor("k")], k)},
                                            {"v", host_from(g.tensors[g.find_tensor("v")], v)}};
    auto r = reference_cpu(g, in);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : ReferenceOutputs{};
  };
  const ReferenceOutputs rg = run(*gqa, kv, vv), rm = run(*mha, k_rep, v_rep), rb = run(*bshd, kv, vv);
  ASSERT_EQ(rg.size(), 2u);
  EXPECT_EQ(rg.at("attn.o"), rm.at("attn.o"));
  EXPECT_EQ(rg.at("attn.stats"), rm.at("attn.stats"));
  EXPECT_EQ(rg.at("attn.o"), rb.at("attn.o"));
  EXPECT_EQ(rg.at("attn.stats"), rb.at("attn.stats"));
  // Causal: query row 0 of every head equals v row 0 of its kv head (bf16-rounded).
  const auto& o = rg.at("attn.o");
  for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(o[d], vv[d], 1e-2);
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// A backward graph through the C++ builder: q [2,4,16,64], k/v [2,2,16,64].
GraphSpec bwd_graph(SdpaBwdAttrs attrs = {}, std::vector<int64_t> o_dims = {2, 4, 16, 64}) {
  GraphSpec g;
  g.name = "bwd";
  g.tensor("q", {2, 4, 16, 64});
  g.tensor("k", {2, 2, 16, 64});
  g.tensor("v", {2, 2, 16, 64});
  g.tensor("o", o_dims);
  g.tensor("do", {2, 4, 16, 64});
  g.tensor("stats", {2, 4, 16, 1}, "", DType::kFP32);
  g.sdpa_bwd("attn_bwd", "q", "k", "v", "o", "do", "stats", attrs);
  return g;
}

TEST(SdpaBwdResolve, GradientsLikeInputsAndFlops) {
  SdpaBwdAttrs a;
  a.causal = true;
  auto r = resolve(bwd_graph(a));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[r->find_tensor("attn_bwd.dq")].dims, V({2, 4, 16, 64}));
  EXPECT_EQ(r->tensors[r->find_tensor("attn_bwd.dk")].dims, V({2, 2, 16, 64}));
  EXPECT_EQ(r->tensors[r->find_tensor("attn_bwd.dv")].dtype, DType::kBF16);
  // 2.5x the forward: 2*B*Hq*(D+Dv) per kept pair, causal 16*17/2 pairs.
  EXPECT_DOUBLE_EQ(r->flops(), 2.5 * 2.0 * 2 * 4 * (16 * 17 / 2) * (64 + 64));
  // causal becomes right_bound 0
  EXPECT_EQ(std::get<SdpaBwdAttrs>(r->ops[0].attrs).right_bound, 0);
}

TEST(SdpaBwdResolve, BadInputsNameTheRole) {
  expect_error(bwd_graph({}, {2, 4, 16, 32}), {"[sdpa_bwd 'attn_bwd']", "'o'", "[B, Hq, Sq, Dv]"});
  GraphSpec g = bwd_graph();
  for (auto& t : g.tensors)
    if (t.name == "stats") t.dtype = DType::kBF16;
  expect_error(g, {"'stats'", "fp32"});
}

TEST(SdpaOptionsResolve, RejectsImpossibleOptions) {
  SdpaFwdAttrs a;
  a.left_bound = 0;
  expect_error(sdpa_graph({1, 2, 8, 64}, {1, 2, 8, 64}, {1, 2, 8, 64}, a), {"left_bound", "at least 1"});
  a = {};
  a.causal = true;
  a.right_bound = 3;
  expect_error(sdpa_graph({1, 2, 8, 64}, {1, 2, 8, 64}, {1, 2, 8, 64}, a), {"causal", "right_bound 3"});
  a = {};
  a.dropout = 1.0;
  GraphSpec g = sdpa_graph({1, 2, 8, 64}, {1, 2, 8, 64}, {1, 2, 8, 64}, a);
  g.tensor("seed", {1, 1, 1, 1}, "", DType::kInt64);
  g.tensor("offset", {1, 1, 1, 1}, "", DType::kInt64);
  g.ops[0].inputs["seed"] = "seed";
  g.ops[0].inputs["offset"] = "offset";
  expect_error(g, {"dropout", "[0, 1)"});
  a = {};
  a.alibi = true;
  expect_error(sdpa_graph({1, 2, 8, 64}, {1, 2, 8, 64}, {1, 2, 8, 64}, a), {"alibi", "causal"});
}

TEST(SdpaOptionsResolve, PaddingLengthsAndValues) {
  GraphSpec g;
  g.tensor("q", {2, 4, 16, 64});
  g.tensor("k", {2, 4, 24, 64});
  g.tensor("v", {2, 4, 24, 64});
  g.tensor("lq", {2, 1, 1, 1}, "", DType::kInt32);
  g.tensor("lkv", {2, 1, 1, 1}, "", DType::kInt32);
  g.tensors.back().values = {24, 5};
  g.tensors[3].values = {16, 3};
  g.sdpa_fwd("attn", "q", "k", "v", {}, {{"seq_len_q", "lq"}, {"seq_len_kv", "lkv"}});
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(std::get<SdpaFwdAttrs>(r->ops[0].attrs).padding);
  // The lengths come from the fixed values: 16*24 + 3*5 pairs per head.
  EXPECT_DOUBLE_EQ(r->flops(), 2.0 * 4 * (16 * 24 + 3 * 5) * (64 + 64));
  EXPECT_EQ(r->tensors[r->find_tensor("lq")].random_hi, 16);
  EXPECT_EQ(r->tensors[r->find_tensor("lkv")].random_hi, 24);
  // Lengths from the run's inputs win over fixed values.
  EXPECT_DOUBLE_EQ(r->flops({{"lq", {1, 1}}, {"lkv", {1, 1}}}), 2.0 * 4 * 2 * (64 + 64));
  g.tensors[3].values = {16};
  expect_error(g, {"'lq'", "1 values", "hold 2"});
  g.tensors[3].values = {17, 3};
  expect_error(g, {"'seq_len_q'", "17", "[0, 16]"});
}

TEST(SdpaJson, NewOptionsRoundTrip) {
  const char* text = R"({
    "name": "x", "io_dtype": "bf16",
    "tensors": [
      {"name": "q", "dims": [1, 2, 8, 64]}, {"name": "k", "dims": [1, 2, 8, 64]},
      {"name": "v", "dims": [1, 2, 8, 64]}, {"name": "o", "dims": [1, 2, 8, 64]},
      {"name": "do", "dims": [1, 2, 8, 64]}, {"name": "stats", "dims": [1, 2, 8, 1], "dtype": "fp32"},
      {"name": "seed", "dims": [1, 1, 1, 1], "dtype": "int64", "values": [7]},
      {"name": "offset", "dims": [1, 1, 1, 1], "dtype": "int64", "values": [0]},
      {"name": "dq"}, {"name": "dk"}, {"name": "dv"}, {"name": "mask", "dtype": "fp32"}
    ],
    "ops": [{"op": "sdpa_bwd", "name": "b",
             "inputs": {"q": "q", "k": "k", "v": "v", "o": "o", "do": "do", "stats": "stats",
                        "seed": "seed", "offset": "offset"},
             "outputs": {"dq": "dq", "dk": "dk", "dv": "dv", "dropout_mask": "mask"},
             "alignment": "bottom_right", "left_bound": 4, "right_bound": 1, "dropout": 0.25,
             "deterministic": true}]
  })";
  auto spec = parse_graph_json(text);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& a = std::get<SdpaBwdAttrs>(spec->ops[0].attrs);
  EXPECT_EQ(a.alignment, SdpaAlignment::kBottomRight);
  EXPECT_EQ(a.left_bound, 4);
  EXPECT_EQ(a.right_bound, 1);
  EXPECT_EQ(a.dropout, 0.25);
  EXPECT_TRUE(a.dump_dropout_mask);
  EXPECT_TRUE(a.deterministic);
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors[r->find_tensor("mask")].dims, V({1, 2, 8, 8}));
  EXPECT_EQ(r->tensors[r->find_tensor("seed")].values, std::vector<double>{7});
  auto again = parse_graph_json(graph_to_json(*spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto r2 = resolve(*again);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(describe(*r2), describe(*r));
  // "deterministic" belongs to sdpa_bwd only; a bad alignment names the choices.
  std::string fwd = R"({"name": "y", "tensors": [{"name": "q", "dims": [1, 2, 8, 64]},
    {"name": "k", "dims": [1, 2, 8, 64]}, {"name": "v", "dims": [1, 2, 8, 64]}, {"name": "o"}],
    "ops": [{"op": "sdpa_fwd", "name": "f", "inputs": {"q": "q", "k": "k", "v": "v"}, "outputs": {"o": "o"},
             "deterministic": true}]})";
  auto bad = parse_graph_json(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("only sdpa_bwd"), std::string::npos) << bad.status().message();
  const std::string key = "\"deterministic\": true";
  fwd.replace(fwd.find(key), key.size(), "\"alignment\": \"diagonal\"");
  bad = parse_graph_json(fwd);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bottom_right"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace fusebox
