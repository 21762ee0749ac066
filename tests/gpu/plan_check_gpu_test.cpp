// The plan check on the H200 (fusebox/plan_check.h, issue 29): every graph of
// tests/cases/ (graphs a user found wrong values or no engine for) is served a
// plan that verifies on new seeds, and a cached plan is checked once and then
// trusted, an edited verdict checked again. Skipped without a GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "../deviceless/test_util.h"
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

// The cases fusebox runs today (the others are refused with NotSupported and the reason:
// docs/architecture.md, "Engine rules"; the partitioner's limits are in the closing notes).
const std::set<std::string> kMustRun = {"batchnorm_inference_bf16_fp32params_nhwc",
                                        "batchnorm_inference_fp16_fp32params_nhwc", "two_convs_one_graph",
                                        "conv_bias_scale_reduce_amax_fp32_nhwc"};

class CaseGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(CaseGraphs, RunsAndVerifiesThroughTheSession) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  auto s = Session::create();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const ResolvedGraph g = load(GetParam());
  PlanReport rep;
  auto plan = (*s)->get_plan(g, {}, &rep);
  const std::string name = testing::stem(GetParam());
  if (!plan.ok()) {
    // Correct or refused: a graph that does not run is refused before anything runs (NotSupported,
    // with the reason), never served a plan that fails the check.
    const bool refused_by_check = plan.status().code() == StatusCode::kVerificationFailed &&
                                  plan.status().message().find("plan check") != std::string::npos;
    EXPECT_TRUE(plan.status().code() == StatusCode::kNotSupported || refused_by_check)
        << plan.status().ToString();
    EXPECT_FALSE(kMustRun.count(name)) << name << " must run: " << plan.status().ToString();
    std::printf("[ refused    ] %s: %s\n", name.c_str(),
                plan.status().message().substr(0, plan.status().message().find('\n')).c_str());
    return;
  }
  EXPECT_TRUE(rep.plan_check.state == "passed" || rep.plan_check.state == "native") << rep.plan_check.text();
  for (uint64_t seed : {11u, 12u}) {  // seeds the check did not use
    RunOptions o;
    o.seed = seed;
    o.verify = true;
    o.iters = 0;
    auto r = run_plan(g, *plan, *(*s)->context(), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (const auto& c : r->comparisons) EXPECT_TRUE(c.pass) << GetParam() << " " << c.ToString();
  }
  if (!rep.plan_check.rejected.empty()) {
    std::printf("[ plan check ] %s: %s\n", testing::stem(GetParam()).c_str(), rep.plan_check.text().c_str());
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

}  // namespace
}  // namespace fusebox
