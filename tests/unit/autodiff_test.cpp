// derive_backward() (fusebox/autodiff.h): the derived backward graph, run by the
// CPU reference, against central finite differences of the forward graph run
// by the same reference (check_gradients(), fusebox/gradient_check.h). For each differentiated input x and
// random seed gradients g_y of the outputs, L(x) = sum_y <g_y, y(x)>; the backward's dL/dx must match (L(x +
// e u) - L(x - e u)) / 2e along a random direction u with entries in {-1, 0, 1}. Inputs are odd multiples of
// 1/128 (never 0: relu's kink) and e = 2^-14 (fp32; 1/128 for 16-bit inputs, attention), so x +- e u is exact
// and the difference measures the function, not rounding.
#include "fusebox/autodiff.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "fusebox/gradient_check.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::resolve_json;

struct Case {
  ResolvedGraph fwd;
  BackwardGraph bwd;
};

// The forward from JSON and its derived backward, which must be a valid graph.
Case make_case(const std::string& json, BackwardOptions opt = {}) {
  Case c;
  auto f = resolve_json(json);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return c;
  c.fwd = *f;
  auto b = derive_backward(c.fwd, opt);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  if (!b.ok()) return c;
  c.bwd = *b;
  auto br = resolve(c.bwd.spec);
  EXPECT_TRUE(br.ok()) << br.status().ToString() << "\n" << graph_to_json(c.bwd.spec);
  return c;
}

// check_gradients() (fusebox/gradient_check.h): every gradient against finite differences.
void expect_gradients_match(Case& c, double tol = 2e-3) {
  ASSERT_FALSE(c.bwd.gradients.empty());
  auto check = check_gradients(c.fwd, c.bwd, 7, tol);
  ASSERT_TRUE(check.ok()) << check.status().ToString() << "\n" << graph_to_json(c.bwd.spec);
  EXPECT_EQ(check->rows.size(), c.bwd.gradients.size());
  for (const GradientCheckRow& r : check->rows)
    EXPECT_TRUE(r.pass) << r.ToString() << "\n" << graph_to_json(c.bwd.spec);
  EXPECT_TRUE(check->pass());
}

TEST(Autodiff, MlpWithSavedActivationRecomputesTheVirtualPreActivation) {
  // h = gelu_tanh(x w1 + b1) is saved (a graph output); its input is virtual,
  // so gelu's backward recomputes x w1 + b1 in the backward graph.
  Case c = make_case(R"({"name": "mlp", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 6, 8]}, {"name": "w1", "dims": [1, 8, 12]},
      {"name": "b1", "dims": [1, 1, 12]}, {"name": "w2", "dims": [1, 12, 5]},
      {"name": "h", "dims": [1, 6, 12]}, {"name": "y", "dims": [1, 6, 5]}],
    "ops": [
      {"op": "matmul", "name": "fc1", "inputs": {"a": "x", "b": "w1"}, "outputs": {"y": "t1"}},
      {"op": "bias_add", "name": "bias1", "inputs": {"x": "t1", "bias": "b1"}, "outputs": {"y": "t2"}},
      {"op": "gelu_tanh", "name": "act", "inputs": {"x": "t2"}, "outputs": {"y": "h"}},
      {"op": "matmul", "name": "fc2", "inputs": {"a": "h", "b": "w2"}, "outputs": {"y": "y"}}]})");
  EXPECT_EQ(c.bwd.seeds, std::vector<std::string>{"y"});  // h is read by fc2: not a seed
  EXPECT_EQ(c.bwd.gradients.size(), 4u);
  EXPECT_EQ(c.bwd.recomputed, (std::vector<std::string>{"fc1", "bias1"}));
  EXPECT_TRUE(c.bwd.inputs.count("h.T")) << "fc2's dw2 = h^T dy reads h transposed";
  // x is read as is (the recomputation) and transposed (dw1): saved, and counted, once.
  EXPECT_EQ(std::count(c.bwd.saved.begin(), c.bwd.saved.end(), "x"), 1);
  int64_t bytes = 0;
  for (const std::string& t : c.bwd.saved) bytes += c.fwd.tensors[c.fwd.find_tensor(t)].storage_bytes();
  EXPECT_EQ(c.bwd.saved_bytes, bytes);
  expect_gradients_match(c);
}

TEST(Autodiff, ConvBiasReluThroughDgradAndWgrad) {
  Case c = make_case(R"({"name": "cbr", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [2, 3, 6, 6]}, {"name": "w", "dims": [4, 3, 3, 3]},
      {"name": "bias", "dims": [1, 4, 1, 1]}, {"name": "y", "dims": [2, 4, 6, 6]}],
    "ops": [
      {"op": "conv_fprop", "name": "conv", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "c"}, "padding": [1, 1]},
      {"op": "bias_add", "name": "b", "inputs": {"x": "c", "bias": "bias"}, "outputs": {"y": "cb"}},
      {"op": "relu", "name": "r", "inputs": {"x": "cb"}, "outputs": {"y": "y"}}]})");
  EXPECT_EQ(c.bwd.gradients.size(), 3u);
  expect_gradients_match(c);
}

TEST(Autodiff, SharedInputAccumulatesAndBroadcastsReduce) {
  // a is used twice (its gradients add); s [1,1,4] is broadcast (its gradient sums).
  Case c = make_case(R"({"name": "acc", "io_dtype": "float", "tensors": [
      {"name": "a", "dims": [1, 3, 4]}, {"name": "s", "dims": [1, 1, 4]}, {"name": "y", "dims": [1, 3, 4]}],
    "ops": [
      {"op": "mul", "name": "m", "inputs": {"a": "a", "b": "s"}, "outputs": {"y": "t"}},
      {"op": "sub", "name": "d", "inputs": {"a": "t", "b": "a"}, "outputs": {"y": "u"}},
      {"op": "silu", "name": "act", "inputs": {"x": "u"}, "outputs": {"y": "y"}}]})");
  expect_gradients_match(c);
}

TEST(Autodiff, TwoInputsWithTheSameGradientTensor) {
  // relu(a + b): both inputs get relu_bwd's one output; each must be an output of its own.
  Case c = make_case(R"({"name": "same", "io_dtype": "float", "tensors": [
      {"name": "a", "dims": [1, 4, 8]}, {"name": "b", "dims": [1, 4, 8]}, {"name": "y", "dims": [1, 4, 8]}],
    "ops": [{"op": "add", "name": "s", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "t"}},
            {"op": "relu", "name": "r", "inputs": {"x": "t"}, "outputs": {"y": "y"}}]})");
  EXPECT_EQ(c.bwd.gradients.size(), 2u);
  auto g = resolve(c.bwd.spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (const char* n : {"a.grad", "b.grad"}) {
    const int t = g->find_tensor(n);
    ASSERT_GE(t, 0) << n;
    EXPECT_TRUE(g->tensors[t].is_output) << n << " must be written by the backward, not read";
  }
  EXPECT_EQ(c.bwd.inputs.count("b.grad"), 0u);
  expect_gradients_match(c);
}

TEST(Autodiff, EveryActivationBackwardMode) {
  for (const char* act : {"relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid", "tanh"}) {
    SCOPED_TRACE(act);
    Case c = make_case(std::string(R"({"name": "act", "io_dtype": "float", "tensors": [
        {"name": "x", "dims": [1, 4, 16]}, {"name": "y", "dims": [1, 4, 16]}],
      "ops": [{"op": ")") +
                       act + R"(", "name": "f", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})");
    expect_gradients_match(c);
  }
}

TEST(Autodiff, RmsNormAndLayerNormTrainingThroughTheirBackwardOps) {
  Case c = make_case(R"({"name": "norms", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 6, 16]}, {"name": "g1", "dims": [1, 1, 16]},
      {"name": "g2", "dims": [1, 1, 16]}, {"name": "b2", "dims": [1, 1, 16]},
      {"name": "iv1", "dims": [1, 6, 1]}, {"name": "n1", "dims": [1, 6, 16]},
      {"name": "mean2", "dims": [1, 6, 1]}, {"name": "iv2", "dims": [1, 6, 1]}, {"name": "y", "dims": [1, 6, 16]}],
    "ops": [
      {"op": "rmsnorm", "name": "rms", "inputs": {"x": "x", "scale": "g1"},
       "outputs": {"y": "n1", "inv_variance": "iv1"}, "epsilon": 1e-5},
      {"op": "layernorm", "name": "ln", "inputs": {"x": "n1", "scale": "g2", "bias": "b2"},
       "outputs": {"y": "y", "mean": "mean2", "inv_variance": "iv2"}, "epsilon": 1e-5}]})");
  EXPECT_EQ(c.bwd.seeds, std::vector<std::string>{"y"});
  EXPECT_EQ(c.bwd.gradients.size(), 4u);
  expect_gradients_match(c, 3e-2);
}

TEST(Autodiff, CrossEntropyFromItsSavedLogSumExp) {
  Case c = make_case(R"({"name": "ce", "io_dtype": "float", "tensors": [
      {"name": "logits", "dims": [6, 10, 1, 1]}, {"name": "labels", "dims": [6, 1, 1, 1], "dtype": "int32",
       "values": [0, 3, 9, -100, 4, 4]},
      {"name": "loss", "dims": [6, 1, 1, 1], "dtype": "float"}, {"name": "lse", "dims": [6, 1, 1, 1], "dtype": "float"}],
    "ops": [{"op": "cross_entropy", "name": "ce", "inputs": {"logits": "logits", "labels": "labels"},
             "outputs": {"loss": "loss", "lse": "lse"}}]})");
  EXPECT_EQ(c.bwd.gradients.size(), 1u) << "labels carry no gradient";
  expect_gradients_match(c);
}

TEST(Autodiff, RopeThroughItsBackwardRotation) {
  std::string freqs;
  for (int p = 0; p < 8; ++p)
    for (int i = 0; i < 4; ++i)
      freqs += (freqs.empty() ? "" : ", ") + std::to_string(p * std::pow(100.0, -i / 4.0));
  Case c = make_case(R"({"name": "rope", "io_dtype": "float", "tensors": [
      {"name": "q", "dims": [1, 2, 8, 8]},
      {"name": "freqs", "dims": [1, 1, 8, 4], "dtype": "float", "values": [)" +
                     freqs + R"(]},
      {"name": "qr", "dims": [1, 2, 8, 8]}],
    "ops": [{"op": "rope", "name": "rq", "inputs": {"x": "q", "freqs": "freqs"}, "outputs": {"y": "qr"}}]})");
  EXPECT_EQ(c.bwd.gradients.size(), 1u) << "freqs carry no gradient";
  expect_gradients_match(c);
}

TEST(Autodiff, CausalGroupedQueryAttentionFromItsSavedStats) {
  // 4 query heads over 2 KV heads: dk and dv sum over the heads sharing them.
  Case c = make_case(R"({"name": "attn", "io_dtype": "bfloat16", "tensors": [
      {"name": "q", "dims": [1, 4, 8, 8]}, {"name": "k", "dims": [1, 2, 8, 8]}, {"name": "v", "dims": [1, 2, 8, 8]},
      {"name": "o", "dims": [1, 4, 8, 8]}, {"name": "stats", "dims": [1, 4, 8, 1], "dtype": "float"}],
    "ops": [{"op": "sdpa_fwd", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v"},
             "outputs": {"o": "o", "stats": "stats"}, "causal": true}]})");
  EXPECT_EQ(c.bwd.seeds, std::vector<std::string>{"o"}) << "stats carry no gradient";
  EXPECT_EQ(c.bwd.gradients.size(), 3u);
  expect_gradients_match(c);
}

TEST(Autodiff, EmbeddingTableThroughTheScatterAdd) {
  // Repeated ids: their rows of dy add up in the table's gradient.
  Case c = make_case(R"({"name": "emb", "io_dtype": "float", "tensors": [
      {"name": "ids", "dims": [8, 1, 1, 1], "dtype": "int32", "values": [2, 0, 2, 5, 1, 2, 0, 3]},
      {"name": "table", "dims": [6, 4, 1, 1], "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
    "ops": [{"op": "embedding", "name": "embed", "inputs": {"ids": "ids", "table": "table"}, "outputs": {"y": "y"}}]})");
  EXPECT_EQ(c.bwd.gradients.size(), 1u) << "ids carry no gradient";
  expect_gradients_match(c);
}

TEST(Autodiff, RefusalsNameTheOpAndSayWhatWouldWork) {
  auto fwd = resolve_json(R"({"name": "ln", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 4, 8]}, {"name": "g", "dims": [1, 1, 8]}, {"name": "b", "dims": [1, 1, 8]},
      {"name": "y", "dims": [1, 4, 8]}],
    "ops": [{"op": "layernorm", "name": "ln", "inputs": {"x": "x", "scale": "g", "bias": "b"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto b = derive_backward(*fwd);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(b.status().message().find("[layernorm 'ln']"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("declare the outputs 'mean' and 'inv_variance'"), std::string::npos)
      << b.status().message();

  BackwardOptions o;
  o.wrt = {"y"};
  auto w = derive_backward(*fwd, o);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("wrt 'y' is not an input"), std::string::npos) << w.status().message();

  auto red = resolve_json(R"({"name": "r", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 4, 8]}, {"name": "y", "dims": [1, 1, 8]}],
    "ops": [{"op": "reduce_sum", "name": "sum", "inputs": {"x": "x"}, "outputs": {"y": "y"}, "reduce_dims": [1]}]})");
  ASSERT_TRUE(red.ok()) << red.status().ToString();
  auto rb = derive_backward(*red);
  ASSERT_FALSE(rb.ok());
  EXPECT_NE(rb.status().message().find("[reduce_sum 'sum']: no gradient"), std::string::npos)
      << rb.status().message();
}

TEST(Autodiff, GradientCheckRefusesGraphsTooLargeForTheCpuReference) {
  Case c = make_case(R"({"name": "big", "io_dtype": "float", "tensors": [
      {"name": "a", "dims": [1, 2048, 2048]}, {"name": "b", "dims": [1, 2048, 2048]}, {"name": "y", "dims": [1, 2048, 2048]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})");
  auto check = check_gradients(c.fwd, c.bwd);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(check.status().message().find("over the limit of 1e+10: check a smaller shape"),
            std::string::npos)
      << check.status().message();
}

TEST(Autodiff, BindingsJsonListsInputsGradientsAndSavedBytes) {
  auto fwd = resolve_json(R"({"name": "mm", "io_dtype": "bfloat16", "tensors": [
      {"name": "a", "dims": [1, 4, 8]}, {"name": "b", "dims": [1, 8, 2]}, {"name": "y", "dims": [1, 4, 2]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto b = derive_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const std::string j = backward_bindings_json(*b);
  for (const char* needle :
       {"\"y.grad\"", "\"gradient\"", "\"a.T\"", "\"transposed\": true", "\"a.grad\"", "\"saved_bytes\": 96"})
    EXPECT_NE(j.find(needle), std::string::npos) << needle << " not in " << j;
  // The backward graph round-trips through the JSON format.
  auto again = parse_graph_json(graph_to_json(b->spec));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(resolve(*again).ok());
}

}  // namespace
}  // namespace fusebox
