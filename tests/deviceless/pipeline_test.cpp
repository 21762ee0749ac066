// Pipeline files: loading, the stage order and every wiring error
// (docs/pipeline-format.md). No GPU, no cuDNN call.
#include "fusebox/pipeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace fusebox {
namespace {

const std::string kDir = std::string(FUSEBOX_SOURCE_DIR) + "/examples/pipelines";
// x [2,8,10,10] -> y [2,16,5,5], and x [2,16,5,5] -> y [2,16,5,5] (bf16, nhwc).
const std::string kDown = "../graphs/small/conv_bias_relu_small.json";
const std::string kSame = "graphs/conv_bias_relu_16to16_small.json";

Result<Pipeline> parse(const std::string& graphs, const std::string& buffers, const std::string& bind) {
  const std::string text = R"({"name": "p", "graphs": {)" + graphs + R"(}, "buffers": {)" + buffers +
                           R"(}, "bind": {)" + bind + "}}";
  return parse_pipeline_json(text, "p.json", kDir);
}

// Constants every stage uses: weights for conv1-like (w1, b1) and 16->16 stages (w2, b2).
const std::string kWeights =
    R"("w1": {"kind": "constant", "file": "weights/two_convs_w1.npy"},
       "b1": {"kind": "constant", "file": "weights/two_convs_b1.npy"},
       "w2": {"kind": "constant", "file": "weights/two_convs_w2.npy"},
       "b2": {"kind": "constant", "file": "weights/two_convs_b2.npy"})";

// Only those of 16->16 stages.
const std::string kWeights2 =
    R"("w2": {"kind": "constant", "file": "weights/two_convs_w2.npy"},
       "b2": {"kind": "constant", "file": "weights/two_convs_b2.npy"})";

std::string same_bind(const std::string& stage, const std::string& in, const std::string& out) {
  return "\"" + stage + R"(": {"x": ")" + in + R"(", "w": "w2", "b": "b2", "y": ")" + out + "\"}";
}

void expect_error(const Result<Pipeline>& p, const std::string& part) {
  ASSERT_FALSE(p.ok()) << "expected an error containing: " << part;
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument) << p.status().ToString();
  EXPECT_NE(p.status().message().find(part), std::string::npos) << p.status().message();
  EXPECT_EQ(p.status().message().rfind("p.json: ", 0), 0u) << p.status().message();
}

TEST(Pipeline, ExampleLoads) {
  auto p = load_pipeline_file(kDir + "/two_convs.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->name, "two_convs");
  ASSERT_EQ(p->stages.size(), 2u);
  EXPECT_EQ(p->order, (std::vector<int>{0, 1}));
  const PipelineBuffer& h = p->buffers[p->find_buffer("hidden")];
  EXPECT_EQ(h.kind, BufferKind::kIntermediate);
  EXPECT_EQ(h.dims, (std::vector<int64_t>{2, 16, 5, 5}));
  EXPECT_EQ(h.dtype, DType::kBF16);
  ASSERT_TRUE(h.writer.has_value());
  EXPECT_EQ(h.writer->stage, 0);
  EXPECT_EQ(h.writer->tensor, "y");
  ASSERT_EQ(h.readers.size(), 1u);
  EXPECT_EQ(h.readers[0].stage, 1);
  EXPECT_EQ(h.readers[0].tensor, "x");
  const PipelineBuffer& w1 = p->buffers[p->find_buffer("w1")];
  EXPECT_EQ(w1.kind, BufferKind::kConstant);
  EXPECT_EQ(w1.file, "weights/two_convs_w1.npy");
  EXPECT_GT(p->flops(), 0);
  EXPECT_DOUBLE_EQ(p->flops(), p->stages[0].graph.flops() + p->stages[1].graph.flops());
}

// "view": part k of n of a dense buffer, read as its own buffer (split_convs: conv1 writes
// hidden [2, 16, 5, 5], each half read by a batch-1 stage).
TEST(Pipeline, ViewsArePartsOfTheirParent) {
  auto p = load_pipeline_file(kDir + "/split_convs.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const PipelineBuffer& h = p->buffers[p->find_buffer("hidden")];
  const PipelineBuffer& h1 = p->buffers[p->find_buffer("hidden_1")];
  EXPECT_FALSE(h.is_view());
  ASSERT_TRUE(h1.is_view());
  EXPECT_EQ(h1.view_of, p->find_buffer("hidden"));
  EXPECT_EQ(h1.dims, (std::vector<int64_t>{1, 16, 5, 5}));
  EXPECT_EQ(h1.view_offset_elements(*p), 400);
  EXPECT_EQ(p->buffers[p->find_buffer("hidden_0")].view_offset_elements(*p), 0);
  EXPECT_FALSE(h1.writer.has_value());
  // Its readers run after the parent's writer, whatever the file order.
  EXPECT_EQ(p->order.front(), 0);
}

TEST(Pipeline, ViewErrors) {
  const std::string down = R"("c1": ")" + kDown + R"(")";
  const std::string graphs = down + R"(, "c2": "graphs/conv_bias_relu_16to16_b1_small.json")";
  const std::string io = R"("image": {"kind": "input"}, "out": {"kind": "output"}, )" + kWeights;
  const std::string bind =
      R"("c1": {"x": "image", "w": "w1", "b": "b1", "y": "hidden"}, )" + same_bind("c2", "half", "out");
  auto with = [&](const std::string& half) {
    return parse(graphs, io + R"(, "hidden": {"kind": "intermediate"}, "half": )" + half, bind);
  };
  ASSERT_TRUE(with(R"({"kind": "intermediate", "view": {"of": "hidden", "part": 1, "parts": 2}})").ok());
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "nothing", "part": 0, "parts": 2}})"),
               "half.view.of: 'nothing' is not a buffer");
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "hidden", "part": 2, "parts": 2}})"),
               "half.view.part: expected an integer from 0 to 1");
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "hidden", "part": 0}})"),
               "missing field 'parts'");
  expect_error(with(R"({"kind": "output", "view": {"of": "hidden", "part": 0, "parts": 2}})"),
               "only an intermediate buffer can be a view");
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "w2", "part": 0, "parts": 2}})"),
               "is a constant");
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "image", "part": 0, "parts": 2}})"),
               "'image' is an input: a view is part of a buffer a stage writes");
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "half", "part": 0, "parts": 2}})"),
               "is the view itself");
  // Three parts of 800 elements: not a whole number of elements each.
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "hidden", "part": 0, "parts": 3}})"),
               "has 800 elements, not a multiple of 3");
  // Four parts of 200: the reader wants 400.
  expect_error(with(R"({"kind": "intermediate", "view": {"of": "hidden", "part": 0, "parts": 4}})"),
               "holds 200 bf16 elements: a view is read as a dense tensor");
  // A view is only read.
  auto written = parse(
      graphs,
      io +
          R"(, "hidden": {"kind": "intermediate"}, "half": {"kind": "intermediate", "view": {"of": "hidden", "part": 0, "parts": 2}}, "h2": {"kind": "intermediate", "view": {"of": "hidden", "part": 1, "parts": 2}})",
      R"("c1": {"x": "image", "w": "w1", "b": "b1", "y": "hidden"}, )" + same_bind("c2", "h2", "half"));
  expect_error(written, "a view is only read; write its parent");
}

TEST(Pipeline, OrderFollowsDataNotFileOrder) {
  auto p =
      parse("\"late\": \"" + kSame + "\", \"early\": \"" + kDown + "\"",
            R"("x": {"kind": "input"}, "h": {"kind": "intermediate"}, "y": {"kind": "output"}, )" + kWeights,
            same_bind("late", "h", "y") + R"(, "early": {"x": "x", "w": "w1", "b": "b1", "y": "h"})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->order, (std::vector<int>{1, 0}));
}

// A chain of n stages listed last to first: the order reverses it (heap-based, not quadratic).
TEST(Pipeline, LongChainInReverse) {
  const int n = 300;
  std::string graphs, buffers = R"("c0": {"kind": "input"}, )" + kWeights2, bind;
  for (int i = n; i >= 1; --i) {
    const std::string s = "s" + std::to_string(i);
    graphs += (graphs.empty() ? "" : ", ") + ("\"" + s + "\": \"" + kSame + "\"");
    bind += (bind.empty() ? "" : ", ") + same_bind(s, "c" + std::to_string(i - 1), "c" + std::to_string(i));
    buffers +=
        ", \"c" + std::to_string(i) + "\": {\"kind\": \"" + (i == n ? "output" : "intermediate") + "\"}";
  }
  auto p = parse(graphs, buffers, bind);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ(p->order.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(p->order[i], n - 1 - i);
  EXPECT_EQ(p->buffers[p->find_buffer("w2")].readers.size(), static_cast<size_t>(n));
}

const std::string kIo = R"("x": {"kind": "input"}, "h": {"kind": "intermediate"}, "y": {"kind": "output"}, )";
const std::string kTwo = "\"a\": \"" + kDown + "\", \"b\": \"" + kSame + "\"";
const std::string kBindA = R"("a": {"x": "x", "w": "w1", "b": "b1", "y": "h"})";

TEST(Pipeline, UnboundTensor) {
  expect_error(parse(kTwo, kIo + kWeights, kBindA + R"(, "b": {"x": "h", "w": "w2", "y": "y"})"),
               "stage 'b': graph tensor 'b' of 'conv_bias_relu_16to16_small' not bound to a buffer");
}

TEST(Pipeline, ShapeMismatchNamesBoth) {
  const std::string graphs = "\"a\": \"" + kDown + "\", \"b\": \"" + kDown + "\"";
  expect_error(parse(graphs, kIo + kWeights, kBindA + R"(, "b": {"x": "h", "w": "w1", "b": "b1", "y": "y"})"),
               "pipeline 'p': stage 'b': graph tensor 'x' is bf16 [2, 8, 10, 10] strides [800, 1, 80, 8] but "
               "buffer 'h' is bf16 [2, 16, 5, 5] strides [400, 1, 80, 16] in stage 'a' (graph tensor 'y')");
}

TEST(Pipeline, DtypeMismatch) {
  const std::string path = ::testing::TempDir() + "/pipeline_fp16_" + std::to_string(::getpid()) + ".json";
  {
    std::ifstream in(kDir + "/" + kSame);
    std::string g((std::istreambuf_iterator<char>(in)), {});
    g.replace(g.find("\"bf16\""), 6, "\"fp16\"");
    std::ofstream(path) << g;
  }
  expect_error(parse("\"a\": \"" + kDown + "\", \"b\": \"" + path + "\"", kIo + kWeights,
                     kBindA + R"(, "b": {"x": "h", "w": "w2", "b": "b2", "y": "y"})"),
               "stage 'b': graph tensor 'x' is fp16 [2, 16, 5, 5]");
  std::remove(path.c_str());
}

TEST(Pipeline, IntermediateReadByNone) {
  expect_error(parse("\"a\": \"" + kDown + "\"",
                     R"("x": {"kind": "input"}, "h": {"kind": "intermediate"}, )" + kWeights, kBindA),
               "intermediate buffer 'h' is written by stage 'a' but read by no stage");
}

TEST(Pipeline, IntermediateWrittenByNone) {
  expect_error(
      parse(
          "\"b\": \"" + kSame + "\"",
          R"("h": {"kind": "intermediate"}, "y": {"kind": "output"}, "w2": {"kind": "constant", "file": "weights/two_convs_w2.npy"}, "b2": {"kind": "constant", "file": "weights/two_convs_b2.npy"})",
          same_bind("b", "h", "y")),
      "intermediate buffer 'h' is written by no stage");
}

TEST(Pipeline, UnusedInput) {
  expect_error(parse(kTwo, kIo + kWeights + R"(, "spare": {"kind": "input"})",
                     kBindA + ", " + same_bind("b", "h", "y")),
               "input buffer 'spare' is read by no stage");
}

TEST(Pipeline, UnusedConstant) {
  expect_error(
      parse("\"b\": \"" + kSame + "\"", R"("x": {"kind": "input"}, "y": {"kind": "output"}, )" + kWeights,
            same_bind("b", "x", "y")),
      "constant buffer 'w1' is read by no stage");
}

TEST(Pipeline, OutputWrittenByNone) {
  expect_error(
      parse(
          "\"b\": \"" + kSame + "\"",
          R"("x": {"kind": "input"}, "y": {"kind": "output"}, "z": {"kind": "output"}, "w2": {"kind": "constant", "file": "weights/two_convs_w2.npy"}, "b2": {"kind": "constant", "file": "weights/two_convs_b2.npy"})",
          same_bind("b", "x", "y")),
      "output buffer 'z' is written by no stage");
}

TEST(Pipeline, TwoWriters) {
  const std::string graphs = "\"a\": \"" + kSame + "\", \"b\": \"" + kSame + "\"";
  expect_error(parse(graphs, R"("x": {"kind": "input"}, "y": {"kind": "output"}, )" + kWeights,
                     same_bind("a", "x", "y") + ", " + same_bind("b", "x", "y")),
               "stage 'b': graph output 'y' writes buffer 'y', which stage 'a' already writes (as 'y'): a "
               "buffer has one writer");
}

TEST(Pipeline, InputWritten) {
  expect_error(
      parse("\"b\": \"" + kSame + "\"", R"("x": {"kind": "input"}, "y": {"kind": "input"}, )" + kWeights,
            same_bind("b", "x", "y")),
      "stage 'b': graph output 'y' writes buffer 'y', a pipeline input: inputs are only read");
}

TEST(Pipeline, Cycle) {
  const std::string graphs = "\"a\": \"" + kSame + "\", \"b\": \"" + kSame + "\", \"c\": \"" + kSame + "\"";
  expect_error(
      parse(
          graphs,
          R"("h1": {"kind": "intermediate"}, "h2": {"kind": "intermediate"}, "h3": {"kind": "intermediate"}, )" +
              kWeights2,
          same_bind("a", "h3", "h1") + ", " + same_bind("b", "h1", "h2") + ", " + same_bind("c", "h2", "h3")),
      "the stages form a cycle: 'a' -> ('h1') -> 'b' -> ('h2') -> 'c' -> ('h3') -> 'a'");
}

TEST(Pipeline, InPlace) {
  expect_error(parse("\"a\": \"" + kSame + "\"", R"("h": {"kind": "intermediate"}, )" + kWeights2,
                     same_bind("a", "h", "h")),
               "stage 'a': reads buffer 'h' (as 'x') that it writes itself (as 'y')");
}

TEST(Pipeline, MissingConstantFile) {
  expect_error(parse(kTwo, kIo + kWeights + R"(, "w9": {"kind": "constant", "file": "weights/nope.npy"})",
                     kBindA + ", " + same_bind("b", "h", "y")),
               "constant buffer 'w9': weights file 'weights/nope.npy' cannot be used: ");
}

TEST(Pipeline, BindingErrors) {
  expect_error(parse(kTwo, kIo + kWeights, kBindA + ", " + same_bind("b", "h", "y") + R"(, "c": {})"),
               "bind: 'c' is not a stage: the stages (graphs) are a, b");
  expect_error(parse(kTwo, kIo + kWeights, kBindA), "stage 'b': missing from 'bind'");
  expect_error(
      parse(kTwo, kIo + kWeights, kBindA + ", " + same_bind("b", "h", "nowhere")),
      "stage 'b': graph tensor 'y' is bound to buffer 'nowhere', which is not declared in 'buffers'");
  expect_error(parse(kTwo, kIo + kWeights,
                     kBindA + R"(, "b": {"x": "h", "w": "w2", "b": "b2", "y": "y", "conv_out": "h"})"),
               "stage 'b': graph tensor 'conv_out' is virtual (it never reaches memory) and takes no buffer");
  expect_error(
      parse(kTwo, kIo + kWeights, kBindA + R"(, "b": {"x": "h", "w": "w2", "b": "b2", "y": "y", "q": "h"})"),
      "stage 'b': binds 'q', which is not a tensor of graph 'conv_bias_relu_16to16_small'");
  expect_error(
      parse(kTwo, kIo + kWeights, kBindA + R"(, "b": {"x": "h", "w": "w2", "b": "b2", "y": "y", "y": "h"})"),
      "key 'y' appears twice in one object");
  expect_error(
      parse(kTwo, kIo + kWeights + R"(, "q": {"kind": "temp"})", kBindA),
      "buffers.q.kind: unknown kind \"temp\": accepted kinds are input, output, constant, intermediate");
}

TEST(Pipeline, GraphErrorsNameTheStage) {
  auto p = parse("\"a\": \"graphs/missing.json\"", R"("x": {"kind": "input"})", R"("a": {})");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kIoError);
  EXPECT_EQ(p.status().message().rfind("p.json: pipeline 'p': stage 'a': ", 0), 0u) << p.status().message();
}

TEST(Pipeline, MalformedJson) {
  auto p = parse_pipeline_json("{\"name\": ", "p.json", kDir);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kParseError);
  auto deep = parse_pipeline_json(std::string(100, '[') + std::string(100, ']'), "p.json", kDir);
  ASSERT_FALSE(deep.ok());
  EXPECT_NE(deep.status().message().find("nest deeper than the limit of 16 levels"), std::string::npos);
}

}  // namespace
}  // namespace fusebox
