// The graph loader's limits (src/graph/graph_limits.h): each one, just under and just
// over, on inputs generated here. Over a limit: InvalidArgument naming the place
// and the limit; under it, the file still parses.
#include "graph_limits.h"

#include <gtest/gtest.h>

#include <string>

#include "fusebox/graph.h"

using namespace fusebox;
namespace limits = fusebox::graph_limits;

namespace {

// A valid graph: relu of x, with `extra_tensors` and `extra_fields` spliced in.
std::string graph(const std::string& extra_tensors = "", const std::string& x_fields = "",
                  const std::string& top = "") {
  return R"({)" + top + R"("tensors": [{"name": "x", "dims": [2, 3])" + x_fields + R"(}, {"name": "y"})" +
         extra_tensors +
         R"(], "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})";
}

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

void expect_ok(const std::string& text) {
  auto r = parse_graph_json(text, "big.json");
  EXPECT_TRUE(r.ok()) << r.status().ToString().substr(0, 300);
}

void expect_invalid(const std::string& text, std::initializer_list<std::string> needles) {
  auto r = parse_graph_json(text, "big.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind("big.json: ", 0), 0u) << r.status().message();
  for (const auto& n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << "message lacks '" << n << "': " << r.status().message();
  }
}

}  // namespace

TEST(GraphLimits, BaseGraphParsesAndResolves) {
  auto r = parse_graph_json(graph());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(resolve(*r).ok());
}

TEST(GraphLimits, NestingDepth) {
  const int limit = limits::kMaxJsonDepth;
  // Root object, "tensors", the tensor object: "values" nest from level 4.
  auto with_values = [](int depth) { return graph(R"(, {"name": "v", "values": )" + nested(depth) + "}"); };
  // Nested arrays as "values" are a type error, but only the depth limit stops the parse.
  auto r = parse_graph_json(with_values(limit - 3), "big.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("expected a number, got an array"), std::string::npos)
      << r.status().message();
  expect_invalid(with_values(limit - 2), {"nest deeper than the limit of 64 levels"});
  // What crashed `fusebox check` before the limit: printing a deep array in an error.
  expect_invalid(R"({"tensors": )" + nested(200000) + R"(, "ops": []})", {"the limit of 64 levels"});
  expect_invalid(R"({"tensors": [{"name": "o", "dims": [1], "values": )" + std::string(300000, '{'),
                 {"big.json: at byte 112: JSON arrays and objects nest deeper than the limit of 64 levels"});
  expect_invalid(std::string(300000, '['), {"big.json: at byte 65: JSON arrays"});
  // Brackets in strings are not nesting.
  expect_ok(graph(R"(, {"name": ")" + std::string(100, '[') + R"(\"]]", "scalar": 1})"));
}

TEST(GraphLimits, TensorCount) {
  auto with_tensors = [](size_t n) {
    std::string s;
    for (size_t i = 2; i < n; ++i) s += R"(, {"name": "t)" + std::to_string(i) + R"(", "scalar": 1})";
    return graph(s);
  };
  expect_ok(with_tensors(limits::kMaxTensors));
  expect_invalid(with_tensors(limits::kMaxTensors + 1),
                 {"big.json: tensors: 100001 tensors exceed the limit of 100000 tensors per graph"});
}

TEST(GraphLimits, OpCount) {
  auto with_ops = [](size_t n) {
    std::string s = R"({"tensors": [{"name": "x", "dims": [4]}, {"name": "y"}], "ops": [)";
    for (size_t i = 0; i < n; ++i) {
      const std::string in = i == 0 ? "x" : "t" + std::to_string(i - 1);
      const std::string out = i + 1 == n ? "y" : "t" + std::to_string(i);
      s += std::string(i ? ", " : "") + R"({"op": "relu", "name": "r)" + std::to_string(i) +
           R"(", "inputs": {"x": ")" + in + R"("}, "outputs": {"y": ")" + out + R"("}})";
    }
    return s + "]}";
  };
  expect_ok(with_ops(limits::kMaxOps));
  expect_invalid(with_ops(limits::kMaxOps + 1),
                 {"big.json: ops: 100001 ops exceed the limit of 100000 ops per graph"});
}

TEST(GraphLimits, NameLength) {
  const std::string ok_name(limits::kMaxNameBytes, 'n'), long_name(limits::kMaxNameBytes + 1, 'n');
  expect_ok(graph(R"(, {"name": ")" + ok_name + R"(", "scalar": 1})"));
  expect_invalid(graph(R"(, {"name": ")" + long_name + R"(", "scalar": 1})"),
                 {"tensors[2].name: 257 bytes exceed the limit of 256 bytes per name"});
  expect_invalid(graph("", "", R"("name": ")" + long_name + R"(", )"), {"big.json: name: 257 bytes exceed"});
  expect_invalid(graph("", R"(, "layout": ")" + long_name + R"(")"),
                 {"tensors[0] ('x').layout: 257 bytes exceed the limit of 256 bytes per layout"});
  // Op names, role names and the tensor names in inputs/outputs.
  std::string g = graph();
  std::string op_name = g, role = g, input = g;
  op_name.replace(op_name.find(R"("name": "r")"), 11, R"("name": ")" + long_name + R"(")");
  expect_invalid(op_name, {"ops[0].name: 257 bytes exceed the limit of 256 bytes per name"});
  role.replace(role.find(R"({"x": "x"})"), 10, R"({")" + long_name + R"(": "x"})");
  expect_invalid(role, {"ops[0] ('r').inputs: a role name of 257 bytes exceed the limit of 256 bytes"});
  input.replace(input.find(R"({"y": "y"})"), 10, R"({"y": ")" + long_name + R"("})");
  expect_invalid(input, {"ops[0] ('r').outputs.y: a tensor name of 257 bytes exceed the limit of 256 bytes"});
}

TEST(GraphLimits, ValuesCount) {
  auto with_values = [](size_t n) {
    std::string v = "0";
    for (size_t i = 1; i < n; ++i) v += ",0";
    return graph(R"(, {"name": "v", "dims": [)" + std::to_string(n) + R"(], "dtype": "int32", "values": [)" +
                 v + "]}");
  };
  expect_ok(with_values(limits::kMaxValues));
  expect_invalid(with_values(limits::kMaxValues + 1),
                 {"tensors[2] ('v').values: 1048577 entries exceed the limit of 1048576 entries per tensor"});
}

TEST(GraphLimits, TotalElements) {
  // x holds 6 elements, so one more tensor may hold 2^40 - 6.
  auto with = [](const std::string& dims) { return graph(R"(, {"name": "a", "dims": )" + dims + "}"); };
  expect_ok(with("[1099511627770]"));
  expect_invalid(with("[1099511627771]"),
                 {"tensors[2] ('a').dims: this tensor brings the tensors so far to 1099511627777 elements",
                  "the limit is 1099511627776 (2^40) elements per graph"});
  // Products that overflow 64 bits are caught, not wrapped.
  expect_invalid(with("[4294967296, 4294967296, 4294967296]"),
                 {"tensors[2] ('a').dims: this tensor alone holds more than 1099511627776 elements"});
  // Dims resolve() rejects (< 1) are not counted here: resolve() names them.
  auto r = parse_graph_json(graph().replace(graph().find("[2, 3]"), 6, "[-1099511627776, 1099511627776]"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(resolve(*r).status().message().find("dim 0 is -1099511627776: dims must be >= 1"),
            std::string::npos)
      << resolve(*r).status().message();
}

TEST(GraphLimits, NumbersBeyondDoubleAndInt64) {
  // Too large for a double: refused by the JSON parser, not turned into inf.
  auto r = parse_graph_json(graph(R"(, {"name": "s", "scalar": 1e999})"), "big.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kParseError) << r.status().ToString();
  EXPECT_NE(r.status().message().find("number overflow"), std::string::npos) << r.status().message();
  // Integers past int64 in dims: out of range, or no longer an integer.
  expect_invalid(graph().replace(graph().find("[2, 3]"), 6, "[2, 18446744073709551615]"),
                 {"tensors[0] ('x').dims[1]: integer 18446744073709551615 is out of range"});
  expect_invalid(graph().replace(graph().find("[2, 3]"), 6, "[2, 100000000000000000000]"),
                 {"tensors[0] ('x').dims[1]: expected an integer, got 1e+20"});
}

TEST(GraphLimits, JsonValuesPerFile) {
  // An array of 2^23 + 1 numbers: refused before the document is built (it would take ~40 times the text).
  std::string many = "[0";
  for (size_t i = 1; i <= limits::kMaxJsonValues; ++i) many += ",0";
  expect_invalid(many + "]",
                 {"big.json: at byte " + std::to_string(2 * limits::kMaxJsonValues - 1) +
                  ": more than 8388608 JSON values (numbers, strings, arrays, objects), the limit "
                  "per graph file"});
  // Commas and brackets in strings are not counted.
  const std::string name = R"([,{,]\",)";
  auto r = parse_graph_json(graph(R"(, {"name": ")" + name + R"(", "scalar": 1})"), "big.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.back().name, "[,{,]\",");
}
