// derive_pipeline_backward() (fusebox/pipeline_backward.h): the backward pipeline
// of a three-stage forward (an MLP with gelu, RoPE over a reshaped view of its
// output, an output projection with a residual that reads the pipeline's input a
// second time), written, loaded like any pipeline and run through the reference
// chain, against central finite differences of the forward chain (as
// tests/unit/autodiff_test.cpp does for one graph).
#include "fusebox/pipeline_backward.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "fusebox/pipeline_run.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "fusebox_pipebwd_XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A host tensor laid out as `t` holding `values` (logical row-major).
HostTensor host(const ResolvedTensor& t, const std::vector<double>& values) {
  HostTensor h = HostTensor::like(t);
  const size_t es = dtype_size_bytes(h.dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), off = 0;
    for (int d = static_cast<int>(h.dims.size()) - 1; d >= 0; --d) {
      off += (rem % h.dims[d]) * h.strides[d];
      rem /= h.dims[d];
    }
    store_element(h.data.data() + off * es, h.dtype, values[i]);
  }
  return h;
}

std::vector<double> grid(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-64, 63);
  std::vector<double> v(n);
  for (auto& x : v) x = (d(rng) + 0.5) / 64.0;
  return v;
}

constexpr const char* kMlp = R"({"name": "mlp", "io_dtype": "float", "tensors": [
    {"name": "x", "dims": [1, 8, 16]}, {"name": "w1", "dims": [1, 16, 16]}, {"name": "b1", "dims": [1, 1, 16]},
    {"name": "h", "dims": [1, 8, 16]}],
  "ops": [
    {"op": "matmul", "name": "fc1", "inputs": {"a": "x", "b": "w1"}, "outputs": {"y": "t1"}},
    {"op": "bias_add", "name": "bias1", "inputs": {"x": "t1", "bias": "b1"}, "outputs": {"y": "t2"}},
    {"op": "gelu_tanh", "name": "act", "inputs": {"x": "t2"}, "outputs": {"y": "h"}}]})";
// h [1, 8, 16] seen as [B=1, H=2, S=8, D=8] (bshd strides): the same memory.
constexpr const char* kRope = R"({"name": "rope", "io_dtype": "float", "tensors": [
    {"name": "hq", "dims": [1, 2, 8, 8], "strides": [128, 8, 16, 1]},
    {"name": "freqs", "dims": [1, 1, 8, 4], "dtype": "float"},
    {"name": "r", "dims": [1, 2, 8, 8], "strides": [128, 8, 16, 1]}],
  "ops": [{"op": "rope", "name": "rq", "inputs": {"x": "hq", "freqs": "freqs"}, "outputs": {"y": "r"}}]})";
constexpr const char* kOut = R"({"name": "out", "io_dtype": "float", "tensors": [
    {"name": "r2", "dims": [1, 8, 16]}, {"name": "w2", "dims": [1, 16, 16]}, {"name": "x2", "dims": [1, 8, 16]},
    {"name": "y", "dims": [1, 8, 16]}],
  "ops": [
    {"op": "matmul", "name": "fc2", "inputs": {"a": "r2", "b": "w2"}, "outputs": {"y": "p"}},
    {"op": "add", "name": "res", "inputs": {"a": "p", "b": "x2"}, "outputs": {"y": "y"}}]})";
constexpr const char* kPipeline = R"({"name": "block",
  "graphs": {"mlp": "mlp.json", "rope": "rope.json", "out": "out.json"},
  "buffers": {"x": {"kind": "input"}, "w1": {"kind": "input"}, "b1": {"kind": "input"},
              "freqs": {"kind": "input"}, "w2": {"kind": "input"},
              "h": {"kind": "intermediate", "reshape": true}, "r": {"kind": "intermediate", "reshape": true},
              "y": {"kind": "output"}},
  "bind": {"mlp": {"x": "x", "w1": "w1", "b1": "b1", "h": "h"},
           "rope": {"hq": "h", "freqs": "freqs", "r": "r"},
           "out": {"r2": "r", "w2": "w2", "x2": "x", "y": "y"}}})";

TEST(PipelineBackward, ThreeStagesAgainstFiniteDifferences) {
  TempDir dir;
  write_text(dir.file("mlp.json"), kMlp);
  write_text(dir.file("rope.json"), kRope);
  write_text(dir.file("out.json"), kOut);
  write_text(dir.file("block.json"), kPipeline);
  auto fwd = load_pipeline_file(dir.file("block.json"));
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();

  auto b = derive_pipeline_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->seeds, std::vector<std::string>{"y"});
  EXPECT_EQ(b->gradients.size(), 4u) << "x, w1, b1, w2; freqs carries none";
  EXPECT_EQ(b->gradients.at("x"), "x.grad") << "x is read by two stages: its parts are summed";
  EXPECT_NE(b->pipeline_json.find("\"x.grad_sum\""), std::string::npos) << b->pipeline_json;
  EXPECT_EQ(b->recomputed, (std::vector<std::string>{"mlp: fc1", "mlp: bias1"}));
  auto path = write_pipeline_backward(*fwd, *b, dir.file("bwd"));
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  auto bwd = load_pipeline_file(*path);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString() << "\n" << b->pipeline_json;

  // Forward inputs on a grid, seeds random.
  std::mt19937 rng(3);
  std::map<std::string, std::vector<double>> in;
  for (const PipelineBuffer& buf : fwd->buffers) {
    if (buf.kind != BufferKind::kInput) continue;
    int64_t n = 1;
    for (int64_t d : buf.dims) n *= d;
    in[buf.name] = grid(n, rng);
  }
  auto data_for = [&](const std::map<std::string, std::vector<double>>& values) {
    PipelineHostData d;
    for (int i = 0; i < static_cast<int>(fwd->buffers.size()); ++i)
      if (fwd->buffers[i].kind == BufferKind::kInput)
        d.emplace(i, host(buffer_tensor(*fwd, i), values.at(fwd->buffers[i].name)));
    return d;
  };
  const std::vector<double> seed = grid(8 * 16, rng);
  auto loss = [&](const std::map<std::string, std::vector<double>>& values) {
    auto chain = reference_chain(*fwd, data_for(values), 1e12);
    EXPECT_TRUE(chain.ok()) << chain.status().ToString();
    double l = 0;
    const auto& y = chain->at("y");
    for (size_t i = 0; i < seed.size(); ++i) l += seed[i] * y[i];
    return l;
  };

  // The backward's inputs: saved forward buffers (the same bytes, whatever view the
  // backward reads them through) and the seed.
  auto chain = reference_chain(*fwd, data_for(in), 1e12);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  PipelineHostData bdata;
  for (int i = 0; i < static_cast<int>(bwd->buffers.size()); ++i) {
    const PipelineBuffer& buf = bwd->buffers[i];
    if (buf.kind != BufferKind::kInput) continue;
    const BackwardInput& bi = b->inputs.at(buf.name);
    if (bi.kind == BackwardInput::Kind::kGradient) {
      bdata.emplace(i, host(buffer_tensor(*bwd, i), seed));
      continue;
    }
    const int fb = fwd->find_buffer(bi.forward_tensor);
    std::vector<double> v;
    if (auto it = in.find(bi.forward_tensor); it != in.end()) {
      v = it->second;
    } else {
      const auto& c = chain->at(bi.forward_tensor);
      v.assign(c.begin(), c.end());
    }
    HostTensor f = host(buffer_tensor(*fwd, fb), v);
    HostTensor t = HostTensor::like(buffer_tensor(*bwd, i));
    ASSERT_EQ(t.data.size(), f.data.size()) << buf.name;
    t.data = f.data;
    bdata.emplace(i, std::move(t));
  }
  auto grads = reference_chain(*bwd, bdata, 1e12);
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();

  std::uniform_int_distribution<int> dir3(-1, 1);
  const double e = 1.0 / 16384;
  for (const auto& [x, gbuf] : b->gradients) {
    const std::vector<float>& g = grads->at(gbuf);
    ASSERT_EQ(g.size(), in.at(x).size()) << x;
    std::vector<int> u(g.size());
    for (auto& k : u) k = dir3(rng);
    double analytic = 0, scale = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      analytic += g[i] * u[i];
      scale += std::fabs(g[i] * u[i]);
    }
    auto plus = in, minus = in;
    for (size_t i = 0; i < u.size(); ++i) {
      plus[x][i] += e * u[i];
      minus[x][i] -= e * u[i];
    }
    const double numeric = (loss(plus) - loss(minus)) / (2 * e);
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::fabs(numeric) + 1e-4 * scale)
        << "gradient of buffer '" << x << "' (" << gbuf << ")\n"
        << b->pipeline_json;
  }
}

TEST(PipelineBackward, RefusesToReplaceTheForwardsFiles) {
  TempDir dir;
  write_text(dir.file("mlp.json"), kMlp);
  write_text(dir.file("rope.json"), kRope);
  write_text(dir.file("out.json"), kOut);
  write_text(dir.file("block.json"), kPipeline);
  auto fwd = load_pipeline_file(dir.file("block.json"));
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto b = derive_pipeline_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  PipelineBackward clash = *b;
  clash.graph_files["mlp.json"] = "{}";  // a stage file named like a forward one, in the same folder
  auto w = write_pipeline_backward(*fwd, clash, dir.path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("a file of the forward pipeline"), std::string::npos)
      << w.status().message();
  std::ifstream f(dir.file("mlp.json"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, kMlp) << "the forward graph file was replaced";

  BackwardOptions o;
  o.wrt = {"h"};
  auto bad = derive_pipeline_backward(*fwd, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("wrt 'h' is not an input or constant buffer"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace fusebox
