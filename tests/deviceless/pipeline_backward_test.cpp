// derive_pipeline_backward() (fusebox/pipeline_backward.h): the backward pipeline
// of a three-stage forward (an MLP with gelu, RoPE over a reshaped view of its
// output, an output projection with a residual that reads the pipeline's input a
// second time), written, loaded like any pipeline and run through the reference
// chain, against central finite differences of the forward chain
// (check_pipeline_gradients()).
#include "fusebox/pipeline_backward.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "fusebox/pipeline_run.h"
#include "fusebox/train.h"
#include "test_util.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;

namespace fs = std::filesystem;

using testing::TempDir;
using testing::write_text;

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

// The three-stage block's files in `dir`, loaded.
Result<Pipeline> write_block(const TempDir& dir) {
  write_text(dir.file("mlp.json"), kMlp);
  write_text(dir.file("rope.json"), kRope);
  write_text(dir.file("out.json"), kOut);
  write_text(dir.file("block.json"), kPipeline);
  return load_pipeline_file(dir.file("block.json"));
}

TEST(PipelineBackward, ThreeStagesAgainstFiniteDifferences) {
  TempDir dir;
  auto fwd = write_block(dir);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();

  auto b = derive_pipeline_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->seeds, std::vector<std::string>{"y"});
  EXPECT_EQ(b->gradients.size(), 4u) << "x, w1, b1, w2; freqs carries none";
  EXPECT_EQ(b->gradients.at("x"), "x.grad") << "x is read by two stages: its parts are summed";
  // mlp's part of x's gradient comes out of fc1's matmul: out's part (the residual's) is added in
  // that matmul's epilogue, not in an accumulation stage.
  EXPECT_EQ(b->pipeline_json.find("\"x.grad_sum\""), std::string::npos) << b->pipeline_json;
  ASSERT_TRUE(b->graph_files.count("mlp.bwd.json")) << b->pipeline_json;
  const std::string& mlp_bwd = b->graph_files.at("mlp.bwd.json");
  EXPECT_NE(mlp_bwd.find(".acc0"), std::string::npos) << mlp_bwd;
  EXPECT_NE(mlp_bwd.find(".acc_add0"), std::string::npos) << mlp_bwd;
  EXPECT_EQ(b->recomputed, (std::vector<std::string>{"mlp: fc1", "mlp: bias1"}));
  auto path = write_pipeline_backward(*fwd, *b, dir.file("bwd"));
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  auto bwd = load_pipeline_file(*path);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString() << "\n" << b->pipeline_json;

  auto check = check_pipeline_gradients(*fwd, *b, *bwd);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_EQ(check->rows.size(), 4u);
  for (const GradientCheckRow& r : check->rows)
    EXPECT_TRUE(r.pass) << r.ToString() << "\n" << b->pipeline_json;
  EXPECT_TRUE(check->pass());
}

// A residual add's gradient is the incoming one passed through: no stage copies it where it is one
// part of a sum (the block above: out's stage has no scale-by-1 copy, its part is y's gradient
// buffer itself), and a gradient handed out that is nothing else is copied once, into a buffer of its
// own (x.grad_copy), never the seed's buffer.
TEST(PipelineBackward, PassedThroughGradientsAreNotCopiedExceptIntoTheirOwnOutput) {
  TempDir dir;
  auto fwd = write_block(dir);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto b = derive_pipeline_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->graph_files.count("out.bwd.json")) << b->pipeline_json;
  EXPECT_EQ(b->graph_files.at("out.bwd.json").find("\"scale\""), std::string::npos)
      << b->graph_files.at("out.bwd.json");

  // One stage: y = r2 @ w2 + x2, every input a gradient wanted.
  write_text(dir.file("out.json"), kOut);
  write_text(dir.file("one.json"), R"({"name": "one", "graphs": {"out": "out.json"},
    "buffers": {"r": {"kind": "input"}, "w2": {"kind": "input"}, "x": {"kind": "input"}, "y": {"kind": "output"}},
    "bind": {"out": {"r2": "r", "w2": "w2", "x2": "x", "y": "y"}}})");
  auto one = load_pipeline_file(dir.file("one.json"));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  auto ob = derive_pipeline_backward(*one);
  ASSERT_TRUE(ob.ok()) << ob.status().ToString();
  EXPECT_EQ(ob->gradients.at("x"), "x.grad");
  EXPECT_NE(ob->pipeline_json.find("\"x.grad_copy\""), std::string::npos) << ob->pipeline_json;
  EXPECT_EQ(ob->graph_files.at("out.bwd.json").find("\"scale\""), std::string::npos);
  auto path = write_pipeline_backward(*one, *ob, dir.file("one_bwd"));
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  auto obwd = load_pipeline_file(*path);
  ASSERT_TRUE(obwd.ok()) << obwd.status().ToString() << "\n" << ob->pipeline_json;
  const int seed = obwd->find_buffer("y.grad"), xg = obwd->find_buffer("x.grad");
  ASSERT_GE(seed, 0);
  ASSERT_GE(xg, 0);
  EXPECT_EQ(obwd->buffers[static_cast<size_t>(seed)].kind, BufferKind::kInput);
  EXPECT_EQ(obwd->buffers[static_cast<size_t>(xg)].kind, BufferKind::kOutput);
  auto check = check_pipeline_gradients(*one, *ob, *obwd);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  EXPECT_EQ(check->rows.size(), 3u);
  for (const GradientCheckRow& r : check->rows) EXPECT_TRUE(r.pass) << r.ToString();
}

TEST(PipelineBackward, RefusesToReplaceTheForwardsFiles) {
  TempDir dir;
  auto fwd = write_block(dir);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto b = derive_pipeline_backward(*fwd);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  PipelineBackward clash = *b;
  clash.graph_files["mlp.json"] = "{}";  // a stage file named like a forward one, in the same folder
  auto w = write_pipeline_backward(*fwd, clash, dir.path);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("is the same file as the graph file of stage 'mlp'"), std::string::npos)
      << w.status().message();
  std::ifstream f(dir.file("mlp.json"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, kMlp) << "the forward graph file was replaced";

  // Stage and pipeline names come from the forward's file: none reaches outside the folder.
  std::string hostile = kPipeline;
  for (const char* from : {"\"mlp\"", "\"block\""}) {
    const std::string to = std::string(from) == "\"mlp\"" ? "\"../../mlp\"" : "\"/tmp/../block\"";
    for (size_t at; (at = hostile.find(from)) != std::string::npos;)
      hostile.replace(at, std::strlen(from), to);
  }
  write_text(dir.file("hostile.json"), hostile);
  auto hf = load_pipeline_file(dir.file("hostile.json"));
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto hb = derive_pipeline_backward(*hf);
  ASSERT_TRUE(hb.ok()) << hb.status().ToString();
  auto hp = write_pipeline_backward(*hf, *hb, dir.file("hostile_out"));
  ASSERT_TRUE(hp.ok()) << hp.status().ToString();
  EXPECT_EQ(fs::path(*hp).parent_path(), fs::path(dir.file("hostile_out")));
  for (const auto& [name, text] : hb->graph_files) EXPECT_EQ(name.find('/'), std::string::npos) << name;
  EXPECT_TRUE(load_pipeline_file(*hp).ok());

  BackwardOptions o;
  o.wrt = {"h"};
  auto bad = derive_pipeline_backward(*fwd, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("wrt 'h' is not an input or constant buffer"), std::string::npos)
      << bad.status().message();
}

// plan_buffer_arena on pipelines whose lives are known. conv10: act1..act9 each written by one stage
// and read by the next, all one size: two slots, alternating. split_convs: 'hidden' is written by
// the first stage and read only through its two views, by the second and third, so it lives until
// the third, where 'out_1' is written: the two may not share memory (they would, were the views'
// reads not counted).
TEST(BufferArena, ChainsAlternateTwoSlotsAndViewsKeepTheirParentAlive) {
  auto conv10 = load_pipeline_file(testing::source_dir() + "/examples/pipelines/conv10.json");
  ASSERT_TRUE(conv10.ok()) << conv10.status().ToString();
  const BufferArenaPlan chain = plan_buffer_arena(*conv10);
  std::vector<int> hs;
  for (int k = 1; k <= 9; ++k) {
    const int b = conv10->find_buffer("act" + std::to_string(k));
    ASSERT_GE(b, 0) << "act" << k;
    hs.push_back(b);
  }
  const int64_t slot = (buffer_tensor(*conv10, hs[0]).storage_bytes() + 255) / 256 * 256;
  EXPECT_EQ(chain.arena_bytes, 2 * slot);
  EXPECT_EQ(chain.separate_bytes, 9 * slot);
  for (size_t k = 0; k + 1 < hs.size(); ++k)
    EXPECT_NE(chain.offsets[static_cast<size_t>(hs[k])], chain.offsets[static_cast<size_t>(hs[k + 1])]) << k;
  for (size_t k = 0; k + 2 < hs.size(); ++k)
    EXPECT_EQ(chain.offsets[static_cast<size_t>(hs[k])], chain.offsets[static_cast<size_t>(hs[k + 2])]) << k;

  auto split = load_pipeline_file(testing::source_dir() + "/examples/pipelines/split_convs.json");
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  const int hidden = split->find_buffer("hidden"), out1 = split->find_buffer("out_1"),
            out0 = split->find_buffer("out_0");
  ASSERT_TRUE(hidden >= 0 && out1 >= 0 && out0 >= 0);
  const BufferArenaPlan two = plan_buffer_arena(*split, {hidden, out1});
  const int64_t h_at = two.offsets[static_cast<size_t>(hidden)],
                o_at = two.offsets[static_cast<size_t>(out1)];
  EXPECT_TRUE(h_at + buffer_tensor(*split, hidden).storage_bytes() <= o_at ||
              o_at + buffer_tensor(*split, out1).storage_bytes() <= h_at)
      << "hidden at " << h_at << ", out_1 at " << o_at;
  EXPECT_EQ(two.offsets[static_cast<size_t>(out0)], -1);
}

// The 125M language model's backward (split SwiGLU, as its example config): its intermediate
// buffers placed in one arena by their lives (plan_buffer_arena). Checked against lives computed
// here: no two buffers alive at one step overlap in memory, each inside the arena and aligned.
TEST(BufferArena, TheLanguageModelsBackwardIntermediatesShareMemoryWithoutOverlap) {
  TempDir dir;
  LmModelConfig m;
  m.vocab = 16384;
  m.dim = 768;
  m.layers = 12;
  m.heads = 12;
  m.kv_heads = 4;
  m.head_dim = 64;
  m.ffn_dim = 2816;
  m.context = 1024;
  auto path = write_lm_pipeline(m, 32, 1024, dir.file("fwd"), "none", "split");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  auto fwd = load_pipeline_file(*path);
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  BackwardOptions o;  // as the trainer asks: every parameter, from the loss
  for (const LmParameter& par : lm_parameters(m)) o.wrt.push_back(par.name);
  o.seeds = {"loss"};
  auto derived = derive_pipeline_backward(*fwd, o);
  ASSERT_TRUE(derived.ok()) << derived.status().ToString();
  auto bpath = write_pipeline_backward(*fwd, *derived, dir.file("bwd"));
  ASSERT_TRUE(bpath.ok()) << bpath.status().ToString();
  auto bwd = load_pipeline_file(*bpath);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  const Pipeline& p = *bwd;
  std::vector<int> shared;
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].kind == BufferKind::kIntermediate && !p.buffers[b].is_view())
      shared.push_back(static_cast<int>(b));
  ASSERT_GT(shared.size(), 100u);
  const BufferArenaPlan plan = plan_buffer_arena(p, shared);
  // Lives: the first and last position in the order of a stage binding the buffer (or a view of it).
  std::map<int, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < p.order.size(); ++i) {
    for (const auto& [tensor, b0] : p.stages[static_cast<size_t>(p.order[i])].bind) {
      int b = b0;
      while (p.buffers[static_cast<size_t>(b)].is_view()) b = p.buffers[static_cast<size_t>(b)].view_of;
      auto [it, fresh] = life.try_emplace(b, i, i);
      it->second.second = i;
    }
  }
  for (size_t x = 0; x < shared.size(); ++x) {
    const int a = shared[x];
    const int64_t a_at = plan.offsets[static_cast<size_t>(a)];
    const int64_t a_bytes = buffer_tensor(p, a).storage_bytes();
    ASSERT_GE(a_at, 0) << p.buffers[static_cast<size_t>(a)].name;
    EXPECT_EQ(a_at % 256, 0);
    EXPECT_LE(a_at + a_bytes, plan.arena_bytes);
    for (size_t y = x + 1; y < shared.size(); ++y) {
      const int c = shared[y];
      if (life.at(a).first > life.at(c).second || life.at(c).first > life.at(a).second) continue;
      const int64_t c_at = plan.offsets[static_cast<size_t>(c)];
      const int64_t c_bytes = buffer_tensor(p, c).storage_bytes();
      EXPECT_TRUE(a_at + a_bytes <= c_at || c_at + c_bytes <= a_at)
          << p.buffers[static_cast<size_t>(a)].name << " and " << p.buffers[static_cast<size_t>(c)].name
          << " live at once and overlap";
    }
  }
  std::printf(
      "125M backward: %zu intermediate buffers, %.2f GiB one allocation each, %.2f GiB in one arena\n",
      shared.size(), plan.separate_bytes / 1073741824.0, plan.arena_bytes / 1073741824.0);
  EXPECT_LT(plan.arena_bytes, plan.separate_bytes / 4);
  // Buffers outside the set are left alone.
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].kind != BufferKind::kIntermediate) EXPECT_EQ(plan.offsets[b], -1) << p.buffers[b].name;
}

}  // namespace
}  // namespace fusebox
