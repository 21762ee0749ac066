// The serving engine (fusebox/serve.h) on the reference backend: the KV pool's bookkeeping,
// the sampling rule, and the engine's logits at every generated token against a full forward
// of the training pipeline (LmTrainer::next_token_logits), with continuous batching, shared
// prefix pages and a pool too small for every request at once.
#include "fusebox/serve.h"

#include <gtest/gtest.h>

#include <cmath>

#include "fusebox/train.h"
#include "kv_pool.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::TempDir;

TEST(KvPool, SharesWholePromptPagesAndEvictsLeastRecentlyReleased) {
  KvPool pool(8, 4);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // pages [1-4] [5-8] [9 10]
  KvPool::Seq s1, s2, s3;
  EXPECT_EQ(pool.admit(&s1, a, 12), 0) << "nothing cached yet";
  EXPECT_EQ(s1.pages.size(), 3u);
  pool.publish(s1, a);
  // Same first 8 tokens: two whole pages shared, never the page of the last prompt token.
  std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 42};
  EXPECT_EQ(pool.admit(&s2, b, 9), 8);
  ASSERT_EQ(s2.pages.size(), 3u);
  EXPECT_EQ(s2.pages[0], s1.pages[0]);
  EXPECT_EQ(s2.pages[1], s1.pages[1]);
  EXPECT_NE(s2.pages[2], s1.pages[2]);
  // A prompt that is exactly the cached pages still computes its last page.
  EXPECT_EQ(pool.admit(&s3, std::vector<int32_t>(a.begin(), a.begin() + 8), 8), 4);
  EXPECT_EQ(pool.free_pages(), 8 - 3 - 1 - 1);
  pool.release(&s1);
  pool.release(&s2);
  pool.release(&s3);
  EXPECT_EQ(pool.free_pages(), 8);
  EXPECT_EQ(pool.cached_pages(), 2) << "the two prefix pages stay cached";
  // A request that needs the whole pool evicts them; the next one finds nothing cached.
  KvPool::Seq big, again;
  EXPECT_EQ(pool.admit(&big, std::vector<int32_t>(29, 7), 32), 0);
  EXPECT_EQ(pool.free_pages(), 0);
  EXPECT_EQ(pool.admit(&again, a, 12), -1) << "a full pool: the request waits";
  pool.release(&big);
  EXPECT_EQ(pool.cached_pages(), 0);
  EXPECT_EQ(pool.admit(&again, a, 12), 0);
}

TEST(Sampling, GreedyTopKTopPAndTemperature) {
  const std::vector<float> l = {0.f, std::log(3.f), -1e9f};  // probabilities 0.25, 0.75, 0
  EXPECT_EQ(sample_token(l, {}, 0.99), 1) << "greedy";
  SamplingParams t;
  t.temperature = 1;
  EXPECT_EQ(sample_token(l, t, 0.70), 1);  // the larger first: [0, 0.75) -> 1
  EXPECT_EQ(sample_token(l, t, 0.80), 0);
  t.top_k = 1;
  EXPECT_EQ(sample_token(l, t, 0.99), 1);
  t.top_k = 0;
  t.top_p = 0.5;
  EXPECT_EQ(sample_token(l, t, 0.99), 1) << "top-p keeps the smallest prefix reaching 0.5";
}

class Engine : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = parse_lm_config(R"({"model": {"vocab": 48, "dim": 32, "layers": 2, "heads": 4, "kv_heads": 2,
      "head_dim": 8, "ffn_dim": 64, "context": 40}, "train": {"batch": 2, "lr": 1e-2, "warmup": 2, "seed": 3}})",
                             "tiny");
    ASSERT_TRUE(c.ok());
    config_ = *c;
    auto t = LmTrainer::create(config_, {dir_.file("train"), 10, TrainBackend::kReference});
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    trainer_ = std::move(*t);
    // A few steps, so that the logits are not uniform.
    TokenStream s;
    for (int i = 0; i < 2000; ++i) s.tokens.push_back((i * 7 + i / 13) % 48);
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(trainer_->step(s).ok());
    ASSERT_TRUE(trainer_->save_checkpoint(dir_.file("ck.safetensors")).ok());
  }
  std::unique_ptr<LmEngine> engine(int64_t pages, int64_t max_batch = 8,
                                   ServeWeights weights = ServeWeights::kBF16, bool deterministic = false,
                                   bool fp8_kv = false) {
    EngineOptions o;
    o.deterministic = deterministic;
    o.fp8_kv = fp8_kv;
    o.page_size = 4;
    o.pool_pages = pages;
    o.max_batch = max_batch;
    o.weights = weights;
    auto e = LmEngine::create(config_, dir_.file("ck.safetensors"), o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(*e) : nullptr;
  }
  // Runs every request to the end; checks each sampled token's logits against a full forward.
  std::map<int64_t, std::vector<int32_t>> run(LmEngine& e, const std::vector<LmRequest>& reqs, int* checked,
                                              double tolerance = 1e-2, double* worst = nullptr) {
    std::map<int64_t, std::vector<int32_t>> out, context;
    for (const LmRequest& r : reqs) {
      auto id = e.add_request(r);
      EXPECT_TRUE(id.ok()) << id.status().ToString();
      context[*id] = r.prompt;
    }
    for (int guard = 0; !e.idle() && guard < 100; ++guard) {
      auto ev = e.step();
      EXPECT_TRUE(ev.ok()) << ev.status().ToString();
      if (!ev.ok()) break;
      for (const TokenEvent& t : *ev) {
        auto full = trainer_->next_token_logits(context[t.request]);
        EXPECT_TRUE(full.ok()) << full.status().ToString();
        const std::vector<float>& mine = e.last_logits(t.request);
        double num = 0, den = 0;
        for (size_t i = 0; i < mine.size(); ++i) {
          num += (mine[i] - (*full)[i]) * double(mine[i] - (*full)[i]);
          den += double((*full)[i]) * (*full)[i];
        }
        if (worst) *worst = std::max(*worst, std::sqrt(num / den));
        EXPECT_LT(std::sqrt(num / den), tolerance)
            << "request " << t.request << " after " << context[t.request].size() << " tokens";
        ++*checked;
        context[t.request].push_back(t.token);
        out[t.request].push_back(t.token);
      }
    }
    EXPECT_TRUE(e.idle());
    return out;
  }
  TempDir dir_;
  LmConfig config_;
  std::unique_ptr<LmTrainer> trainer_;
};

TEST_F(Engine, ContinuousBatchingWithSharedPrefixesMatchesTheFullForward) {
  auto e = engine(64);
  ASSERT_TRUE(e);
  std::vector<LmRequest> reqs(4);
  reqs[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  reqs[1].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21};  // shares two pages with the first
  reqs[2].prompt = {30};
  reqs[3].prompt = {5, 9, 13, 17, 21, 25, 29};
  reqs[3].sampling = {0.8, 10, 0.9, 77};
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].max_new_tokens = 3 + static_cast<int64_t>(i);
  int checked = 0;
  const auto out = run(*e, reqs, &checked);
  EXPECT_EQ(checked, 3 + 4 + 5 + 6);
  EXPECT_EQ(e->stats().cached_prompt_tokens, 8) << "the second prompt's first two pages came from the cache";
  // The same requests on a pool too small for all at once (they wait; nothing is corrupted),
  // one at a time: the same tokens.
  auto small = engine(6, 2);
  ASSERT_TRUE(small);
  int checked2 = 0;
  const auto out2 = run(*small, reqs, &checked2);
  EXPECT_EQ(out2, out);
  EXPECT_GT(small->stats().steps, e->stats().steps) << "requests waited for pages";
}

TEST_F(Engine, PromptsAdmittedTogetherArePrefilledInPaddedBatchesByBucket) {
  // Context 40: buckets of 16 tokens take 2 rows (16 x 2 <= 40), of 32 one.
  auto e = engine(64);
  ASSERT_TRUE(e);
  std::vector<LmRequest> reqs(5);
  reqs[0].prompt = {1, 2, 3};
  reqs[1].prompt = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  reqs[2].prompt = {11, 12, 13, 14, 15};
  reqs[3].prompt = {40, 41, 42, 43, 44, 45, 46, 47, 0,  1,
                    2,  3,  4,  5,  6,  7,  8,  9,  10, 11};  // 20 tokens: the 32 bucket
  reqs[4].prompt = {33, 34};
  reqs[4].sampling = {0.9, 0, 0.95, 5};
  for (LmRequest& r : reqs) r.max_new_tokens = 4;
  int checked = 0;
  // Every token's logits against the full forward, padding and all (run() checks each event).
  for (const LmRequest& r : reqs) ASSERT_TRUE(e->add_request(r).ok());
  auto first = e->step();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->size(), 5u) << "every prompt prefilled in the first step";
  EXPECT_EQ(e->stats().prefill_batches, 3) << "16-token bucket: 2 + 2 rows, 32-token bucket: 1 row";
  EXPECT_EQ(e->stats().prefill_tokens, 3 + 9 + 5 + 20 + 2);
  auto batched = engine(64);
  ASSERT_TRUE(batched);
  const auto out = run(*batched, reqs, &checked);
  EXPECT_EQ(checked, 5 * 4);
  // Each request alone: the same tokens.
  auto alone = engine(64, 1);
  ASSERT_TRUE(alone);
  int checked2 = 0;
  EXPECT_EQ(run(*alone, reqs, &checked2), out);
  EXPECT_EQ(alone->stats().prefill_batches, 5);
}

// The deterministic mode's scheduling (EngineOptions::deterministic; its GPU kernels are
// ServeGpu.DeterministicModeGivesARequestTheSameLogitsAloneOrAmong63): each prompt prefilled in a
// batch of its own, no prefix pages shared, the same tokens as without it; FP8 weights refused.
TEST_F(Engine, DeterministicModePrefillsEachPromptAloneAndSharesNoPages) {
  std::vector<LmRequest> reqs(4);
  reqs[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  reqs[1].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21};  // two pages shareable with the first
  reqs[2].prompt = {30, 31};
  reqs[3].prompt = {5, 9, 13};
  reqs[3].sampling = {0.8, 10, 0.9, 77};
  for (LmRequest& r : reqs) r.max_new_tokens = 4;
  auto plain = engine(64);
  ASSERT_TRUE(plain);
  int checked = 0;
  const auto out = run(*plain, reqs, &checked);
  EXPECT_EQ(plain->stats().cached_prompt_tokens, 8);
  auto det = engine(64, 8, ServeWeights::kBF16, /*deterministic=*/true);
  ASSERT_TRUE(det);
  int checked_det = 0;
  for (const LmRequest& r : reqs) ASSERT_TRUE(det->add_request(r).ok());
  auto first = det->step();
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->size(), 4u) << "every prompt prefilled in the first step";
  EXPECT_EQ(det->stats().prefill_batches, 4) << "one batch per prompt";
  EXPECT_EQ(det->stats().cached_prompt_tokens, 0) << "no prefix pages shared";
  auto det2 = engine(64, 8, ServeWeights::kBF16, /*deterministic=*/true);
  ASSERT_TRUE(det2);
  EXPECT_EQ(run(*det2, reqs, &checked_det), out);
  EXPECT_EQ(det2->stats().cached_prompt_tokens, 0);
  EngineOptions o;
  o.deterministic = true;
  o.weights = ServeWeights::kFP8Channel;
  auto fp8 = LmEngine::create(config_, dir_.file("ck.safetensors"), o);
  ASSERT_FALSE(fp8.ok());
  EXPECT_NE(fp8.status().message().find("deterministic mode takes bf16 weights"), std::string::npos)
      << fp8.status().message();
}

TEST_F(Engine, Fp8WeightsStayCloseToTheFullForward) {
  // The layers' matrices in e4m3 (per channel, then per tensor), activations quantized by token:
  // every token's logits within 5% rel-L2 of the bf16/fp32 full forward, and measurably not the
  // bf16 engine's (the FP8 path really ran).
  std::vector<LmRequest> reqs(3);
  reqs[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  reqs[1].prompt = {30, 31};
  reqs[2].prompt = {5, 9, 13, 17, 21, 25, 29};
  for (LmRequest& r : reqs) r.max_new_tokens = 5;
  double worst_bf16 = 0;
  int checked = 0;
  auto bf16 = engine(64);
  ASSERT_TRUE(bf16);
  run(*bf16, reqs, &checked, 1e-2, &worst_bf16);
  for (ServeWeights w : {ServeWeights::kFP8Channel, ServeWeights::kFP8Tensor}) {
    auto e = engine(64, 8, w);
    ASSERT_TRUE(e);
    double worst = 0;
    int n = 0;
    run(*e, reqs, &n, 5e-2, &worst);
    EXPECT_EQ(n, 15);
    EXPECT_GT(worst, std::max(2 * worst_bf16, 1e-3))
        << "FP8 weights changed nothing: was the FP8 path taken?";
    std::printf("[ fp8 ] %s: worst logits rel-L2 %.3g (bf16 weights: %.3g)\n",
                w == ServeWeights::kFP8Channel ? "per channel" : "per tensor", worst, worst_bf16);
  }
}

// An FP8 KV cache (EngineOptions::fp8_kv): every token's logits within 5% rel-L2 of the full
// forward, measurably not the bf16 cache's (the e4m3 rows really were read), with shared prefix
// pages and continuous batching; the same tokens alone as batched.
TEST_F(Engine, Fp8KvCacheStaysCloseToTheFullForward) {
  std::vector<LmRequest> reqs(3);
  reqs[0].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  reqs[1].prompt = {1, 2, 3, 4, 5, 6, 7, 8, 20, 21};  // two pages shared with the first
  reqs[2].prompt = {5, 9, 13, 17, 21, 25, 29};
  for (LmRequest& r : reqs) r.max_new_tokens = 5;
  double worst_bf16 = 0, worst = 0;
  int checked = 0, n = 0;
  auto bf16 = engine(64);
  ASSERT_TRUE(bf16);
  run(*bf16, reqs, &checked, 1e-2, &worst_bf16);
  auto e = engine(64, 8, ServeWeights::kBF16, false, /*fp8_kv=*/true);
  ASSERT_TRUE(e);
  const auto out = run(*e, reqs, &n, 5e-2, &worst);
  EXPECT_EQ(n, 15);
  EXPECT_EQ(e->stats().cached_prompt_tokens, 8);
  EXPECT_GT(worst, std::max(2 * worst_bf16, 1e-4)) << "the FP8 cache changed nothing: was it read?";
  std::printf("[ fp8 kv ] worst logits rel-L2 %.3g (bf16 cache: %.3g)\n", worst, worst_bf16);
  auto alone = engine(64, 1, ServeWeights::kBF16, false, true);
  ASSERT_TRUE(alone);
  int n2 = 0;
  EXPECT_EQ(run(*alone, reqs, &n2, 5e-2), out);
}

TEST_F(Engine, TeacherForcingEmitsTheForcedTokensWithTheirLogits) {
  auto e = engine(32);
  ASSERT_TRUE(e);
  std::vector<LmRequest> reqs(2);
  reqs[0].prompt = {1, 2, 3};
  reqs[0].forced = {40, 0, 47, 5, 5};
  reqs[0].max_new_tokens = 5;
  reqs[1].prompt = {9};
  reqs[1].forced = {8, 7, 6};
  reqs[1].max_new_tokens = 3;
  reqs[1].sampling = {1.0, 0, 1.0, 3};  // forcing wins over sampling
  int checked = 0;
  const auto out = run(*e, reqs, &checked);  // each event's logits against the full forward
  EXPECT_EQ(checked, 8);
  EXPECT_EQ(out.at(0), reqs[0].forced);
  EXPECT_EQ(out.at(1), reqs[1].forced);
  LmRequest bad = reqs[0];
  bad.max_new_tokens = 6;
  EXPECT_NE(e->add_request(bad).status().message().find("5 forced tokens for 6 new ones"), std::string::npos);
  bad.max_new_tokens = 2;
  bad.forced = {1, 48};
  EXPECT_NE(e->add_request(bad).status().message().find("forced token 1 = 48 is outside the vocabulary"),
            std::string::npos);
}

TEST_F(Engine, SeedsAndBadRequests) {
  auto e = engine(32);
  ASSERT_TRUE(e);
  LmRequest r;
  r.prompt = {3, 4, 5};
  r.max_new_tokens = 6;
  r.sampling = {1.0, 0, 1.0, 5};
  int checked = 0;
  const auto a = run(*e, {r, r}, &checked);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a.at(0), a.at(1)) << "the same seed, the same tokens";
  LmRequest bad = r;
  bad.prompt = {3, 48};
  auto st = e->add_request(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("outside the vocabulary [0, 48)"), std::string::npos);
  bad.prompt = std::vector<int32_t>(38, 1);
  EXPECT_NE(e->add_request(bad).status().message().find("over the context of 40"), std::string::npos);
  bad.prompt = {1, 2};
  bad.max_new_tokens = INT64_MAX - 1;  // must not wrap past the context check
  EXPECT_NE(e->add_request(bad).status().message().find("over the context of 40"), std::string::npos);
  bad.prompt = {};
  EXPECT_FALSE(e->add_request(bad).ok());
  EngineOptions huge;
  huge.page_size = 1 << 30;
  EXPECT_EQ(LmEngine::create(config_, dir_.file("ck.safetensors"), huge).status().code(),
            StatusCode::kInvalidArgument);
  EngineOptions o;
  o.backend = ServeBackend::kGpu;
  auto gpu = LmEngine::create(config_, dir_.file("ck.safetensors"), o);
  if (!gpu.ok()) {  // no GPU here (on a GPU it builds: tests/gpu/serve_gpu_test.cpp)
    EXPECT_EQ(gpu.status().code(), StatusCode::kNotSupported) << gpu.status().ToString();
    EXPECT_NE(gpu.status().message().find("the GPU backend needs a GPU"), std::string::npos);
  }
  EXPECT_FALSE(LmEngine::create(config_, dir_.file("nope.safetensors"), {}).ok());
}

}  // namespace
}  // namespace fusebox
