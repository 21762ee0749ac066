// Per-tensor delayed scaling for FP8 training (fusebox/fp8_scaling.h): the scale from the amax
// history (its max, or the last), the margin, zero and non-finite amaxes, the window sliding, and
// the checkpoint form with its bad inputs.
#include "fusebox/fp8_scaling.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fusebox {
namespace {

TEST(Fp8DelayedScaling, ScalesFromTheAmaxHistory) {
  Fp8ScalingConfig c;
  c.history = 3;
  auto s = Fp8DelayedScaling::create({{"x", DType::kFP8E4M3}, {"dy", DType::kFP8E5M2}}, c);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s->scale("x"), 1.f) << "1 until an amax is recorded";
  ASSERT_TRUE(s->record("x", 2.f).ok());
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f / 2.f);
  EXPECT_FLOAT_EQ(*s->scale_inv("x"), 2.f / 448.f);
  ASSERT_TRUE(s->record("x", 0.5f).ok());
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f / 2.f) << "the largest of the history";
  ASSERT_TRUE(s->record("x", 1.f).ok());
  ASSERT_TRUE(s->record("x", 1.f).ok());  // 2 leaves the window of 3
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f / 1.f);
  ASSERT_TRUE(s->record("x", 0.f).ok());  // an all-zero tensor: the window's max still decides
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f);
  ASSERT_TRUE(s->record("dy", 1024.f).ok());
  EXPECT_FLOAT_EQ(*s->scale("dy"), 57344.f / 1024.f) << "e5m2's largest value";
  // Non-finite or negative amaxes and unknown tensors are refused by name; the scale stays.
  for (float bad : {NAN, INFINITY, -1.f}) {
    const Status st = s->record("dy", bad);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("tensor 'dy'"), std::string::npos) << st.message();
  }
  EXPECT_FLOAT_EQ(*s->scale("dy"), 56.f);
  EXPECT_FALSE(s->scale("w").ok());
  EXPECT_FALSE(s->record("w", 1.f).ok());
}

TEST(Fp8DelayedScaling, MostRecentAmaxAndMargin) {
  Fp8ScalingConfig c;
  c.history = 4;
  c.margin = 2;
  c.amax = Fp8ScalingConfig::Amax::kMostRecent;
  auto s = Fp8DelayedScaling::create({{"x", DType::kFP8E4M3}}, c);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->record("x", 8.f).ok());
  ASSERT_TRUE(s->record("x", 2.f).ok());
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f / 2.f / 4.f);
  // An all-zero tensor as the most recent: the scale stays as it was.
  ASSERT_TRUE(s->record("x", 0.f).ok());
  EXPECT_FLOAT_EQ(*s->scale("x"), 448.f / 2.f / 4.f);
}

TEST(Fp8DelayedScaling, RefusesBadConfigs) {
  Fp8ScalingConfig c;
  EXPECT_FALSE(Fp8DelayedScaling::create({{"x", DType::kBF16}}, c).ok());
  EXPECT_FALSE(Fp8DelayedScaling::create({{"x", DType::kFP8E4M3}, {"x", DType::kFP8E5M2}}, c).ok());
  c.history = 0;
  EXPECT_FALSE(Fp8DelayedScaling::create({{"x", DType::kFP8E4M3}}, c).ok());
  c.history = 16;
  c.margin = 40;
  EXPECT_FALSE(Fp8DelayedScaling::create({{"x", DType::kFP8E4M3}}, c).ok());
}

TEST(Fp8DelayedScaling, CheckpointStateRoundTripsAndBadStateIsNamed) {
  Fp8ScalingConfig c;
  c.history = 4;
  auto s = Fp8DelayedScaling::create({{"a", DType::kFP8E4M3}, {"b", DType::kFP8E5M2}}, c);
  ASSERT_TRUE(s.ok());
  for (float v : {3.f, 7.f, 5.f}) ASSERT_TRUE(s->record("a", v).ok());
  const auto st = s->state();
  ASSERT_EQ(st.at("fp8_amax_history.a"), (std::vector<float>{0.f, 3.f, 7.f, 5.f}));
  ASSERT_EQ(st.at("fp8_scale.a"), (std::vector<float>{448.f / 7.f}));
  EXPECT_EQ(st.at("fp8_scale.b"), (std::vector<float>{1.f}));
  auto t = Fp8DelayedScaling::create({{"a", DType::kFP8E4M3}, {"b", DType::kFP8E5M2}}, c);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(t->restore(st).ok());
  // The restored history goes on as the original would: 3 leaves the window, 7 stays.
  for (auto* x : {&*s, &*t}) ASSERT_TRUE(x->record("a", 1.f).ok());
  for (auto* x : {&*s, &*t}) ASSERT_TRUE(x->record("a", 1.f).ok());
  EXPECT_EQ(*s->scale("a"), *t->scale("a"));
  EXPECT_FLOAT_EQ(*t->scale("a"), 448.f / 7.f);
  EXPECT_EQ(s->state(), t->state());
  // Bad states: each refused, naming the tensor; nothing restored.
  auto bad = st;
  bad.erase("fp8_scale.b");
  Status e = t->restore(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.message().find("'b'"), std::string::npos) << e.message();
  bad = st;
  bad["fp8_amax_history.a"] = {1.f, 2.f};
  EXPECT_FALSE(t->restore(bad).ok());
  bad = st;
  bad["fp8_amax_history.a"][1] = NAN;
  EXPECT_FALSE(t->restore(bad).ok());
  bad = st;
  bad["fp8_scale.a"] = {0.f};
  EXPECT_FALSE(t->restore(bad).ok());
  EXPECT_EQ(s->state(), t->state()) << "a refused restore changes nothing";
}

}  // namespace
}  // namespace fusebox
