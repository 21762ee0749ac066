// src/graph/checks.cpp through resolve(): what cuDNN would refuse at build time
// is refused at check, InvalidArgument naming the tensor or op and the rule.
#include <gtest/gtest.h>

#include <string>

#include "checks.h"
#include "fusebox/graph.h"

using namespace fusebox;

namespace {

// relu: x -> y, with x's and y's extra fields spliced in.
Status resolve_relu(const std::string& dims, const std::string& x_strides,
                    const std::string& y_strides = "") {
  std::string text =
      R"({"tensors": [{"name": "x", "dims": )" + dims +
      (x_strides.empty() ? "" : R"(, "strides": )" + x_strides) + R"(}, {"name": "y")" +
      (y_strides.empty() ? "" : R"(, "strides": )" + y_strides) +
      R"(}], "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})";
  auto spec = parse_graph_json(text, "g.json");
  if (!spec.ok()) return spec.status();
  return resolve(*spec).status();
}

void expect_invalid(const Status& st, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  for (const auto& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
}

std::string chain(size_t n) {
  std::string s = R"({"name": "chain", "tensors": [{"name": "x", "dims": [4]}, {"name": "y"}], "ops": [)";
  for (size_t i = 0; i < n; ++i) {
    const std::string in = i == 0 ? "x" : "t" + std::to_string(i - 1);
    const std::string out = i + 1 == n ? "y" : "t" + std::to_string(i);
    s += std::string(i ? ", " : "") + R"({"op": "relu", "name": "r)" + std::to_string(i) +
         R"(", "inputs": {"x": ")" + in + R"("}, "outputs": {"y": ")" + out + R"("}})";
  }
  return s + "]}";
}

}  // namespace

TEST(GraphChecks, NonAliasingStridesPass) {
  EXPECT_TRUE(resolve_relu("[2, 3, 4]", "").ok());
  EXPECT_TRUE(resolve_relu("[2, 3, 4]", "[1, 2, 6]").ok());     // column-major
  EXPECT_TRUE(resolve_relu("[2, 3, 4]", "[100, 20, 2]").ok());  // gaps are fine
  EXPECT_TRUE(resolve_relu("[2, 1, 4]", "[4, 0, 1]").ok());     // a size-1 dim never steps
  EXPECT_TRUE(resolve_relu("[2, 1, 4]", "[4, 4, 1]").ok());
  // Interleaved but disjoint: offsets 3i + 2j for i < 2, j < 3 are 0 2 4 3 5 7.
  EXPECT_TRUE(resolve_relu("[2, 3]", "[3, 2]").ok());
}

TEST(GraphChecks, AliasingInputStridesAreRefused) {
  const Status st = resolve_relu("[4, 4]", "[1, 1]");
  expect_invalid(st,
                 {"tensor 'x' (graph input) dims [4, 4] strides [1, 1]", "two logical elements share memory",
                  "dims 0 and 1 overlap: 1 step(s) along dim 0 and 1 along dim 1 both move 1 elements"});
  expect_invalid(resolve_relu("[2, 3, 4]", "[12, 4, 2]"),
                 {"dims 1 and 2 overlap: 1 step(s) along dim 1 and 2 along dim 2"});
  expect_invalid(resolve_relu("[8, 8]", "[6, 4]"),
                 {"dims 0 and 1 overlap: 2 step(s) along dim 0 and 3 along dim 1 both move 12"});
}

TEST(GraphChecks, AliasingOutputStridesAreRefused) {
  expect_invalid(resolve_relu("[4, 4]", "", "[2, 1]"), {"tensor 'y' (graph output)", "dims 0 and 1 overlap"});
}

TEST(GraphChecks, ThreeDimsThatCollideOnlyTogether) {
  // No two dims collide, but 1 + 2 == 3: elements (1, 1, 0) and (0, 0, 1).
  expect_invalid(resolve_relu("[2, 2, 2]", "[1, 2, 3]"), {"8 elements fit in 7 addresses"});
  // 3 dims, span large enough for the count: found by enumeration.
  expect_invalid(resolve_relu("[2, 2, 3]", "[5, 7, 6]"), {"shares offset"});
  // 3 interleaved dims that are disjoint: 0..7 in a Gray-code-like order.
  EXPECT_TRUE(resolve_relu("[2, 2, 2]", "[1, 4, 2]").ok());
}

TEST(GraphChecks, OpCountLimit) {
  const size_t limit = graph_checks::kMaxCudnnOps;
  auto at = parse_graph_json(chain(limit), "c.json");
  ASSERT_TRUE(at.ok());
  EXPECT_TRUE(resolve(*at).ok()) << resolve(*at).status().ToString();
  auto over = parse_graph_json(chain(limit + 1), "c.json");
  ASSERT_TRUE(over.ok());
  expect_invalid(
      resolve(*over).status(),
      {"graph 'chain' has 251 ops; cuDNN accepts at most 250 operations in one graph (MAX_OPGRAPH_OPS",
       "[relu 'r250']"});
}
