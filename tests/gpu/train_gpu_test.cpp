// The language model's GPU training step (src/train/gpu_step.h) against the reference backend
// (the CPU reference chain and the host AdamW, itself checked against the numpy model in
// tests/python/test_train_lm.py): the same init, the same batches, the losses within bf16
// noise, the gradients of step 0 within 3e-2 rel-L2, the CUDA graph replay equal to eager
// steps, a resume exact, and a non-finite step refused with the parameters unchanged.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../deviceless/test_util.h"
#include "fusebox/runtime.h"
#include "fusebox/tensor.h"
#include "fusebox/train.h"

namespace fusebox {
namespace {

using testing::rel_l2;
using testing::TempDir;

constexpr char kTiny[] = R"({
  "model": {"vocab": 64, "dim": 64, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 16,
            "ffn_dim": 128, "context": 64},
  "train": {"batch": 4, "accum": 2, "lr": 3e-3, "min_lr": 3e-4, "warmup": 3, "seed": 5, "deterministic": true}
})";

TokenStream tokens(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  TokenStream s;
  s.path = "synthetic";
  int32_t x = 0, stride = 1;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 48 == 0) stride = 1 + static_cast<int32_t>(rng() % 5), x = static_cast<int32_t>(rng() % 64);
    x = (x + stride) % 64;
    s.tokens.push_back(x);
  }
  return s;
}

class TrainGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
    auto c = parse_lm_config(kTiny, "tiny");
    ASSERT_TRUE(c.ok());
    config_ = *c;
  }
  std::unique_ptr<LmTrainer> make(TrainBackend b, const std::string& dir) {
    auto t = LmTrainer::create(config_, {dir, 12, b, ""});
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  void fp8_steps_follow_the_reference(bool fuse_casts);
  LmConfig config_;
};

TEST_F(TrainGpu, StepsFollowTheReferenceBackend) {
  TempDir d;
  const TokenStream data = tokens(20000, 1);
  auto ref = make(TrainBackend::kReference, d.file("ref"));
  auto gpu = make(TrainBackend::kGpu, d.file("gpu"));
  ASSERT_TRUE(ref && gpu);
  std::printf("GPU step: %s, %.1f MiB\n", gpu->plan_summary().c_str(), gpu->device_bytes() / 1048576.0);
  std::vector<double> lr, lg;
  bool graph = false;
  for (int s = 0; s < 12; ++s) {
    auto a = ref->step(data);
    auto b = gpu->step(data);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    if (s == 0) {
      EXPECT_NEAR(b->loss, a->loss, 2e-2 * a->loss) << "step 0 loss";
      EXPECT_NEAR(b->grad_norm, a->grad_norm, 5e-2 * a->grad_norm) << "step 0 gradient norm";
      ASSERT_TRUE(ref->save_gradients(d.file("ref_grads.safetensors")).ok());
      ASSERT_TRUE(gpu->save_gradients(d.file("gpu_grads.safetensors")).ok());
    }
    graph = graph || b->cuda_graph;
    lr.push_back(a->loss);
    lg.push_back(b->loss);
    std::printf("step %2d  reference %.5f  gpu %.5f%s\n", s, a->loss, b->loss,
                b->cuda_graph ? " (graph)" : "");
  }
  EXPECT_TRUE(graph) << "steps after the first replay as a CUDA graph: " << gpu->plan_summary();
  double mad = 0;
  for (size_t i = 0; i < lr.size(); ++i) mad += std::fabs(lr[i] - lg[i]) / lr.size();
  EXPECT_LT(mad, 0.03) << "mean |loss difference| over 12 steps";
  EXPECT_LT(lg.back(), lg.front() - 0.3) << "the GPU run's loss falls";
  for (const LmParameter& p : lm_parameters(config_.model)) {
    ResolvedTensor t;
    t.name = "grad." + p.name;
    t.dims = p.shape;
    t.dtype = DType::kFP32;
    t.strides.assign(p.shape.size(), 1);
    if (p.shape.size() == 2) t.strides[0] = p.shape[1];
    auto a = read_safetensors_for(d.file("ref_grads.safetensors"), t.name, t);
    auto b = read_safetensors_for(d.file("gpu_grads.safetensors"), t.name, t);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_LT(rel_l2(b->to_float_logical(), a->to_float_logical()), 3e-2) << p.name;
  }
  auto v = gpu->validation_loss(data, 2);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(std::isfinite(*v));
}

// The backward's intermediates in one arena by their lives (train.share_buffers) against one
// allocation each: the same steps (deterministic config: the same kernels on the same values, so
// the same losses and gradients), in less device memory.
TEST_F(TrainGpu, SharedIntermediatesTakeTheSameStepsInLessMemory) {
  TempDir d;
  const TokenStream data = tokens(20000, 3);
  auto separate = make(TrainBackend::kGpu, d.file("separate"));
  config_.train.share_buffers = true;
  auto shared = make(TrainBackend::kGpu, d.file("shared"));
  ASSERT_TRUE(separate && shared);
  std::printf("device memory: %.2f MiB one allocation each, %.2f MiB shared\n",
              separate->device_bytes() / 1048576.0, shared->device_bytes() / 1048576.0);
  EXPECT_LT(shared->device_bytes(), separate->device_bytes());
  for (int s = 0; s < 6; ++s) {
    auto a = separate->step(data);
    auto b = shared->step(data);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_NEAR(b->loss, a->loss, 1e-6 * std::fabs(a->loss)) << "step " << s;
    EXPECT_NEAR(b->grad_norm, a->grad_norm, 1e-6 * std::fabs(a->grad_norm)) << "step " << s;
  }
}

// FP8 training (train.fp8, fusebox/fp8_training.h) on the GPU against the reference backend's
// FP8 run (the same rewritten pipelines through the CPU references, the host delayed scaling):
// every GEMM the rewrite made builds an engine, the losses stay close, the loss falls, the step
// replays as a CUDA graph with the scale update inside it, and a checkpoint's scaling state
// resumes the GPU run where it stood.
// 12 FP8 steps of the tiny model on the GPU against the reference backend's, in a CUDA graph, then
// a resume; `fuse_casts`: with train.fp8_fuse_casts (fusebox_pointwise_quantize in the step).
void TrainGpu::fp8_steps_follow_the_reference(bool fuse_casts) {
  TempDir d;
  const TokenStream data = tokens(20000, 7);
  config_.train.swiglu = "split";
  config_.train.fp8 = true;
  config_.train.fp8_fuse_casts = fuse_casts;
  auto ref = make(TrainBackend::kReference, d.file("ref"));
  auto gpu = make(TrainBackend::kGpu, d.file("gpu"));
  ASSERT_TRUE(ref && gpu);
  for (const auto& [what, ms] : gpu->startup_ms()) std::printf("start-up: %s (%.0f ms)\n", what.c_str(), ms);
  std::printf("GPU FP8 step: %s\n", gpu->plan_summary().c_str());
  std::vector<double> lr, lg;
  bool graph = false;
  for (int s = 0; s < 12; ++s) {
    auto a = ref->step(data);
    auto b = gpu->step(data);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    graph = graph || b->cuda_graph;
    lr.push_back(a->loss);
    lg.push_back(b->loss);
    std::printf("step %2d  reference fp8 %.5f  gpu fp8 %.5f%s\n", s, a->loss, b->loss,
                b->cuda_graph ? " (graph)" : "");
    if (s == 5) ASSERT_TRUE(gpu->save_checkpoint(d.file("ck.safetensors")).ok());
  }
  EXPECT_TRUE(graph) << gpu->plan_summary();
  if (fuse_casts) {
    bool fused = false;
    for (const auto& [what, ms] : gpu->startup_ms())
      fused = fused || (what.find(" casts fused") != std::string::npos &&
                        what.find(" 0 casts fused") == std::string::npos);
    EXPECT_TRUE(fused) << "the start-up line counts the casts fused";
  }
  double mad = 0;
  for (size_t i = 0; i < lr.size(); ++i) mad += std::fabs(lr[i] - lg[i]) / lr.size();
  EXPECT_LT(mad, 0.05) << "mean |loss difference| over 12 FP8 steps";
  EXPECT_LT(lg.back(), lg.front() - 0.3) << "the GPU FP8 run's loss falls";
  auto again = make(TrainBackend::kGpu, d.file("again"));
  ASSERT_TRUE(again);
  ASSERT_TRUE(again->load_checkpoint(d.file("ck.safetensors")).ok());
  for (int s = 6; s < 12; ++s) {
    auto b = again->step(data);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_NEAR(b->loss, lg[static_cast<size_t>(s)], 1e-3 * lg[static_cast<size_t>(s)])
        << "resumed step " << s;
  }
}

TEST_F(TrainGpu, Fp8StepsFollowTheReferenceBackendsFp8Steps) { fp8_steps_follow_the_reference(false); }

TEST_F(TrainGpu, Fp8StepsWithFusedCastsFollowTheReferenceBackendsFp8Steps) {
  fp8_steps_follow_the_reference(true);
}

TEST_F(TrainGpu, ResumeIsExactAndNonFiniteStepsChangeNothing) {
  TempDir d;
  const TokenStream data = tokens(20000, 2);
  auto a = make(TrainBackend::kGpu, d.file("a"));
  ASSERT_TRUE(a);
  std::vector<double> la;
  for (int s = 0; s < 6; ++s) {
    auto r = a->step(data);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    la.push_back(r->loss);
    if (s == 2) ASSERT_TRUE(a->save_checkpoint(d.file("ck.safetensors")).ok());
  }
  auto b = make(TrainBackend::kGpu, d.file("b"));
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->load_checkpoint(d.file("ck.safetensors")).ok());
  for (int s = 3; s < 6; ++s) {
    auto r = b->step(data);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->loss, la[static_cast<size_t>(s)])
        << "step " << s << " (embedding_bwd's atomics would differ)";
  }
  // Output weights of bf16's largest value: the logits overflow; the step is refused by name.
  std::vector<SafetensorsEntry> e;
  std::vector<std::vector<float>> store;
  const auto params = lm_parameters(config_.model);
  store.reserve(3 * params.size());
  for (const std::string prefix : {"", "adam_m.", "adam_v."})
    for (const LmParameter& p : params) {
      const float x = !prefix.empty() ? 0.f : p.name == "output" ? 3e38f : p.init_std == 0 ? 1.f : 0.01f;
      store.emplace_back(static_cast<size_t>(p.elements()), x);
      e.push_back({prefix + p.name, p.shape, store.back().data()});
    }
  ASSERT_TRUE(write_safetensors_f32(d.file("huge.safetensors"), e,
                                    {{"format", "fusebox-lm/1"},
                                     {"step", "0"},
                                     {"sequences", "0"},
                                     {"config", lm_config_json(config_)}})
                  .ok());
  ASSERT_TRUE(b->load_checkpoint(d.file("huge.safetensors")).ok());
  const auto before = b->parameters();
  auto r = b->step(data);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("non-finite"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(b->parameters(), before);
}

}  // namespace
}  // namespace fusebox
