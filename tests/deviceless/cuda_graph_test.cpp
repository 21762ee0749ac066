// CudaGraph and BoundPlan argument checks that need no GPU: every refusal is
// a Status naming what was wrong, never a crash (tests/gpu covers the rest).
#include "fusebox/cuda_graph.h"

#include <gtest/gtest.h>

#include "fusebox/graph.h"
#include "fusebox/runtime.h"
#include "test_util.h"

namespace fusebox {
namespace {

TEST(CudaGraphArgs, RecordingNames) {
  EXPECT_EQ(graph_recording_name(GraphRecording::kNative), "native");
  EXPECT_EQ(graph_recording_name(GraphRecording::kNativeFrontend), "native (frontend)");
  EXPECT_EQ(graph_recording_name(GraphRecording::kCapture), "capture");
}

TEST(CudaGraphArgs, CreateRefusesNoPlansNullAndUnboundPlans) {
  auto none = CudaGraph::create({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no plans"), std::string::npos) << none.status().message();

  auto null = CudaGraph::create({nullptr});
  ASSERT_FALSE(null.ok());
  EXPECT_EQ(null.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(null.status().message().find("step 0"), std::string::npos) << null.status().message();

  BoundPlan unbound;
  auto u = CudaGraph::create({&unbound});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(u.status().message().find("not a bound plan"), std::string::npos) << u.status().message();
}

TEST(CudaGraphArgs, EmptyGraphRefusesEverythingWithAStatus) {
  CudaGraph g;
  EXPECT_EQ(g.size(), 0u);
  EXPECT_TRUE(g.steps().empty());
  EXPECT_EQ(g.plan(0), nullptr);
  EXPECT_EQ(g.stream(), nullptr);
  EXPECT_EQ(g.launch().code(), StatusCode::kInternal);
  EXPECT_EQ(g.update().code(), StatusCode::kInternal);
  int x = 0;
  EXPECT_EQ(g.rebind(0, 0, &x, 4).code(), StatusCode::kInternal);
  EXPECT_EQ(g.rebind(0, "x", &x, 4).code(), StatusCode::kInternal);
}

TEST(BoundPlanArgs, UnboundPlanHasNoSizesAndRefusesRebinds) {
  BoundPlan b;
  EXPECT_EQ(b.tensor_bytes(0), -1);
  EXPECT_EQ(b.tensor_bytes(-1), -1);
  int x = 0;
  EXPECT_EQ(b.check_buffer(0, 4).code(), StatusCode::kInternal);
  EXPECT_EQ(b.rebind(0, &x, 4).code(), StatusCode::kInternal);
  EXPECT_FALSE(b.rebind("x", &x, 4).ok());
  EXPECT_FALSE(b.direct());
  EXPECT_EQ(b.execute().code(), StatusCode::kInternal);
}

// Which examples `run --cuda-graph` compares byte for byte with eager, and
// which within tolerance: the H200 showed reduce_sum_bias_grad,
// matmul_gelu_rowsum_small and sdpa_bwd_causal differing in the last bits
// between two runs of one plan (2026-12-01), and the paged decode (eng8, one
// query per sequence) one byte in 524288 between eager and CUDA graph runs.
TEST(CudaGraphArgs, NotBitReproducibleNamesTheOpAndWhy) {
  const std::map<std::string, std::string> expect = {
      {"examples/graphs/reduce_sum_bias_grad.json", "a reduction"},
      {"examples/graphs/small/matmul_gelu_rowsum_small.json", "a reduction"},
      {"examples/graphs/sdpa_bwd_causal.json", "accumulates dq with atomics"},
      {"examples/graphs/sdpa_paged_decode.json", "one query per sequence"},
      {"examples/graphs/small/sdpa_paged_decode_small.json", "one query per sequence"},
      {"examples/graphs/conv_bias_relu.json", ""},
      {"examples/graphs/sdpa_fwd_causal.json", ""},
      {"examples/graphs/small/sdpa_bwd_small.json", ""},  // "deterministic": true
  };
  for (const auto& [file, why] : expect) {
    auto spec = load_graph_file(testing::source_dir() + "/" + file);
    ASSERT_TRUE(spec.ok()) << file << ": " << spec.status().message();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << file << ": " << g.status().message();
    const std::string got = not_bit_reproducible(*g);
    if (why.empty()) {
      EXPECT_EQ(got, "") << file;
    } else {
      EXPECT_NE(got.find(why), std::string::npos) << file << ": " << got;
      EXPECT_NE(got.find("op '"), std::string::npos) << file << ": " << got;
    }
  }
}

}  // namespace
}  // namespace fusebox
