// The cuDNN lowering refuses a graph whose ops form independent groups (joined only by shared
// inputs), naming the groups, before any engine is asked: on the H100 and H200 every engine that
// accepted such a graph (a training step's da, dw and residual copy) gave wrong values. The
// session's partition then runs each group as a part.
#include <gtest/gtest.h>

#include "fusebox/plan.h"
#include "test_util.h"

namespace fusebox {
namespace {

TEST(IndependentGroups, TheLoweringRefusesThemNamingEachGroup) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  auto spec = load_graph_file(testing::source_dir() +
                              "/tests/cases/wrong-values/matmul_da_dw_residual_independent.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  BuildReport rep;
  auto plan = build_plan(*g, *target, {}, &rep);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
  const std::string& m = plan.status().message();
  EXPECT_NE(m.find("its ops form 3 independent groups ("), std::string::npos) << m;
  for (const char* group : {"[gemm.da]", "[gemm.db]", "[residual.grad.copy]"})
    EXPECT_NE(m.find(group), std::string::npos) << group << " in " << m;
  for (const StepReport& st : rep.steps) {
    if (st.name == "create_execution_plans") EXPECT_FALSE(st.ran);
  }
}

}  // namespace
}  // namespace fusebox
