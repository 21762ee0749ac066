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
  for (const ShapeValues& shape : c.shapes) {
    PlanReport rep;
    const common::Stopwatch watch;
    PlanRequest request;
    request.override_shapes = false;  // the kernel cache here; override shapes: override_shape_gpu_test.cpp
    auto got = session.get_plan(*spec, shape, request, &rep);
    const double ms = watch.ms();
    ASSERT_TRUE(got.ok()) << c.file << " at " << shape_text(shape) << ": " << got.status().ToString();
    std::printf("[ note ] %s %s: %.2f ms, engine %s, %s\n", spec->name.c_str(), shape_text(shape).c_str(), ms,
                rep.engine.c_str(), rep.shape_summary().c_str());
    EXPECT_EQ(rep.shape, shape);
    keys.push_back(rep.cache_key);
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

}  // namespace
}  // namespace fusebox
