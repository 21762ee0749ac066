#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusebox/graph.h"

using namespace fusebox;
namespace fs = std::filesystem;

namespace {

std::string examples_dir() { return std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs"; }

std::string read_text(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const char* kMinimal = R"({
  "name": "mini", "io_dtype": "fp16",
  "tensors": [
    {"name": "x", "dims": [2, 8, 6, 6], "layout": "nhwc"},
    {"name": "w", "dims": [4, 8, 3, 3], "strides": [72, 1, 24, 8]},
    {"name": "s", "scalar": 0.5},
    {"name": "y", "dtype": "fp32", "layout": "nhwc"}
  ],
  "ops": [
    {"op": "conv_fprop", "name": "conv1", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "c"},
     "padding": [1, 1], "stride": [2, 2], "compute_dtype": "fp32"},
    {"op": "scale", "name": "sc", "inputs": {"x": "c", "scale": "s"}, "outputs": {"y": "y"}}
  ]
})";

Status parse_error(const std::string& text) {
  auto r = parse_graph_json(text, "graph.json");
  if (r.ok()) return Status::Ok();
  return r.status();
}

void expect_parse_error(const std::string& text, std::initializer_list<const char*> needles) {
  Status s = parse_error(text);
  ASSERT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.message().rfind("graph.json: ", 0), 0u) << s.message();
  for (const char* n : needles)
    EXPECT_NE(s.message().find(n), std::string::npos) << "message lacks '" << n << "': " << s.message();
}

}  // namespace

TEST(Json, ParsesAllFields) {
  auto r = parse_graph_json(kMinimal, "mini.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const GraphSpec& g = *r;
  EXPECT_EQ(g.name, "mini");
  EXPECT_EQ(g.io_dtype, DType::kFP16);
  EXPECT_EQ(g.intermediate_dtype, DType::kFP32);
  ASSERT_EQ(g.tensors.size(), 4u);
  EXPECT_EQ(g.tensors[1].strides, (std::vector<int64_t>{72, 1, 24, 8}));
  EXPECT_EQ(g.tensors[2].scalar_value, 0.5);
  EXPECT_EQ(g.tensors[3].dtype, DType::kFP32);
  ASSERT_EQ(g.ops.size(), 2u);
  EXPECT_EQ(std::get<ConvFpropAttrs>(g.ops[0].attrs).stride, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(g.ops[0].compute_dtype, DType::kFP32);
  auto rg = resolve(g);
  ASSERT_TRUE(rg.ok()) << rg.status().ToString();
  EXPECT_EQ(rg->tensors[rg->find_tensor("y")].dims, (std::vector<int64_t>{2, 4, 3, 3}));
  EXPECT_EQ(rg->tensors[rg->find_tensor("s")].dims, (std::vector<int64_t>{1, 1, 1, 1}));
}

TEST(Json, RoundTrip) {
  auto r = parse_graph_json(kMinimal);
  ASSERT_TRUE(r.ok());
  std::string text = graph_to_json(*r);
  auto r2 = parse_graph_json(text, "roundtrip");
  ASSERT_TRUE(r2.ok()) << r2.status().ToString() << "\n" << text;
  EXPECT_EQ(graph_to_json(*r2), text);
  EXPECT_EQ(r2->tensors[2].scalar_value, 0.5);
  EXPECT_EQ(r2->tensors[1].strides, r->tensors[1].strides);

  // builder-made graph with every op type
  GraphSpec g;
  g.name = "all";
  g.tensor("a", {1, 4, 8});
  g.tensor("b", {1, 8, 4});
  g.scalar("k", 0.1 + 0.2);  // needs 17 digits to round-trip
  std::string t = g.matmul("mm", "a", "b");
  for (auto m : {PointwiseMode::kRelu, PointwiseMode::kGeluTanh, PointwiseMode::kGeluErf,
                 PointwiseMode::kSilu, PointwiseMode::kSigmoid, PointwiseMode::kTanh}) {
    t = g.pointwise(std::string(pointwise_mode_name(m)), m, t);
  }
  t = g.pointwise("scale", PointwiseMode::kScale, t, "k");
  t = g.pointwise("mul", PointwiseMode::kMul, t, t);
  g.output(t, "row_major", DType::kFP32);
  auto rg = resolve(g);
  ASSERT_TRUE(rg.ok()) << rg.status().ToString();
  auto back = parse_graph_json(graph_to_json(g, -1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(graph_to_json(*back), graph_to_json(g));
  EXPECT_EQ(back->tensors[2].scalar_value, 0.1 + 0.2);
  EXPECT_TRUE(resolve(*back).ok());
}

TEST(Json, TypeErrorsNamePath) {
  expect_parse_error(
      R"({"tensors": [{"name": "x", "dims": [1]}, {"name": "w", "dims": [1, "3"]}], "ops": []})",
      {"tensors[1] ('w').dims[1]: expected an integer, got \"3\""});
  expect_parse_error(R"({"tensors": [{"name": "x", "dims": [1.5]}], "ops": []})",
                     {"tensors[0] ('x').dims[0]", "1.5"});
  expect_parse_error(R"({"tensors": [{"name": "x", "virtual": 1}], "ops": []})",
                     {"('x').virtual", "true or false"});
  expect_parse_error(R"({"tensors": {}, "ops": []})", {"tensors", "an array"});
  expect_parse_error(R"([1, 2])", {"graph", "an object"});
  expect_parse_error(R"({"tensors": [{"name": "x", "scalar": "1"}], "ops": []})",
                     {"('x').scalar", "a number"});
  expect_parse_error(R"({"tensors": [], "ops": [{"op": "relu", "name": "r", "inputs": {"x": 3}}]})",
                     {"ops[0] ('r').inputs.x", "a string"});
  expect_parse_error(
      R"({"tensors": [], "ops": [{"op": "conv_fprop", "name": "c", "inputs": {}, "padding": [1, -1.0]}]})",
      {"ops[0] ('c').padding[1]", "expected an integer"});
}

TEST(Json, UnknownNamesListAccepted) {
  expect_parse_error(R"({"tensors": [], "ops": [], "extra": 1})",
                     {"unknown field 'extra'", "io_dtype", "tensors"});
  expect_parse_error(R"({"tensors": [{"name": "x", "shape": [1]}], "ops": []})",
                     {"('x')", "unknown field 'shape'", "dims", "strides", "scalar"});
  expect_parse_error(R"({"tensors": [], "ops": [{"op": "relu", "name": "r", "inputs": {}, "padding": [1]}]})",
                     {"ops[0] ('r')", "unknown field 'padding'", "compute_dtype"});
  expect_parse_error(R"({"tensors": [], "ops": [{"op": "gelu", "name": "g", "inputs": {}}]})",
                     {"ops[0] ('g').op", "unknown op \"gelu\"", "gelu_tanh", "conv_fprop"});
  expect_parse_error(R"({"io_dtype": "fp64", "tensors": [], "ops": []})",
                     {"io_dtype", "fp64", "bf16", "fp8_e4m3"});
  expect_parse_error(R"({"tensors": [{"dims": [1]}], "ops": []})", {"tensors[0]", "missing field 'name'"});
  expect_parse_error(R"({"ops": []})", {"missing field 'tensors'"});
}

TEST(Json, MalformedJsonGivesBytePosition) {
  Status s = parse_error(R"({"tensors": [}, "ops": []})");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kParseError);
  EXPECT_NE(s.message().find("graph.json: invalid JSON at byte 14"), std::string::npos) << s.message();
  EXPECT_FALSE(parse_error("").ok());
  EXPECT_FALSE(parse_error("{").ok());
}

// Issue #32 case 14: a repeated key was accepted, the last one winning (pipeline
// files refused it); text after a NUL byte was ignored.
TEST(Json, RefusesDuplicateKeys) {
  ASSERT_TRUE(parse_error(kMinimal).ok());
  std::string twice = kMinimal;
  twice.replace(twice.find("\"name\": \"mini\""), 14, R"("name": "mini", "name": "other")");
  expect_parse_error(twice, {"key 'name' appears twice"});
  std::string op_twice = kMinimal;
  op_twice.replace(op_twice.find("\"padding\": [1, 1]"), 17, R"("padding": [1, 1], "padding": [0, 0])");
  expect_parse_error(op_twice, {"key 'padding' appears twice"});
}

TEST(Json, RefusesNulByte) {
  std::string text = std::string(kMinimal) + std::string(1, '\0') + "garbage";
  expect_parse_error(text, {"NUL byte", "at byte"});
  std::string inside = kMinimal;
  inside.insert(inside.find("mini") + 2, 1, '\0');
  expect_parse_error(inside, {"NUL byte"});
}

TEST(Json, OpOutputsDefaultToVirtualName) {
  auto r = parse_graph_json(R"({"tensors": [{"name": "x", "dims": [2]}, {"name": "r.y"}],
                                "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->ops[0].outputs.at("y"), "r.y");
  EXPECT_TRUE(resolve(*r).ok());
}

TEST(Json, EveryExampleResolves) {
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(examples_dir())) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    ++files;
    auto spec = load_graph_file(e.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    if (e.path().filename() == "invalid_shapes.json") {
      ASSERT_FALSE(g.ok()) << e.path();
      const std::string& m = g.status().message();
      for (const char* n : {"conv1", "'w'", "'x'", "C=48", "C=64", "divide"})
        EXPECT_NE(m.find(n), std::string::npos) << m;
      continue;
    }
    if (e.path().filename() == "invalid_sdpa_lengths.json") {
      ASSERT_FALSE(g.ok()) << e.path();
      const std::string& m = g.status().message();
      for (const char* n : {"[sdpa_fwd 'attn']", "'seq_len_q'", "500", "[0, 96]"}) {
        EXPECT_NE(m.find(n), std::string::npos) << m;
      }
      continue;
    }
    ASSERT_TRUE(g.ok()) << e.path() << ": " << g.status().ToString();
    EXPECT_FALSE(g->output_tensors().empty());
    EXPECT_FALSE(describe(*g).empty());
    // round trip keeps the resolved graph
    auto again = parse_graph_json(graph_to_json(*spec), "rt");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    auto g2 = resolve(*again);
    ASSERT_TRUE(g2.ok());
    EXPECT_EQ(describe(*g2), describe(*g));
    EXPECT_EQ(graph_fingerprint(*g2), graph_fingerprint(*g));
    if (e.path().parent_path().filename() == "small") {
      // Small examples are checked by the CPU reference everywhere (fp64, well
      // under a second each): keep them under 5e7 multiply-adds.
      double macs = g->flops() / 2;  // upper bound on conv/matmul MACs (includes pointwise)
      EXPECT_LT(macs, 5e7) << e.path();
    }
  }
  EXPECT_GE(files, 9);
}

TEST(Json, ExampleShapes) {
  auto spec = load_graph_file(examples_dir() + "/conv_bias_relu.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const auto& y = g->tensors[g->find_tensor("y")];
  EXPECT_EQ(y.dims, (std::vector<int64_t>{16, 64, 56, 56}));
  EXPECT_EQ(y.strides, (std::vector<int64_t>{200704, 1, 3584, 64}));
  EXPECT_EQ(y.dtype, DType::kBF16);
  EXPECT_TRUE(g->tensors[g->find_tensor("conv_out")].is_virtual);
  EXPECT_EQ(g->tensors[g->find_tensor("conv_out")].dtype, DType::kFP32);
  EXPECT_EQ(g->tensors[g->find_tensor("conv_out")].strides, (std::vector<int64_t>{200704, 1, 3584, 64}));

  auto small = load_graph_file(examples_dir() + "/small/conv_bias_relu_small.json");
  ASSERT_TRUE(small.ok());
  auto gs = resolve(*small);
  ASSERT_TRUE(gs.ok());
  EXPECT_EQ(gs->tensors[gs->find_tensor("y")].dims, (std::vector<int64_t>{2, 16, 5, 5}));
}

TEST(Json, TruncatedFileFailsCleanly) {
  std::string text = read_text(examples_dir() + "/conv_bias_relu.json");
  ASSERT_GT(text.size(), 100u);
  fs::path tmp =
      fs::temp_directory_path() /
      ("fusebox_truncated_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".json");
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text.substr(0, text.size() / 2);
  }
  auto r = load_graph_file(tmp.string());
  fs::remove(tmp);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kParseError);
  EXPECT_NE(r.status().message().find(tmp.string()), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("byte"), std::string::npos);
  for (size_t cut : {size_t{0}, size_t{1}, text.size() - 2}) {
    EXPECT_FALSE(parse_graph_json(text.substr(0, cut), "t").ok()) << cut;
  }
}

TEST(Json, UnreadableFile) {
  auto r = load_graph_file("/nonexistent/dir/graph.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/graph.json"), std::string::npos);
  auto d = load_graph_file(examples_dir());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kIoError);
}

TEST(Json, DocExampleResolves) {
  std::string doc = read_text(std::string(FUSEBOX_SOURCE_DIR) + "/docs/graph-format.md");
  auto start = doc.find("```json\n");
  ASSERT_NE(start, std::string::npos);
  start += 8;
  auto end = doc.find("```", start);
  auto spec = parse_graph_json(doc.substr(start, end - start), "docs/graph-format.md");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->tensors[g->find_tensor("y")].strides, (std::vector<int64_t>{200704, 1, 3584, 64}));
}

TEST(Json, RejectsFilesOver64MiB) {
  fs::path tmp = fs::temp_directory_path() / "fusebox_huge_graph.json";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << "{}";
  }
  fs::resize_file(tmp, (64ull << 20) + 1);  // sparse: cheap
  auto r = load_graph_file(tmp.string());
  fs::remove(tmp);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("64 MiB"), std::string::npos);
}
