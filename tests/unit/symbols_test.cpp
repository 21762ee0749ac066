// Symbolic dims: parsing, ranges, binding concrete shapes, identity per shape.
#include <gtest/gtest.h>

#include <string>

#include "fusebox/graph.h"

using namespace fusebox;

namespace {

const std::string kSmall =
    std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/conv_bias_relu_dyn_small.json";

// A conv + relu whose batch is the symbol N; `symbols` and x's dims are spliced in.
std::string conv_json(const std::string& symbols, const std::string& x_dims,
                      const std::string& x_extra = "") {
  return R"({"name": "c", "symbols": )" + symbols + R"(,
    "tensors": [
      {"name": "x", "dims": )" +
         x_dims + R"(, "layout": "nhwc")" + x_extra + R"(},
      {"name": "w", "dims": [16, 8, 3, 3], "layout": "nhwc"},
      {"name": "y", "layout": "nhwc"}],
    "ops": [
      {"op": "conv_fprop", "name": "conv1", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "c1"}, "padding": [1, 1]},
      {"op": "relu", "name": "act", "inputs": {"x": "c1"}, "outputs": {"y": "y"}}]})";
}

void expect_error(const Status& st, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  for (const char* p : parts)
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' in " << st.message();
}

GraphSpec must_load(const std::string& path) {
  auto s = load_graph_file(path);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : GraphSpec{};
}

ResolvedGraph must_resolve(const GraphSpec& s) {
  auto g = resolve(s);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : ResolvedGraph{};
}

TEST(Symbols, ExampleParsesAtItsDefault) {
  GraphSpec s = must_load(kSmall);
  ASSERT_EQ(s.symbols.size(), 1u);
  const SymbolRange& n = s.symbols.at("N");
  EXPECT_EQ(n.min, 1);
  EXPECT_EQ(n.max, 8);
  EXPECT_EQ(n.default_value, 2);
  EXPECT_EQ(n.value, 2);
  EXPECT_EQ(s.tensors[0].dims, (std::vector<int64_t>{2, 8, 10, 10}));
  EXPECT_EQ(s.tensors[0].dim_symbols, (std::vector<std::string>{"N", "", "", ""}));
  EXPECT_TRUE(s.tensors[1].dim_symbols.empty());
  ResolvedGraph g = must_resolve(s);
  EXPECT_EQ(g.shape, (ShapeValues{{"N", 2}}));
  EXPECT_FALSE(g.symbolic_id.empty());
  EXPECT_NE(describe(g).find("symbolic, at shape N=2"), std::string::npos) << describe(g);
}

TEST(Symbols, ArrayRangeDefaultsToItsMax) {
  auto s = parse_graph_json(conv_json(R"({"N": [1, 32]})", R"(["N", 8, 6, 6])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->symbols.at("N").default_value, 32);
  EXPECT_EQ(s->tensors[0].dims[0], 32);
}

TEST(Symbols, ParseErrorsNameTheSymbol) {
  expect_error(parse_graph_json(conv_json(R"({"N": [1, 32]})", R"(["B", 8, 6, 6])"), "g.json").status(),
               {"g.json", "tensors[0] ('x').dims[0]", "unknown symbol \"B\"", "declared: N"});
  expect_error(parse_graph_json(conv_json(R"({"N": [8, 4]})", R"(["N", 8, 6, 6])"), "g.json").status(),
               {"symbols.N", "[8, 4]", "min <= max"});
  expect_error(parse_graph_json(conv_json(R"({"N": [0, 4]})", R"(["N", 8, 6, 6])"), "g.json").status(),
               {"symbols.N", "1 <= min"});
  expect_error(parse_graph_json(
                   conv_json(R"({"N": {"min": 1, "max": 4, "default": 5}})", R"(["N", 8, 6, 6])"), "g.json")
                   .status(),
               {"symbols.N.default", "5", "[1, 4]"});
  expect_error(parse_graph_json(conv_json(R"({"N": [1, 2, 3]})", R"(["N", 8, 6, 6])"), "g.json").status(),
               {"symbols.N", "[min, max]"});
  expect_error(
      parse_graph_json(conv_json(R"({"N": {"min": 1, "max": 4, "step": 2}})", R"(["N", 8, 6, 6])"), "g.json")
          .status(),
      {"symbols.N", "step"});
  expect_error(parse_graph_json(conv_json(R"([1, 4])", R"(["N", 8, 6, 6])"), "g.json").status(), {"symbols"});
  // Names stay plain: no '=' or ',' (they would break --shape), no control bytes.
  for (const char* bad : {R"({"B=1": [1, 4]})", R"({"a,b": [1, 4]})", R"({"1N": [1, 4]})", R"({"": [1, 4]})",
                          R"({"N\u001b": [1, 4]})"}) {
    expect_error(parse_graph_json(conv_json(bad, R"([2, 8, 6, 6])"), "g.json").status(),
                 {"symbols", "letters, digits and '_'"});
  }
}

TEST(Symbols, AStringDimWithoutSymbolsIsATypeError) {
  auto r = parse_graph_json(R"({"tensors": [{"name": "x", "dims": [2, "N"]}], "ops": []})", "g.json");
  expect_error(r.status(), {"tensors[0] ('x').dims[1]", "expected an integer", "\"N\""});
}

TEST(Symbols, StridesOrValuesCannotFollowASymbolicShape) {
  auto s =
      parse_graph_json(conv_json(R"({"N": [1, 4]})", R"(["N", 8, 6, 6])", R"(, "strides": [288, 1, 48, 8])"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  expect_error(resolve(*s).status(), {"'x'", "symbolic dims and explicit strides", "layout"});
}

TEST(Symbols, BindDerivesDimsAndStridesPerShape) {
  GraphSpec s = must_load(kSmall);
  auto b4 = bind_shape(s, {{"N", 4}});
  ASSERT_TRUE(b4.ok()) << b4.status().ToString();
  ResolvedGraph g4 = must_resolve(*b4);
  const ResolvedTensor& x = g4.tensors[g4.find_tensor("x")];
  EXPECT_EQ(x.dims, (std::vector<int64_t>{4, 8, 10, 10}));
  EXPECT_EQ(x.strides, (std::vector<int64_t>{800, 1, 80, 8}));  // nhwc at N=4
  EXPECT_EQ(g4.tensors[g4.find_tensor("y")].dims, (std::vector<int64_t>{4, 16, 5, 5}));
  EXPECT_EQ(g4.shape, (ShapeValues{{"N", 4}}));
  // No values: the defaults.
  auto def = bind_shape(s, {});
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->tensors[0].dims[0], 2);
  // The range's ends are in it.
  EXPECT_TRUE(bind_shape(s, {{"N", 1}}).ok());
  EXPECT_TRUE(bind_shape(s, {{"N", 8}}).ok());
}

TEST(Symbols, OutOfRangeNamesTheDimAndTheRange) {
  GraphSpec s = must_load(kSmall);
  expect_error(bind_shape(s, {{"N", 9}}).status(), {"[graph 'conv_bias_relu_dyn_small']", "symbol 'N'",
                                                    "dim 0 of 'x'", "= 9", "outside its range [1, 8]"});
  expect_error(bind_shape(s, {{"N", 0}}).status(), {"symbol 'N'", "[1, 8]"});
  expect_error(bind_shape(s, {{"B", 2}}).status(), {"unknown symbol 'B'", "declares N"});
  GraphSpec fixed =
      must_load(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/conv_bias_relu_small.json");
  expect_error(bind_shape(fixed, {{"N", 2}}).status(), {"declares no symbols"});
  EXPECT_TRUE(bind_shape(fixed, {}).ok());
}

TEST(Symbols, EachShapeHasItsOwnKeyAndOneGraphIdentity) {
  GraphSpec s = must_load(kSmall);
  ResolvedGraph g2 = must_resolve(*bind_shape(s, {{"N", 2}}));
  ResolvedGraph g4 = must_resolve(*bind_shape(s, {{"N", 4}}));
  // Plan-cache keys are made from the canonical form: the concrete dims are in it.
  EXPECT_NE(graph_fingerprint(g2), graph_fingerprint(g4));
  EXPECT_NE(g2.canonical, g4.canonical);
  EXPECT_EQ(g2.symbolic_id, g4.symbolic_id);
  EXPECT_EQ(g2.symbolic_id, symbolic_graph_id(s));
  // At N=2 it is the same concrete graph as the static small example.
  ResolvedGraph fixed = must_resolve(
      must_load(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/conv_bias_relu_small.json"));
  EXPECT_EQ(graph_fingerprint(g2), graph_fingerprint(fixed));
  EXPECT_TRUE(fixed.symbolic_id.empty());
  EXPECT_TRUE(fixed.shape.empty());
  // Another range is another symbolic graph (another kernel cache).
  GraphSpec wider = s;
  wider.symbols.at("N").max = 16;
  EXPECT_NE(symbolic_graph_id(wider), symbolic_graph_id(s));
}

TEST(Symbols, JsonRoundTripKeepsSymbols) {
  GraphSpec s = must_load(kSmall);
  auto bound = bind_shape(s, {{"N", 5}});
  ASSERT_TRUE(bound.ok());
  const std::string text = graph_to_json(*bound);
  EXPECT_NE(text.find("\"N\""), std::string::npos) << text;
  auto again = parse_graph_json(text, "rt");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
  EXPECT_EQ(again->symbols.at("N").min, 1);
  EXPECT_EQ(again->symbols.at("N").max, 8);
  EXPECT_EQ(again->symbols.at("N").value, 2);  // the file format holds the default, not the bound value
  EXPECT_EQ(again->tensors[0].dim_symbols, s.tensors[0].dim_symbols);
  EXPECT_EQ(symbolic_graph_id(*again), symbolic_graph_id(s));
}

TEST(Symbols, ShapeValuesParse) {
  auto v = parse_shape_values("B=8,S=128");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (ShapeValues{{"B", 8}, {"S", 128}}));
  EXPECT_EQ(shape_text(*v), "B=8,S=128");
  EXPECT_TRUE(parse_shape_values("")->empty());
  for (const char* bad :
       {"B", "=8", "B=0", "B=-1", "B=x", "B=8,", "B=8,B=9", "B=8,,S=1", "B=99999999999999999999"}) {
    auto r = parse_shape_values(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok())
      EXPECT_NE(r.status().message().find("NAME=VALUE"), std::string::npos) << r.status().message();
  }
}

TEST(Symbols, ShapeSweepsParse) {
  auto a = parse_shape_sweep("B=1..4");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->symbol, "B");
  EXPECT_EQ(a->values, (std::vector<int64_t>{1, 2, 3, 4}));
  auto b = parse_shape_sweep("S=16..64:16");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->values, (std::vector<int64_t>{16, 32, 48, 64}));
  auto c = parse_shape_sweep("S=16..70:16");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->values, (std::vector<int64_t>{16, 32, 48, 64}));
  auto l = parse_shape_sweep("B=1,2,8");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->values, (std::vector<int64_t>{1, 2, 8}));
  for (const char* bad : {"B", "B=", "B=4..1", "B=1..100000", "B=a..b", "B=1..4:0", "B=1,,2", "=1..2"}) {
    EXPECT_FALSE(parse_shape_sweep(bad).ok()) << bad;
  }
  auto all = sweep_shapes({*l, *parse_shape_sweep("S=16,32")});
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(all[0], (ShapeValues{{"B", 1}, {"S", 16}}));
  EXPECT_EQ(all[1], (ShapeValues{{"B", 1}, {"S", 32}}));
  EXPECT_EQ(all[5], (ShapeValues{{"B", 8}, {"S", 32}}));
  EXPECT_TRUE(sweep_shapes({}).empty());
}

TEST(Symbols, LargeExamplesBindAcrossTheirRanges) {
  const std::string dir = std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/";
  struct Case {
    const char* file;
    ShapeValues lo, hi;
  };
  for (const Case& c : {Case{"conv_bias_relu_dyn.json", {{"N", 1}}, {{"N", 64}}},
                        Case{"matmul_bias_gelu_dyn.json", {{"B", 1}, {"M", 16}}, {{"B", 64}, {"M", 2048}}},
                        Case{"sdpa_fwd_dyn.json", {{"B", 1}, {"S", 16}}, {{"B", 16}, {"S", 512}}}}) {
    GraphSpec s = must_load(dir + c.file);
    for (const ShapeValues& v : {c.lo, c.hi}) {
      auto b = bind_shape(s, v);
      ASSERT_TRUE(b.ok()) << c.file << ": " << b.status().ToString();
      ResolvedGraph g = must_resolve(*b);
      EXPECT_EQ(g.shape, v) << c.file;
    }
  }
}

}  // namespace
