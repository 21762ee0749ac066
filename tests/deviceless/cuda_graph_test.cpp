// CudaGraph and BoundPlan argument checks that need no GPU: every refusal is
// a Status naming what was wrong, never a crash (tests/gpu covers the rest).
#include "fusebox/cuda_graph.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace fusebox
