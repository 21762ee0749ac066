// Norm ops (layernorm, rmsnorm and their backward ops): resolve() rules and errors, JSON, canonical form, and
// the CPU reference against hand-computed values and invariants.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

// resolve() fails with InvalidArgument naming every needle (reference_test_util.h).
constexpr auto expect_error = testing_util::expect_resolve_error;

using testing_util::host_from;

std::vector<int64_t> V(std::initializer_list<int64_t> v) { return v; }

struct NormGraph {
  std::vector<int64_t> x = {8, 16, 1, 1}, scale = {1, 16, 1, 1};
  std::string layout = "nhwc";
  bool training = false;
  double epsilon = 1e-5;
  DType stats_dtype = DType::kFP32;
  bool stats_virtual = false;
  bool only_mean = false;  // name "mean" without "inv_variance"
  bool rms = false;        // rmsnorm (no "mean" output)
  bool bias = true;        // rmsnorm: whether it has a bias
};

GraphSpec layernorm_graph(const NormGraph& p) {
  GraphSpec g;
  g.name = "ln";
  const std::string lay = p.x.size() == 4 ? p.layout : "";
  g.tensor("x", p.x, lay);
  g.tensor("scale", p.scale, lay, DType::kFP32);
  if (p.bias) g.tensor("bias", p.scale, lay, DType::kFP32);
  OpSpec op;
  op.name = "ln";
  const NormPhase phase = p.training ? NormPhase::kTraining : NormPhase::kInference;
  if (p.rms) {
    op.attrs = RmsNormAttrs{p.epsilon, phase, p.bias};
  } else {
    op.attrs = LayerNormAttrs{p.epsilon, phase};
  }
  op.inputs = {{"x", "x"}, {"scale", "scale"}};
  if (p.bias) op.inputs["bias"] = "bias";
  op.outputs = {{"y", "y"}};
  g.output("y", lay);
  if ((p.training && !p.rms) || p.only_mean) {
    op.outputs["mean"] = "mean";
    TensorSpec m;
    m.name = "mean";
    m.dtype = p.stats_dtype;
    m.is_virtual = p.stats_virtual;
    g.tensors.push_back(m);
  }
  if (p.training) {
    op.outputs["inv_variance"] = "inv_variance";
    TensorSpec iv;
    iv.name = "inv_variance";
    iv.dtype = p.stats_dtype;
    iv.is_virtual = p.stats_virtual;
    g.tensors.push_back(iv);
  }
  g.ops.push_back(op);
  return g;
}

const ResolvedTensor& T(const ResolvedGraph& g, const std::string& name) {
  return g.tensors[g.find_tensor(name)];
}

TEST(NormRowDims, TrailingDimsOnly) {
  EXPECT_EQ(norm_row_dims({8192, 4096, 1, 1}, {1, 4096, 1, 1}), 1);
  EXPECT_EQ(norm_row_dims({4, 32, 64}, {1, 1, 64}), 2);
  EXPECT_EQ(norm_row_dims({4, 32, 64}, {1, 32, 64}), 1);
  EXPECT_EQ(norm_row_dims({4, 32, 64}, {1, 32, 1}), -1);   // not trailing
  EXPECT_EQ(norm_row_dims({4, 32, 64}, {4, 32, 64}), -1);  // the first dim is a row dim
  EXPECT_EQ(norm_row_dims({4, 32, 64}, {1, 64}), -1);      // ranks differ
  EXPECT_EQ(norm_row_dims({4}, {1}), -1);                  // rank 1 has nothing to normalize
}

TEST(LayerNormResolve, InferenceAndTraining) {
  NormGraph p;
  auto r = resolve(layernorm_graph(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({8, 16, 1, 1}));
  EXPECT_EQ(T(*r, "y").strides, T(*r, "x").strides);
  EXPECT_EQ(T(*r, "y").dtype, DType::kBF16);
  EXPECT_EQ(r->output_tensors().size(), 1u);
  EXPECT_DOUBLE_EQ(r->flops(), 8.0 * 8 * 16);
  // Random gains near 1.
  EXPECT_EQ(T(*r, "scale").random_lo, 0.5);
  EXPECT_EQ(T(*r, "scale").random_hi, 1.5);

  p.training = true;
  auto t = resolve(layernorm_graph(p));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  for (const char* s : {"mean", "inv_variance"}) {
    EXPECT_EQ(T(*t, s).dims, V({8, 1, 1, 1})) << s;
    EXPECT_EQ(T(*t, s).dtype, DType::kFP32) << s;
    EXPECT_TRUE(T(*t, s).is_output) << s;
  }
  EXPECT_NE(describe(*t).find("epsilon 1e-05, training"), std::string::npos) << describe(*t);
  const std::string j = op_resolved_attrs_json(*t, t->ops[0]);
  EXPECT_NE(j.find("\"phase\":\"training\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"normalized_dims\":[1,2,3]"), std::string::npos) << j;
  EXPECT_NE(graph_fingerprint(*r), graph_fingerprint(*t));  // the phase is part of the plan
}

TEST(LayerNormResolve, RankThreeOverTheLastDim) {
  NormGraph p;
  p.x = {2, 5, 32};
  p.scale = {1, 1, 32};
  p.training = true;
  auto r = resolve(layernorm_graph(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "mean").dims, V({2, 5, 1}));
  EXPECT_EQ(T(*r, "mean").strides, V({5, 1, 1}));
  EXPECT_NE(op_resolved_attrs_json(*r, r->ops[0]).find("\"normalized_dims\":[2]"), std::string::npos);
}

TEST(LayerNormResolve, ErrorsNameOpTensorAndWhatIsAccepted) {
  NormGraph p;
  p.x = {8192, 4096, 1, 1};
  p.scale = {1, 4000, 1, 1};
  expect_error(layernorm_graph(p), {"[layernorm 'ln'] input 'scale' ('scale') has dims [1, 4000, 1, 1]",
                                    "'x' ('x') is [8192, 4096, 1, 1]", "e.g. [1, 4096, 1, 1]"});
  p.scale = {8192, 4096, 1, 1};
  expect_error(layernorm_graph(p), {"input 'scale'", "1 on its row (leading) dims"});

  NormGraph bias;
  GraphSpec g = layernorm_graph(bias);
  g.tensors[2].dims = {1, 8, 1, 1};
  expect_error(g, {"input 'bias' ('bias') has dims [1, 8, 1, 1] but 'scale' ('scale') has [1, 16, 1, 1]"});

  NormGraph rank1;
  rank1.x = {16};
  rank1.scale = {16};
  expect_error(layernorm_graph(rank1), {"input 'x' ('x') has rank 1", "rank >= 2"});

  NormGraph ints;
  g = layernorm_graph(ints);
  g.tensors[0].dtype = DType::kInt32;
  expect_error(g, {"input 'x' ('x') has dtype int32", "bf16, fp16 or fp32"});

  NormGraph eps;
  eps.epsilon = -1e-5;
  expect_error(layernorm_graph(eps), {"[layernorm 'ln'] epsilon is -1e-05", ">= 0"});
  eps.epsilon = NAN;
  expect_error(layernorm_graph(eps), {"epsilon is nan"});

  NormGraph stats;
  stats.training = true;
  stats.stats_dtype = DType::kBF16;
  expect_error(layernorm_graph(stats), {"output 'mean' ('mean') has dtype bf16", "fp32 only"});
  stats.stats_dtype = DType::kFP32;
  stats.stats_virtual = true;
  expect_error(layernorm_graph(stats), {"output 'mean' ('mean') is virtual", "graph output"});

  NormGraph half;
  half.only_mean = true;
  GraphSpec hg = layernorm_graph(half);
  std::get<LayerNormAttrs>(hg.ops[0].attrs).phase = NormPhase::kTraining;  // as the JSON parser sets it
  expect_error(hg, {"outputs must be exactly the roles y, mean, inv_variance", "training phase"});
}

const char* kLayerNormJson = R"({
  "name": "ln",
  "tensors": [
    {"name": "x", "dims": [64, 128, 1, 1], "layout": "nhwc"},
    {"name": "scale", "dims": [1, 128, 1, 1], "layout": "nhwc", "dtype": "fp32"},
    {"name": "bias", "dims": [1, 128, 1, 1], "layout": "nhwc", "dtype": "fp32"},
    {"name": "y", "layout": "nhwc"},
    {"name": "mean", "dtype": "fp32"}, {"name": "inv_variance", "dtype": "fp32"}
  ],
  "ops": [{"op": "layernorm", "name": "ln", "epsilon": 0.001,
           "inputs": {"x": "x", "scale": "scale", "bias": "bias"},
           "outputs": {"y": "y", "mean": "mean", "inv_variance": "inv_variance"}}]
})";

TEST(LayerNormJson, ParsesRoundTripsAndKeepsEpsilonExact) {
  auto spec = parse_graph_json(kLayerNormJson, "ln.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& a = std::get<LayerNormAttrs>(spec->ops[0].attrs);
  EXPECT_EQ(a.phase, NormPhase::kTraining);
  EXPECT_EQ(a.epsilon, 0.001);
  auto again = parse_graph_json(graph_to_json(*spec), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(graph_to_json(*again), graph_to_json(*spec));

  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->canonical.find("epsilon=0.001"), std::string::npos) << r->canonical;
  // epsilon's last bit is a different plan.
  std::string next = kLayerNormJson;
  next.replace(next.find("0.001"), 5, "0.0010000000000000002");
  auto rn = resolve(*parse_graph_json(next, "next.json"));
  ASSERT_TRUE(rn.ok()) << rn.status().ToString();
  EXPECT_NE(graph_fingerprint(*r), graph_fingerprint(*rn));

  // Without statistics: inference; without epsilon: 1e-5.
  const std::string inf = R"({"name": "ln", "tensors": [
    {"name": "x", "dims": [64, 128]}, {"name": "scale", "dims": [1, 128]}, {"name": "bias", "dims": [1, 128]},
    {"name": "y"}],
    "ops": [{"op": "layernorm", "name": "ln", "inputs": {"x": "x", "scale": "scale", "bias": "bias"},
             "outputs": {"y": "y"}}]})";
  auto is = parse_graph_json(inf, "inference.json");
  ASSERT_TRUE(is.ok()) << is.status().ToString();
  EXPECT_EQ(std::get<LayerNormAttrs>(is->ops[0].attrs).phase, NormPhase::kInference);
  EXPECT_EQ(std::get<LayerNormAttrs>(is->ops[0].attrs).epsilon, 1e-5);
}

TEST(LayerNormJson, Errors) {
  std::string bad = kLayerNormJson;
  bad.replace(bad.find("0.001"), 5, "\"small\"");
  auto r = parse_graph_json(bad, "bad.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("bad.json: ops[0] ('ln').epsilon: expected a number"),
            std::string::npos)
      << r.status().message();

  std::string unknown = kLayerNormJson;
  unknown.replace(unknown.find("\"epsilon\""), std::string("\"epsilon\"").size(), "\"eps\"");
  r = parse_graph_json(unknown, "unknown.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("epsilon"), std::string::npos) << r.status().message();
}

// ---------------------------------------------------------------- CPU reference

struct NormRun {
  ResolvedGraph g;
  std::map<std::string, HostTensor> inputs;
  ReferenceOutputs out;
};

NormRun run_layernorm(NormGraph p, const std::vector<double>& x, const std::vector<double>& scale,
                      const std::vector<double>& bias) {
  NormRun run;
  auto r = resolve(layernorm_graph(p));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  run.g = *r;
  run.inputs["x"] = host_from(T(run.g, "x"), x);
  run.inputs["scale"] = host_from(T(run.g, "scale"), scale);
  if (p.bias) run.inputs["bias"] = host_from(T(run.g, "bias"), bias);
  auto out = reference_cpu(run.g, run.inputs);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (out.ok()) run.out = *out;
  return run;
}

TEST(LayerNormReferenceCpu, ByHand) {
  // Row 0 [1, 2, 3, 4]: mean 2.5, var 1.25; epsilon 0.75 makes var + eps = 2.
  // Row 1 constant: var 0, so y = bias whatever the scale.
  NormGraph p;
  p.x = {2, 4, 1, 1};
  p.scale = {1, 4, 1, 1};
  p.training = true;
  p.epsilon = 0.75;
  const std::vector<double> scale = {1, 2, 0.5, -1}, bias = {0, 0.25, -0.5, 1};
  NormRun run = run_layernorm(p, {1, 2, 3, 4, 5, 5, 5, 5}, scale, bias);
  const std::vector<float>& y = run.out.at("y");
  ASSERT_EQ(y.size(), 8u);
  const double inv0 = 1.0 / std::sqrt(2.0);
  const double x0[] = {1, 2, 3, 4};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[i], (x0[i] - 2.5) * inv0 * scale[i] + bias[i], 1e-6) << i;
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(y[4 + i], bias[i], 1e-6) << i;
  EXPECT_NEAR(run.out.at("mean")[0], 2.5, 1e-7);
  EXPECT_NEAR(run.out.at("mean")[1], 5.0, 1e-7);
  EXPECT_NEAR(run.out.at("inv_variance")[0], inv0, 1e-7);
  EXPECT_NEAR(run.out.at("inv_variance")[1], 1.0 / std::sqrt(0.75), 1e-6);
}

TEST(LayerNormReferenceCpu, NormalizesEachRowAndIgnoresShiftAndScale) {
  NormGraph p;
  p.x = {3, 5, 64};  // rank 3: rows [3, 5], normalized over the last dim
  p.scale = {1, 1, 64};
  p.epsilon = 0;  // exact invariance under x -> a * x + c
  p.training = true;
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> x(3 * 5 * 64), moved(x.size());
  // x is bf16: multiples of 1/64 in [-1, 1] survive the rounding, and so does 0.5 * x + 0.25.
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = std::round(u(gen) * 64) / 64;
    moved[i] = 0.5 * x[i] + 0.25;
  }
  const std::vector<double> ones(64, 1.0), zeros(64, 0.0);
  NormRun a = run_layernorm(p, x, ones, zeros);
  NormRun b = run_layernorm(p, moved, ones, zeros);
  const std::vector<float>& y = a.out.at("y");
  for (int r = 0; r < 15; ++r) {
    double s = 0, s2 = 0;
    for (int i = 0; i < 64; ++i) s += y[r * 64 + i], s2 += y[r * 64 + i] * y[r * 64 + i];
    EXPECT_NEAR(s / 64, 0.0, 1e-6) << r;
    EXPECT_NEAR(s2 / 64, 1.0, 1e-5) << r;
    EXPECT_NEAR(b.out.at("mean")[r], 0.5 * a.out.at("mean")[r] + 0.25, 1e-6) << r;
    EXPECT_NEAR(b.out.at("inv_variance")[r], 2.0 * a.out.at("inv_variance")[r],
                1e-4 * a.out.at("inv_variance")[r]);
  }
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(b.out.at("y")[i], y[i], 1e-5) << i;
}

TEST(LayerNormReferenceCpu, FeedsALaterOp) {
  // y virtual, then relu: the reference hands the norm's output on.
  GraphSpec g = layernorm_graph(NormGraph{});
  g.tensors.erase(g.tensors.begin() + 3);  // "y" no longer declared: virtual
  g.pointwise("act", PointwiseMode::kRelu, "y");
  g.output("act.y");
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(T(*r, "y").is_virtual);
  std::vector<double> x(8 * 16), scale(16), bias(16);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>((i * 37) % 17) / 8.0 - 1.0;
  for (size_t i = 0; i < 16; ++i) scale[i] = 0.5 + static_cast<double>(i) / 16, bias[i] = 0.125 * (i % 3);
  NormRun plain = run_layernorm(NormGraph{}, x, scale, bias);
  std::map<std::string, HostTensor> in = {{"x", host_from(T(*r, "x"), x)},
                                          {"scale", host_from(T(*r, "scale"), scale)},
                                          {"bias", host_from(T(*r, "bias"), bias)}};
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<float>& act = out->at("act.y");
  ASSERT_EQ(act.size(), plain.out.at("y").size());
  int negative = 0;
  for (size_t i = 0; i < act.size(); ++i) {
    negative += plain.out.at("y")[i] < 0;
    EXPECT_EQ(act[i], std::max(plain.out.at("y")[i], 0.0f)) << i;
  }
  EXPECT_GT(negative, 0);  // relu did something
}

// ---------------------------------------------------------------- rmsnorm

TEST(RmsNormResolve, PhaseBiasAndErrors) {
  NormGraph p;
  p.rms = true;
  p.bias = false;
  p.training = true;
  auto r = resolve(layernorm_graph(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "inv_variance").dims, V({8, 1, 1, 1}));
  EXPECT_EQ(r->find_tensor("mean"), -1);
  EXPECT_EQ(r->ops[0].inputs.size(), 2u);
  EXPECT_DOUBLE_EQ(r->flops(), 4.0 * 8 * 16);
  p.bias = true;
  auto b = resolve(layernorm_graph(p));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_DOUBLE_EQ(b->flops(), 5.0 * 8 * 16);
  EXPECT_NE(graph_fingerprint(*r), graph_fingerprint(*b));
  EXPECT_NE(describe(*b).find("rmsnorm(x=x, scale=scale, bias=bias) -> y [8, 16, 1, 1]"), std::string::npos)
      << describe(*b);

  p.scale = {1, 15, 1, 1};
  expect_error(layernorm_graph(p),
               {"[rmsnorm 'ln'] input 'scale' ('scale') has dims [1, 15, 1, 1]", "e.g. [1, 16, 1, 1]"});
}

const char* kRmsNormJson = R"({
  "name": "rms",
  "tensors": [
    {"name": "x", "dims": [4, 6, 32]}, {"name": "scale", "dims": [1, 1, 32], "dtype": "fp32"},
    {"name": "y"}, {"name": "inv_variance", "dtype": "fp32"}
  ],
  "ops": [{"op": "rmsnorm", "name": "rms", "epsilon": 1e-6, "inputs": {"x": "x", "scale": "scale"},
           "outputs": {"y": "y", "inv_variance": "inv_variance"}}]
})";

TEST(RmsNormJson, PhaseFromOutputsBiasFromInputs) {
  auto spec = parse_graph_json(kRmsNormJson, "rms.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const auto& a = std::get<RmsNormAttrs>(spec->ops[0].attrs);
  EXPECT_EQ(a.phase, NormPhase::kTraining);
  EXPECT_FALSE(a.bias);
  EXPECT_EQ(a.epsilon, 1e-6);
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "inv_variance").dims, V({4, 6, 1}));
  auto again = parse_graph_json(graph_to_json(*spec), "round trip");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(graph_to_json(*again), graph_to_json(*spec));

  std::string with_mean = kRmsNormJson;
  const std::string from = R"("inv_variance": "inv_variance")";
  with_mean.replace(with_mean.find(from), from.size(), R"("mean": "inv_variance")");
  auto wm = parse_graph_json(with_mean, "mean.json");
  ASSERT_TRUE(wm.ok()) << wm.status().ToString();
  auto rm = resolve(*wm);
  ASSERT_FALSE(rm.ok());
  EXPECT_NE(rm.status().message().find("[rmsnorm 'rms'] outputs must be exactly one role 'y'"),
            std::string::npos)
      << rm.status().message();
}

TEST(RmsNormReferenceCpu, ByHandWithAndWithoutBias) {
  // Row [3, 4] (rank 2): mean of squares 12.5, epsilon 3.5 makes it 16: inv 0.25.
  NormGraph p;
  p.rms = true;
  p.x = {2, 2};
  p.scale = {1, 2};
  p.epsilon = 3.5;
  p.training = true;
  p.bias = false;
  NormRun run = run_layernorm(p, {3, 4, -1, 1}, {1, 2}, {});
  EXPECT_NEAR(run.out.at("y")[0], 0.75, 1e-7);
  EXPECT_NEAR(run.out.at("y")[1], 2.0, 1e-7);
  EXPECT_NEAR(run.out.at("inv_variance")[0], 0.25, 1e-7);
  // Row [-1, 1]: mean of squares 1, + 3.5: inv 1/sqrt(4.5).
  EXPECT_NEAR(run.out.at("inv_variance")[1], 1.0 / std::sqrt(4.5), 1e-7);
  EXPECT_NEAR(run.out.at("y")[2], -1.0 / std::sqrt(4.5), 1e-7);
  p.bias = true;
  p.training = false;
  NormRun biased = run_layernorm(p, {3, 4, -1, 1}, {1, 2}, {0.5, -0.5});
  EXPECT_NEAR(biased.out.at("y")[0], 1.25, 1e-7);
  EXPECT_NEAR(biased.out.at("y")[1], 1.5, 1e-7);
  EXPECT_EQ(biased.out.count("inv_variance"), 0u);
}

TEST(RmsNormReferenceCpu, ScaleInvariantWithoutEpsilon) {
  // rmsnorm(a * x) == rmsnorm(x) for a > 0 when epsilon is 0; unlike
  // layernorm it is not shift invariant.
  NormGraph p;
  p.rms = true;
  p.bias = false;
  p.epsilon = 0;
  std::vector<double> x(8 * 16), twice(x.size()), shifted(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<double>((i * 29) % 31) / 16.0 - 1.0;
    twice[i] = 2 * x[i];
    shifted[i] = x[i] + 0.5;
  }
  const std::vector<double> ones(16, 1.0);
  NormRun a = run_layernorm(p, x, ones, {});
  NormRun b = run_layernorm(p, twice, ones, {});
  NormRun c = run_layernorm(p, shifted, ones, {});
  double moved = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(a.out.at("y")[i], b.out.at("y")[i], 1e-6) << i;
    moved = std::max(moved, std::fabs(static_cast<double>(a.out.at("y")[i] - c.out.at("y")[i])));
  }
  EXPECT_GT(moved, 0.1);
  // Each row's mean square is 1.
  for (int r = 0; r < 8; ++r) {
    double s2 = 0;
    for (int i = 0; i < 16; ++i) s2 += a.out.at("y")[r * 16 + i] * a.out.at("y")[r * 16 + i];
    EXPECT_NEAR(s2 / 16, 1.0, 1e-5) << r;
  }
}

// ---------------------------------------------------------------- backward

// dy, x [rows, n] fp32 (io fp32: no rounding in the finite differences), scale
// [1, n], the statistics [rows, 1].
GraphSpec bwd_graph(bool rms, int64_t rows, int64_t n, bool dbias = true) {
  GraphSpec g;
  g.name = "bwd";
  g.io_dtype = DType::kFP32;
  g.tensor("dy", {rows, n});
  g.tensor("x", {rows, n});
  g.tensor("scale", {1, n});
  if (!rms) g.tensor("mean", {rows, 1});
  g.tensor("inv_variance", {rows, 1});
  OpSpec op;
  op.name = "bwd";
  op.inputs = {{"dy", "dy"}, {"x", "x"}, {"scale", "scale"}, {"inv_variance", "inv_variance"}};
  if (!rms) op.inputs["mean"] = "mean";
  op.outputs = {{"dx", "dx"}, {"dscale", "dscale"}};
  if (dbias) op.outputs["dbias"] = "dbias";
  if (rms) {
    op.attrs = RmsNormBwdAttrs{dbias};
  } else {
    op.attrs = LayerNormBwdAttrs{};
  }
  g.ops.push_back(op);
  for (const auto& [role, t] : op.outputs) g.output(t);
  return g;
}

TEST(NormBwdResolve, ShapesRangesAndErrors) {
  auto r = resolve(bwd_graph(false, 8, 16));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "dx").dims, V({8, 16}));
  EXPECT_EQ(T(*r, "dscale").dims, V({1, 16}));
  EXPECT_EQ(T(*r, "dbias").dtype, DType::kFP32);
  EXPECT_EQ(T(*r, "mean").random_lo, -0.05);
  EXPECT_EQ(T(*r, "inv_variance").random_lo, 1.6);
  EXPECT_DOUBLE_EQ(r->flops(), 14.0 * 8 * 16);
  auto rms = resolve(bwd_graph(true, 8, 16, /*dbias=*/false));
  ASSERT_TRUE(rms.ok()) << rms.status().ToString();
  EXPECT_EQ(rms->find_tensor("dbias"), -1);
  EXPECT_DOUBLE_EQ(rms->flops(), 11.0 * 8 * 16);
  EXPECT_NE(graph_fingerprint(*rms), graph_fingerprint(*resolve(bwd_graph(true, 8, 16, true))));

  GraphSpec g = bwd_graph(false, 8, 16);
  g.tensors[3].dims = {1, 8};  // mean transposed
  expect_error(g, {"[layernorm_bwd 'bwd'] input 'mean' ('mean') is [1, 8] fp32", "fp32 [8, 1]"});
  g = bwd_graph(true, 8, 16);
  g.tensors[0].dims = {8, 15};
  expect_error(g, {"[rmsnorm_bwd 'bwd'] input 'dy' ('dy') has dims [8, 15] but 'x' ('x') has [8, 16]"});
  g = bwd_graph(true, 8, 16);
  g.tensors[3].dtype = DType::kBF16;
  expect_error(g, {"input 'inv_variance' ('inv_variance') is [8, 1] bf16"});
  g = bwd_graph(false, 8, 16);
  for (auto& t : g.tensors)
    if (t.name == "dscale") t.is_virtual = true;
  expect_error(g, {"output 'dscale': tensor 'dscale' is virtual", "writes its outputs to memory"});
}

// Runs the forward (training) and feeds its statistics to the backward: dx
// must be the gradient of sum(y * dy), by central differences in double.
void check_bwd_against_finite_differences(bool rms) {
  const int64_t rows = 3, n = 8;
  const double eps = 1e-3;
  std::vector<double> x(rows * n), dy(rows * n), scale(n), bias(n, 0.0);
  for (int64_t i = 0; i < rows * n; ++i) {
    x[i] = std::sin(0.7 * static_cast<double>(i)) + 0.1 * static_cast<double>(i % 3);
    dy[i] = std::cos(1.3 * static_cast<double>(i));
  }
  for (int64_t i = 0; i < n; ++i) scale[i] = 0.5 + 0.125 * static_cast<double>(i);
  NormGraph p;
  p.rms = rms;
  p.x = {rows, n};
  p.scale = {1, n};
  p.epsilon = eps;
  p.training = true;
  p.bias = !rms;
  GraphSpec fg = layernorm_graph(p);
  fg.io_dtype = DType::kFP32;
  auto fr = resolve(fg);
  ASSERT_TRUE(fr.ok()) << fr.status().ToString();
  auto forward = [&](const std::vector<double>& xv) {
    std::map<std::string, HostTensor> in = {{"x", host_from(T(*fr, "x"), xv)},
                                            {"scale", host_from(T(*fr, "scale"), scale)}};
    if (!rms) in["bias"] = host_from(T(*fr, "bias"), bias);
    auto out = reference_cpu(*fr, in);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return *out;
  };
  const ReferenceOutputs f0 = forward(x);
  auto loss = [&](const std::vector<double>& xv) {
    const ReferenceOutputs o = forward(xv);
    double l = 0;
    for (size_t i = 0; i < dy.size(); ++i) l += static_cast<double>(o.at("y")[i]) * dy[i];
    return l;
  };

  auto br = resolve(bwd_graph(rms, rows, n));
  ASSERT_TRUE(br.ok()) << br.status().ToString();
  std::map<std::string, HostTensor> bin = {
      {"dy", host_from(T(*br, "dy"), dy)},
      {"x", host_from(T(*br, "x"), x)},
      {"scale", host_from(T(*br, "scale"), scale)},
      {"inv_variance", host_from(T(*br, "inv_variance"), std::vector<double>(f0.at("inv_variance").begin(),
                                                                             f0.at("inv_variance").end()))}};
  if (!rms)
    bin["mean"] = host_from(T(*br, "mean"), std::vector<double>(f0.at("mean").begin(), f0.at("mean").end()));
  auto b = reference_cpu(*br, bin);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const double h = 1e-3;
  for (int64_t i = 0; i < rows * n; ++i) {
    std::vector<double> up = x, down = x;
    up[i] += h;
    down[i] -= h;
    const double fd = (loss(up) - loss(down)) / (2 * h);
    EXPECT_NEAR(b->at("dx")[i], fd, 2e-3 * (1 + std::fabs(fd))) << (rms ? "rms " : "ln ") << i;
  }
  // dscale = sum over rows of dy * xhat, dbias = sum of dy: against the forward's y (bias 0, so xhat = y /
  // scale).
  for (int64_t c = 0; c < n; ++c) {
    double ds = 0, db = 0;
    for (int64_t r = 0; r < rows; ++r) {
      ds += dy[r * n + c] * f0.at("y")[r * n + c] / scale[c];
      db += dy[r * n + c];
    }
    EXPECT_NEAR(b->at("dscale")[c], ds, 1e-5) << c;
    EXPECT_NEAR(b->at("dbias")[c], db, 1e-5) << c;
  }
  if (!rms) {
    // Shift invariance of the forward: each row of dx sums to 0.
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < n; ++c) s += b->at("dx")[r * n + c];
      EXPECT_NEAR(s, 0.0, 1e-5) << r;
    }
  }
}

TEST(NormBwdReferenceCpu, LayerNormMatchesFiniteDifferences) { check_bwd_against_finite_differences(false); }
TEST(NormBwdReferenceCpu, RmsNormMatchesFiniteDifferences) { check_bwd_against_finite_differences(true); }

TEST(LayerNormReferenceCpu, ResidualAddFeedsTheNorm) {
  // add(x, residual) -> virtual h -> layernorm: the same as layernorm of x + residual.
  auto spec =
      load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/invalid_add_layernorm.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(T(*r, "h").is_virtual);
  EXPECT_EQ(T(*r, "h").dtype, DType::kFP32);
  const int64_t rows = 64, n = 256;
  std::vector<double> x(rows * n), res(rows * n), sum(rows * n), scale(n), bias(n);
  for (int64_t i = 0; i < rows * n; ++i) {
    x[i] = static_cast<double>((i * 7) % 64) / 64.0 - 0.5;  // exact in bf16, and so is the sum
    res[i] = static_cast<double>((i * 13) % 32) / 32.0 - 0.5;
    sum[i] = x[i] + res[i];
  }
  for (int64_t i = 0; i < n; ++i) scale[i] = 1.0 + static_cast<double>(i % 4) / 8, bias[i] = (i % 5) / 10.0;
  auto fused = reference_cpu(*r, {{"x", host_from(T(*r, "x"), x)},
                                  {"residual", host_from(T(*r, "residual"), res)},
                                  {"scale", host_from(T(*r, "scale"), scale)},
                                  {"bias", host_from(T(*r, "bias"), bias)}});
  ASSERT_TRUE(fused.ok()) << fused.status().ToString();
  NormGraph p;
  p.x = {rows, n, 1, 1};
  p.scale = {1, n, 1, 1};
  NormRun plain = run_layernorm(p, sum, scale, bias);
  ASSERT_EQ(fused->at("y").size(), plain.out.at("y").size());
  for (size_t i = 0; i < plain.out.at("y").size(); ++i)
    EXPECT_FLOAT_EQ(fused->at("y")[i], plain.out.at("y")[i]) << i;
}

TEST(LayerNormExamples, Resolve) {
  for (const char* f :
       {"layernorm_train.json", "small/layernorm_small.json", "rmsnorm_train.json",
        "small/rmsnorm_bias_small.json", "layernorm_bwd.json", "small/layernorm_bwd_small.json",
        "rmsnorm_bwd.json", "small/rmsnorm_bwd_dbias_small.json", "invalid_add_layernorm.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
  }
}

}  // namespace
}  // namespace fusebox
