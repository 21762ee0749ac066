// fold_matmul_batch_dims() (src/cudnn/ops/matmul_lowering.cpp): a matmul graph with
// two batch dims is lowered as rank 3 when every tensor's batch dims are all 1 or the
// graph's, contiguous; otherwise it is left alone. The graphs are from fusebox's
// sweep of 2026-12-05 on the H200, where every rank-4 matmul found no engine.
#include "ops/matmul_fold.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace fusebox::cudnn {
namespace {

const ResolvedTensor& t(const ResolvedGraph& g, const std::string& name) {
  return testing::tensor_named(g, name);
}

TEST(MatmulFold, TwoBatchDimsFoldIntoOneWithTheSameMemory) {
  // gen_matmul_1111: a col-major [1, 2, 129, 64] times b [1, 2, 64, 129].
  const ResolvedGraph g = testing::resolved_graph(R"({"name": "m", "tensors": [
      {"name": "a", "dims": [1, 2, 129, 64], "layout": "col_major"}, {"name": "b", "dims": [1, 2, 64, 129]},
      {"name": "bias", "dims": [1, 1, 1, 129]}, {"name": "y", "dims": [1, 2, 129, 129]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "p"}},
            {"op": "bias_add", "name": "ba", "inputs": {"x": "p", "bias": "bias"}, "outputs": {"y": "y"}}]})");
  std::string note;
  auto f = fold_matmul_batch_dims(g, &note);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(t(*f, "a").dims, (std::vector<int64_t>{2, 129, 64}));
  EXPECT_EQ(t(*f, "a").strides, (std::vector<int64_t>{t(g, "a").strides[1], 1, 129}));
  EXPECT_EQ(t(*f, "b").dims, (std::vector<int64_t>{2, 64, 129}));
  EXPECT_EQ(t(*f, "bias").dims, (std::vector<int64_t>{1, 1, 129}));
  EXPECT_EQ(t(*f, "y").dims, (std::vector<int64_t>{2, 129, 129}));
  for (const char* n : {"a", "b", "bias", "y"})
    EXPECT_EQ(t(*f, n).storage_bytes(), t(g, n).storage_bytes()) << n;
  EXPECT_NE(note.find("batch dims [1, 2] folded into one of 2"), std::string::npos) << note;
}

TEST(MatmulFold, LeftAloneWhereFoldingWouldChangeTheMeaning) {
  // gen_matmul_1192: b broadcast along the second batch dim only ([4, 1] against [4, 4]).
  EXPECT_FALSE(fold_matmul_batch_dims(testing::resolved_graph(R"({"name": "m", "tensors": [
      {"name": "a", "dims": [4, 4, 27, 7]}, {"name": "b", "dims": [4, 1, 7, 128]}, {"name": "y", "dims": [4, 4, 27, 128]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})"),
                                      nullptr));
  // Batch dims not contiguous (a batch-major view with a gap).
  EXPECT_FALSE(fold_matmul_batch_dims(testing::resolved_graph(R"({"name": "m", "tensors": [
      {"name": "a", "dims": [2, 3, 8, 8], "strides": [512, 64, 8, 1]}, {"name": "b", "dims": [2, 3, 8, 8]},
      {"name": "y", "dims": [2, 3, 8, 8]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})"),
                                      nullptr));
  // Rank 3 already.
  EXPECT_FALSE(fold_matmul_batch_dims(testing::resolved_graph(R"({"name": "m", "tensors": [
      {"name": "a", "dims": [2, 8, 8]}, {"name": "b", "dims": [2, 8, 8]}, {"name": "y", "dims": [2, 8, 8]}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]})"),
                                      nullptr));
  // A reduction reads dims by index.
  EXPECT_FALSE(fold_matmul_batch_dims(testing::resolved_graph(R"({"name": "m", "tensors": [
      {"name": "a", "dims": [2, 3, 8, 8]}, {"name": "b", "dims": [2, 3, 8, 8]}, {"name": "y", "dims": [1, 1, 8, 8], "dtype": "float"}],
    "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "p"}},
            {"op": "reduce_sum", "name": "r", "inputs": {"x": "p"}, "outputs": {"y": "y"}, "reduce_dims": [0, 1]}]})"),
                                      nullptr));
}

}  // namespace
}  // namespace fusebox::cudnn
