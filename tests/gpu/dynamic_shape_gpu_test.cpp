// Symbolic graphs on the GPU: several concrete shapes of conv, matmul and
// SDPA graphs through one session's kernel cache; every plan runs and matches
// the reference at its own shape; the kernel cache turns cold then warm (or
// the report says why dynamic shapes were refused). Build costs are printed
// for the lead (the 10x target is measured by `fusebox shapes`, not asserted
// here). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>

#include "../deviceless/test_util.h"
#include "common/stopwatch.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {
namespace {

using testing::source_dir;

struct Case {
  std::string file;
  std::vector<ShapeValues> shapes;
};

class DynamicShapeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(DynamicShapeGpu, ShapesShareTheKernelCacheAndVerify) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  const Case& c = GetParam();
  auto spec = load_graph_file(source_dir() + "/examples/graphs/" + c.file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto s = Session::create();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Session& session = **s;
  std::vector<std::string> keys;
  int dynamic = 0;
  bool probed = false;
  double cold_ms = -1;
  std::vector<double> warm_ms;
  size_t replayed = 0;
  for (const ShapeValues& shape : c.shapes) {
    PlanReport rep;
    const common::Stopwatch watch;
    PlanRequest request;
    request.override_shapes = false;  // the kernel cache here; override shapes: OverrideShapeGpu below
    auto got = session.get_plan(*spec, shape, request, &rep);
    const double ms = watch.ms();
    ASSERT_TRUE(got.ok()) << c.file << " at " << shape_text(shape) << ": " << got.status().ToString();
    std::printf("[ note ] %s %s: %.2f ms, engine %s, %s\n", spec->name.c_str(), shape_text(shape).c_str(), ms,
                rep.engine.c_str(), rep.shape_summary().c_str());
    EXPECT_EQ(rep.shape, shape);
    keys.push_back(rep.cache_key);
    if (rep.engine_replayed && rep.plan_check.rejected.empty()) {
      // The first shape's engine replayed with the kernel cache: checked at its first two
      // replayed shapes, then served on that (session.cpp, kShapesCheckedPerPath); the run below still
      // verifies every shape.
      EXPECT_EQ(rep.plan_check.state, replayed < 2 ? "passed" : "other shapes")
          << shape_text(shape) << ": " << rep.plan_check.text();
      ++replayed;
    }
    if (rep.dynamic_shape) {
      EXPECT_EQ(rep.kernel_cache, dynamic == 0 ? "cold" : "warm");
      EXPECT_EQ(rep.kernel_cache_builds_before, dynamic);
      if (dynamic == 0) {
        cold_ms = ms;
      } else {
        warm_ms.push_back(ms);
      }
      ++dynamic;
    } else {
      EXPECT_TRUE(!rep.dynamic_fallback.empty() || !rep.static_policy.empty())
          << "a static build of a symbolic graph must say why";
      // The policy's static builds follow its probe of the static heuristics (first shape) or
      // a dynamic first build of a precompiled engine.
      if (rep.static_probe_ms > 0) probed = true;
      if (!rep.static_policy.empty()) EXPECT_TRUE(probed || dynamic >= 1);
    }
    RunOptions o;
    o.verify = true;
    o.iters = 0;
    o.cpu_reference_max_flops = 0;  // the GPU reference: these shapes are too large for the CPU one
    auto run = run_plan(got->graph, got->plan, *session.context(), o);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_TRUE(run->verified_ok) << shape_text(shape) << ": " << verify_status(*run).ToString();
  }
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(std::unique(keys.begin(), keys.end()), keys.end()) << "one plan-cache key per concrete shape";
  EXPECT_EQ(session.kernel_cache_count(), 1);
  if (!warm_ms.empty()) {
    std::sort(warm_ms.begin(), warm_ms.end());
    std::printf("[ note ] %s: first dynamic build %.2f ms, median warm build %.2f ms over %zu shapes\n",
                spec->name.c_str(), cold_ms, warm_ms[warm_ms.size() / 2], warm_ms.size());
  }
}

std::vector<ShapeValues> values(const std::string& sym, std::vector<int64_t> vs, ShapeValues fixed = {}) {
  std::vector<ShapeValues> out;
  for (int64_t v : vs) {
    ShapeValues s = fixed;
    s[sym] = v;
    out.push_back(s);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(
    Examples, DynamicShapeGpu,
    ::testing::Values(Case{"conv_bias_relu_dyn.json", values("N", {1, 2, 3, 8})},
                      Case{"matmul_bias_gelu_dyn.json", values("M", {64, 128, 192, 320}, {{"B", 2}})},
                      Case{"sdpa_fwd_dyn.json", values("S", {64, 128, 192, 256}, {{"B", 1}})}),
    [](const ::testing::TestParamInfo<Case>& i) { return testing::stem(i.param.file); });

// ---- Execute-time shape override (issue 35, part 3; docs/architecture.md, "Override shapes"): a
// symbolic graph's first plan is built override-enabled and serves later shapes with no build.
// Every shape's plan runs on random inputs and matches the reference at its own shape, eagerly
// and replayed in a CUDA graph; a shape the override path did not serve must say why. On a cuDNN
// older than 9.23 the path is off and the test says so.
class OverrideShapeGpu : public ::testing::TestWithParam<Case> {};

TEST_P(OverrideShapeGpu, LaterShapesNeedNoBuildAndVerify) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  if (!override_shapes_available()) GTEST_SKIP() << "the loaded cuDNN has no override shapes (9.23+)";
  const Case& c = GetParam();
  auto spec = load_graph_file(source_dir() + "/examples/graphs/" + c.file);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto s = Session::create();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Session& session = **s;
  int served = 0;
  int static_built = 0;
  std::string refused;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const ShapeValues& shape = c.shapes[i];
    PlanReport rep;
    const common::Stopwatch watch;
    auto got = session.get_plan(*spec, shape, {}, &rep);
    const double ms = watch.ms();
    ASSERT_TRUE(got.ok()) << c.file << " at " << shape_text(shape) << ": " << got.status().ToString();
    std::printf("[ note ] %s %s: %.3f ms (override %.3f ms, plan check %.3f ms), engine %s, %s%s%s\n",
                spec->name.c_str(), shape_text(shape).c_str(), ms, rep.override_ms, rep.plan_check.ms,
                rep.engine.c_str(), rep.shape_summary().c_str(),
                rep.override_refused.empty() ? "" : "; override refused: ", rep.override_refused.c_str());
    if (i == 0) {
      EXPECT_TRUE(rep.override_shape == "built" || !rep.override_refused.empty())
          << "the first build is override-enabled or says why not";
    }
    if (rep.source == PlanSource::kShapeOverride) {
      ++served;
      EXPECT_TRUE(got->plan.shape_overridden());
      EXPECT_FALSE(got->plan.serialize().ok()) << "a view at another shape is never serialized";
      EXPECT_EQ(rep.override_built_shape, c.shapes[0]);
    }
    if (!rep.override_refused.empty()) refused = rep.override_refused;
    // Refused override shapes give way to the static policy where a static build takes an engine
    // with precompiled kernels, as on a cuDNN without override shapes, from the refused shape on
    // (cuDNN 9.27's full set: conv_bias_relu_dyn's dynamic-shape engine ran at 2.0x the time).
    if (!rep.static_policy.empty()) {
      EXPECT_FALSE(rep.dynamic_shape) << shape_text(shape);
      EXPECT_FALSE(refused.empty()) << shape_text(shape)
                                    << ": the static policy serves only where override is refused";
      ++static_built;
    } else if (static_built > 0 && rep.source != PlanSource::kShapeOverride) {
      ADD_FAILURE() << shape_text(shape)
                    << ": once the static policy serves the graph, it serves every later shape";
    }
    RunOptions o;
    o.verify = true;
    o.iters = 0;
    o.cuda_graph = true;
    o.cpu_reference_max_flops = 0;  // the GPU reference at these sizes
    auto run = run_plan(got->graph, got->plan, *session.context(), o);
    ASSERT_TRUE(run.ok()) << shape_text(shape) << ": " << run.status().ToString();
    EXPECT_TRUE(run->verified_ok) << shape_text(shape) << ": " << verify_status(*run).ToString();
    EXPECT_TRUE(run->cuda_graph.used);
    EXPECT_TRUE(run->cuda_graph.bit_identical || run->cuda_graph.within_tolerance)
        << shape_text(shape) << ": the CUDA graph's outputs differ from eager";
  }
  std::printf("[ note ] %s: %d of %zu shapes served with no build, %d static builds (precompiled)%s%s\n",
              spec->name.c_str(), served, c.shapes.size(), static_built,
              refused.empty() ? "" : "; refused: ", refused.c_str());
  if (served == 0) EXPECT_FALSE(refused.empty()) << "no shape was served by override, and nothing says why";
}

INSTANTIATE_TEST_SUITE_P(
    Examples, OverrideShapeGpu,
    ::testing::Values(Case{"conv_bias_relu_dyn.json", values("N", {2, 1, 3, 8, 5})},
                      Case{"matmul_bias_gelu_dyn.json", values("M", {256, 64, 200, 512, 333}, {{"B", 2}})},
                      Case{"sdpa_fwd_dyn.json", values("S", {128, 64, 192, 256, 80}, {{"B", 1}})}),
    [](const ::testing::TestParamInfo<Case>& i) { return testing::stem(i.param.file); });

}  // namespace
}  // namespace fusebox
