// The embedding op (include/fusebox/ops/embedding.h): resolve()'s rules and
// their messages, random ids inside the table, the id check before a run, and
// the CPU reference against a lookup written out here.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/op_traits.h"
#include "fusebox/reference.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::expect_error;
using testing_util::host_from;
using testing_util::resolve_json;

// ids [N,1,1,1], table [V,H,1,1], add [P,H,1,1]; `ids`, `table`, `add` replace those tensors' fields.
std::string embed_json(const std::string& ids = R"("dims": [6, 1, 1, 1], "dtype": "int32")",
                       const std::string& table = R"("dims": [10, 8, 1, 1], "layout": "nhwc")",
                       const std::string& add = R"("dims": [3, 8, 1, 1], "layout": "nhwc")",
                       bool with_add = true, const std::string& extra_op = "") {
  return R"({"name": "emb", "io_dtype": "bf16", "tensors": [
    {"name": "ids", )" +
         ids + R"(}, {"name": "table", )" + table + R"(}, {"name": "add", )" + add +
         R"(}, {"name": "y", "layout": "nhwc"}],
  "ops": [{"op": "embedding", "name": "embed", "inputs": {"ids": "ids", "table": "table")" +
         (with_add ? R"(, "add": "add")" : "") + R"(}, "outputs": {"y": "y"}})" + extra_op + "]}";
}

TEST(Embedding, ResolvesShapesAndRandomIdRange) {
  auto g = resolve_json(embed_json());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& y = g->tensors[g->find_tensor("y")];
  EXPECT_EQ(y.dims, (std::vector<int64_t>{6, 8, 1, 1}));
  EXPECT_EQ(y.dtype, DType::kBF16);
  EXPECT_FALSE(y.is_virtual);
  const ResolvedTensor& ids = g->tensors[g->find_tensor("ids")];
  EXPECT_EQ(ids.random_lo, 0);
  EXPECT_EQ(ids.random_hi, 9);  // V - 1: random ids are rows of the table
  EXPECT_DOUBLE_EQ(g->flops(), 6.0 * 8);
  auto without = resolve_json(embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")",
                                         R"("dims": [10, 8, 1, 1], "layout": "nhwc")",
                                         R"("dims": [3, 8, 1, 1], "layout": "nhwc")", false));
  ASSERT_FALSE(without.ok());  // 'add' declared but unused: an unused input is an error
}

TEST(Embedding, RefusesWhatTheKernelCannotRead) {
  expect_error(embed_json(R"("dims": [6, 1, 1, 1])"), {"[embedding 'embed'] input 'ids' ('ids')", "int32"});
  expect_error(embed_json(R"("dims": [6, 2, 1, 1], "dtype": "int32")"), {"[N, 1, 1, 1]"});
  expect_error(
      embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")", R"("dims": [10, 8], "layout": "row_major")"),
      {"input 'table' ('table')", "[rows, H, 1, 1]"});
  expect_error(embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")",
                          R"("dims": [10, 8, 1, 1], "strides": [1, 10, 1, 1])"),
               {"input 'table' ('table')", "rows of H contiguous values"});
  expect_error(
      embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")", R"("dims": [10, 8, 1, 1], "dtype": "int32")"),
      {"input 'table'", "bf16, fp16 or fp32"});
  expect_error(embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")", R"("dims": [10, 8, 1, 1])",
                          R"("dims": [4, 8, 1, 1])"),
               {"input 'add' ('add') has 4 rows, which do not divide the 6 ids"});
  expect_error(embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")", R"("dims": [10, 8, 1, 1])",
                          R"("dims": [3, 4, 1, 1])"),
               {"input 'add' ('add') has rows of 4", "rows of 8", "[P, 8, 1, 1]"});
}

TEST(Embedding, CpuReferenceLooksUpAddsAndGivesNanOutsideTheTable) {
  auto g = resolve_json(embed_json());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& ids_t = g->tensors[g->find_tensor("ids")];
  const ResolvedTensor& table_t = g->tensors[g->find_tensor("table")];
  const ResolvedTensor& add_t = g->tensors[g->find_tensor("add")];
  std::vector<double> table(80), add(24);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::ldexp(static_cast<double>(i % 13) - 6, -3);
  for (size_t i = 0; i < add.size(); ++i) add[i] = std::ldexp(static_cast<double>(i % 7) - 3, -4);
  const std::vector<double> ids{7, 0, 9, 3, 3, 5};
  std::map<std::string, HostTensor> in{
      {"ids", host_from(ids_t, ids)}, {"table", host_from(table_t, table)}, {"add", host_from(add_t, add)}};
  EXPECT_TRUE(check_embedding_ids(*g, in).ok());
  auto ref = reference_cpu(*g, in);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const std::vector<float>& y = ref->at("y");
  ASSERT_EQ(y.size(), 48u);
  for (int n = 0; n < 6; ++n) {
    for (int h = 0; h < 8; ++h) {
      const double want =
          table[static_cast<size_t>(ids[n] * 8 + h)] + add[static_cast<size_t>((n % 3) * 8 + h)];
      EXPECT_EQ(y[static_cast<size_t>(n * 8 + h)], static_cast<float>(want)) << n << "," << h;
    }
  }
  // A table whose rows are padded (row stride 12 for 8 values): the lookup reads each row where it
  // lies in the caller's data (the reference reads the table in place, not a float copy of it).
  auto padded = resolve_json(embed_json(R"("dims": [6, 1, 1, 1], "dtype": "int32")",
                                        R"("dims": [10, 8, 1, 1], "strides": [12, 1, 12, 12])"));
  ASSERT_TRUE(padded.ok()) << padded.status().ToString();
  std::map<std::string, HostTensor> in_padded{
      {"ids", host_from(padded->tensors[padded->find_tensor("ids")], ids)},
      {"table", host_from(padded->tensors[padded->find_tensor("table")], table)},
      {"add", host_from(padded->tensors[padded->find_tensor("add")], add)}};
  auto ref_padded = reference_cpu(*padded, in_padded);
  ASSERT_TRUE(ref_padded.ok()) << ref_padded.status().ToString();
  EXPECT_EQ(ref_padded->at("y"), y);
  // An id outside [0, V): the check names it; the reference gives its row NaN.
  in["ids"] = host_from(ids_t, {7, 0, 10, 3, -1, 5});
  Status bad = check_embedding_ids(*g, in);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find(
                "[embedding 'embed'] input 'ids' ('ids'): ids[2] = 10 is outside table 'table' of 10 rows"),
            std::string::npos)
      << bad.message();
  auto nan_ref = reference_cpu(*g, in);
  ASSERT_TRUE(nan_ref.ok());
  EXPECT_TRUE(std::isnan(nan_ref->at("y")[2 * 8]));
  EXPECT_TRUE(std::isnan(nan_ref->at("y")[4 * 8 + 7]));
  EXPECT_FALSE(std::isnan(nan_ref->at("y")[3 * 8]));
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

std::string embed_bwd_json(const std::string& extra = "", const std::string& dtable = R"("dtype": "fp32")") {
  return R"({"name": "emb_bwd", "io_dtype": "bf16", "tensors": [
    {"name": "ids", "dims": [7, 1, 1, 1], "dtype": "int32", "values": [3, 0, 3, 4, 3, 0, 1]},
    {"name": "dy", "dims": [7, 5, 1, 1], "layout": "nhwc"}, {"name": "dt", )" +
         dtable + R"(}],
  "ops": [{"op": "embedding_bwd", "name": "dembed", "inputs": {"ids": "ids", "dy": "dy"},
           "outputs": {"dtable": "dt"}, "rows": 6)" +
         extra + "}]}";
}

TEST(EmbeddingBwd, SumsTheRowsOfEachIdInFp32) {
  auto g = testing_util::resolve_json(embed_bwd_json());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const ResolvedTensor& dt = g->tensors[g->find_tensor("dt")];
  EXPECT_EQ(dt.dims, (std::vector<int64_t>{6, 5, 1, 1}));
  EXPECT_EQ(dt.dtype, DType::kFP32);
  const std::vector<int> ids{3, 0, 3, 4, 3, 0, 1};
  std::vector<double> dy(35);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::ldexp(static_cast<double>((i * 37) % 23) - 11.0, -3);
  std::vector<double> idv(ids.begin(), ids.end());
  auto out = reference_cpu(*g, {{"ids", testing_util::host_from(g->tensors[g->find_tensor("ids")], idv)},
                                {"dy", testing_util::host_from(g->tensors[g->find_tensor("dy")], dy)}});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  std::vector<double> want(30, 0.0);
  for (size_t n = 0; n < ids.size(); ++n)
    for (int h = 0; h < 5; ++h) want[ids[n] * 5 + h] += dy[n * 5 + h];
  const auto& got = out->at("dt");
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << i;  // exact: eighths, few terms
  for (int h = 0; h < 5; ++h) EXPECT_EQ(got[2 * 5 + h], 0.0f) << "row 2: no id names it";
  EXPECT_TRUE(op_not_bit_reproducible(*g, g->ops[0]).find("atomics") != std::string::npos);
  auto det = testing_util::resolve_json(embed_bwd_json(R"(, "deterministic": true)"));
  ASSERT_TRUE(det.ok()) << det.status().ToString();
  EXPECT_EQ(op_not_bit_reproducible(*det, det->ops[0]), "");
}

TEST(EmbeddingBwd, RefusesWithWhatWouldBeAccepted) {
  testing_util::expect_error(embed_bwd_json("", R"("dtype": "bf16")"),
                             {"[embedding_bwd 'dembed'] output 'dtable' ('dt')", "declare dtable fp32"});
  auto no_rows = parse_graph_json(R"({"name": "e", "tensors": [
      {"name": "ids", "dims": [2, 1, 1, 1], "dtype": "int32"}, {"name": "dy", "dims": [2, 4, 1, 1]},
      {"name": "dt", "dtype": "fp32"}],
    "ops": [{"op": "embedding_bwd", "name": "d", "inputs": {"ids": "ids", "dy": "dy"}, "outputs": {"dtable": "dt"}}]})");
  ASSERT_FALSE(no_rows.ok());
  EXPECT_NE(no_rows.status().message().find("embedding_bwd needs \"rows\""), std::string::npos)
      << no_rows.status().message();
  testing_util::expect_error(R"({"name": "e", "tensors": [
      {"name": "ids", "dims": [2, 1, 1, 1], "dtype": "int32", "values": [0, 6]}, {"name": "dy", "dims": [2, 4, 1, 1]},
      {"name": "dt", "dtype": "fp32"}],
    "ops": [{"op": "embedding_bwd", "name": "d", "inputs": {"ids": "ids", "dy": "dy"}, "outputs": {"dtable": "dt"},
             "rows": 6}]})",
                             {"values[1] = 6 is not a row of the table (6 rows)"});
}

}  // namespace
}  // namespace fusebox
