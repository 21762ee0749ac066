// Execute-time shape override on the GPU (issue 35, part 3; docs/architecture.md, "Override
// shapes"): a symbolic graph's first plan is built override-enabled and serves later shapes with
// no build. Every shape's plan runs on random inputs and matches the reference at its own shape,
// eagerly and replayed in a CUDA graph; a shape the override path did not serve must say why.
// On a cuDNN older than 9.23 the path is off and the test says so. Skipped without a GPU.
#include <gtest/gtest.h>

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
  std::printf("[ note ] %s: %d of %zu shapes served with no build%s%s\n", spec->name.c_str(), served,
              c.shapes.size(), refused.empty() ? "" : "; refused: ", refused.c_str());
  if (served == 0) EXPECT_FALSE(refused.empty()) << "no shape was served by override, and nothing says why";
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
    Examples, OverrideShapeGpu,
    ::testing::Values(Case{"conv_bias_relu_dyn.json", values("N", {2, 1, 3, 8, 5})},
                      Case{"matmul_bias_gelu_dyn.json", values("M", {256, 64, 200, 512, 333}, {{"B", 2}})},
                      Case{"sdpa_fwd_dyn.json", values("S", {128, 64, 192, 256, 80}, {{"B", 1}})}),
    [](const ::testing::TestParamInfo<Case>& i) { return testing::stem(i.param.file); });

}  // namespace
}  // namespace fusebox
