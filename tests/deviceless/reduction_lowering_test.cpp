// The reductions' cuDNN lowering (src/cudnn/ops/reduction_lowering.cpp), deviceless: a reduction
// whose reduced dims all have size 1 reduces nothing and is lowered as the pointwise op it is
// (the H200's cuDNN 9.19 reduction engines gave wrong values for it: tests/cases/wrong-values/
// matmul_bias_reduce_amax_size1_dim.json); any other reduction stays cuDNN's reduction.
#include <gtest/gtest.h>

#include "fusebox/plan.h"
#include "test_util.h"

namespace fusebox {
namespace {

ResolvedGraph load(const std::string& path) {
  auto spec = load_graph_file(testing::source_dir() + "/" + path);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

// The lowering notes of a deviceless build (the build itself may stop at the engines: cuDNN's
// pointwise engines are runtime-compiled, which a deviceless build leaves out).
std::vector<std::string> notes_of(const ResolvedGraph& g) {
  auto target = DeviceTarget::from_file(testing::devprop_path());
  EXPECT_TRUE(target.ok()) << target.status().ToString();
  BuildReport rep;
  auto plan = build_plan(g, *target, {}, &rep);
  if (!plan.ok()) EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
  return rep.lowering_notes;
}

bool has_note(const std::vector<std::string>& notes, const std::string& text) {
  for (const std::string& n : notes)
    if (n.find(text) != std::string::npos) return true;
  return false;
}

TEST(ReductionLowering, AnAmaxOverSize1DimsIsLoweredAsAbs) {
  ResolvedGraph g = load("tests/cases/wrong-values/matmul_bias_reduce_amax_size1_dim.json");
  const auto notes = notes_of(g);
  EXPECT_TRUE(
      has_note(notes, "[reduce_amax 'reduce']: every reduced dim has size 1: lowered as the pointwise abs"))
      << ::testing::PrintToString(notes);
}

TEST(ReductionLowering, ASumOverSize1DimsIsLoweredAsIdentity) {
  ResolvedGraph g = load("tests/cases/wrong-values/matmul_bias_reduce_amax_size1_dim.json");
  for (ResolvedOp& op : g.ops) {
    if (auto* r = std::get_if<ReductionAttrs>(&op.attrs)) r->mode = ReductionMode::kSum;
  }
  EXPECT_TRUE(has_note(notes_of(g), "lowered as the pointwise identity"));
}

TEST(ReductionLowering, AReductionOverALongerDimStaysAReduction) {
  ResolvedGraph g = load("tests/cases/wrong-values/matmul_bias_reduce_amax_size1_dim.json");
  for (ResolvedOp& op : g.ops) {
    if (auto* r = std::get_if<ReductionAttrs>(&op.attrs)) r->reduce_dims = {1, 2};
  }
  for (ResolvedTensor& t : g.tensors) {
    if (t.name == "r") {
      t.dims = {2, 1, 1};
      t.strides = {1, 1, 1};
    }
  }
  EXPECT_FALSE(has_note(notes_of(g), "every reduced dim has size 1"));
}

}  // namespace
}  // namespace fusebox
