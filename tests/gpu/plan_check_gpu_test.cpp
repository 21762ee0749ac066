// The plan check on the H200 (fusebox/plan_check.h, issue 29): every graph of
// tests/cases/ (graphs a user found wrong values or no engine for) is served a
// plan that verifies on new seeds, and a cached plan is checked once and then
// trusted, an edited verdict checked again. Skipped without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "../deviceless/test_util.h"
#include "fusebox/plan_cache.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {
namespace {

using testing::source_dir;

std::vector<std::string> case_graphs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(source_dir() + "/tests/cases")) {
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ResolvedGraph load(const std::string& path) {
  auto spec = load_graph_file(path);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

class CaseGraphs : public ::testing::TestWithParam<std::string> {};

// Every case runs and verifies (issue 29: 0 wrong values, 0 stops): on a cuDNN engine, a
// partition, or, where no cuDNN engine builds a single op, fusebox's reference kernels. A
// second session on the same plan cache starts warm (a partition with a reference-kernel part
// included) and serves the same numbers.
TEST_P(CaseGraphs, RunsAndVerifiesThroughTheSessionColdAndWarm) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  testing::TempDir dir;
  PlanCache cache = PlanCache::open(dir.file("plans.sqlite"));
  ASSERT_TRUE(cache.enabled());
  SessionOptions so;
  so.cache = &cache;
  const ResolvedGraph g = load(GetParam());
  const std::string name = testing::stem(GetParam());
  for (const char* start : {"cold", "warm"}) {
    auto s = Session::create(so);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    PlanReport rep;
    auto plan = (*s)->get_plan(g, {}, &rep);
    ASSERT_TRUE(plan.ok()) << name << " (" << start << "): " << plan.status().ToString();
    if (std::string(start) == "cold") {
      EXPECT_TRUE(rep.plan_check.state == "passed" || rep.plan_check.state == "native")
          << rep.plan_check.text();
      EXPECT_TRUE(rep.stored || plan->native()) << name << ": a built plan is stored";
    } else if (!plan->native()) {
      EXPECT_EQ(rep.cache, "hit") << name;
    }
    for (uint64_t seed : {11u, 12u}) {  // seeds the check did not use
      RunOptions o;
      o.seed = seed;
      o.verify = true;
      o.iters = 0;
      auto r = run_plan(g, *plan, *(*s)->context(), o);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (const auto& c : r->comparisons) EXPECT_TRUE(c.pass) << GetParam() << " " << c.ToString();
    }
    std::string how = plan->engine_name();
    for (const auto& f : rep.reference_fallback) how += "; reference kernels for " + f.substr(0, 160);
    std::printf("[ %-10s ] %s: %s (plan check %s)\n", start, name.c_str(), how.c_str(),
                rep.plan_check.text().c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CaseGraphs, ::testing::ValuesIn(case_graphs()),
                         [](const auto& info) { return testing::stem(info.param); });

TEST(PlanCheckGpu, ACachedPlanIsCheckedOnceThenTrustedAndAnEditedVerdictIsCheckedAgain) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  const auto dir =
      std::filesystem::temp_directory_path() / ("fusebox_plan_check_gpu_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  PlanCache cache = PlanCache::open((dir / "plans.sqlite").string());
  ASSERT_TRUE(cache.enabled());
  SessionOptions so;
  so.cache = &cache;
  auto s = Session::create(so);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");

  PlanReport built;
  ASSERT_TRUE((*s)->get_plan(g, {}, &built).ok());
  EXPECT_EQ(built.source, PlanSource::kBuilt);
  EXPECT_EQ(built.plan_check.state, "passed");
  EXPECT_EQ(built.plan_check.plans_checked, 1);
  EXPECT_TRUE(built.stored);

  PlanReport warm;
  ASSERT_TRUE((*s)->get_plan(g, {}, &warm).ok());
  EXPECT_EQ(warm.cache, "hit");
  EXPECT_EQ(warm.plan_check.state, "trusted");  // a warm start runs nothing
  EXPECT_EQ(warm.plan_check.ms, 0);

  // Edit the verdict of the stored entry: the next hit checks the plan again and re-seals it.
  auto entry = cache.lookup(warm.cache_key);
  ASSERT_TRUE(entry.ok() && entry->has_value());
  CacheEntry edited = **entry;
  edited.info.plan_check_detail += " (edited)";
  ASSERT_TRUE(cache.store(edited).ok());
  PlanReport rechecked;
  ASSERT_TRUE((*s)->get_plan(g, {}, &rechecked).ok());
  EXPECT_EQ(rechecked.cache, "hit");
  EXPECT_EQ(rechecked.plan_check.state, "passed");
  EXPECT_EQ(rechecked.plan_check.plans_checked, 1);
  PlanReport trusted_again;
  ASSERT_TRUE((*s)->get_plan(g, {}, &trusted_again).ok());
  EXPECT_EQ(trusted_again.plan_check.state, "trusted");
  std::printf("[ plan check ] conv_bias_relu_small: built %.2f ms of steps, check %.2f ms\n",
              built.build.total_ms(), built.plan_check.ms);
  std::filesystem::remove_all(dir);
}

// fusebox's own kernels are not in the plan cache, so a session checks them as it builds them;
// an equal graph (other names, as a transformer's layers) with the same kernel is checked once per
// session, and a new session checks again.
TEST(PlanCheckGpu, AFuseboxKernelIsCheckedOncePerSessionForEqualGraphs) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  auto spec = load_graph_file(source_dir() + "/examples/graphs/small/rope_small.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const ResolvedGraph g = load(source_dir() + "/examples/graphs/small/rope_small.json");
  GraphSpec renamed_spec = *spec;
  renamed_spec.name = "rope_layer_2";
  for (auto& op : renamed_spec.ops) op.name += "_2";
  auto renamed = resolve(renamed_spec);
  ASSERT_TRUE(renamed.ok()) << renamed.status().ToString();
  ASSERT_EQ(renamed->canonical, g.canonical);
  for (int session = 0; session < 2; ++session) {
    auto s = Session::create({});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    PlanReport first, second;
    auto p1 = (*s)->get_plan(g, {}, &first);
    ASSERT_TRUE(p1.ok()) << p1.status().ToString();
    if (!p1->native()) GTEST_SKIP() << "rope_small is not on fusebox's kernel here: " << p1->engine_name();
    EXPECT_EQ(first.plan_check.state, "passed") << first.plan_check.text();
    EXPECT_EQ(first.plan_check.plans_checked, 1);
    auto p2 = (*s)->get_plan(*renamed, {}, &second);
    ASSERT_TRUE(p2.ok()) << p2.status().ToString();
    EXPECT_EQ(second.plan_check.state, "session") << second.plan_check.text();
    EXPECT_EQ(second.plan_check.plans_checked, 0);
  }
}

}  // namespace
}  // namespace fusebox
