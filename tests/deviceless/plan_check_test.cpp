// The plan check's bookkeeping without a GPU (fusebox/plan_check.h): sealed
// verdicts in plan files and cache entries (an edited one is not trusted),
// the session's report when nothing can run, and BuildOptions::excluded_engines
// with real deviceless builds (what the check uses to take the next candidate).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/kernels_revision.h"
#include "common/plan_info_json.h"
#include "fusebox/cached_plan.h"
#include "fusebox/plan_file.h"
#include "fusebox/session.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::devprop_path;
using testing::source_dir;

PlanFileInfo sample_info() {
  PlanFileInfo i;
  i.graph_fingerprint = "0123456789abcdef";
  i.engine = "eng41_k2=4_k13=0";
  i.device_name = "NVIDIA H200";
  i.sm_version = 90;
  i.sm_count = 132;
  i.cudnn_version = 91900;
  i.frontend_version = "1.32.0";
  return i;
}

TEST(PlanCheckSeal, APassingVerdictIsTrustedForItsPayloadOnly) {
  PlanFileInfo info = sample_info();
  PlanCheckRun run;
  run.passed = true;
  run.detail = "y: rel_l2=1.0e-03 PASS";
  record_plan_check(info, run, "aaaaaaaaaaaaaaaa");
  EXPECT_EQ(info.plan_check, "pass");
  EXPECT_TRUE(plan_info_json::check_passed(info, "aaaaaaaaaaaaaaaa"));
  // Another payload (a plan swapped under the verdict): not trusted.
  EXPECT_FALSE(plan_info_json::check_passed(info, "aaaaaaaaaaaaaaab"));
}

TEST(PlanCheckSeal, EditedVerdictsAreNotTrusted) {
  PlanCheckRun run;
  run.passed = true;
  run.detail = "y: PASS";
  PlanFileInfo base = sample_info();
  record_plan_check(base, run, "cc");
  ASSERT_TRUE(plan_info_json::check_passed(base, "cc"));
  PlanFileInfo e1 = base;
  e1.plan_check_detail = "y: PASS (edited)";
  EXPECT_FALSE(plan_info_json::check_passed(e1, "cc"));
  PlanFileInfo e2 = base;
  e2.engine = "eng0";  // the verdict moved to another engine
  EXPECT_FALSE(plan_info_json::check_passed(e2, "cc"));
  PlanFileInfo e3 = base;
  e3.cudnn_version = 92700;  // another cuDNN: checked again there
  EXPECT_FALSE(plan_info_json::check_passed(e3, "cc"));
  PlanFileInfo e4 = sample_info();
  e4.plan_check = "pass";  // a verdict with no seal
  EXPECT_FALSE(plan_info_json::check_passed(e4, "cc"));
  PlanFileInfo e5 = base;
  e5.plan_check_seal = std::string(16, '0');
  EXPECT_FALSE(plan_info_json::check_passed(e5, "cc"));
}

// A plan of fusebox's own kernels is serialized as their names: the code that runs is this build's.
// Its verdict holds only under the kernels revision it was recorded with (common/kernels_revision.h):
// from another build, or from before revisions were recorded, it is checked again; a cuDNN plan's
// verdict does not depend on the revision. The revision is sealed: editing it does not help.
TEST(PlanCheckSeal, AVerdictOnFuseboxKernelsHoldsForTheirRevisionOnly) {
  PlanCheckRun run;
  run.passed = true;
  run.detail = "o: PASS";
  for (const char* engine : {"fusebox_sdpa_decode", "partitioned[eng0 | fusebox_reference]"}) {
    SCOPED_TRACE(engine);
    PlanFileInfo native = sample_info();
    native.engine = engine;
    native.fusebox_kernels = common::kernels_revision();
    record_plan_check(native, run, "cc");
    EXPECT_TRUE(plan_info_json::check_passed(native, "cc"));
    PlanFileInfo other_build = native;
    other_build.fusebox_kernels = "0000000000000000";
    EXPECT_FALSE(plan_info_json::check_passed(other_build, "cc"));
    PlanFileInfo older = sample_info();  // recorded before revisions were
    older.engine = engine;
    record_plan_check(older, run, "cc");
    EXPECT_FALSE(plan_info_json::check_passed(older, "cc"));
  }
  PlanFileInfo cudnn = sample_info();
  cudnn.fusebox_kernels = "0000000000000000";
  record_plan_check(cudnn, run, "cc");
  EXPECT_TRUE(plan_info_json::check_passed(cudnn, "cc")) << "a cuDNN plan: any revision";
  PlanFileInfo edited = cudnn;
  edited.fusebox_kernels = common::kernels_revision();
  EXPECT_FALSE(plan_info_json::check_passed(edited, "cc")) << "the revision is under the seal";
  EXPECT_EQ(std::string(common::kernels_revision()).size(), 16u);
}

TEST(PlanCheckSeal, AFailingRunRecordsNothing) {
  PlanFileInfo info = sample_info();
  PlanCheckRun run;
  run.passed = false;
  run.detail = "dx: 11232 non-finite FAIL";
  record_plan_check(info, run, "cc");
  EXPECT_TRUE(info.plan_check.empty());
  EXPECT_FALSE(plan_info_json::check_passed(info, "cc"));
}

TEST(PlanCheckReportText, SaysWhatHappened) {
  PlanCheckReport r;
  r.state = "off";
  EXPECT_NE(r.text().find("--no-plan-check"), std::string::npos);
  r.state = "passed";
  r.plans_checked = 2;
  r.rejected.push_back({"eng3_k1=2", "dx: 11232 non-finite FAIL"});
  const std::string t = r.text();
  EXPECT_NE(t.find("passed (2 plans checked"), std::string::npos) << t;
  EXPECT_NE(t.find("rejected eng3_k1=2: dx: 11232 non-finite FAIL"), std::string::npos) << t;
  r.state = "failed";
  EXPECT_NE(r.text().find("FAILED"), std::string::npos);
}

class PlanCheckDeviceless : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusebox_plan_check_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    auto spec = load_graph_file(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    g_ = *g;
    auto t = DeviceTarget::from_file(devprop_path());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    target_ = *t;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  ResolvedGraph g_;
  DeviceTarget target_;
};

TEST_F(PlanCheckDeviceless, ADevicelessSessionSaysNothingRanAndOffSaysOff) {
  SessionOptions o;
  o.device_properties_file = devprop_path();
  auto s = Session::create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  PlanReport r;
  ASSERT_TRUE((*s)->get_plan(g_, {}, &r).ok());
  EXPECT_EQ(r.plan_check.state, "deviceless");
  EXPECT_EQ(r.plan_check.plans_checked, 0);
  PlanRequest off;
  off.check_plan = false;
  PlanReport r2;
  ASSERT_TRUE((*s)->get_plan(g_, off, &r2).ok());
  EXPECT_EQ(r2.plan_check.state, "off");
}

TEST_F(PlanCheckDeviceless, ACacheEntryKeepsItsVerdictAndAnEditedOneIsNotTrusted) {
  PlanCache cache = PlanCache::open((dir_ / "plans.sqlite").string());
  ASSERT_TRUE(cache.enabled());
  BuildOptions bo;
  auto plan = build_plan(g_, target_, bo, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  PlanCheckRun run;
  run.passed = true;
  run.detail = "y: rel_l2=1e-3 PASS";
  std::vector<std::string> warnings;
  ASSERT_TRUE(store_plan(&cache, g_, target_, "policy-x", *plan, -1, &warnings, &run));
  auto got = lookup_cached_plan(&cache, g_, target_, "policy-x", nullptr);
  ASSERT_TRUE(got.ok() && got->hit);
  EXPECT_TRUE(got->check_trusted);
  EXPECT_EQ(got->entry.info.plan_check, "pass");

  // Stored without a verdict: not trusted.
  ASSERT_TRUE(store_plan(&cache, g_, target_, "policy-y", *plan, -1, &warnings, nullptr));
  auto plain = lookup_cached_plan(&cache, g_, target_, "policy-y", nullptr);
  ASSERT_TRUE(plain.ok() && plain->hit);
  EXPECT_FALSE(plain->check_trusted);

  // The verdict edited in the entry (the payload and its checksum intact): checked again.
  auto listed = cache.lookup(got->key);
  ASSERT_TRUE(listed.ok() && listed->has_value());
  CacheEntry edited = **listed;
  edited.info.plan_check_detail = "everything fine, trust me";
  ASSERT_TRUE(cache.store(edited).ok());
  auto again = lookup_cached_plan(&cache, g_, target_, "policy-x", nullptr);
  ASSERT_TRUE(again.ok() && again->hit);
  EXPECT_FALSE(again->check_trusted);
}

TEST_F(PlanCheckDeviceless, APlanFileKeepsItsVerdictAndAnEditedFileIsNotTrusted) {
  BuildOptions bo;
  auto plan = build_plan(g_, target_, bo, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto bytes = plan->serialize();
  ASSERT_TRUE(bytes.ok());
  PlanFileInfo info = make_plan_info(g_, *plan, target_);
  PlanCheckRun run;
  run.passed = true;
  run.detail = "y: PASS";
  record_plan_check(info, run, plan_info_json::payload_xxh3(bytes->data(), bytes->size()));
  const std::string path = (dir_ / "p.plan").string();
  ASSERT_TRUE(write_plan_file(path, info, *bytes).ok());
  auto pf = read_plan_file(path);
  ASSERT_TRUE(pf.ok()) << pf.status().ToString();
  EXPECT_TRUE(plan_info_json::check_passed(
      pf->info, plan_info_json::payload_xxh3(pf->payload.data(), pf->payload.size())));

  // Edit the verdict's text in the file: still a readable plan file, but the verdict is not trusted.
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find("y: PASS");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 7, "y: PAS5");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  auto edited = read_plan_file(path);
  if (edited.ok()) {
    EXPECT_FALSE(plan_info_json::check_passed(
        edited->info, plan_info_json::payload_xxh3(edited->payload.data(), edited->payload.size())));
  }  // (a header checksum refusing the edit outright is as good)
}

TEST_F(PlanCheckDeviceless, AnExcludedEngineIsSkippedForTheNextCandidate) {
  BuildOptions bo;
  BuildReport first_report;
  auto first = build_plan(g_, target_, bo, &first_report);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const std::string rejected = first->engine_name();

  BuildOptions without = bo;
  without.heuristics = {HeuristicMode::kA, HeuristicMode::kB, HeuristicMode::kFallback};
  without.excluded_engines = {rejected};
  BuildReport r;
  auto next = build_plan(g_, target_, without, &r);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_NE(next->engine_name(), rejected);
  bool listed = false;
  for (const auto& e : r.excluded) listed = listed || e.rfind(rejected + ": ", 0) == 0;
  EXPECT_TRUE(listed) << "the report lists the excluded engine";

  // Pinning the excluded engine is refused, naming why.
  BuildOptions pinned = without;
  pinned.engine = rejected;
  auto refused = build_plan(g_, target_, pinned, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(refused.status().message().find("plan check"), std::string::npos) << refused.status().message();
}

TEST_F(PlanCheckDeviceless, ExcludingEveryCandidateIsNotSupportedNamingThem) {
  auto listed = list_engines(g_, target_, BuildOptions{}, /*build_each=*/false, nullptr);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  BuildOptions all;
  for (const auto& c : *listed) all.excluded_engines.push_back(c.name);
  auto r = build_plan(g_, target_, all, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("excluded"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Two convolutions in one graph: no cuDNN engine runs them together, each
// conv + bias + relu has a precompiled engine, so the partitioner's real
// oracle splits it deviceless into two parts run as one plan.
class PartitionedDeviceless : public PlanCheckDeviceless {};

// Two equal conv blocks (the same canonical form as parts): the partitioner's oracle builds the
// part once, and the second part must still get a plan of its own (the H200 sweep of 2026-12-05
// stopped on three equal scale ops with "part ... was accepted but not built").
TEST_F(PartitionedDeviceless, TwoEqualPartsEachGetAPlan) {
  auto spec = parse_graph_json(R"({"name": "equal_blocks", "io_dtype": "bf16", "intermediate_dtype": "fp32",
    "tensors": [{"name": "x", "dims": [2, 16, 12, 12], "layout": "nhwc"},
                {"name": "w1", "dims": [16, 16, 3, 3], "layout": "nhwc"},
                {"name": "b1", "dims": [1, 16, 1, 1], "layout": "nhwc"},
                {"name": "w2", "dims": [16, 16, 3, 3], "layout": "nhwc"},
                {"name": "b2", "dims": [1, 16, 1, 1], "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
    "ops": [{"op": "conv_fprop", "name": "conv1", "inputs": {"x": "x", "w": "w1"}, "outputs": {"y": "c1"}, "padding": [1, 1]},
            {"op": "bias_add", "name": "bias1", "inputs": {"x": "c1", "bias": "b1"}, "outputs": {"y": "t1"}},
            {"op": "relu", "name": "act1", "inputs": {"x": "t1"}, "outputs": {"y": "h"}},
            {"op": "conv_fprop", "name": "conv2", "inputs": {"x": "h", "w": "w2"}, "outputs": {"y": "c2"}, "padding": [1, 1]},
            {"op": "bias_add", "name": "bias2", "inputs": {"x": "c2", "bias": "b2"}, "outputs": {"y": "t2"}},
            {"op": "relu", "name": "act2", "inputs": {"x": "t2"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  SessionOptions o;
  o.device_properties_file = devprop_path();
  auto s = Session::create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  PlanReport r;
  auto plan = (*s)->get_plan(*g, {}, &r);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(plan->part_count(), 2);
  ASSERT_NE(plan->part_graph(0), nullptr);
  ASSERT_NE(plan->part_graph(1), nullptr);
  EXPECT_EQ(plan->part_graph(0)->canonical, plan->part_graph(1)->canonical)
      << "the test needs two parts of one canonical form";
  EXPECT_NE(plan->part_plan(0), nullptr);
  EXPECT_NE(plan->part_plan(1), nullptr);
}

TEST_F(PartitionedDeviceless, TwoConvsRunAsOnePlanOfTwoPartsThroughTheCacheAndAPlanFile) {
  auto spec = load_graph_file(source_dir() + "/tests/cases/partitioned/two_convs_one_graph.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  PlanCache cache = PlanCache::open((dir_ / "plans.sqlite").string());
  SessionOptions o;
  o.device_properties_file = devprop_path();
  o.cache = &cache;
  auto s = Session::create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  PlanReport r;
  auto plan = (*s)->get_plan(*g, {}, &r);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->part_count(), 2);
  EXPECT_EQ(r.partition,
            "2 parts: [conv_fprop 'conv1', bias_add 'bias1', relu 'act1'] | "
            "[conv_fprop 'conv2', bias_add 'bias2', relu 'act2']");
  ASSERT_EQ(r.partition_cuts.size(), 1u);
  EXPECT_NE(r.partition_cuts[0].find("[relu 'act1'] and [conv_fprop 'conv2'] have no engine together"),
            std::string::npos)
      << r.partition_cuts[0];
  ASSERT_EQ(r.partition_parts.size(), 2u);
  EXPECT_EQ(r.partition_parts[1].first_op, 3);
  // The temporary h (2x32x12x12) sits at the start of the workspace: fp32 where the parts take it, else
  // bf16 (deviceless, the precompiled conv + bias + relu engine writes bf16).
  EXPECT_TRUE(r.partition_temporary_bytes == 2 * 32 * 12 * 12 * 4 ||
              r.partition_temporary_bytes == 2 * 32 * 12 * 12 * 2)
      << r.partition_temporary_bytes;
  EXPECT_GE(plan->workspace_bytes(), r.partition_temporary_bytes);
  EXPECT_EQ(plan->engine_name().rfind("partitioned[", 0), 0u) << plan->engine_name();
  EXPECT_TRUE(r.stored);

  // A warm start: the cache holds the two parts as one entry.
  PlanReport warm;
  auto hit = (*s)->get_plan(*g, {}, &warm);
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(warm.cache, "hit");
  EXPECT_EQ(hit->part_count(), 2);
  EXPECT_EQ(hit->engine_name(), plan->engine_name());

  // And a plan file.
  auto bytes = plan->serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const std::string path = (dir_ / "two.plan").string();
  ASSERT_TRUE(write_plan_file(path, make_plan_info(*g, *plan, target_), *bytes).ok());
  auto pf = read_plan_file(path);
  ASSERT_TRUE(pf.ok()) << pf.status().ToString();
  auto back = deserialize_plan(*g, pf->payload, target_, nullptr, pf->info.engine);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->part_count(), 2);

  // Not when told not to: the whole graph's error.
  PlanRequest whole;
  whole.partition = false;
  whole.use_tuned_cache = false;
  SessionOptions o2;
  o2.device_properties_file = devprop_path();
  auto s2 = Session::create(o2);
  ASSERT_TRUE(s2.ok());
  auto refused = (*s2)->get_plan(*g, whole, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported);
}

TEST_F(PartitionedDeviceless, APartitionOverTheWorkspaceLimitIsRefusedNamingBothNumbers) {
  auto spec = load_graph_file(source_dir() + "/tests/cases/partitioned/two_convs_one_graph.json");
  ASSERT_TRUE(spec.ok());
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok());
  SessionOptions o;
  o.device_properties_file = devprop_path();
  o.workspace_limit_bytes = 1024;  // less than the temporary (18,432 bytes in bf16)
  auto s = Session::create(o);
  ASSERT_TRUE(s.ok());
  auto plan = (*s)->get_plan(*g, {}, nullptr);
  ASSERT_FALSE(plan.ok());
  const std::string& m = plan.status().message();
  EXPECT_NE(m.find("over the limit of 1024"), std::string::npos) << m;
  EXPECT_NE(m.find("for the temporaries between parts"), std::string::npos) << m;
}

}  // namespace
}  // namespace fusebox
