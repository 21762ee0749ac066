// fusebox's reference kernels as an engine (kernels::make_reference_kernel, engine
// "fusebox_reference": the last resort of issue 29 for an op no cuDNN engine builds). Every small
// example graph, pinned to it, runs through a Plan and verifies against the independent CPU
// reference on random inputs: the outputs land in their graph dtypes (bf16, fp16, fp32, FP8) and
// strides (NHWC, transposed, padded). A graph with a cuDNN-drawn dropout mask is refused.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include "../deviceless/test_util.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"

namespace fusebox {
namespace {

std::vector<std::string> small_examples() {
  std::vector<std::string> out;
  for (const std::string& p : testing::example_graphs())
    if (p.find("/small/") != std::string::npos) out.push_back(p);
  return out;
}

class ReferenceKernelGpu : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceKernelGpu, PinnedRunsEverySmallExampleAndVerifiesAgainstTheCpuReference) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  auto spec = load_graph_file(GetParam());
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  if (!g.ok()) GTEST_SKIP() << "needs shape values: " << g.status().message();  // a symbolic example
  auto ctx = GpuContext::create(0);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  BuildOptions o;
  o.engine = kReferenceEngine;
  BuildReport rep;
  auto plan = build_plan(*g, DeviceTarget{}, o, &rep, ctx->get());
  const std::string name = testing::stem(GetParam());
  if (name.find("dropout") != std::string::npos) {
    ASSERT_FALSE(plan.ok()) << name << ": a cuDNN-drawn dropout mask cannot come from the reference";
    EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
    return;
  }
  ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().ToString();
  EXPECT_TRUE(plan->native());
  EXPECT_EQ(plan->engine_name(), kReferenceEngine);
  RunOptions ro;
  ro.seed = 5;
  ro.verify = true;
  ro.iters = 0;
  ro.cpu_reference_max_flops = 1e12;  // the independent fp64 reference, not the kernels themselves
  auto r = run_plan(*g, *plan, **ctx, ro);
  ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
  EXPECT_EQ(r->reference_kind, "cpu");
  ASSERT_FALSE(r->comparisons.empty());
  for (const auto& c : r->comparisons) EXPECT_TRUE(c.pass) << name << " " << c.ToString();
}

INSTANTIATE_TEST_SUITE_P(Examples, ReferenceKernelGpu, ::testing::ValuesIn(small_examples()),
                         [](const auto& info) { return testing::stem(info.param); });

}  // namespace
}  // namespace fusebox
