// Pipelines without a GPU (include/fusebox/pipeline_run.h): inputs and
// constants checked against their buffers before any GPU work, the total
// file-size cap, deviceless builds of every stage, the reference chain.
#include "fusebox/pipeline_run.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "test_util.h"

namespace fusebox {
namespace {

using testing::devprop_path;
using testing::source_dir;
namespace fs = std::filesystem;

std::string pipelines() { return source_dir() + "/examples/pipelines"; }

using testing::TempDir;
using testing::write_text;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// two_convs with absolute graph paths and w1 from `w1_file` (relative to the temp folder).
std::string two_convs_with(const TempDir& dir, const std::string& w1_file) {
  const std::string w = pipelines() + "/weights/";
  const std::string text = R"({"name": "twc", "graphs": {"conv1": ")" + source_dir() +
                           R"(/examples/graphs/small/conv_bias_relu_small.json", "conv2": ")" + pipelines() +
                           R"(/graphs/conv_bias_relu_16to16_small.json"},
    "buffers": {"image": {"kind": "input"}, "w1": {"kind": "constant", "file": ")" +
                           w1_file + R"("},
      "b1": {"kind": "constant", "file": ")" +
                           w + R"(two_convs_b1.npy"}, "hidden": {"kind": "intermediate"},
      "w2": {"kind": "constant", "file": ")" +
                           w + R"(two_convs_w2.npy"},
      "b2": {"kind": "constant", "file": ")" +
                           w + R"(two_convs_b2.npy"}, "out": {"kind": "output"}},
    "bind": {"conv1": {"x": "image", "w": "w1", "b": "b1", "y": "hidden"},
             "conv2": {"x": "hidden", "w": "w2", "b": "b2", "y": "out"}}})";
  const std::string path = dir.file("twc.json");
  write_text(path, text);
  return path;
}

HostTensor dense(DType dtype, std::vector<int64_t> dims) {
  HostTensor h;
  h.dtype = dtype;
  h.dims = dims;
  h.strides.assign(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) h.strides[i] = h.strides[i + 1] * dims[i + 1];
  h.data.assign(static_cast<size_t>(h.element_count()) * dtype_size_bytes(dtype), 0);
  return h;
}

void expect_has(const Status& st, const std::vector<std::string>& parts) {
  for (const auto& part : parts)
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in: " << st.message();
}

TEST(PipelineData, ExampleInputsAndConstants) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = load_pipeline_data(*p, 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->size(), 5u);  // image and four constants
  for (const auto& [bi, h] : *d) {
    const PipelineBuffer& b = p->buffers[bi];
    EXPECT_TRUE(b.kind == BufferKind::kInput || b.kind == BufferKind::kConstant) << b.name;
    EXPECT_EQ(h.dims, b.dims) << b.name;
    EXPECT_EQ(h.dtype, b.dtype) << b.name;
  }
  // The same seed, the same input; another seed, another.
  auto again = load_pipeline_data(*p, 1);
  auto other = load_pipeline_data(*p, 2);
  const int image = p->find_buffer("image");
  EXPECT_EQ(d->at(image).data, again->at(image).data);
  EXPECT_NE(d->at(image).data, other->at(image).data);
}

TEST(PipelineData, GivenInputIsRead) {
  TempDir dir;
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  const int image = p->find_buffer("image");
  HostTensor h = dense(DType::kFP32, p->buffers[image].dims);
  float* f = reinterpret_cast<float*>(h.data.data());
  for (int64_t i = 0; i < h.element_count(); ++i) f[i] = 0.5f;
  ASSERT_TRUE(write_npy(dir.file("image.npy"), h).ok());
  auto d = load_pipeline_data(*p, 1, {{"image", dir.file("image.npy")}});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  for (float v : d->at(image).to_float_logical()) ASSERT_EQ(v, 0.5f);

  auto wrong = load_pipeline_data(*p, 1, {{"hidden", dir.file("image.npy")}});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  expect_has(wrong.status(), {"pipeline 'two_convs'", "'hidden'", "is not an input buffer", "'image'"});
}

// An embedding stage's ids from an input file: read and checked before any GPU work; an id
// outside the table names the stage, the position and the value. Random ids are rows of it.
TEST(PipelineData, EmbeddingIdsAreCheckedWhenLoaded) {
  TempDir dir;
  const std::string path = dir.file("emb.json");
  write_text(path, R"({"name": "emb", "graphs": {"embed": ")" + source_dir() +
                       R"(/examples/graphs/small/embedding_small.json"},
    "buffers": {"tok": {"kind": "input"}, "table": {"kind": "input"}, "pos": {"kind": "input"},
                "out": {"kind": "output"}},
    "bind": {"embed": {"ids": "tok", "table": "table", "pos": "pos", "y": "out"}}})");
  auto p = load_pipeline_file(path);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(load_pipeline_data(*p, 3).ok());  // random ids: rows of the 50-row table
  HostTensor ids = dense(DType::kInt32, {12, 1, 1, 1});
  int32_t* v = reinterpret_cast<int32_t*>(ids.data.data());
  for (int i = 0; i < 12; ++i) v[i] = i;
  v[7] = 50;
  ASSERT_TRUE(write_npy(dir.file("tok.npy"), ids).ok());
  auto d = load_pipeline_data(*p, 1, {{"tok", dir.file("tok.npy")}});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  expect_has(
      d.status(),
      {"stage 'embed'", "[embedding 'embed'] input 'ids' ('ids'): ids[7] = 50 is outside table", "50 rows"});
}

TEST(PipelineData, WrongShapedWeights) {
  TempDir dir;
  ASSERT_TRUE(write_npy(dir.file("w1.npy"), dense(DType::kFP32, {16, 8, 3, 1})).ok());
  auto p = load_pipeline_file(two_convs_with(dir, dir.file("w1.npy")));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = load_pipeline_data(*p, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  expect_has(d.status(), {"twc.json: pipeline 'twc'", "constant buffer 'w1'", "w1.npy",
                          "expected a float array of shape [16, 8, 3, 3] for bf16", "(16, 8, 3, 1)"});
}

TEST(PipelineData, ParallelLoadingKeepsOrderAndTheFirstFailure) {
  // The weights load on several threads: the data is the same every time, and with two bad
  // files the error is always the first one in buffer order (w1 before w2), never a race.
  TempDir dir;
  ASSERT_TRUE(write_npy(dir.file("w1.npy"), dense(DType::kFP32, {16, 8, 3, 1})).ok());
  std::string text = read_text(two_convs_with(dir, dir.file("w1.npy")));
  const std::string w2 = pipelines() + "/weights/two_convs_w2.npy";
  const size_t at = text.find(w2);
  ASSERT_NE(at, std::string::npos);
  ASSERT_TRUE(write_npy(dir.file("w2bad.npy"), dense(DType::kFP32, {1, 2, 3})).ok());
  text.replace(at, w2.size(), dir.file("w2bad.npy"));
  write_text(dir.file("twc2.json"), text);
  auto bad = load_pipeline_file(dir.file("twc2.json"));
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  for (int i = 0; i < 20; ++i) {
    auto d = load_pipeline_data(*bad, 1);
    ASSERT_FALSE(d.ok());
    expect_has(d.status(), {"constant buffer 'w1'", "(16, 8, 3, 1)"});
  }
  auto good = load_pipeline_file(source_dir() + "/examples/pipelines/two_convs.json");
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  auto a = load_pipeline_data(*good, 7);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  for (int i = 0; i < 5; ++i) {
    auto b = load_pipeline_data(*good, 7);
    ASSERT_TRUE(b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (const auto& [bi, h] : *a)
      EXPECT_EQ(h.data, b->at(bi).data) << good->buffers[static_cast<size_t>(bi)].name;
  }
}

TEST(PipelineData, WrongDtypeWeights) {
  TempDir dir;
  ASSERT_TRUE(write_npy(dir.file("w1.npy"), dense(DType::kInt32, {16, 8, 3, 3})).ok());
  auto p = load_pipeline_file(two_convs_with(dir, dir.file("w1.npy")));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = load_pipeline_data(*p, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  expect_has(d.status(), {"pipeline 'twc'", "constant buffer 'w1'", "integer array '<i4'", "bf16"});
}

TEST(PipelineData, NotNpyWeights) {
  TempDir dir;
  write_text(dir.file("w1.npy"), "not a numpy file at all");
  auto p = load_pipeline_file(two_convs_with(dir, dir.file("w1.npy")));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = load_pipeline_data(*p, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kParseError);
  expect_has(d.status(), {"pipeline 'twc'", "constant buffer 'w1'", "bad magic"});
}

TEST(PipelineLimits, WeightsOverTheTotalCap) {
  TempDir dir;
  // Sparse: the size is what counts, checked before a byte is read.
  { std::ofstream(dir.file("huge.npy")).put('x'); }
  fs::resize_file(dir.file("huge.npy"), kMaxPipelineTotalFileBytes + 1);
  auto p = load_pipeline_file(two_convs_with(dir, dir.file("huge.npy")));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  expect_has(p.status(), {"twc.json: pipeline 'twc'", "graph and weights files add up to", "64 GiB"});
}

TEST(PipelineLimits, GraphFilesOverTheCapPerStage) {
  TempDir dir;
  // 5 stages naming one 60 MiB graph file (under the per-file limit): 300 MiB read in all.
  { std::ofstream(dir.file("g.json")).put('{'); }
  fs::resize_file(dir.file("g.json"), uint64_t{60} << 20);
  std::string graphs, bind;
  for (int i = 0; i < 5; ++i) {
    graphs += std::string(i ? ", " : "") + "\"s" + std::to_string(i) + "\": \"g.json\"";
    bind += std::string(i ? ", " : "") + "\"s" + std::to_string(i) + "\": {}";
  }
  write_text(dir.file("p.json"), R"({"name": "big", "graphs": {)" + graphs +
                                     R"(}, "buffers": {"x": {"kind": "input"}}, "bind": {)" + bind + "}}");
  auto p = load_pipeline_file(dir.file("p.json"));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  expect_has(p.status(), {"pipeline 'big'", "graph files add up to 314572800 bytes", "256 MiB"});
}

TEST(PipelineBuildDeviceless, TwoConvs) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  SessionOptions so;
  so.device_properties_file = devprop_path();
  auto s = Session::create(so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  PipelineBuild b;
  Status st = build_pipeline(**s, *p, {}, &b);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(b.stages.size(), 2u);
  for (const auto& sb : b.stages) {
    EXPECT_TRUE(sb.ok);
    EXPECT_FALSE(sb.plan.engine_name().empty());
    EXPECT_EQ(sb.report.source, PlanSource::kBuilt);
    EXPECT_GT(sb.ms, 0);
  }
  auto plans = b.plans_by_stage(*p);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0], &b.stages[0].plan);

  // A deviceless session builds but cannot run.
  auto data = load_pipeline_data(*p, 1);
  ASSERT_TRUE(data.ok());
  auto ex = PipelineExecutor::create(**s, *p, plans, *data);
  ASSERT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), StatusCode::kNoDevice);
}

TEST(PipelineBuildDeviceless, FailureNamesTheStage) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  SessionOptions so;
  so.device_properties_file = devprop_path();
  auto s = Session::create(so);
  ASSERT_TRUE(s.ok());
  PlanRequest r;
  r.engine = "eng9999_no_such_engine";
  PipelineBuild b;
  Status st = build_pipeline(**s, *p, r, &b);
  ASSERT_FALSE(st.ok());
  expect_has(st, {"pipeline 'two_convs'", "stage 'conv1'"});
  ASSERT_EQ(b.stages.size(), 1u);  // stopped at the first stage
  EXPECT_FALSE(b.stages[0].ok);
}

TEST(PipelineBuildDeviceless, KeepGoingTriesEveryStage) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  SessionOptions so;
  so.device_properties_file = devprop_path();
  auto s = Session::create(so);
  ASSERT_TRUE(s.ok());
  PlanRequest r;
  r.engine = "eng9999_no_such_engine";
  PipelineBuild b;
  Status st = build_pipeline(**s, *p, r, &b, /*keep_going=*/true);
  ASSERT_FALSE(st.ok());
  expect_has(st, {"pipeline 'two_convs'", "stage 'conv1'", "2 of 2 stages failed to build"});
  ASSERT_EQ(b.stages.size(), 2u);  // both tried
  for (const auto& sb : b.stages) {
    EXPECT_FALSE(sb.ok);
    EXPECT_FALSE(sb.error.ok());
  }
  expect_has(b.stages[1].error, {"stage 'conv2'"});
  EXPECT_EQ(b.plans_by_stage(*p)[1], nullptr);

  // Nothing fails: the same as without keep_going.
  PipelineBuild ok;
  ASSERT_TRUE(build_pipeline(**s, *p, {}, &ok, true).ok());
  EXPECT_EQ(ok.stages.size(), 2u);
}

TEST(PipelineReference, ChainIsStageByStage) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  auto data = load_pipeline_data(*p, 3);
  ASSERT_TRUE(data.ok());
  std::string kind;
  auto chain = reference_chain(*p, *data, 2e9, &kind);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  EXPECT_EQ(kind, "cpu");
  ASSERT_TRUE(chain->count("hidden") && chain->count("out"));

  // By hand: stage 1's reference, rounded to bf16 in hidden's layout, feeds stage 2's.
  const PipelineStage& s1 = p->stages[0];
  const PipelineStage& s2 = p->stages[1];
  auto at = [&](const char* b) { return data->at(p->find_buffer(b)); };
  auto r1 = reference_cpu(s1.graph, {{"x", at("image")}, {"w", at("w1")}, {"b", at("b1")}});
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->at("y"), chain->at("hidden"));
  HostTensor hidden = HostTensor::like(buffer_tensor(*p, p->find_buffer("hidden")));
  const std::vector<float>& v = r1->at("y");
  // Dense NHWC storage of [2,16,5,5]: logical (n,c,h,w) at n*400 + h*80 + w*16 + c.
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 16; ++c)
      for (int64_t h = 0; h < 5; ++h)
        for (int64_t w = 0; w < 5; ++w)
          store_element(hidden.data.data() + 2 * (n * 400 + h * 80 + w * 16 + c), DType::kBF16,
                        v[static_cast<size_t>(((n * 16 + c) * 5 + h) * 5 + w)]);
  auto r2 = reference_cpu(s2.graph, {{"x", hidden}, {"w", at("w2")}, {"b", at("b2")}});
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->at("y"), chain->at("out"));
}

TEST(PipelineReference, ChainToleranceGrowsWithDepth) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  const Tolerance one = tolerance_for(p->stages[0].graph, "y");
  const Tolerance hidden = chain_tolerance(*p, p->find_buffer("hidden"));
  const Tolerance out = chain_tolerance(*p, p->find_buffer("out"));
  EXPECT_DOUBLE_EQ(hidden.rel_l2, one.rel_l2);
  EXPECT_DOUBLE_EQ(out.rel_l2, 2 * one.rel_l2);
  EXPECT_DOUBLE_EQ(out.max_abs_rel, 2 * one.max_abs_rel);

  auto c10 = load_pipeline_file(pipelines() + "/conv10.json");
  ASSERT_TRUE(c10.ok()) << c10.status().ToString();
  EXPECT_DOUBLE_EQ(chain_tolerance(*c10, c10->find_buffer("out")).rel_l2, 10 * one.rel_l2);
}

TEST(PipelineReference, VerifyStatusNamesTheFirstFailingStage) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  PipelineRunResult r;
  r.verified_ok = false;
  for (int s : p->order) {
    StageRun sr;
    sr.stage = s;
    sr.engine = "eng0";
    sr.reference_kind = "cpu";
    Comparison c;
    c.tensor = s == 0 ? "hidden" : "out";
    c.pass = s == 0;
    sr.comparisons.push_back(c);
    sr.verified_ok = c.pass;
    r.stages.push_back(sr);
  }
  Status st = pipeline_verify_status(*p, r);
  EXPECT_EQ(st.code(), StatusCode::kVerificationFailed);
  expect_has(st, {"pipeline 'two_convs'", "stage 'conv2'", "first stage", "buffer out"});
  EXPECT_EQ(st.message().find("stage 'conv1'"), std::string::npos) << st.message();

  r.stages[1].verified_ok = true;
  r.stages[1].comparisons[0].pass = true;
  Comparison c;
  c.tensor = "out";
  r.chain.push_back(c);
  r.chain_reference_kind = "cpu";
  st = pipeline_verify_status(*p, r);
  expect_has(st, {"final outputs", "chained", "buffer out"});
  r.verified_ok = true;
  EXPECT_TRUE(pipeline_verify_status(*p, r).ok());
}

// Every buffer as the references make them: what a correct run leaves.
std::map<int, HostTensor> reference_buffers(const Pipeline& p, const PipelineHostData& data) {
  std::map<int, HostTensor> out = data;
  auto chain = reference_chain(p, data, 2e9);
  EXPECT_TRUE(chain.ok()) << chain.status().ToString();
  for (const auto& [name, values] : *chain) {
    const int b = p.find_buffer(name);
    const ResolvedTensor t = buffer_tensor(p, b);
    HostTensor h = HostTensor::like(t);
    const std::vector<int64_t> idx_strides = t.strides;
    // Logical row-major -> strided storage, rounded to the dtype.
    std::vector<int64_t> idx(t.dims.size(), 0);
    for (size_t i = 0; i < values.size(); ++i) {
      int64_t off = 0;
      for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * idx_strides[d];
      store_element(h.data.data() + off * dtype_size_bytes(t.dtype), t.dtype, values[i]);
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < t.dims[d]) break;
        idx[d] = 0;
      }
    }
    out[b] = std::move(h);
  }
  return out;
}

TEST(PipelineVerify, AttributesTheFirstDivergingStage) {
  auto p = load_pipeline_file(pipelines() + "/two_convs.json");
  ASSERT_TRUE(p.ok());
  auto data = load_pipeline_data(*p, 4);
  ASSERT_TRUE(data.ok());
  const std::map<int, HostTensor> good = reference_buffers(*p, *data);

  PipelineRunResult ok;
  ASSERT_TRUE(verify_pipeline(*p, *data, good, 2e9, &ok).ok());
  EXPECT_TRUE(ok.verified_ok);
  ASSERT_EQ(ok.stages.size(), 2u);
  EXPECT_EQ(ok.stages[0].comparisons.at(0).tensor, "hidden");
  EXPECT_EQ(ok.stages[1].comparisons.at(0).tensor, "out");
  ASSERT_EQ(ok.chain.size(), 1u);
  EXPECT_TRUE(ok.chain[0].pass);
  EXPECT_TRUE(pipeline_verify_status(*p, ok).ok());

  // hidden negated: conv1 diverges and is named first (conv2, whose reference
  // is computed from the wrong hidden, diverges too).
  std::map<int, HostTensor> bad = good;
  HostTensor& h = bad[p->find_buffer("hidden")];
  for (size_t i = 0; i + 1 < h.data.size(); i += 2) h.data[i + 1] ^= 0x80;  // bf16 sign bits
  PipelineRunResult r;
  ASSERT_TRUE(verify_pipeline(*p, *data, bad, 2e9, &r).ok());
  EXPECT_FALSE(r.verified_ok);
  EXPECT_FALSE(r.stages[0].verified_ok);
  Status st = pipeline_verify_status(*p, r);
  EXPECT_EQ(st.code(), StatusCode::kVerificationFailed);
  expect_has(st, {"stage 'conv1'", "first stage", "buffer hidden"});

  // out wrong: conv1 fine, conv2 and the chain diverge; conv2 is named.
  bad = good;
  HostTensor& o = bad[p->find_buffer("out")];
  for (size_t i = 0; i + 1 < o.data.size(); i += 2) o.data[i + 1] ^= 0x80;
  PipelineRunResult r2;
  ASSERT_TRUE(verify_pipeline(*p, *data, bad, 2e9, &r2).ok());
  EXPECT_TRUE(r2.stages[0].verified_ok);
  EXPECT_FALSE(r2.stages[1].verified_ok);
  EXPECT_FALSE(r2.chain.at(0).pass);
  expect_has(pipeline_verify_status(*p, r2), {"stage 'conv2'", "buffer out"});

  // A buffer without a value is an error, not a crash.
  bad.erase(p->find_buffer("hidden"));
  PipelineRunResult r3;
  EXPECT_EQ(verify_pipeline(*p, *data, bad, 2e9, &r3).code(), StatusCode::kInvalidArgument);
}

// A "reshape" buffer (docs/pipeline-format.md): stage a writes h as [1, 6, 8]
// row-major; stage b reads the same memory as [1, 8, 6] column-major (a
// transpose) and adds a bias per column. The references and the verification
// read each stage's view, not the buffer's.
struct ReshapePipeline {
  TempDir dir;
  std::string path;
  ReshapePipeline(const std::string& reshape_field = R"(, "reshape": true)",
                  const std::string& b_dims = R"([1, 8, 6], "layout": "col_major")") {
    write_text(dir.file("a.json"), R"({"name": "relu_rows", "tensors": [{"name": "x", "dims": [1, 6, 8]},
      {"name": "y"}], "ops": [{"op": "relu", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})");
    write_text(dir.file("b.json"), R"({"name": "bias_cols", "tensors": [{"name": "x", "dims": )" + b_dims +
                                       R"(}, {"name": "bias", "dims": [1, 1, 6]}, {"name": "y"}],
      "ops": [{"op": "bias_add", "name": "b", "inputs": {"x": "x", "bias": "bias"}, "outputs": {"y": "y"}}]})");
    path = dir.file("p.json");
    write_text(path, R"({"name": "p", "graphs": {"a": "a.json", "b": "b.json"},
      "buffers": {"x": {"kind": "input"}, "h": {"kind": "intermediate")" +
                         reshape_field + R"(}, "bias": {"kind": "input"}, "out": {"kind": "output"}},
      "bind": {"a": {"x": "x", "y": "h"}, "b": {"x": "h", "bias": "bias", "y": "out"}}})");
  }
};

TEST(PipelineReshape, ViewsOfOneBuffer) {
  ReshapePipeline rp;
  auto p = load_pipeline_file(rp.path);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const PipelineBuffer& h = p->buffers[p->find_buffer("h")];
  EXPECT_TRUE(h.reshape);
  EXPECT_EQ(h.dims, (std::vector<int64_t>{1, 6, 8}));  // the writer's
  EXPECT_EQ(h.strides, (std::vector<int64_t>{48, 8, 1}));
  auto data = load_pipeline_data(*p, 5);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  auto chain = reference_chain(*p, *data, 2e9);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  const std::vector<float> x = data->at(p->find_buffer("x")).to_float_logical();
  const std::vector<float> bias = data->at(p->find_buffer("bias")).to_float_logical();
  const std::vector<float>& out = chain->at("out");  // logical [1, 8, 6]
  ASSERT_EQ(out.size(), 48u);
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 6; ++i) {
      const float want = std::max(x[i * 8 + j], 0.0f) + bias[i];
      ASSERT_NEAR(out[j * 6 + i], want, 1e-6) << "out[0, " << j << ", " << i << "]";
    }
  // What a correct run leaves verifies; the stage reads h through its own view.
  PipelineRunResult r;
  ASSERT_TRUE(verify_pipeline(*p, *data, reference_buffers(*p, *data), 2e9, &r).ok());
  EXPECT_TRUE(r.verified_ok) << pipeline_verify_status(*p, r).ToString();
}

TEST(PipelineReshape, RefusedWithoutTheFlagOrWhenNotTheSameMemory) {
  {
    ReshapePipeline rp("");
    auto p = load_pipeline_file(rp.path);
    ASSERT_FALSE(p.ok());
    expect_has(p.status(), {"stage 'b': graph tensor 'x' is bf16 [1, 8, 6]", "buffer 'h' is bf16 [1, 6, 8]",
                            "\"reshape\": true"});
  }
  {
    ReshapePipeline rp(R"(, "reshape": true)", R"([1, 4, 6])");
    auto p = load_pipeline_file(rp.path);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    expect_has(p.status(), {"stage 'b'", "same dtype and element count and be dense"});
  }
  {
    // Gaps: [1, 8, 6] with a row stride of 7 spans 55 elements for 48.
    ReshapePipeline rp(R"(, "reshape": true)", R"([1, 8, 6], "strides": [56, 7, 1])");
    auto p = load_pipeline_file(rp.path);
    ASSERT_FALSE(p.ok());
    expect_has(p.status(), {"be dense"});
  }
  {
    ReshapePipeline rp(R"(, "reshape": "yes")");
    auto p = load_pipeline_file(rp.path);
    ASSERT_FALSE(p.ok());
    expect_has(p.status(), {"buffers.h.reshape: expected true or false, got a string"});
  }
}

}  // namespace
}  // namespace fusebox
