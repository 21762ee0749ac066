// The Session's plan policy without a GPU: the mode order with a fake
// builder, and cache-source selection and the workspace limit with real
// deviceless builds of conv + bias + relu (which cuDNN builds without a driver).
#include "fusebox/session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "fusebox/partition.h"
#include "fusebox/plan_file.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::devprop_path;
using testing::source_dir;

const std::vector<HeuristicMode> kA{HeuristicMode::kA}, kB{HeuristicMode::kB}, kF{HeuristicMode::kFallback};

// A failure as build_plan reports it: `steps` steps ran, the last failed.
Status fake_failure(BuildReport* r, int steps, StatusCode code, const std::string& msg) {
  const char* names[] = {"validate", "build_operation_graph", "create_execution_plans", "check_support",
                         "build_plans"};
  for (int i = 0; i < steps; ++i) r->steps.push_back({names[i], 1.0, true, Status::Ok(), ""});
  r->steps.back().status = Status(code, msg);
  return r->steps.back().status;
}

// A builder that fails for the modes in `failing` the way cuDNN does when a
// mode has no engine, and records the order it was called in.
struct FakeBuilder {
  std::vector<std::vector<HeuristicMode>> failing;
  std::vector<std::vector<HeuristicMode>> calls;
  int steps_on_failure = 3;
  StatusCode code = StatusCode::kNotSupported;
  BuildFn fn() {
    return [this](const BuildOptions& o, BuildReport* r) -> Result<Plan> {
      calls.push_back(o.heuristics);
      for (const auto& f : failing) {
        if (f == o.heuristics) return fake_failure(r, steps_on_failure, code, "No valid engine configs");
      }
      return Plan();
    };
  }
};

TEST(SessionPolicy, DefaultOrderIsAThenBThenFallback) {
  const auto order = default_mode_order();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0], kA);
  EXPECT_EQ(order[1], kB);
  EXPECT_EQ(order[2], kF);
}

TEST(SessionPolicy, ModeAServesWithoutTryingOthers) {
  FakeBuilder b;
  std::vector<ModeAttempt> attempts;
  auto plan = build_modes_in_turn({}, default_mode_order(), b.fn(), &attempts);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0], kA);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_TRUE(attempts[0].status.ok());
}

TEST(SessionPolicy, FallsBackInOrderWhenModesHaveNoEngine) {
  // The case: mode A (and here B) find no engine, fallback does.
  FakeBuilder b;
  b.failing = {kA, kB};
  std::vector<ModeAttempt> attempts;
  BuildOptions base;
  base.max_workspace_bytes = 1234;
  auto plan = build_modes_in_turn(base, default_mode_order(), b.fn(), &attempts);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(b.calls.size(), 3u);
  EXPECT_EQ(b.calls[0], kA);
  EXPECT_EQ(b.calls[1], kB);
  EXPECT_EQ(b.calls[2], kF);
  ASSERT_EQ(attempts.size(), 3u);
  EXPECT_EQ(attempts[0].status.code(), StatusCode::kNotSupported);
  EXPECT_EQ(attempts[1].status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(attempts[2].status.ok());
  EXPECT_EQ(attempts[2].modes, kF);
}

TEST(SessionPolicy, StopsAtAFailureNoModeCanFix) {
  // validate failing (one step ran) fails every mode alike.
  FakeBuilder b;
  b.failing = {kA, kB, kF};
  b.steps_on_failure = 1;
  b.code = StatusCode::kInvalidArgument;
  std::vector<ModeAttempt> attempts;
  auto plan = build_modes_in_turn({}, default_mode_order(), b.fn(), &attempts);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(attempts.size(), 1u);
}

TEST(SessionPolicy, AllModesFailingNamesThemAll) {
  FakeBuilder b;
  b.failing = {kA, kB, kF};
  std::vector<ModeAttempt> attempts;
  auto plan = build_modes_in_turn({}, default_mode_order(), b.fn(), &attempts);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(plan.status().message().find(
                "no heuristic mode yielded a buildable engine (tried in turn: a, b, fallback)"),
            std::string::npos)
      << plan.status().message();
  EXPECT_EQ(attempts.size(), 3u);
}

TEST(SessionPolicy, WhichFailuresAnotherModeMayFix) {
  BuildReport early, late;
  (void)fake_failure(&early, 2, StatusCode::kNotSupported, "x");
  (void)fake_failure(&late, 4, StatusCode::kNotSupported, "x");
  EXPECT_FALSE(another_mode_may_help(early.steps.back().status, early));
  EXPECT_TRUE(another_mode_may_help(late.steps.back().status, late));
  EXPECT_TRUE(another_mode_may_help(Status(StatusCode::kCudnnError, "x"), late));
  EXPECT_FALSE(another_mode_may_help(Status(StatusCode::kCudaError, "x"), late));
  EXPECT_FALSE(another_mode_may_help(InvalidArgument("x"), late));
}

TEST(SessionPolicy, PolicyKeysDifferByModeEngineAndLimit) {
  PlanRequest def, pinned_a, engine;
  pinned_a.heuristics = kA;
  engine.engine = "eng0";
  EXPECT_NE(request_policy_key(def, -1), request_policy_key(pinned_a, -1));
  EXPECT_NE(request_policy_key(def, -1), request_policy_key(engine, -1));
  EXPECT_NE(request_policy_key(def, -1), request_policy_key(def, 0));
  EXPECT_NE(request_policy_key(def, -1).find("a>b>fallback"), std::string::npos);
}

// ---------------------------------------------------------------- real deviceless builds

class DevicelessSession : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusebox_session_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    cache_ = std::make_unique<PlanCache>(PlanCache::open((dir_ / "plans.sqlite").string()));
    ASSERT_TRUE(cache_->enabled());
    g_ = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static ResolvedGraph load(const std::string& path) {
    auto spec = load_graph_file(path);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  }
  std::unique_ptr<Session> session(PlanCache* cache, int64_t limit = -1) {
    SessionOptions o;
    o.device_properties_file = devprop_path();
    o.cache = cache;
    o.workspace_limit_bytes = limit;
    auto s = Session::create(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::filesystem::path dir_;
  std::unique_ptr<PlanCache> cache_;
  ResolvedGraph g_;
};

TEST_F(DevicelessSession, BuildsWithModeAThenHitsTheCache) {
  auto s = session(cache_.get());
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->deviceless());
  EXPECT_EQ(s->context(), nullptr);
  PlanReport r;
  auto plan = s->get_plan(g_, {}, &r);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(r.source, PlanSource::kBuilt);
  EXPECT_EQ(r.heuristic_mode, "a");
  ASSERT_EQ(r.attempts.size(), 1u);
  EXPECT_EQ(r.build.steps.size(), 5u);
  EXPECT_EQ(r.cache, "miss");
  EXPECT_TRUE(r.stored);
  EXPECT_EQ(r.engine, plan->engine_name());
  EXPECT_FALSE(r.engine.empty());
  EXPECT_GT(r.total_ms, 0);
  EXPECT_EQ(r.source_text(), "built now");

  PlanReport again;
  auto hit = s->get_plan(g_, {}, &again);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(again.source, PlanSource::kHeuristicCache);
  EXPECT_EQ(again.cache, "hit");
  EXPECT_EQ(again.cache_key, r.cache_key);
  EXPECT_TRUE(again.attempts.empty());
  EXPECT_EQ(hit->engine_name(), r.engine);
}

// fusebox's own kernels go into the plan cache by name (with the plan check's verdict on a GPU),
// so a warm start reads them back instead of building and checking them again.
TEST_F(DevicelessSession, AFuseboxKernelIsStoredByNameAndHitsTheCache) {
  const ResolvedGraph g = load(source_dir() + "/examples/graphs/small/rope_small.json");
  PlanReport r, again;
  {
    auto s = session(cache_.get());
    ASSERT_TRUE(s);
    auto plan = s->get_plan(g, {}, &r);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_TRUE(plan->native()) << plan->engine_name();
    EXPECT_TRUE(r.stored);
  }
  auto s = session(cache_.get());  // a new start on the same cache
  ASSERT_TRUE(s);
  auto hit = s->get_plan(g, {}, &again);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(again.cache, "hit");
  EXPECT_TRUE(hit->native());
  EXPECT_EQ(hit->engine_name(), r.engine);
  EXPECT_EQ(hit->part_count(), 0) << "one part by name reads back as the kernel, not a partition";
}

TEST_F(DevicelessSession, ATunedEntryComesFirstUnlessAnEngineIsPinnedOrTunedIsOff) {
  auto s = session(cache_.get());
  ASSERT_TRUE(s);
  auto plan = s->get_plan(g_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> warnings;
  ASSERT_TRUE(
      store_plan(cache_.get(), g_, s->target(), tune_policy_key(TunePolicy{}), *plan, 0.25, &warnings));

  PlanReport r;
  ASSERT_TRUE(s->get_plan(g_, {}, &r).ok());
  EXPECT_EQ(r.source, PlanSource::kTunedCache);
  EXPECT_DOUBLE_EQ(r.cache_entry.tuned_median_ms, 0.25);
  EXPECT_EQ(r.source_text(), "plan cache (tuned)");

  PlanRequest no_tuned;
  no_tuned.use_tuned_cache = false;
  ASSERT_TRUE(s->get_plan(g_, no_tuned, &r).ok());
  EXPECT_EQ(r.source, PlanSource::kHeuristicCache);

  PlanRequest pinned;
  pinned.engine = plan->engine_name();
  auto p = s->get_plan(g_, pinned, &r);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(r.source, PlanSource::kBuilt);  // its own key: a miss the first time
  EXPECT_EQ(p->engine_name(), pinned.engine);
  ASSERT_TRUE(s->get_plan(g_, pinned, &r).ok());
  EXPECT_EQ(r.source, PlanSource::kHeuristicCache);
}

TEST_F(DevicelessSession, ARunInACudaGraphPrefersTheEntryTunedInsideCudaGraphs) {
  auto s = session(cache_.get());
  ASSERT_TRUE(s);
  auto plan = s->get_plan(g_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  TunePolicy in_graph;
  in_graph.cuda_graph = true;
  // Eager-timed keys are what they were before the CUDA-graph timing existed; the new one differs.
  EXPECT_EQ(tune_policy_key(TunePolicy{}),
            "tune;modes=a,b,fallback;max_ws=-1;det=0;rtc=1;top=0;budget_ms=0.000000");
  EXPECT_EQ(tune_policy_key(in_graph), tune_policy_key(TunePolicy{}) + ";graph=1");
  std::vector<std::string> warnings;
  ASSERT_TRUE(
      store_plan(cache_.get(), g_, s->target(), tune_policy_key(TunePolicy{}), *plan, 0.25, &warnings));

  PlanRequest replayed;
  replayed.cuda_graph = true;
  PlanReport r;
  ASSERT_TRUE(s->get_plan(g_, replayed, &r).ok());  // only the eager-timed entry: it serves
  EXPECT_EQ(r.source, PlanSource::kTunedCache);
  EXPECT_DOUBLE_EQ(r.cache_entry.tuned_median_ms, 0.25);
  EXPECT_EQ(r.source_text(), "plan cache (tuned)");

  ASSERT_TRUE(store_plan(cache_.get(), g_, s->target(), tune_policy_key(in_graph), *plan, 0.125, &warnings));
  ASSERT_TRUE(s->get_plan(g_, replayed, &r).ok());
  EXPECT_EQ(r.source, PlanSource::kTunedCache);
  EXPECT_DOUBLE_EQ(r.cache_entry.tuned_median_ms, 0.125);
  EXPECT_EQ(r.source_text(), "plan cache (tuned in a CUDA graph)");

  ASSERT_TRUE(s->get_plan(g_, {}, &r).ok());  // an eager run keeps the eager-timed winner
  EXPECT_DOUBLE_EQ(r.cache_entry.tuned_median_ms, 0.25);
  EXPECT_EQ(r.source_text(), "plan cache (tuned)");
}

TEST_F(DevicelessSession, APinnedModeBuildsOnceWithThatMode) {
  auto s = session(nullptr);
  ASSERT_TRUE(s);
  PlanRequest req;
  req.heuristics = kB;
  PlanReport r;
  auto plan = s->get_plan(g_, req, &r);
  if (!plan.ok()) {
    // Mode B may offer nothing deviceless; then nothing else may be tried.
    EXPECT_EQ(r.attempts.size(), 1u);
    return;
  }
  EXPECT_EQ(r.cache, "off");
  EXPECT_EQ(r.heuristic_mode, "b");
  ASSERT_EQ(r.attempts.size(), 1u);
  EXPECT_EQ(r.attempts[0].modes, kB);
}

TEST_F(DevicelessSession, APlanFileIsUsedAsIs) {
  auto s = session(cache_.get());
  ASSERT_TRUE(s);
  auto plan = s->get_plan(g_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto bytes = plan->serialize();
  ASSERT_TRUE(bytes.ok());
  const std::string path = (dir_ / "p.plan").string();
  ASSERT_TRUE(write_plan_file(path, make_plan_info(g_, *plan, s->target()), *bytes).ok());
  PlanRequest req;
  req.plan_file = path;
  PlanReport r;
  auto from_file = s->get_plan(g_, req, &r);
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(r.source, PlanSource::kPlanFile);
  EXPECT_TRUE(r.plan_file_built_deviceless);
  EXPECT_EQ(r.cache, "off");
  EXPECT_EQ(r.source_text(), "plan file (built deviceless)");
  EXPECT_EQ(from_file->engine_name(), plan->engine_name());

  // Another graph's plan file is refused, naming the file.
  ResolvedGraph other = load(source_dir() + "/examples/graphs/conv_bias_relu.json");
  auto wrong = s->get_plan(other, req);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find(path), std::string::npos) << wrong.status().message();
}

TEST_F(DevicelessSession, WorkspaceLimitDropsLargerCandidatesAndSaysWhich) {
  // The big conv's heuristic choice needs workspace (131 B on cuDNN 9.19).
  ResolvedGraph big = load(source_dir() + "/examples/graphs/conv_bias_relu.json");
  auto s = session(nullptr);
  ASSERT_TRUE(s);
  PlanReport unlimited;
  auto first = s->get_plan(big, {}, &unlimited);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const int64_t need = first->workspace_bytes();
  EXPECT_EQ(unlimited.build.workspace_limit, -1);
  EXPECT_TRUE(unlimited.build.dropped.empty());
  if (need == 0) GTEST_SKIP() << "the heuristic choice needs no workspace with this cuDNN";

  PlanRequest req;
  req.max_workspace_bytes = need - 1;
  PlanReport r;
  auto limited = s->get_plan(big, req, &r);
  EXPECT_EQ(r.build.workspace_limit, need - 1);
  ASSERT_FALSE(r.build.dropped.empty());
  bool dropped_choice = false;
  for (const auto& d : r.build.dropped) {
    EXPECT_GT(d.workspace_bytes, need - 1) << d.name;
    EXPECT_NE(d.why.find("over the limit of " + std::to_string(need - 1)), std::string::npos) << d.why;
    dropped_choice |= d.name == first->engine_name();
  }
  EXPECT_TRUE(dropped_choice) << "the unlimited choice " << first->engine_name() << " needs " << need;
  if (limited.ok()) {
    EXPECT_LE(limited->workspace_bytes(), need - 1);
    EXPECT_NE(limited->engine_name(), first->engine_name());
  } else {
    EXPECT_NE(limited.status().message().find("workspace limit"), std::string::npos)
        << limited.status().message();
  }
}

TEST_F(DevicelessSession, APinnedEngineOverTheLimitIsRefusedSayingWhy) {
  ResolvedGraph big = load(source_dir() + "/examples/graphs/conv_bias_relu.json");
  auto s = session(nullptr);
  ASSERT_TRUE(s);
  auto first = s->get_plan(big);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  if (first->workspace_bytes() == 0)
    GTEST_SKIP() << "the heuristic choice needs no workspace with this cuDNN";
  PlanRequest req;
  req.engine = first->engine_name();
  req.max_workspace_bytes = first->workspace_bytes() - 1;
  PlanReport r;
  auto pinned = s->get_plan(big, req, &r);
  ASSERT_FALSE(pinned.ok());
  EXPECT_EQ(pinned.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pinned.status().message().find("pinned engine '" + req.engine + "' needs " +
                                           std::to_string(first->workspace_bytes()) + " bytes of workspace"),
            std::string::npos)
      << pinned.status().message();
  EXPECT_EQ(r.attempts.size(), 1u);
}

TEST_F(DevicelessSession, TheSessionLimitAppliesAndTheTighterLimitWins) {
  // The big conv's choice needs 131 B on cuDNN 9.19, and candidates needing
  // none exist: a session limit of 0 must pick one of those.
  ResolvedGraph big = load(source_dir() + "/examples/graphs/conv_bias_relu.json");
  auto unlimited = session(nullptr);
  ASSERT_TRUE(unlimited);
  auto choice = unlimited->get_plan(big);
  ASSERT_TRUE(choice.ok()) << choice.status().ToString();
  auto s = session(nullptr, 0);
  ASSERT_TRUE(s);
  PlanRequest looser;
  looser.max_workspace_bytes = 1 << 20;  // the session's 0 is tighter
  PlanReport r;
  auto plan = s->get_plan(big, looser, &r);
  EXPECT_EQ(r.build.workspace_limit, 0);
  if (!plan.ok()) {
    // No candidate under the limit: one error naming it.
    EXPECT_NE(plan.status().message().find("workspace limit of 0 bytes: no candidate meets it"),
              std::string::npos)
        << plan.status().message();
    return;
  }
  EXPECT_EQ(plan->workspace_bytes(), 0);
  if (choice->workspace_bytes() > 0) {
    bool dropped_choice = false;
    for (const auto& d : r.build.dropped) dropped_choice |= d.name == choice->engine_name();
    EXPECT_TRUE(dropped_choice);
  }
}

TEST_F(DevicelessSession, ACachedPlanOverTheLimitIsIgnoredWithAWarning) {
  ResolvedGraph big = load(source_dir() + "/examples/graphs/conv_bias_relu.json");
  auto unlimited = session(cache_.get());
  ASSERT_TRUE(unlimited);
  auto plan = unlimited->get_plan(big);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  if (plan->workspace_bytes() == 0) GTEST_SKIP() << "the plan needs no workspace";
  std::vector<std::string> warnings;
  ASSERT_TRUE(store_plan(cache_.get(), big, unlimited->target(), tune_policy_key(TunePolicy{}), *plan, 1.0,
                         &warnings));
  auto limited = session(cache_.get(), plan->workspace_bytes() - 1);
  PlanReport r;
  (void)limited->get_plan(big, {}, &r);
  EXPECT_NE(r.source, PlanSource::kTunedCache);
  bool warned = false;
  for (const auto& w : r.warnings) warned |= w.find("over the limit") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST_F(DevicelessSession, CannotBindOrTune) {
  auto s = session(nullptr);
  ASSERT_TRUE(s);
  auto plan = s->get_plan(g_);
  ASSERT_TRUE(plan.ok());
  auto bound = s->bind(*plan, {});
  ASSERT_FALSE(bound.ok());
  EXPECT_EQ(bound.status().code(), StatusCode::kNoDevice);
  auto tuned = s->tune(g_, TunePolicy{});
  ASSERT_FALSE(tuned.ok());
  EXPECT_EQ(tuned.status().code(), StatusCode::kNoDevice);
}

// The reference-kernel fallback (issue 29): deviceless it is never taken (a runtime-compiled engine
// the deviceless build cannot see may exist on the GPU), but it can be pinned; a partitioned plan
// with a reference-kernel part serializes (no plan bytes for that part) and reads back.
TEST_F(DevicelessSession, TheReferenceFallbackIsOnlyTakenOnAGpuButCanBePinned) {
  auto s = session(nullptr);
  ASSERT_TRUE(s);
  const ResolvedGraph g = load(source_dir() + "/tests/cases/partitioned/two_convs_one_graph.json");
  PlanRequest pinned;
  pinned.engine = kReferenceEngine;
  PlanReport r;
  auto plan = s->get_plan(g, pinned, &r);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->native());
  EXPECT_EQ(plan->engine_name(), kReferenceEngine);
  EXPECT_TRUE(r.reference_fallback.empty());  // pinned, not a fallback
  bool noted = false;
  for (const auto& n : r.build.lowering_notes)
    noted |= n.find("naive reference kernels") != std::string::npos;
  EXPECT_TRUE(noted) << "the build report says the plan runs on the reference kernels";

  // Two parts: cuDNN's conv1+bias1+relu1, then the second conv block on the reference kernels.
  std::map<int, DType> io_temporary;  // as the partitioner settles it deviceless (cli.md)
  for (size_t i = 0; i < g.tensors.size(); ++i)
    if (g.tensors[i].name == "h") io_temporary[static_cast<int>(i)] = DType::kBF16;
  auto partition = partition_at(g, {{0, 3}, {3, 3}}, io_temporary);
  ASSERT_TRUE(partition.ok()) << partition.status().ToString();
  std::vector<Plan> parts;
  auto first = s->get_plan(partition->parts[0].graph, {}, nullptr);  // heuristic modes in turn
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  parts.push_back(std::move(first).value());
  BuildOptions ref;
  ref.engine = kReferenceEngine;
  auto second = build_plan(partition->parts[1].graph, s->target(), ref, nullptr, nullptr);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  parts.push_back(std::move(second).value());
  auto whole = compose_partitioned_plan(g, *partition, std::move(parts));
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ASSERT_NE(whole->part_plan(1), nullptr);  // the parts, to time alone (run --time-parts)
  EXPECT_EQ(whole->part_plan(1)->engine_name(), kReferenceEngine);
  EXPECT_EQ(whole->part_graph(1)->ops.size(), 3u);
  EXPECT_EQ(whole->part_graph(2), nullptr);
  EXPECT_EQ(whole->part_plan(-1), nullptr);
  auto bytes = whole->serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = deserialize_plan(g, *bytes, s->target(), nullptr);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->part_count(), 2);
  EXPECT_EQ(back->engine_name(), whole->engine_name());
  EXPECT_NE(back->engine_name().find("| fusebox_reference"), std::string::npos) << back->engine_name();
}

}  // namespace
}  // namespace fusebox
