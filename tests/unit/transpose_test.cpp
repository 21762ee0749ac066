// transpose (include/fusebox/ops/transpose.h): resolve() shapes, layouts and errors, the JSON
// round trip and canonical form, the CPU reference against hand-computed values (x read through
// its own strides), and the gradient rule against finite differences.
#include <gtest/gtest.h>

#include "fusebox/autodiff.h"
#include "fusebox/gradient_check.h"
#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::host_from;
using testing_util::resolve_json;

const ResolvedTensor& T(const ResolvedGraph& g, const std::string& name) {
  return g.tensors[g.find_tensor(name)];
}

std::string graph_json(const std::string& perm, const std::string& x_extra = "",
                       const std::string& y_extra = "") {
  return R"({"name": "t", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [2, 3, 4])" +
         x_extra + R"(}, {"name": "y")" + y_extra + R"(}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "y"},
             "permutation": )" +
         perm + "}]}";
}

TEST(Transpose, DimsFollowThePermutationAndYIsDense) {
  auto r = resolve_json(graph_json("[2, 0, 1]"));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(T(*r, "y").dims, (std::vector<int64_t>{4, 2, 3}));
  EXPECT_EQ(T(*r, "y").strides, (std::vector<int64_t>{6, 3, 1}));
  EXPECT_EQ(T(*r, "y").dtype, DType::kFP32);
  EXPECT_DOUBLE_EQ(r->flops(), 0.0);
  // A declared layout for y is kept (the write goes there).
  auto cm = resolve_json(graph_json("[0, 2, 1]", "", R"(, "layout": "col_major")"));
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  EXPECT_EQ(T(*cm, "y").strides, (std::vector<int64_t>{12, 1, 4}));
}

TEST(Transpose, ErrorsNameThePermutationAndTheRule) {
  for (const char* bad : {"[0, 1]", "[0, 1, 1]", "[0, 1, 3]", "[]"}) {
    SCOPED_TRACE(bad);
    auto r = resolve_json(graph_json(bad));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("[transpose 'tr'] permutation"), std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("as torch.permute"), std::string::npos) << r.status().message();
  }
  auto dtype = resolve_json(graph_json("[1, 0, 2]", "", R"(, "dtype": "bf16")"));
  ASSERT_FALSE(dtype.ok());
  EXPECT_NE(dtype.status().message().find("keeps their dtype"), std::string::npos)
      << dtype.status().message();
  auto dims = resolve_json(graph_json("[1, 0, 2]", "", R"(, "dims": [2, 3, 4])"));
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("but the op produces [3, 2, 4]"), std::string::npos)
      << dims.status().message();
}

TEST(Transpose, JsonRoundTripAndCanonicalForm) {
  auto spec = parse_graph_json(graph_json("[1, 2, 0]"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto back = parse_graph_json(graph_to_json(*spec));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  auto a = resolve(*spec);
  auto b = resolve(*back);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->canonical, b->canonical);
  auto other = resolve_json(graph_json("[2, 0, 1]"));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(a->canonical, other->canonical);  // the permutation is part of the form
  EXPECT_EQ(op_resolved_attrs_json(*a, a->ops[0]), R"({"permutation":[1,2,0]})");
}

TEST(Transpose, CpuReferenceByHandReadsXThroughItsStrides) {
  // x [2, 3] = [[0, 1, 2], [3, 4, 5]] stored column-major; y = x^T [3, 2].
  auto r = resolve_json(R"({"name": "t", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [2, 3], "layout": "col_major"}, {"name": "y"}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "y"},
             "permutation": [1, 0]}]})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::map<std::string, HostTensor> in;
  in["x"] = host_from(T(*r, "x"), {0, 1, 2, 3, 4, 5});
  auto out = reference_cpu(*r, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->at("y"), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Rank 4, the attention layout change [B,S,H,D] -> [B,H,S,D].
  auto r4 = resolve_json(R"({"name": "t4", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [1, 2, 3, 2]}, {"name": "y"}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "y"},
             "permutation": [0, 2, 1, 3]}]})");
  ASSERT_TRUE(r4.ok()) << r4.status().ToString();
  std::vector<float> xs(12);
  for (int i = 0; i < 12; ++i) xs[i] = static_cast<float>(i);
  std::map<std::string, HostTensor> in4;
  in4["x"] = host_from(T(*r4, "x"), {xs.begin(), xs.end()});
  auto out4 = reference_cpu(*r4, in4);
  ASSERT_TRUE(out4.ok()) << out4.status().ToString();
  // y[0, h, s, d] = x[0, s, h, d] = s*6 + h*2 + d
  EXPECT_EQ(out4->at("y"), (std::vector<float>{0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11}));
}

TEST(Transpose, GradientIsTheInversePermutation) {
  auto fwd = resolve_json(R"({"name": "tg", "io_dtype": "float", "tensors": [
      {"name": "x", "dims": [2, 3, 4]}, {"name": "w", "dims": [4, 2, 3]}, {"name": "t"}, {"name": "y"}],
    "ops": [{"op": "transpose", "name": "tr", "inputs": {"x": "x"}, "outputs": {"y": "t"},
             "permutation": [2, 0, 1]},
            {"op": "mul", "name": "m", "inputs": {"a": "t", "b": "w"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(fwd.ok()) << fwd.status().ToString();
  auto bwd = derive_backward(*fwd);
  ASSERT_TRUE(bwd.ok()) << bwd.status().ToString();
  auto check = check_gradients(*fwd, *bwd, 7, 2e-3);
  ASSERT_TRUE(check.ok()) << check.status().ToString();
  for (const GradientCheckRow& row : check->rows) EXPECT_TRUE(row.pass) << row.ToString();
  EXPECT_TRUE(check->pass());
}

}  // namespace
}  // namespace fusebox
