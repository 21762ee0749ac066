// FP8 training's pipeline rewrite (fusebox/fp8_training.h) on the language model's pipelines,
// through the CPU references: which GEMMs it rewrites and which it keeps, that the results load as
// pipelines, that the FP8 forward's loss stays near the bf16 one's with scales from the bf16
// amaxes, the amax outputs equal max |x| of the buffers they record, and that a rewrite never
// writes into the input's folder.
#include "fusebox/fp8_training.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "fusebox/pipeline_backward.h"
#include "fusebox/pipeline_run.h"
#include "fusebox/train.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::TempDir;

LmModelConfig tiny_model() {
  LmModelConfig m;
  m.vocab = 32;
  m.dim = 32;
  m.layers = 2;
  m.heads = 4;
  m.kv_heads = 2;
  m.head_dim = 8;
  m.ffn_dim = 64;
  m.context = 16;
  return m;
}

std::map<std::string, std::vector<double>> forward_values(const LmModelConfig& m, int64_t batch) {
  std::mt19937 rng(5);
  std::normal_distribution<double> w(0, 0.2);
  std::map<std::string, std::vector<double>> in;
  const int64_t n = batch * m.context;
  for (const char* k : {"ids", "labels"}) {
    std::vector<double>& v = in[k];
    for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<double>(rng() % m.vocab));
  }
  const std::vector<float> a = lm_rope_angles(m, m.context);
  in["freqs"].assign(a.begin(), a.end());
  for (const LmParameter& p : lm_parameters(m)) {
    std::vector<double>& v = in[p.name];
    for (int64_t i = 0; i < p.elements(); ++i) v.push_back(p.init_std == 0 ? 1.0 : w(rng));
  }
  return in;
}

double mean_loss(const std::map<std::string, std::vector<float>>& chain) {
  double s = 0;
  for (float l : chain.at("loss")) s += l;
  return s / static_cast<double>(chain.at("loss").size());
}

float amax_of(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

// The matmuls in stage `stage`'s graph (-1: no such stage).
int matmuls_in(const Pipeline& p, const std::string& stage) {
  const int at = p.find_stage(stage);
  if (at < 0) return -1;
  int n = 0;
  for (const auto& op : p.stages[static_cast<size_t>(at)].graph.ops) n += op_type_name(op.attrs) == "matmul";
  return n;
}

// The tiny model's forward pipeline and its derived backward, written under `d`, with the
// backward's rewrite options as the trainer sets them (gradients to e5m2, no e4m3 amax).
struct TinyBackward {
  std::string path, bpath;
  Pipeline fwd, bwd;
  PipelineBackward derived;
  Fp8RewriteOptions options;
};

Result<TinyBackward> tiny_backward(TempDir& d, const LmModelConfig& m) {
  TinyBackward t;
  FUSEBOX_ASSIGN_OR_RETURN(t.path, write_lm_pipeline(m, 1, m.context, d.file("fwd"), "none", "split"));
  FUSEBOX_ASSIGN_OR_RETURN(t.fwd, load_pipeline_file(t.path));
  BackwardOptions bo;
  for (const LmParameter& p : lm_parameters(m)) bo.wrt.push_back(p.name);
  bo.seeds = {"loss"};
  FUSEBOX_ASSIGN_OR_RETURN(t.derived, derive_pipeline_backward(t.fwd, bo));
  FUSEBOX_ASSIGN_OR_RETURN(t.bpath, write_pipeline_backward(t.fwd, t.derived, d.file("bwd")));
  FUSEBOX_ASSIGN_OR_RETURN(t.bwd, load_pipeline_file(t.bpath));
  t.options.keep_buffers = {"output", "h_norm"};
  t.options.amax_of_e4m3 = false;
  for (const PipelineBuffer& b : t.bwd.buffers) {
    auto it = t.derived.inputs.find(b.name);
    if (it == t.derived.inputs.end() || it->second.kind != BackwardInput::Kind::kSaved)
      t.options.gradients.insert(b.name);
  }
  return t;
}

TEST(Fp8Training, TheBlocksGemmsAreRewrittenTheOutputProjectionKeptAndTheLossStaysClose) {
  TempDir d;
  const LmModelConfig m = tiny_model();
  auto path = write_lm_pipeline(m, 2, m.context, d.file("fwd"), "none", "split");
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  Fp8RewriteOptions o;
  o.keep_buffers = {"output", "h_norm"};
  auto r = fp8_rewrite_pipeline(*path, d.file("fp8"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gemms, 7 * m.layers) << "q, k, v, wo, gate, up and down in every layer";
  ASSERT_EQ(r->kept.size(), 1u);
  EXPECT_NE(r->kept[0].find("'output'"), std::string::npos) << r->kept[0];
  // One cast per buffer and layout: the attention norm's output feeds q, k and v through one copy.
  EXPECT_EQ(r->casts, 11 * m.layers);
  EXPECT_EQ(r->amax.size(), static_cast<size_t>(r->casts));
  for (const auto& [b, t] : r->quantized) EXPECT_EQ(t, DType::kFP8E4M3) << b;

  auto bf16 = load_pipeline_file(*path);
  auto fp8 = load_pipeline_file(r->pipeline_path);
  ASSERT_TRUE(bf16.ok()) << bf16.status().ToString();
  ASSERT_TRUE(fp8.ok()) << fp8.status().ToString();
  auto in = forward_values(m, 2);
  auto bdata = pipeline_host_data(*bf16, in);
  ASSERT_TRUE(bdata.ok()) << bdata.status().ToString();
  auto bchain = reference_chain(*bf16, *bdata, 1e300);
  ASSERT_TRUE(bchain.ok()) << bchain.status().ToString();
  // Scales from the bf16 forward's amaxes (what delayed scaling converges to), e4m3's 448.
  for (const auto& [b, t] : r->quantized) {
    auto it = bchain->find(b);
    const float a = it != bchain->end() ? amax_of(it->second) : [&] {
      float mm = 0;
      for (double x : in.at(b)) mm = std::max(mm, static_cast<float>(std::fabs(x)));
      return mm;
    }();
    ASSERT_GT(a, 0) << b;
    in[fp8_scale_buffer(b)] = {448.0 / a};
    in[fp8_scale_inv_buffer(b)] = {static_cast<double>(1.f / static_cast<float>(448.0 / a))};
  }
  auto fdata = pipeline_host_data(*fp8, in);
  ASSERT_TRUE(fdata.ok()) << fdata.status().ToString();
  auto fchain = reference_chain(*fp8, *fdata, 1e300);
  ASSERT_TRUE(fchain.ok()) << fchain.status().ToString();
  const double lb = mean_loss(*bchain), lf = mean_loss(*fchain);
  EXPECT_NEAR(lf, lb, 0.02 * lb) << "bf16 " << lb << ", fp8 " << lf;
  EXPECT_NE(lf, lb) << "the FP8 forward must round somewhere";
  // The amax outputs are max |x| of the buffer each records, as the FP8 forward computed it.
  // (A buffer whose cast went into the stage that writes it is no longer written: its amax is the
  // bf16 forward's within the FP8 GEMMs' difference upstream.)
  for (const std::string& b : r->virtualized) {
    auto a = fchain->find(fp8_amax_buffer(b));
    ASSERT_NE(a, fchain->end()) << b;
    EXPECT_EQ(fchain->count(b), 0u) << b;
    EXPECT_NEAR(a->second.at(0), amax_of(bchain->at(b)), 0.1 * amax_of(bchain->at(b))) << b;
  }
  for (const std::string& b : r->amax) {
    if (std::count(r->virtualized.begin(), r->virtualized.end(), b)) continue;
    auto a = fchain->find(fp8_amax_buffer(b));
    ASSERT_NE(a, fchain->end()) << b;
    auto x = fchain->find(b);
    const float want = x != fchain->end() ? amax_of(x->second) : [&] {
      float mm = 0;
      for (double v : in.at(b)) mm = std::max(mm, std::fabs(static_cast<float>(v)));
      return mm;
    }();
    EXPECT_NEAR(a->second.at(0), want, 1e-2 * want) << b;  // the buffer rounded to bf16 before its cast
  }
}

TEST(Fp8Training, TheBackwardQuantizesGradientsToE5M2AndRecordsOnlyTheirAmax) {
  TempDir d;
  const LmModelConfig m = tiny_model();
  auto t = tiny_backward(d, m);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string& bpath = t->bpath;
  const Fp8RewriteOptions& o = t->options;
  auto r = fp8_rewrite_pipeline(bpath, d.file("fp8"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gemms, 2 * 7 * m.layers) << "a dgrad and a wgrad GEMM per forward GEMM";
  int e5m2 = 0;
  for (const auto& [b, t] : r->quantized) {
    EXPECT_EQ(t == DType::kFP8E5M2, o.gradients.count(b) > 0) << b;
    e5m2 += t == DType::kFP8E5M2;
  }
  EXPECT_GT(e5m2, 0);
  EXPECT_EQ(r->amax.size(), static_cast<size_t>(e5m2)) << "the saved buffers' amaxes are the forward's";
  auto loaded = load_pipeline_file(r->pipeline_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  // Each dgrad and wgrad GEMM is a stage of its own (one connected graph: one plan with its descales).
  EXPECT_EQ(r->split.size(), static_cast<size_t>(7 * m.layers)) << "a stage per forward GEMM, split in two";
  for (const std::string& split : r->split)
    for (const char* k : {".0", ".1"}) {
      EXPECT_EQ(matmuls_in(*loaded, split + k), 1) << split << k;
    }
  // A gradient read by a dgrad GEMM (row-major, as operand a) and a wgrad GEMM (column-major, as
  // operand b) is cast once into both copies: a quantize stage with y2, one per such gradient.
  int two_copies = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.file("fp8") + "/graphs")) {
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = text.find("\"y2\":"); at != std::string::npos; at = text.find("\"y2\":", at + 1))
      ++two_copies;
  }
  EXPECT_EQ(two_copies, e5m2) << "every quantized gradient feeds one dgrad and one wgrad here";
  // Never into the input's folder.
  auto same = fp8_rewrite_pipeline(bpath, d.file("bwd"), o);
  ASSERT_FALSE(same.ok());
  EXPECT_NE(same.status().message().find("no file of it is replaced"), std::string::npos)
      << same.status().ToString();
  // A hostile graph file (types the format does not allow where the rewrite walks) is one error
  // from the pipeline loader, before anything is written.
  for (const auto& e : std::filesystem::directory_iterator(d.file("bwd"))) {
    if (e.path().filename().string().find(".bwd.json") == std::string::npos) continue;
    std::ofstream(e.path()) << R"({"name": "x", "io_dtype": "bf16", "tensors": 5, "ops": [{"op": 7}]})";
    break;
  }
  auto hostile = fp8_rewrite_pipeline(bpath, d.file("fp8_hostile"), o);
  ASSERT_FALSE(hostile.ok());
  EXPECT_NE(hostile.status().message().find("fp8 rewrite"), std::string::npos) << hostile.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(d.file("fp8_hostile")));
}

// The forward's casts of the saved buffers write the copies the backward's GEMMs read (the
// transposed ones from the same read): the backward then casts only gradients, drops the bf16
// buffers its GEMMs alone read, and computes bit for bit the gradients it computes casting them
// itself.
TEST(Fp8Training, TheBackwardReadsTheForwardsCopiesAndGetsTheSameGradients) {
  TempDir d;
  const LmModelConfig m = tiny_model();
  auto t = tiny_backward(d, m);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string& path = t->path;
  const std::string& bpath = t->bpath;
  const PipelineBackward& derived = t->derived;

  Fp8RewriteOptions fo;
  fo.keep_buffers = {"output", "h_norm"};
  for (const auto& [name, in] : derived.inputs) {
    if (in.kind != BackwardInput::Kind::kSaved) continue;
    if (name == in.forward_tensor) fo.export_copies.insert(name);
    fo.read_elsewhere.insert(in.forward_tensor);  // the plain backward below reads them all
  }
  auto f = fp8_rewrite_pipeline(path, d.file("fp8_fwd"), fo);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->casts, 11 * m.layers) << "the transposed copies come from the same casts";
  EXPECT_EQ(f->added.size(), static_cast<size_t>(f->casts));

  Fp8RewriteOptions bo = t->options;
  auto plain = fp8_rewrite_pipeline(bpath, d.file("fp8_bwd_plain"), bo);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  bo.provided = f->exported;
  auto shared = fp8_rewrite_pipeline(bpath, d.file("fp8_bwd_shared"), bo);
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->gemms, plain->gemms);
  int gradient_casts = 0;
  for (const auto& [b, t] : plain->quantized) gradient_casts += t == DType::kFP8E5M2;
  EXPECT_EQ(shared->casts, gradient_casts) << "only gradients are cast in the backward";
  EXPECT_LT(shared->casts, plain->casts);
  EXPECT_EQ(shared->taken.size(), static_cast<size_t>(11 * m.layers))
      << "7 weights and 4 activations a layer";
  EXPECT_FALSE(shared->dropped.empty()) << "a buffer only GEMMs read is no longer saved in bf16";

  // Both backwards from one forward (the one that writes the copies), every scale 1.
  auto ffp8 = load_pipeline_file(f->pipeline_path);
  auto bplain = load_pipeline_file(plain->pipeline_path);
  auto bshared = load_pipeline_file(shared->pipeline_path);
  ASSERT_TRUE(ffp8.ok()) << ffp8.status().ToString();
  ASSERT_TRUE(bplain.ok()) << bplain.status().ToString();
  ASSERT_TRUE(bshared.ok()) << bshared.status().ToString();
  auto in = forward_values(m, 1);
  std::map<std::string, std::vector<double>> scales;
  for (const auto* q : {&f->quantized, &plain->quantized})
    for (const auto& [b, t] : *q) scales[fp8_scale_buffer(b)] = scales[fp8_scale_inv_buffer(b)] = {1.0};
  for (const auto& [k, v] : scales) in[k] = v;
  auto fdata = pipeline_host_data(*ffp8, in);
  ASSERT_TRUE(fdata.ok()) << fdata.status().ToString();
  auto chain = reference_chain(*ffp8, *fdata, 1e300);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  std::map<std::string, std::vector<double>> seeds;
  seeds["loss"].assign(chain->at("loss").size(), 1.0 / static_cast<double>(chain->at("loss").size()));
  PipelineBackward with_copies = derived;
  for (const std::string& c : shared->taken)
    with_copies.inputs[c] = BackwardInput{BackwardInput::Kind::kSaved, c, false};
  std::map<std::string, std::vector<float>> grads[2];
  for (int k = 0; k < 2; ++k) {
    const Pipeline& b = k == 0 ? *bplain : *bshared;
    auto data = backward_pipeline_data(*ffp8, k == 0 ? derived : with_copies, b, in, *chain, seeds, scales);
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    auto out = reference_chain(b, *data, 1e300);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    grads[k] = std::move(*out);
  }
  for (const LmParameter& p : lm_parameters(m)) {
    const std::string& g = derived.gradients.at(p.name);
    ASSERT_TRUE(grads[0].count(g) && grads[1].count(g)) << g;
    EXPECT_GT(amax_of(grads[0].at(g)), 0) << g;
    EXPECT_EQ(grads[0].at(g), grads[1].at(g)) << p.name;
  }
}

// A stage of two independent GEMMs becomes two stages, each binding only what its graph declares;
// where a split's name is a stage already, the rewrite is one error naming both, and writes nothing.
TEST(Fp8Training, IndependentGemmsSplitIntoStagesAndANameClashIsRefused) {
  TempDir d;
  const std::string two = R"({"name": "two", "io_dtype": "bf16", "tensors": [
      {"name": "a", "dims": [1, 16, 32]}, {"name": "b", "dims": [1, 32, 8]}, {"name": "c", "dims": [1, 32, 8]},
      {"name": "y1", "dims": [1, 16, 8]}, {"name": "y2", "dims": [1, 16, 8]}],
    "ops": [{"op": "matmul", "name": "m1", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y1"}},
            {"op": "matmul", "name": "m2", "inputs": {"a": "a", "b": "c"}, "outputs": {"y": "y2"}}]})";
  const std::string one = R"({"name": "one", "io_dtype": "bf16", "tensors": [
      {"name": "x", "dims": [1, 16, 8]}, {"name": "w", "dims": [1, 8, 8]}, {"name": "y", "dims": [1, 16, 8]}],
    "ops": [{"op": "matmul", "name": "m", "inputs": {"a": "x", "b": "w"}, "outputs": {"y": "y"}}]})";
  auto pipeline = [&](const std::string& dir, const std::string& other) {
    std::filesystem::create_directories(d.file(dir));
    std::ofstream(d.file(dir) + "/two.json") << two;
    std::ofstream(d.file(dir) + "/one.json") << one;
    std::ofstream(d.file(dir) + "/p.json") << R"({"name": "p", "graphs": {"s": "two.json", ")" << other
                                           << R"(": "one.json"},
      "buffers": {"a": {"kind": "input"}, "b": {"kind": "input"}, "c": {"kind": "input"}, "w": {"kind": "input"},
                  "y1": {"kind": "intermediate"}, "y2": {"kind": "output"}, "y3": {"kind": "output"}},
      "bind": {"s": {"a": "a", "b": "b", "c": "c", "y1": "y1", "y2": "y2"},
               ")" << other << R"(": {"x": "y1", "w": "w", "y": "y3"}}})";
    return d.file(dir) + "/p.json";
  };
  Fp8RewriteOptions o;
  auto r = fp8_rewrite_pipeline(pipeline("ok", "t"), d.file("ok_fp8"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->gemms, 3);
  ASSERT_EQ(r->split, std::vector<std::string>{"s"});
  auto loaded = load_pipeline_file(r->pipeline_path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  for (const char* stage : {"s.0", "s.1"}) {
    EXPECT_EQ(matmuls_in(*loaded, stage), 1) << stage;
    const int at = loaded->find_stage(stage);
    ASSERT_GE(at, 0) << stage;
    const PipelineStage& st = loaded->stages[static_cast<size_t>(at)];
    EXPECT_EQ(st.bind.count(std::string(stage) == "s.0" ? "y1" : "y2"), 1u) << stage;
    EXPECT_EQ(st.bind.count(std::string(stage) == "s.0" ? "y2" : "y1"), 0u) << stage;
  }
  EXPECT_LT(loaded->find_stage("s"), 0);

  auto clash = fp8_rewrite_pipeline(pipeline("clash", "s.0"), d.file("clash_fp8"), o);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("splits into 's.0', a stage that exists already"),
            std::string::npos)
      << clash.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(d.file("clash_fp8")));
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int quantize_ops(const Pipeline& p, const std::string& stage) {
  const int at = p.find_stage(stage);
  if (at < 0) return -1;
  int n = 0;
  for (const auto& op : p.stages[static_cast<size_t>(at)].graph.ops)
    n += op_type_name(op.attrs) == "quantize";
  return n;
}

// The casts of buffers a pointwise stage writes go into that stage (Fp8RewriteOptions::fuse_casts):
// the gated MLP's product forward, its two gradients and the gradient sums backward. A buffer then
// read by nothing leaves the pipeline; one another pipeline reads (read_elsewhere) stays. The
// gradients are as close to the bf16 backward's as the unfused rewrite's (the fused cast quantizes
// the fp32 value, the unfused one the bf16 buffer).
TEST(Fp8Training, CastsFuseIntoThePointwiseStagesThatWriteTheirBuffers) {
  TempDir d;
  const LmModelConfig m = tiny_model();
  auto t = tiny_backward(d, m);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Fp8RewriteOptions fo;
  fo.keep_buffers = {"output", "h_norm"};
  auto f = fp8_rewrite_pipeline(t->path, d.file("f"), fo);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->fused, m.layers) << "the SwiGLU product's cast, a layer";
  ASSERT_EQ(f->virtualized.size(), static_cast<size_t>(m.layers));
  auto fl = load_pipeline_file(f->pipeline_path);
  ASSERT_TRUE(fl.ok()) << fl.status().ToString();
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string layer = "layers." + std::to_string(l);
    EXPECT_EQ(std::count(f->virtualized.begin(), f->virtualized.end(), layer + ".act"), 1) << layer;
    EXPECT_LT(fl->find_buffer(layer + ".act"), 0) << layer;
    EXPECT_LT(fl->find_stage(layer + ".act.fp8.1.cast"), 0) << layer;
    EXPECT_EQ(quantize_ops(*fl, layer + ".glu"), 1) << layer;
  }
  fo.read_elsewhere = {"layers.0.act"};
  auto kept = fp8_rewrite_pipeline(t->path, d.file("f_kept"), fo);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->fused, m.layers - 1)
      << "layers.0.act's cast stays: the buffer is read elsewhere, by nothing here";
  EXPECT_EQ(kept->virtualized, std::vector<std::string>{"layers.1.act"});
  fo.fuse_casts = false;
  auto off = fp8_rewrite_pipeline(t->path, d.file("f_off"), fo);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->fused, 0);
  EXPECT_TRUE(off->virtualized.empty());
  EXPECT_EQ(off->casts, f->casts);

  // The backward, fused and not, from the bf16 forward's saved buffers, every scale 1.
  Fp8RewriteOptions bo = t->options;
  auto fused = fp8_rewrite_pipeline(t->bpath, d.file("b_fused"), bo);
  bo.fuse_casts = false;
  auto plain = fp8_rewrite_pipeline(t->bpath, d.file("b_plain"), bo);
  ASSERT_TRUE(fused.ok() && plain.ok());
  EXPECT_EQ(fused->casts, plain->casts);
  EXPECT_GE(fused->fused, 3 * m.layers) << "the gate's and up's gradients and a gradient sum, a layer";
  EXPECT_EQ(fused->virtualized.size(), static_cast<size_t>(2 * m.layers)) << "the SwiGLU's two gradients";
  auto in = forward_values(m, 1);
  auto fdata = pipeline_host_data(t->fwd, in);
  ASSERT_TRUE(fdata.ok()) << fdata.status().ToString();
  auto chain = reference_chain(t->fwd, *fdata, 1e300);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  std::map<std::string, std::vector<double>> seeds, scales;
  seeds["loss"].assign(chain->at("loss").size(), 1.0 / static_cast<double>(chain->at("loss").size()));
  for (const auto& [b, ty] : plain->quantized)
    scales[fp8_scale_buffer(b)] = scales[fp8_scale_inv_buffer(b)] = {1.0};
  std::map<std::string, std::vector<float>> grads[3];
  for (int k = 0; k < 3; ++k) {
    auto b = load_pipeline_file(k == 0 ? fused->pipeline_path : k == 1 ? plain->pipeline_path : t->bpath);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    auto data = backward_pipeline_data(t->fwd, t->derived, *b, in, *chain, seeds, scales);
    ASSERT_TRUE(data.ok()) << data.status().ToString();
    auto out = reference_chain(*b, *data, 1e300);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    grads[k] = std::move(*out);
  }
  int differ = 0;
  for (const LmParameter& p : lm_parameters(m)) {
    const std::string& g = t->derived.gradients.at(p.name);
    ASSERT_TRUE(grads[0].count(g) && grads[1].count(g)) << g;
    EXPECT_GT(amax_of(grads[1].at(g)), 0) << g;
    // Against the bf16 backward's, the fused casts' gradients are as close as the unfused ones' (at
    // scale 1 both are about 0.1 off in rel-L2 here; within 14% of each other on 2026-12-07).
    const double fused_err = rel_l2(grads[0].at(g), grads[2].at(g)),
                 plain_err = rel_l2(grads[1].at(g), grads[2].at(g));
    EXPECT_LE(fused_err, 1.25 * plain_err + 0.01)
        << p.name << ": fused " << fused_err << ", unfused " << plain_err;
    differ += grads[0].at(g) != grads[1].at(g);
  }
  EXPECT_GT(differ, 0) << "the fused casts quantize the fp32 values: some gradient moves";
}

}  // namespace
}  // namespace fusebox
