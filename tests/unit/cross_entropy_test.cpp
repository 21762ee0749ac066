// The cross_entropy op (include/fusebox/ops/cross_entropy.h): resolve()'s
// rules and their messages, and the CPU reference: the loss against
// -log softmax written out here, the backward against finite differences of
// the forward's loss (with dloss weights), ignored rows and bad labels.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::expect_error;
using testing_util::host_from;
using testing_util::resolve_json;

std::string fwd_json(int64_t n, int64_t v, const std::string& extra = "", const std::string& labels = "",
                     bool lse = true, const std::string& logits = "") {
  const std::string lg = logits.empty() ? R"("dims": [)" + std::to_string(n) + ", " + std::to_string(v) +
                                              R"(, 1, 1], "layout": "nhwc")"
                                        : logits;
  const std::string lb =
      labels.empty() ? R"("dims": [)" + std::to_string(n) + R"(, 1, 1, 1], "dtype": "int32")" : labels;
  return R"({"name": "ce", "io_dtype": "fp32", "tensors": [{"name": "logits", )" + lg +
         R"(}, {"name": "labels", )" + lb + R"(}, {"name": "loss"})" + (lse ? R"(, {"name": "lse"})" : "") +
         R"(], "ops": [{"op": "cross_entropy", "name": "xent", )" + extra +
         R"("inputs": {"logits": "logits", "labels": "labels"}, "outputs": {"loss": "loss")" +
         (lse ? R"(, "lse": "lse")" : "") + "}}]}";
}

std::string bwd_json(int64_t n, int64_t v, const std::string& extra = "") {
  const std::string nn = std::to_string(n), vv = std::to_string(v);
  return R"({"name": "ce_bwd", "io_dtype": "fp32", "tensors": [{"name": "logits", "dims": [)" + nn + ", " +
         vv + R"(, 1, 1], "layout": "nhwc"}, {"name": "labels", "dims": [)" + nn +
         R"(, 1, 1, 1], "dtype": "int32"}, {"name": "lse", "dims": [)" + nn +
         R"(, 1, 1, 1], "dtype": "fp32"}, {"name": "dloss", "dims": [)" + nn +
         R"(, 1, 1, 1], "dtype": "fp32"}, {"name": "dlogits", "layout": "nhwc"}],
  "ops": [{"op": "cross_entropy_bwd", "name": "xent_bwd", )" +
         extra +
         R"("inputs": {"logits": "logits", "labels": "labels", "lse": "lse", "dloss": "dloss"},
           "outputs": {"dlogits": "dlogits"}}]})";
}

TEST(CrossEntropy, ResolvesShapesAndRandomLabels) {
  auto g = resolve_json(fwd_json(6, 50));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors[g->find_tensor("loss")].dims, (std::vector<int64_t>{6, 1, 1, 1}));
  EXPECT_EQ(g->tensors[g->find_tensor("loss")].dtype, DType::kFP32);
  EXPECT_EQ(g->tensors[g->find_tensor("lse")].dtype, DType::kFP32);
  EXPECT_EQ(g->tensors[g->find_tensor("labels")].random_lo, 0);
  EXPECT_EQ(g->tensors[g->find_tensor("labels")].random_hi, 49);
  EXPECT_DOUBLE_EQ(g->flops(), 4.0 * 6 * 50);
  auto b = resolve_json(bwd_json(6, 50));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->tensors[b->find_tensor("dlogits")].dims, (std::vector<int64_t>{6, 50, 1, 1}));
  EXPECT_DOUBLE_EQ(b->flops(), 3.0 * 6 * 50);
}

TEST(CrossEntropy, RefusesWithTheRuleThatFailed) {
  expect_error(fwd_json(6, 50, "", "", true, R"("dims": [6, 50, 2, 1])"),
               {"[cross_entropy 'xent'] input 'logits' ('logits')", "[N, V, 1, 1]"});
  expect_error(fwd_json(6, 50, "", "", true, R"("dims": [6, 50, 1, 1], "strides": [1, 6, 1, 1])"),
               {"input 'logits'", "rows of V contiguous values"});
  expect_error(fwd_json(6, 50, "", R"("dims": [6, 1, 1, 1])"), {"input 'labels' ('labels')", "int32"});
  expect_error(fwd_json(6, 50, "", R"("dims": [5, 1, 1, 1], "dtype": "int32")"),
               {"input 'labels' ('labels') has dims [5, 1, 1, 1]", "[6, 1, 1, 1]"});
  expect_error(fwd_json(6, 50, R"("ignore_index": 3, )"), {"ignore_index is 3", "outside [0, V)"});
}

struct Rows {
  std::vector<double> logits, labels;
};
Rows random_rows(int64_t n, int64_t v, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-4, 4);
  Rows r;
  for (int64_t i = 0; i < n * v; ++i) r.logits.push_back(static_cast<float>(u(rng)));
  for (int64_t i = 0; i < n; ++i) r.labels.push_back(static_cast<double>(rng() % v));
  return r;
}

Result<std::map<std::string, std::vector<float>>> run(
    const std::string& json, const std::map<std::string, std::vector<double>>& values) {
  auto g = resolve_json(json);
  if (!g.ok()) return g.status();
  std::map<std::string, HostTensor> in;
  for (const auto& [name, v] : values) in[name] = host_from(g->tensors[g->find_tensor(name)], v);
  return reference_cpu(*g, in);
}

TEST(CrossEntropy, CpuReferenceIsMinusLogSoftmaxOfTheLabel) {
  const int64_t n = 5, v = 37;
  Rows r = random_rows(n, v, 3);
  r.labels[2] = -100;  // ignored
  auto out = run(fwd_json(n, v), {{"logits", r.logits}, {"labels", r.labels}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (int64_t i = 0; i < n; ++i) {
    double z = 0;  // sum of exp, written without a max shift (the logits are small)
    for (int64_t c = 0; c < v; ++c) z += std::exp(r.logits[i * v + c]);
    const double want = r.labels[i] < 0 ? 0.0 : -std::log(std::exp(r.logits[i * v + r.labels[i]]) / z);
    EXPECT_NEAR(out->at("loss")[i], want, 1e-5) << "row " << i;
    EXPECT_NEAR(out->at("lse")[i], std::log(z), 1e-5) << "row " << i;
  }
  // A label outside [0, V) that is not ignore_index: NaN, the other rows unharmed.
  r.labels[2] = 37;
  auto bad = run(fwd_json(n, v), {{"logits", r.logits}, {"labels", r.labels}});
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(std::isnan(bad->at("loss")[2]));
  EXPECT_FALSE(std::isnan(bad->at("loss")[1]));
  // Another ignore_index.
  r.labels[2] = -1;
  auto other = run(fwd_json(n, v, R"("ignore_index": -1, )"), {{"logits", r.logits}, {"labels", r.labels}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->at("loss")[2], 0.0f);
}

TEST(CrossEntropy, BackwardIsTheGradientOfTheWeightedLoss) {
  const int64_t n = 4, v = 11;
  Rows r = random_rows(n, v, 9);
  r.labels[1] = -100;  // ignored: zero gradient
  const std::vector<double> dloss{0.25, -1.5, 0.75, 2.0};
  auto fwd = run(fwd_json(n, v), {{"logits", r.logits}, {"labels", r.labels}});
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  std::vector<double> lse(fwd->at("lse").begin(), fwd->at("lse").end());
  auto bwd =
      run(bwd_json(n, v), {{"logits", r.logits}, {"labels", r.labels}, {"lse", lse}, {"dloss", dloss}});
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  // L(x) = sum_n dloss[n] * loss_n(x): central differences, in double.
  auto weighted = [&](const std::vector<double>& x) {
    double total = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (r.labels[i] < 0) continue;
      double z = 0;
      for (int64_t c = 0; c < v; ++c) z += std::exp(x[i * v + c]);
      total += dloss[i] * (std::log(z) - x[i * v + static_cast<int64_t>(r.labels[i])]);
    }
    return total;
  };
  const double h = 1e-5;
  for (int64_t k = 0; k < n * v; ++k) {
    std::vector<double> up = r.logits, down = r.logits;
    up[k] += h;
    down[k] -= h;
    const double want = (weighted(up) - weighted(down)) / (2 * h);
    EXPECT_NEAR(bwd->at("dlogits")[k], want, 1e-5) << "logit " << k;
  }
}

}  // namespace
}  // namespace fusebox
