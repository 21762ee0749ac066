// transpose's cuDNN lowering (src/cudnn/ops/transpose_lowering.cpp), deviceless: an op reading
// the transpose's output in the same graph is refused before any engine is asked, naming both
// ops, so the session's partition ends a part at the transpose; the lowering writes y's memory
// in x's dim order, which rules out execute-time shape override for the plan.
#include <gtest/gtest.h>

#include "fusebox/plan.h"
#include "test_util.h"

namespace fusebox {
namespace {

TEST(TransposeLowering, AnOpReadingItsOutputInTheSameGraphIsRefusedByName) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const ResolvedGraph g = testing::resolved_graph(R"({"name": "tr_relu", "io_dtype": "bf16", "tensors": [
      {"name": "x", "dims": [2, 8, 4, 16]}, {"name": "t"}, {"name": "y"}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "t"},
             "permutation": [0, 2, 1, 3]},
            {"op": "relu", "name": "act", "inputs": {"x": "t"}, "outputs": {"y": "y"}}]})");
  BuildReport rep;
  auto plan = build_plan(g, *target, {}, &rep);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
  const std::string& m = plan.status().message();
  EXPECT_NE(m.find("[transpose 'tr']: its output 't' is read by op 'act'"), std::string::npos) << m;
  EXPECT_NE(m.find("a transpose ends its graph"), std::string::npos) << m;
  // Refused while lowering: no engine was asked.
  for (const StepReport& st : rep.steps) {
    if (st.name == "create_execution_plans") EXPECT_FALSE(st.ran);
  }
}

TEST(TransposeLowering, TheOutputIsWrittenInXsDimOrderSoNoShapeOverride) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const ResolvedGraph g = testing::resolved_graph(R"({"name": "tr_dyn", "io_dtype": "bf16",
    "symbols": {"S": {"min": 8, "max": 64}},
    "tensors": [{"name": "x", "dims": [2, "S", 4, 16]}, {"name": "y"}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "y"},
             "permutation": [0, 2, 1, 3]}]})");
  BuildOptions o;
  o.dynamic_shape = true;
  o.override_shapes = true;
  BuildReport rep;
  auto plan = build_plan(g, *target, o, &rep);
  // Deviceless the pointwise engines (runtime-compiled) are left out; on a GPU the plan builds,
  // and serves its own shape only (the lowering's note says why).
  if (plan.ok()) {
    EXPECT_FALSE(plan->serves_other_shapes());
    bool noted = false;
    for (const auto& n : rep.lowering_notes) noted |= n.find("serves this shape only") != std::string::npos;
    EXPECT_TRUE(noted);
  } else {
    EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
  }
}

}  // namespace
}  // namespace fusebox
