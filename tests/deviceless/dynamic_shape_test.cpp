// Symbolic graphs through a deviceless session: one plan-cache entry per
// concrete shape, the shape in the report, out-of-range values refused
// before anything is built.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_cache.h"
#include "fusebox/session.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::devprop_path;
using testing::source_dir;

class DynamicShapeDeviceless : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusebox_dynshape_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    cache_ = std::make_unique<PlanCache>(PlanCache::open((dir_ / "plans.sqlite").string()));
    ASSERT_TRUE(cache_->enabled());
    auto spec = load_graph_file(source_dir() + "/examples/graphs/small/conv_bias_relu_dyn_small.json");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    spec_ = *spec;
    SessionOptions o;
    o.device_properties_file = devprop_path();
    o.cache = cache_.get();
    auto s = Session::create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    session_ = std::move(s).value();
  }
  void TearDown() override {
    session_.reset();
    cache_.reset();
    std::filesystem::remove_all(dir_);
  }
  size_t entries() {
    auto l = cache_->list();
    EXPECT_TRUE(l.ok());
    return l.ok() ? l->size() : 0;
  }

  std::filesystem::path dir_;
  std::unique_ptr<PlanCache> cache_;
  std::unique_ptr<Session> session_;
  GraphSpec spec_;
};

TEST_F(DynamicShapeDeviceless, TwoShapesGiveTwoCacheEntries) {
  // Dynamic shapes even where a static build would take precompiled kernels (the policy's probe
  // is tested below).
  PlanRequest dyn;
  dyn.static_when_precompiled = false;
  PlanReport r2, r4;
  auto p2 = session_->get_plan(spec_, {{"N", 2}}, dyn, &r2);
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  auto p4 = session_->get_plan(spec_, {{"N", 4}}, dyn, &r4);
  ASSERT_TRUE(p4.ok()) << p4.status().ToString();
  EXPECT_EQ(r2.source, PlanSource::kBuilt);
  EXPECT_EQ(r4.source, PlanSource::kBuilt);
  // Deviceless, override shapes are never used (plan_at_shape asks cuDNN on the GPU for the
  // workspace), though PlanRequest::override_shapes is on by default.
  EXPECT_TRUE(dyn.override_shapes);
  EXPECT_EQ(r2.override_shape, "");
  EXPECT_EQ(r4.override_shape, "");
  EXPECT_FALSE(p4->plan.shape_overridden());
  EXPECT_FALSE(p2->plan.serves_other_shapes());
  EXPECT_TRUE(r2.stored);
  EXPECT_TRUE(r4.stored);
  EXPECT_NE(r2.cache_key, r4.cache_key);
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(r2.shape, (ShapeValues{{"N", 2}}));
  EXPECT_EQ(r4.shape, (ShapeValues{{"N", 4}}));
  // The plan is for the bound shape.
  EXPECT_EQ(p4->graph.tensors[p4->graph.find_tensor("x")].dims, (std::vector<int64_t>{4, 8, 10, 10}));
  EXPECT_EQ(p4->graph.tensors[p4->graph.find_tensor("y")].dims, (std::vector<int64_t>{4, 16, 5, 5}));
  EXPECT_EQ(session_->kernel_cache_count(), 1);
  // Dynamic shapes served, or a static build said why not: never silent.
  for (const PlanReport* r : {&r2, &r4}) {
    if (r->dynamic_shape) {
      EXPECT_NE(r->kernel_cache, "off");
    } else {
      EXPECT_EQ(r->kernel_cache, "off");
      EXPECT_FALSE(r->dynamic_fallback.empty());
    }
    EXPECT_NE(r->source_text().find("[shape N="), std::string::npos) << r->source_text();
    EXPECT_FALSE(r->shape_summary().empty());
  }
  // The second shape replays the first one's engine (or says why it could not).
  if (r2.dynamic_shape && !r2.build.choice.empty()) {
    EXPECT_TRUE(r4.engine_replayed || !r4.replay_failed.empty());
    if (r4.engine_replayed) {
      EXPECT_EQ(r4.engine, r2.engine);
      EXPECT_EQ(r4.heuristic_mode, "replay");
      EXPECT_TRUE(r4.build.replayed);
    }
  }
  if (r2.dynamic_shape && r4.dynamic_shape) {
    EXPECT_EQ(r2.kernel_cache, "cold");
    EXPECT_EQ(r4.kernel_cache, "warm");
    EXPECT_EQ(r4.kernel_cache_builds_before, 1);
  }

  // The same shape again: a cache hit, no new entry.
  PlanReport again;
  auto p2b = session_->get_plan(spec_, {{"N", 2}}, dyn, &again);
  ASSERT_TRUE(p2b.ok()) << p2b.status().ToString();
  EXPECT_EQ(again.source, PlanSource::kHeuristicCache);
  EXPECT_EQ(again.cache_key, r2.cache_key);
  EXPECT_EQ(entries(), 2u);
}

TEST_F(DynamicShapeDeviceless, PrecompiledStaticEngineKeepsEveryShapeStatic) {
  // Deviceless, cuDNN builds only precompiled engines: the probe before the first build finds
  // one for the static build, so no shape pays for a dynamic-shape build.
  PlanReport a, b;
  ASSERT_TRUE(session_->get_plan(spec_, {{"N", 2}}, {}, &a).ok());
  ASSERT_TRUE(session_->get_plan(spec_, {{"N", 5}}, {}, &b).ok());
  EXPECT_GT(a.static_probe_ms, 0);
  EXPECT_EQ(b.static_probe_ms, 0) << "asked once per graph";
  for (const PlanReport* r : {&a, &b}) {
    EXPECT_FALSE(r->dynamic_shape);
    EXPECT_EQ(r->kernel_cache, "off");
    EXPECT_NE(r->static_policy.find("precompiled"), std::string::npos) << r->static_policy;
    EXPECT_NE(r->static_policy.find(r->engine), std::string::npos) << r->static_policy << " vs " << r->engine;
  }
  EXPECT_NE(a.cache_key, b.cache_key);
  EXPECT_EQ(entries(), 2u);
}

TEST_F(DynamicShapeDeviceless, AWarmCacheAnswersBeforeTheProbe) {
  PlanReport cold;
  ASSERT_TRUE(session_->get_plan(spec_, {{"N", 2}}, {}, &cold).ok());
  EXPECT_GT(cold.static_probe_ms, 0);
  // A new process (session) with the same cache: the shape's entry serves with no heuristic query.
  SessionOptions o;
  o.device_properties_file = devprop_path();
  o.cache = cache_.get();
  auto again = Session::create(o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  PlanReport warm;
  ASSERT_TRUE((*again)->get_plan(spec_, {{"N", 2}}, {}, &warm).ok());
  EXPECT_EQ(warm.source, PlanSource::kHeuristicCache);
  EXPECT_EQ(warm.cache_key, cold.cache_key);
  EXPECT_EQ(warm.static_probe_ms, 0) << "no probe when the cache holds the shape";
  EXPECT_EQ(warm.build.steps.size(), 0u);
  EXPECT_EQ(entries(), 1u);
  // A shape the cache lacks: the probe runs then, once.
  PlanReport other;
  ASSERT_TRUE((*again)->get_plan(spec_, {{"N", 3}}, {}, &other).ok());
  EXPECT_EQ(other.source, PlanSource::kBuilt);
  EXPECT_GT(other.static_probe_ms, 0);
  EXPECT_NE(other.static_policy.find("precompiled"), std::string::npos);
}

TEST_F(DynamicShapeDeviceless, StaticBuildsOfEachShapeAreTheirOwnEntries) {
  PlanRequest fixed;
  fixed.dynamic_shape = false;
  PlanReport a, b;
  ASSERT_TRUE(session_->get_plan(spec_, {{"N", 1}}, fixed, &a).ok());
  ASSERT_TRUE(session_->get_plan(spec_, {{"N", 3}}, fixed, &b).ok());
  EXPECT_FALSE(a.dynamic_shape);
  EXPECT_EQ(a.kernel_cache, "off");
  EXPECT_TRUE(a.dynamic_fallback.empty());
  EXPECT_NE(a.cache_key, b.cache_key);
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(session_->kernel_cache_count(), 0);
  EXPECT_EQ(a.shape_summary(), "shape N=1: static build");
}

TEST_F(DynamicShapeDeviceless, AnEngineChoiceReplaysAtAnotherShape) {
  auto target = DeviceTarget::from_file(devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto at = [&](int64_t n) {
    auto b = bind_shape(spec_, {{"N", n}});
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    auto g = resolve(*b);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  };
  const ResolvedGraph g2 = at(2), g6 = at(6);
  BuildReport first;
  auto p2 = build_plan(g2, *target, BuildOptions{}, &first);
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  if (first.choice.empty()) {
    GTEST_SKIP() << "engine " << p2->engine_name()
                 << " has a knob the frontend cannot pass back: not replayable";
  }
  EXPECT_FALSE(first.replayed);
  BuildOptions replay;
  replay.replay = first.choice;
  BuildReport second;
  auto p6 = build_plan(g6, *target, replay, &second);
  ASSERT_TRUE(p6.ok()) << p6.status().ToString();
  EXPECT_TRUE(second.replayed);
  EXPECT_EQ(p6->engine_name(), p2->engine_name());
  EXPECT_EQ(second.candidate_plans, 1);  // one engine config, no heuristic query
  EXPECT_EQ(second.choice.engine_id, first.choice.engine_id);
  EXPECT_EQ(second.choice.knobs, first.choice.knobs);
  // A bogus engine fails plainly, never a crash.
  BuildOptions bogus;
  bogus.replay.engine_id = 1000000;
  BuildReport none;
  EXPECT_FALSE(build_plan(g6, *target, bogus, &none).ok());
}

TEST_F(DynamicShapeDeviceless, OutOfRangeIsRefusedBeforeBuilding) {
  PlanReport r;
  auto p = session_->get_plan(spec_, {{"N", 9}}, {}, &r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  for (const char* part : {"symbol 'N'", "dim 0 of 'x'", "[1, 8]"}) {
    EXPECT_NE(p.status().message().find(part), std::string::npos) << p.status().message();
  }
  EXPECT_TRUE(r.attempts.empty());
  EXPECT_EQ(entries(), 0u);
}

}  // namespace
}  // namespace fusebox
