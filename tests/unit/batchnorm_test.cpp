// Batchnorm ops (batchnorm training forward, batchnorm_inference, batchnorm_bwd): resolve() rules and errors,
// JSON, and the CPU reference against hand-computed values and finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

std::string example(const char* f) { return std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f; }

struct BnGraph {
  std::vector<int64_t> x = {2, 4, 3, 3};
  std::vector<int64_t> scale = {1, 4, 1, 1};
  double epsilon = 1e-5, momentum = 0.1;
  DType stats_dtype = DType::kFP32;
  bool stats_virtual = false;
  bool relu = false;  // a relu after y
};

std::vector<int64_t> channel(const std::vector<int64_t>& x) {
  std::vector<int64_t> d(x.size(), 1);
  d[1] = x[1];
  return d;
}

GraphSpec train_graph(const BnGraph& p) {
  GraphSpec g;
  g.name = "bn";
  g.io_dtype = DType::kFP32;
  g.tensor("x", p.x, "channels_last");
  g.tensor("scale", p.scale, "channels_last", DType::kFP32);
  g.tensor("bias", p.scale, "channels_last", DType::kFP32);
  g.tensor("running_mean", channel(p.x), "channels_last", DType::kFP32);
  g.tensor("running_var", channel(p.x), "channels_last", DType::kFP32);
  OpSpec op;
  op.name = "bn";
  op.attrs = BatchNormAttrs{p.epsilon, p.momentum};
  op.inputs = {{"x", "x"},
               {"scale", "scale"},
               {"bias", "bias"},
               {"running_mean", "running_mean"},
               {"running_var", "running_var"}};
  op.outputs = {{"y", p.relu ? "bn_out" : "y"}};
  for (const char* s : {"mean", "inv_variance", "next_running_mean", "next_running_var"}) {
    op.outputs[s] = s;
    TensorSpec t;
    t.name = s;
    t.dtype = p.stats_dtype;
    t.is_virtual = p.stats_virtual;
    g.tensors.push_back(t);
  }
  g.ops.push_back(op);
  if (p.relu) g.pointwise("act", PointwiseMode::kRelu, "bn_out");
  g.output(p.relu ? "act.y" : "y", "channels_last");
  return g;
}

GraphSpec bwd_graph(const std::vector<int64_t>& x, const std::vector<int64_t>& dy) {
  GraphSpec g;
  g.name = "dbn";
  g.io_dtype = DType::kFP32;
  g.tensor("dy", dy, "channels_last");
  g.tensor("x", x, "channels_last");
  for (const char* s : {"scale", "mean", "inv_variance"})
    g.tensor(s, channel(x), "channels_last", DType::kFP32);
  OpSpec op;
  op.name = "dbn";
  op.attrs = BatchNormBwdAttrs{};
  op.inputs = {
      {"dy", "dy"}, {"x", "x"}, {"scale", "scale"}, {"mean", "mean"}, {"inv_variance", "inv_variance"}};
  op.outputs = {{"dx", "dx"}, {"dscale", "dscale"}, {"dbias", "dbias"}};
  g.ops.push_back(op);
  for (const char* s : {"dx", "dscale", "dbias"}) g.output(s);
  return g;
}

TEST(BatchNormResolve, TrainingOutputs) {
  BnGraph p;
  auto r = resolve(train_graph(p));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, V({2, 4, 3, 3}));
  EXPECT_EQ(T(*r, "y").strides, T(*r, "x").strides);
  for (const char* s : {"mean", "inv_variance", "next_running_mean", "next_running_var"}) {
    EXPECT_EQ(T(*r, s).dims, V({1, 4, 1, 1})) << s;
    EXPECT_EQ(T(*r, s).dtype, DType::kFP32) << s;
    EXPECT_TRUE(T(*r, s).is_output) << s;
  }
  EXPECT_GT(T(*r, "running_var").random_lo, 0.0);  // a variance
  EXPECT_DOUBLE_EQ(r->flops(), 8.0 * 2 * 4 * 3 * 3);
  const std::string j = op_resolved_attrs_json(*r, r->ops[0]);
  EXPECT_NE(j.find("\"momentum\":0.1"), std::string::npos) << j;
  EXPECT_NE(j.find("\"normalized_dims\":[0,2,3]"), std::string::npos) << j;
  BnGraph m = p;
  m.momentum = 0.2;
  auto r2 = resolve(train_graph(m));
  ASSERT_TRUE(r2.ok());
  EXPECT_NE(graph_fingerprint(*r), graph_fingerprint(*r2));  // momentum is baked into the plan
}

TEST(BatchNormResolve, ErrorsNameOpTensorAndWhatIsAccepted) {
  BnGraph p;
  p.scale = {1, 3, 1, 1};
  expect_error(train_graph(p),
               {"[batchnorm 'bn'] input 'scale' ('scale') has dims [1, 3, 1, 1]",
                "'x' ('x') is [2, 4, 3, 3] (C=4)", "one value per channel, dims [1, 4, 1, 1]"});
  p.scale = {1, 4, 3, 3};
  expect_error(train_graph(p), {"input 'scale'", "dims [1, 4, 1, 1]"});

  GraphSpec g = train_graph(BnGraph{});
  g.tensors[3].dtype = DType::kBF16;  // running_mean
  expect_error(g, {"input 'running_mean' ('running_mean') has dtype bf16", "in fp32 only"});

  BnGraph stats;
  stats.stats_virtual = true;
  expect_error(train_graph(stats), {"output 'mean' ('mean') is virtual", "graph output"});
  stats.stats_virtual = false;
  stats.stats_dtype = DType::kFP16;
  expect_error(train_graph(stats), {"output 'mean' ('mean') has dtype fp16", "fp32 only"});

  BnGraph mom;
  mom.momentum = 1.5;
  expect_error(train_graph(mom), {"[batchnorm 'bn'] momentum is 1.5", "in [0, 1]"});
  BnGraph eps;
  eps.epsilon = -1;
  expect_error(train_graph(eps), {"[batchnorm 'bn'] epsilon is -1", ">= 0"});

  BnGraph rank3;
  rank3.x = {2, 4, 9};
  rank3.scale = {1, 4, 1};
  expect_error(train_graph(rank3), {"input 'x' ('x') has rank 3", "[N, C, H, W] or [N, C, D, H, W]"});

  BnGraph one;
  one.x = {1, 4, 1, 1};
  expect_error(train_graph(one), {"needs at least 2 elements per channel"});

  expect_error(
      bwd_graph({2, 4, 3, 3}, {2, 4, 3, 2}),
      {"[batchnorm_bwd 'dbn'] input 'dy' ('dy') has dims [2, 4, 3, 2] but 'x' ('x') has [2, 4, 3, 3]",
       "shaped like x"});
}

TEST(BatchNormJson, ParsesRoundTripsTheExamples) {
  for (const char* f :
       {"batchnorm_train.json", "batchnorm_train_relu.json", "batchnorm_bwd.json",
        "invalid_batchnorm_inference_relu.json", "small/batchnorm_train_relu_small.json",
        "small/batchnorm_train_small.json", "small/invalid_batchnorm_inference_relu_small.json",
        "small/batchnorm_bwd_small.json"}) {
    auto spec = load_graph_file(example(f));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto again = parse_graph_json(graph_to_json(*spec), "round trip");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(graph_to_json(*again), graph_to_json(*spec)) << f;
    auto r = resolve(*spec);
    ASSERT_TRUE(r.ok()) << f << ": " << r.status().ToString();
  }
  auto spec = load_graph_file(example("small/batchnorm_train_relu_small.json"));
  ASSERT_TRUE(spec.ok());
  const auto& a = std::get<BatchNormAttrs>(spec->ops[0].attrs);
  EXPECT_EQ(a.momentum, 0.5);
  EXPECT_EQ(a.epsilon, 1e-3);
}

// Deterministic values in [-1, 1].
std::vector<double> values(size_t n, unsigned seed, double lo = -1, double hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

using Outputs = std::map<std::string, std::vector<float>>;

Outputs run_train(const BnGraph& p, const std::vector<double>& x, const std::vector<double>& scale,
                  const std::vector<double>& bias, const std::vector<double>& rm,
                  const std::vector<double>& rv) {
  auto r = resolve(train_graph(p));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  auto out = reference_cpu(*r, {{"x", host_from(T(*r, "x"), x)},
                                {"scale", host_from(T(*r, "scale"), scale)},
                                {"bias", host_from(T(*r, "bias"), bias)},
                                {"running_mean", host_from(T(*r, "running_mean"), rm)},
                                {"running_var", host_from(T(*r, "running_var"), rv)}});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : Outputs{};
}

TEST(BatchNormReferenceCpu, TrainingByHand) {
  // x [2, 1, 1, 2] = {1, 3} (n = 0) and {5, 7} (n = 1): mean 4, biased var 5,
  // unbiased 20/3.
  BnGraph p;
  p.x = {2, 1, 1, 2};
  p.scale = {1, 1, 1, 1};
  p.epsilon = 0;
  p.momentum = 0.25;
  Outputs o = run_train(p, {1, 3, 5, 7}, {2}, {0.5}, {1}, {2});
  ASSERT_FALSE(o.empty());
  const double inv = 1 / std::sqrt(5.0);
  EXPECT_FLOAT_EQ(o["mean"][0], 4.0f);
  EXPECT_FLOAT_EQ(o["inv_variance"][0], static_cast<float>(inv));
  EXPECT_FLOAT_EQ(o["y"][0], static_cast<float>((1 - 4) * inv * 2 + 0.5));
  EXPECT_FLOAT_EQ(o["y"][3], static_cast<float>((7 - 4) * inv * 2 + 0.5));
  EXPECT_FLOAT_EQ(o["next_running_mean"][0], 0.75f * 1 + 0.25f * 4);
  EXPECT_FLOAT_EQ(o["next_running_var"][0], static_cast<float>(0.75 * 2 + 0.25 * 20.0 / 3));
}

TEST(BatchNormReferenceCpu, ChannelsAreIndependentAndReluFuses) {
  BnGraph p;
  p.relu = true;
  const auto x = values(72, 1), s = values(4, 2, 0.5, 1.5), b = values(4, 3), rm = values(4, 4),
             rv = values(4, 5, 0.5, 1.5);
  Outputs fused = run_train(p, x, s, b, rm, rv);
  p.relu = false;
  Outputs plain = run_train(p, x, s, b, rm, rv);
  ASSERT_FALSE(fused.empty());
  ASSERT_FALSE(plain.empty());
  for (size_t i = 0; i < plain["y"].size(); ++i)
    EXPECT_FLOAT_EQ(fused["act.y"][i], std::max(0.0f, plain["y"][i]));
  // Per channel: y has mean bias and (biased) variance scale^2 * var / (var + eps).
  for (int c = 0; c < 4; ++c) {
    double sum = 0, sq = 0;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 9; ++i) sum += plain["y"][(n * 4 + c) * 9 + i];
    const double mean_y = sum / 18;
    for (int n = 0; n < 2; ++n)
      for (int i = 0; i < 9; ++i) sq += std::pow(plain["y"][(n * 4 + c) * 9 + i] - mean_y, 2);
    EXPECT_NEAR(mean_y, b[c], 1e-5) << c;
    EXPECT_NEAR(sq / 18, s[c] * s[c], 1e-3) << c;  // eps 1e-5 against var ~ 1/3
  }
}

TEST(BatchNormReferenceCpu, InferenceWithTheSavedStatisticsIsTheTrainingOutput) {
  BnGraph p;
  const auto x = values(72, 11), s = values(4, 12, 0.5, 1.5), b = values(4, 13);
  Outputs t = run_train(p, x, s, b, values(4, 14), values(4, 15, 0.5, 1.5));
  ASSERT_FALSE(t.empty());
  auto spec = load_graph_file(example("small/invalid_batchnorm_inference_relu_small.json"));
  ASSERT_TRUE(spec.ok());
  // The same graph shape as the example but x [2, 4, 3, 3] and no relu: build it directly.
  GraphSpec g;
  g.name = "bni";
  g.io_dtype = DType::kFP32;
  g.tensor("x", p.x, "channels_last");
  for (const char* n : {"scale", "bias", "mean", "inv_variance"})
    g.tensor(n, p.scale, "channels_last", DType::kFP32);
  OpSpec op;
  op.name = "bn";
  op.attrs = BatchNormInferenceAttrs{};
  op.inputs = {
      {"x", "x"}, {"scale", "scale"}, {"bias", "bias"}, {"mean", "mean"}, {"inv_variance", "inv_variance"}};
  op.outputs = {{"y", "y"}};
  g.ops.push_back(op);
  g.output("y", "channels_last");
  auto r = resolve(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto out =
      reference_cpu(*r, {{"x", host_from(T(*r, "x"), x)},
                         {"scale", host_from(T(*r, "scale"), s)},
                         {"bias", host_from(T(*r, "bias"), b)},
                         {"mean", host_from(T(*r, "mean"), as_double(t["mean"]))},
                         {"inv_variance", host_from(T(*r, "inv_variance"), as_double(t["inv_variance"]))}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (size_t i = 0; i < t["y"].size(); ++i) EXPECT_NEAR(out->at("y")[i], t["y"][i], 1e-5) << i;
}

TEST(BatchNormBwdReferenceCpu, MatchesFiniteDifferencesOfTheTrainingForward) {
  // L = sum(dy * y(x, scale, bias)) with batch statistics: dx, dscale, dbias
  // from batchnorm_bwd (fed the forward's saved statistics) are its gradients.
  BnGraph p;
  p.epsilon = 1e-3;
  auto x = values(72, 21), s = values(4, 22, 0.5, 1.5), b = values(4, 23);
  const auto dy = values(72, 24), rm = values(4, 25), rv = values(4, 26, 0.5, 1.5);
  auto loss = [&](const std::vector<double>& xv, const std::vector<double>& sv,
                  const std::vector<double>& bv) {
    Outputs o = run_train(p, xv, sv, bv, rm, rv);
    double l = 0;
    for (size_t i = 0; i < dy.size(); ++i) l += dy[i] * o["y"][i];
    return l;
  };
  Outputs fwd = run_train(p, x, s, b, rm, rv);
  ASSERT_FALSE(fwd.empty());
  auto r = resolve(bwd_graph(p.x, p.x));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  auto g =
      reference_cpu(*r, {{"dy", host_from(T(*r, "dy"), dy)},
                         {"x", host_from(T(*r, "x"), x)},
                         {"scale", host_from(T(*r, "scale"), s)},
                         {"mean", host_from(T(*r, "mean"), as_double(fwd["mean"]))},
                         {"inv_variance", host_from(T(*r, "inv_variance"), as_double(fwd["inv_variance"]))}});
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const double h = 1e-3;  // fp32 outputs: central differences good to about 1e-3
  for (size_t i : {size_t{0}, size_t{5}, size_t{17}, size_t{40}, size_t{71}}) {
    auto xp = x, xm = x;
    xp[i] += h, xm[i] -= h;
    EXPECT_NEAR(g->at("dx")[i], (loss(xp, s, b) - loss(xm, s, b)) / (2 * h), 2e-3) << "dx " << i;
  }
  for (size_t c = 0; c < 4; ++c) {
    auto sp = s, sm = s, bp = b, bm = b;
    sp[c] += h, sm[c] -= h, bp[c] += h, bm[c] -= h;
    EXPECT_NEAR(g->at("dscale")[c], (loss(x, sp, b) - loss(x, sm, b)) / (2 * h), 2e-3) << "dscale " << c;
    EXPECT_NEAR(g->at("dbias")[c], (loss(x, s, bp) - loss(x, s, bm)) / (2 * h), 2e-3) << "dbias " << c;
  }
}

TEST(BatchNormTolerance, DefaultsPerDtype) {
  auto spec = load_graph_file(example("small/batchnorm_train_relu_small.json"));
  ASSERT_TRUE(spec.ok());
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(tolerance_for(*r, "next_running_var").rel_l2, default_tolerance(DType::kFP32).rel_l2);
  EXPECT_DOUBLE_EQ(tolerance_for(*r, "y").max_abs_rel, default_tolerance(DType::kBF16).max_abs_rel);
}

}  // namespace
}  // namespace fusebox
