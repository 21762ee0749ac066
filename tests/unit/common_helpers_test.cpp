// fusebox_common: the helpers several layers share (op_where, dims_string,
// strided walks, cuda_status, Stopwatch). Their text is part of every
// layer's messages, so it is pinned here byte for byte.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/cuda_status.h"
#include "common/dims_string.h"
#include "common/json_text.h"
#include "common/op_where.h"
#include "common/stopwatch.h"
#include "common/strided.h"

namespace fusebox {
namespace {

TEST(CommonHelpersTest, OpWhereAndDimsString) {
  EXPECT_EQ(common::op_where("conv_fprop", "conv1"), "[conv_fprop 'conv1']");
  EXPECT_EQ(common::op_where("sdpa_fwd", ""), "[sdpa_fwd '']");
  EXPECT_EQ(common::dims_string({16, 64, 56, 56}), "[16, 64, 56, 56]");
  EXPECT_EQ(common::dims_string({}), "[]");
}

TEST(CommonHelpersTest, StridedWalkFollowsStrides) {
  // A [2, 3] view of a [2, 4] row-major buffer (row stride 4).
  const std::vector<int64_t> dims = {2, 3}, strides = {4, 1};
  EXPECT_EQ(common::product(dims), 6);
  EXPECT_EQ(common::storage_span(dims, strides), 7);
  EXPECT_EQ(common::storage_span({2, 0}, strides), 0);
  EXPECT_EQ(common::dense_row_major({2, 3, 4}), (std::vector<int64_t>{12, 4, 1}));
  std::vector<std::pair<int64_t, int64_t>> seen;
  common::for_each_element(dims, strides, [&](int64_t i, int64_t off) { seen.push_back({i, off}); });
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {1, 1}, {2, 2}, {3, 4}, {4, 5}, {5, 6}};
  EXPECT_EQ(seen, want);
  seen.clear();
  common::for_each_element_in(dims, strides, 2, 4, [&](int64_t i, int64_t off) { seen.push_back({i, off}); });
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int64_t>>{{2, 2}, {3, 4}}));
}

TEST(CommonHelpersTest, CudaStatusWording) {
  EXPECT_TRUE(common::cuda_status(cudaSuccess, "upload").ok());
  EXPECT_TRUE(common::cuda_status(cudaSuccess, "[op 'x'] ", "cudaMalloc").ok());
  // The cuDNN and runtime layers: "<where>: name: text".
  const Status a = common::cuda_status(cudaErrorInvalidValue, "upload 'x'");
  EXPECT_EQ(a.code(), StatusCode::kCudaError);
  EXPECT_EQ(a.message(),
            std::string("upload 'x': cudaErrorInvalidValue: ") + cudaGetErrorString(cudaErrorInvalidValue));
  // The references: "<where><what> failed: name: text".
  const Status b = common::cuda_status(cudaErrorMemoryAllocation, "[sdpa_fwd 'attn'] ", "cudaMallocAsync(p)");
  EXPECT_EQ(b.code(), StatusCode::kCudaError);
  EXPECT_EQ(b.message(),
            std::string("[sdpa_fwd 'attn'] cudaMallocAsync(p) failed: cudaErrorMemoryAllocation: ") +
                cudaGetErrorString(cudaErrorMemoryAllocation));
}

TEST(CommonHelpersTest, StopwatchCountsUpAndRestarts) {
  common::Stopwatch w;
  const double first = w.ms();
  EXPECT_GE(first, 0.0);
  EXPECT_GE(w.ms(), first);
  w.restart();
  EXPECT_GE(w.ms(), 0.0);
}

}  // namespace
}  // namespace fusebox

TEST(JsonText, DepthAndValuesOutsideStrings) {
  using fusebox::common::JsonTextLimit;
  using fusebox::common::scan_json_text;
  EXPECT_EQ(scan_json_text(R"({"a": [1, 2, {"b": 3}]})", 3, 100).kind, JsonTextLimit::Kind::kNone);
  // Brackets, commas and escaped quotes inside strings do not count.
  EXPECT_EQ(scan_json_text(R"(["[[[{,,,", "\"[[["])", 1, 3).kind, JsonTextLimit::Kind::kNone);
  const JsonTextLimit deep = scan_json_text("[[[1]]]", 2, 100);
  EXPECT_EQ(deep.kind, JsonTextLimit::Kind::kDepth);
  EXPECT_EQ(deep.byte, 2u);
  // 1 + '[' + ',' at byte 2 = 3 values; the ',' at byte 4 makes 4 > 3.
  const JsonTextLimit many = scan_json_text("[1,2,3,4]", 8, 3);
  EXPECT_EQ(many.kind, JsonTextLimit::Kind::kValues);
  EXPECT_EQ(many.byte, 4u);
  EXPECT_EQ(scan_json_text("[1,2]]]]", 1, 100).kind,
            JsonTextLimit::Kind::kNone);  // unbalanced: the parser's job
}
