// fold_pointwise_broadcast_dims() (src/cudnn/ops/pointwise_lowering.cpp): a graph of pointwise ops
// whose input broadcasts over two dims, which cuDNN 9.19's pointwise engine gets wrong (H100,
// 2026-12-05: x [2,8,27] + b [1,1,27] 49% off), is lowered with adjacent dims merged where that
// leaves one broadcast dim (x [1,16,27] + b [1,1,27] was right); otherwise it is left alone and the
// rule pointwise-broadcast-over-two-dims bars the engine.
#include "ops/pointwise_fold.h"

#include <gtest/gtest.h>

#include "fusebox/plan.h"
#include "test_util.h"

namespace fusebox::cudnn {
namespace {

ResolvedGraph add_graph(const std::string& x, const std::string& b) {
  return testing::resolved_graph(R"({"name": "add", "io_dtype": "bf16", "tensors": [)" + x + ", " + b +
                                 R"(, {"name": "y"}],
    "ops": [{"op": "add", "name": "add", "inputs": {"a": "x", "b": "b"}, "outputs": {"y": "y"}}]})");
}

const ResolvedTensor& t(const ResolvedGraph& g, const std::string& name) {
  return testing::tensor_named(g, name);
}

TEST(PointwiseFold, ABiasOverTwoLeadingDimsFoldsIntoOne) {
  const ResolvedGraph g =
      add_graph(R"({"name": "x", "dims": [2, 8, 27]})", R"({"name": "b", "dims": [1, 1, 27]})");
  EXPECT_TRUE(pointwise_broadcast_eng1_gets_wrong(g));
  std::string note;
  auto f = fold_pointwise_broadcast_dims(g, &note);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(t(*f, "x").dims, (std::vector<int64_t>{1, 16, 27}));
  EXPECT_EQ(t(*f, "x").strides, (std::vector<int64_t>{432, 27, 1}));
  EXPECT_EQ(t(*f, "b").dims, (std::vector<int64_t>{1, 1, 27}));
  EXPECT_EQ(t(*f, "y").dims, (std::vector<int64_t>{1, 16, 27}));
  for (const char* n : {"x", "b", "y"}) EXPECT_EQ(t(*f, n).storage_bytes(), t(g, n).storage_bytes()) << n;
  EXPECT_FALSE(pointwise_broadcast_eng1_gets_wrong(*f));
  EXPECT_NE(note.find("dims [2, 8, 27] folded to [1, 16, 27]"), std::string::npos) << note;
}

TEST(PointwiseFold, RankTwoIsPaddedToRankThree) {
  const ResolvedGraph g =
      add_graph(R"({"name": "x", "dims": [16, 27]})", R"({"name": "b", "dims": [1, 27]})");
  EXPECT_TRUE(pointwise_broadcast_eng1_gets_wrong(g));
  auto f = fold_pointwise_broadcast_dims(g, nullptr);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(t(*f, "x").dims, (std::vector<int64_t>{1, 16, 27}));
  EXPECT_EQ(t(*f, "b").dims, (std::vector<int64_t>{1, 1, 27}));
}

// Left alone: what eng1 gets wrong but no merge fixes, and what eng1 runs right as it is.
TEST(PointwiseFold, GraphsNoFoldFixesOrNeedsAreLeftAlone) {
  struct Case {
    const char* x;
    const char* b;
    bool eng1_wrong;
  };
  for (const Case& c : {
           // b [1, 8, 1] broadcasts over dims 0 and 2: no merge leaves one.
           Case{R"({"name": "x", "dims": [2, 8, 27]})", R"({"name": "b", "dims": [1, 8, 1]})", true},
           // x's dims 0 and 1 are not contiguous: they cannot be read as one.
           Case{R"({"name": "x", "dims": [2, 8, 27], "strides": [27, 54, 1]})",
                R"({"name": "b", "dims": [1, 1, 27]})", true},
           // One broadcast dim at rank 3: right on the H100 as it is.
           Case{R"({"name": "x", "dims": [2, 8, 27]})", R"({"name": "b", "dims": [1, 8, 27]})", false},
           // A per-channel input over NHWC at rank 4: eng1 ran it right in every lowered
           // batchnorm_inference of the sweeps.
           Case{R"({"name": "x", "dims": [2, 8, 5, 5], "layout": "nhwc"})",
                R"({"name": "b", "dims": [1, 8, 1, 1], "layout": "nhwc"})", false},
       }) {
    const ResolvedGraph g = add_graph(c.x, c.b);
    EXPECT_EQ(pointwise_broadcast_eng1_gets_wrong(g), c.eng1_wrong) << c.x << " + " << c.b;
    EXPECT_FALSE(fold_pointwise_broadcast_dims(g, nullptr).has_value()) << c.x << " + " << c.b;
  }
}

TEST(PointwiseFold, TheLoweringSaysWhatItFoldedAndServesThisShapeOnly) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  const ResolvedGraph g =
      add_graph(R"({"name": "x", "dims": [2, 8, 27]})", R"({"name": "b", "dims": [1, 1, 27]})");
  BuildReport rep;
  auto plan = build_plan(g, *target, {}, &rep);
  // Deviceless, the pointwise engines (runtime-compiled) are left out; the lowering ran.
  if (!plan.ok()) EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
  bool noted = false;
  for (const auto& n : rep.lowering_notes) noted |= n.find("folded to [1, 16, 27]") != std::string::npos;
  EXPECT_TRUE(noted) << ::testing::PrintToString(rep.lowering_notes);
  for (const auto& e : rep.excluded)
    EXPECT_EQ(e.find("pointwise-broadcast-over-two-dims"), std::string::npos) << e;
}

}  // namespace
}  // namespace fusebox::cudnn
