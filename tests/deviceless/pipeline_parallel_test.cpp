// Data-parallel pipeline runs (pipeline_parallel.h), the parts that need no
// GPU: how a batch splits, slicing and stacking host tensors along dim 0,
// which buffers of a symbolic pipeline follow the batch, and the errors a
// run gives before any device work. The GPU run is tests/gpu/pipeline_gpu_test.cpp.
#include "fusebox/pipeline_parallel.h"

#include <gtest/gtest.h>

#include <numeric>

#include "test_util.h"

namespace fusebox {
namespace {

using testing::source_dir;

TEST(DataParallel, SplitBatchIsEvenFirstSharesLarger) {
  auto a = split_batch(8, 3);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int64_t>{3, 3, 2}));
  auto b = split_batch(2, 2);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int64_t>{1, 1}));
  auto c = split_batch(7, 1);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (std::vector<int64_t>{7}));
  auto few = split_batch(1, 2);
  ASSERT_FALSE(few.ok());
  EXPECT_NE(few.status().message().find("at least one row"), std::string::npos) << few.status().message();
  EXPECT_FALSE(split_batch(4, 0).ok());
}

// An NHWC bf16 tensor [4, 3, 2, 2] (strides [12, 1, 6, 3]) with distinct bytes.
HostTensor nhwc_tensor() {
  HostTensor t;
  t.dtype = DType::kBF16;
  t.dims = {4, 3, 2, 2};
  t.strides = {12, 1, 6, 3};
  t.data.resize(4 * 12 * 2);
  std::iota(t.data.begin(), t.data.end(), uint8_t{1});
  return t;
}

TEST(DataParallel, SliceThenConcatGivesTheTensorBack) {
  const HostTensor t = nhwc_tensor();
  auto a = slice_batch(t, 0, 3, "x");
  auto b = slice_batch(t, 3, 1, "x");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->dims, (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(b->data.size(), 12u * 2);
  EXPECT_EQ(b->data.front(), t.data[3 * 12 * 2]);  // row 3 starts where it did
  auto back = concat_batch({&*a, &*b}, "x");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dims, t.dims);
  EXPECT_EQ(back->strides, t.strides);
  EXPECT_EQ(back->data, t.data);
}

TEST(DataParallel, SliceAndConcatRefuseWhatTheyCannotSplit) {
  HostTensor t = nhwc_tensor();
  auto out_of_range = slice_batch(t, 3, 2, "buffer 'x'");
  ASSERT_FALSE(out_of_range.ok());
  EXPECT_NE(out_of_range.status().message().find("buffer 'x'"), std::string::npos);
  HostTensor inner = t;  // dim 0 innermost: rows are not blocks
  inner.strides = {1, 4, 12, 24};
  auto bad = slice_batch(inner, 0, 1, "buffer 'x'");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("outermost"), std::string::npos) << bad.status().message();
  HostTensor other = t;
  other.dims[1] = 2;
  other.strides = {8, 1, 4, 2};
  other.data.resize(4 * 8 * 2);
  auto mixed = concat_batch({&t, &other}, "output 'y'");
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("only dim 0 may differ"), std::string::npos)
      << mixed.status().message();
  EXPECT_FALSE(concat_batch({&t, nullptr}, "output 'y'").ok());
}

Pipeline load(const std::string& name, const ShapeValues& shape = {}) {
  auto p = load_pipeline_file(source_dir() + "/examples/pipelines/" + name + ".json", shape);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

TEST(DataParallel, InputsIntermediatesAndOutputsFollowTheBatchWeightsDoNot) {
  const Pipeline full = load("two_convs_dyn", {{"N", 5}});
  const Pipeline a = load("two_convs_dyn", {{"N", 3}});
  const Pipeline b = load("two_convs_dyn", {{"N", 2}});
  auto split = batch_split(full, {&a, &b}, {3, 2});
  ASSERT_TRUE(split.ok()) << split.status().ToString();
  for (size_t i = 0; i < full.buffers.size(); ++i) {
    const PipelineBuffer& buf = full.buffers[i];
    EXPECT_EQ((*split)[i], buf.kind != BufferKind::kConstant) << buf.name;
  }
  auto sym = batch_symbol_of(full, "");
  ASSERT_TRUE(sym.ok());
  EXPECT_EQ(*sym, "N");
  // shares that do not add up to the whole batch follow nothing
  auto wrong = batch_split(full, {&a, &a}, {3, 3});
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("buffer 'image'"), std::string::npos) << wrong.status().message();
}

TEST(DataParallel, ErrorsBeforeAnyDeviceWork) {
  const Pipeline fixed = load("two_convs");
  auto none = batch_symbol_of(fixed, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("declares no symbols"), std::string::npos)
      << none.status().message();
  const Pipeline dyn = load("two_convs_dyn", {{"N", 4}});
  auto unknown = batch_symbol_of(dyn, "B");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("no symbol 'B'"), std::string::npos)
      << unknown.status().message();
  auto data = load_pipeline_data(dyn, 3);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  DataParallelOptions o;
  o.devices = {0, 0, 0, 0, 0};  // five shares of a batch of 4
  auto r = run_pipeline_data_parallel(dyn, *data, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("cannot be split over 5 devices"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace fusebox
