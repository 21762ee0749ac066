// CudaGraph on the GPU: replay gives the eager bits (native recording and
// stream capture alike), rebinding updates the executable graph without a new
// CudaGraph, a buffer too small is refused, a moved workspace arena is
// followed, and a chain of plans feeding each other replays as eager.
// Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "../deviceless/test_util.h"
#include "fusebox/cuda_graph.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {
namespace {

using testing::source_dir;

#define ASSERT_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

struct Buffers {
  std::map<std::string, void*> ptrs;
  std::map<std::string, size_t> bytes;
  ~Buffers() {
    for (auto& [n, p] : ptrs) cudaFree(p);
  }
};

class CudaGraphGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
    auto s = Session::create();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    session_ = std::move(s).value();
  }
  static ResolvedGraph load(const std::string& path) {
    auto spec = load_graph_file(path);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  }
  // Inputs from `seed` uploaded, outputs poisoned with 0xFF.
  void allocate(const ResolvedGraph& g, Buffers& b, uint64_t seed = 7) {
    auto inputs = make_inputs(g, seed);
    ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();
    for (const auto& t : g.tensors) {
      if (t.is_virtual || t.scalar_value) continue;
      const size_t n = static_cast<size_t>(std::max<int64_t>(t.storage_bytes(), 1));
      void* p = nullptr;
      ASSERT_CUDA(cudaMalloc(&p, n));
      b.ptrs[t.name] = p;
      b.bytes[t.name] = n;
      auto it = inputs->find(t.name);
      if (it != inputs->end()) {
        ASSERT_CUDA(cudaMemcpy(p, it->second.data.data(), it->second.data.size(), cudaMemcpyHostToDevice));
      } else {
        ASSERT_CUDA(cudaMemset(p, 0xFF, n));
      }
    }
    ASSERT_CUDA(cudaDeviceSynchronize());
  }
  static std::vector<uint8_t> download(void* p, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  static void poison(const ResolvedGraph& g, Buffers& b) {
    for (const auto& t : g.tensors) {
      if (t.is_output) ASSERT_EQ(cudaMemset(b.ptrs[t.name], 0xFF, b.bytes[t.name]), cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void sync() {
    ASSERT_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(session_->context()->stream())));
  }

  std::unique_ptr<Session> session_;
};

struct Case {
  std::string graph;
  bool native;
};

class CudaGraphGpuExample : public CudaGraphGpu, public ::testing::WithParamInterface<Case> {};

TEST_P(CudaGraphGpuExample, ReplayIsBitIdenticalToEager) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/" + GetParam().graph + ".json");
  auto plan = session_->get_plan(g);
  if (!plan.ok())
    GTEST_SKIP() << "no plan for this graph on this GPU: " << plan.status().message().substr(0, 200);
  Buffers b;
  allocate(g, b);
  auto bound = session_->bind(*plan, b.ptrs);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  ASSERT_TRUE(bound->execute().ok());
  sync();
  std::map<std::string, std::vector<uint8_t>> eager;
  for (const auto& t : g.tensors) {
    if (t.is_output) eager[t.name] = download(b.ptrs[t.name], b.bytes[t.name]);
  }
  CudaGraphOptions o;
  o.allow_native = GetParam().native;
  auto cg = CudaGraph::create({&*bound}, o);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ASSERT_EQ(cg->size(), 1u);
  const CudaGraphStep& step = cg->steps()[0];
  std::printf("[ note ] %s: engine %s, bound path %s, recording %s%s%s\n", g.name.c_str(),
              step.engine.c_str(), bound->direct() ? "direct" : "frontend",
              std::string(graph_recording_name(step.recording)).c_str(),
              step.why_not_native.empty() ? "" : ": ", step.why_not_native.c_str());
  if (!GetParam().native) EXPECT_EQ(step.recording, GraphRecording::kCapture);
  for (int rep = 0; rep < 2; ++rep) {  // the second launch replays the uploaded graph
    poison(g, b);
    ASSERT_TRUE(cg->launch().ok());
    sync();
    for (const auto& [name, bytes] : eager) EXPECT_EQ(download(b.ptrs[name], b.bytes[name]), bytes) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Small, CudaGraphGpuExample,
    ::testing::Values(Case{"conv_bias_relu_small", true}, Case{"conv_bias_relu_small", false},
                      Case{"matmul_bias_gelu_small", true}, Case{"matmul_bias_gelu_small", false},
                      Case{"sdpa_fwd_small", true}, Case{"sdpa_fwd_small", false},
                      Case{"sdpa_alibi_small", true}, Case{"sdpa_alibi_small", false}),
    [](const auto& info) { return info.param.graph + (info.param.native ? "_native" : "_capture"); });

// Rebinding an input and an output updates the executable graph: the next
// launch reads the new input and writes the new output.
class CudaGraphGpuPath : public CudaGraphGpu, public ::testing::WithParamInterface<bool> {};

TEST_P(CudaGraphGpuPath, RebindUpdatesWithoutANewGraph) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = session_->get_plan(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  Buffers first, second;  // two input sets (different seeds)
  allocate(g, first, 7);
  allocate(g, second, 99);
  // Eager results for each input set.
  auto eager_bound = session_->bind(*plan, second.ptrs);
  ASSERT_TRUE(eager_bound.ok());
  ASSERT_TRUE(eager_bound->execute().ok());
  sync();
  const size_t ny = first.bytes["y"];
  const auto expect_second = download(second.ptrs["y"], ny);

  auto bound = session_->bind(*plan, first.ptrs);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  CudaGraphOptions o;
  o.allow_native = GetParam();
  auto cg = CudaGraph::create({&*bound}, o);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  poison(g, first);
  ASSERT_TRUE(cg->launch().ok());
  sync();
  const auto expect_first = download(first.ptrs["y"], ny);
  EXPECT_NE(expect_first, expect_second) << "the two input sets must give different outputs";

  // Every input (x, w, b) and the output y to new buffers; the graph is updated in place.
  std::vector<std::string> inputs;
  for (const auto& t : g.tensors) {
    if (t.is_input && !t.scalar_value) inputs.push_back(t.name);
  }
  void* y2 = nullptr;
  ASSERT_CUDA(cudaMalloc(&y2, ny));
  ASSERT_CUDA(cudaMemset(y2, 0xFF, ny));
  poison(g, first);
  for (const auto& name : inputs) {
    Status st = cg->rebind(0, name, second.ptrs[name], static_cast<int64_t>(second.bytes[name]));
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  ASSERT_TRUE(cg->rebind(0, bound->slot_of("y"), y2, static_cast<int64_t>(ny)).ok());
  EXPECT_EQ(cg->steps()[0].updates, static_cast<int64_t>(inputs.size()) + 1);
  ASSERT_TRUE(cg->launch().ok());
  sync();
  EXPECT_EQ(download(y2, ny), expect_second) << "the new inputs, into the new output";
  EXPECT_EQ(download(first.ptrs["y"], ny), std::vector<uint8_t>(ny, 0xFF)) << "the old output is untouched";

  // Back to the first input set through BoundPlan::rebind and update().
  for (const auto& name : inputs) ASSERT_TRUE(bound->rebind(name, first.ptrs[name]).ok());
  ASSERT_TRUE(cg->update().ok());
  ASSERT_TRUE(cg->launch().ok());
  sync();
  EXPECT_EQ(download(y2, ny), expect_first);
  cudaFree(y2);
}

TEST_P(CudaGraphGpuPath, BufferTooSmallIsRefusedAndNothingChanges) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = session_->get_plan(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  Buffers b;
  allocate(g, b);
  auto bound = session_->bind(*plan, b.ptrs);
  ASSERT_TRUE(bound.ok());
  CudaGraphOptions o;
  o.allow_native = GetParam();
  auto cg = CudaGraph::create({&*bound}, o);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  const int slot = bound->slot_of("y");
  const int64_t need = bound->tensor_bytes(slot);
  ASSERT_EQ(need, g.tensors[g.find_tensor("y")].storage_bytes());
  void* small = nullptr;
  ASSERT_CUDA(cudaMalloc(&small, need));
  Status st = cg->rebind(0, "y", small, need - 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'y' needs " + std::to_string(need) + " bytes, the new buffer has " +
                              std::to_string(need - 2)),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("step 0"), std::string::npos) << st.message();
  EXPECT_EQ(cg->steps()[0].updates, 0);
  // Still bound to the old output.
  ASSERT_CUDA(cudaMemset(small, 0xFF, need));
  poison(g, b);
  ASSERT_TRUE(cg->launch().ok());
  sync();
  EXPECT_EQ(download(small, need), std::vector<uint8_t>(need, 0xFF));
  EXPECT_NE(download(b.ptrs["y"], need), std::vector<uint8_t>(need, 0xFF));
  EXPECT_EQ(cg->rebind(1, "y", small, need).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cg->rebind(0, "nope", small, need).code(), StatusCode::kInvalidArgument);
  cudaFree(small);
}

TEST_P(CudaGraphGpuPath, MovedWorkspaceArenaIsFollowed) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/sdpa_fwd_small.json");
  auto plan = session_->get_plan(g);
  if (!plan.ok()) GTEST_SKIP() << plan.status().message().substr(0, 200);
  Buffers b;
  allocate(g, b);
  auto bound = session_->bind(*plan, b.ptrs);
  ASSERT_TRUE(bound.ok());
  CudaGraphOptions o;
  o.allow_native = GetParam();
  auto cg = CudaGraph::create({&*bound}, o);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ASSERT_TRUE(cg->launch().ok());
  sync();
  std::map<std::string, std::vector<uint8_t>> before;
  for (const auto& t : g.tensors) {
    if (t.is_output) before[t.name] = download(b.ptrs[t.name], b.bytes[t.name]);
  }
  ASSERT_TRUE(session_->reserve_workspace(session_->workspace_bytes() + (64 << 20)).ok());
  poison(g, b);
  ASSERT_TRUE(cg->launch().ok());
  sync();
  for (const auto& [name, bytes] : before) EXPECT_EQ(download(b.ptrs[name], b.bytes[name]), bytes) << name;
  EXPECT_EQ(cg->steps()[0].updates, plan->workspace_bytes() > 0 ? 1 : 0)
      << "only a plan using the workspace follows it";
}

INSTANTIATE_TEST_SUITE_P(Paths, CudaGraphGpuPath, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "native" : "capture"); });

// Three 3x3 convolutions, each one's output the next one's input: one graph
// replays the chain as eager launches compute it.
TEST_F(CudaGraphGpu, ChainOfPlansReplaysAsEager) {
  GraphSpec s;
  s.name = "chain_layer";
  s.tensor("x", {2, 16, 12, 12}, "nhwc");
  s.tensor("w", {16, 16, 3, 3}, "nhwc");
  s.tensor("b", {1, 16, 1, 1}, "nhwc");
  const std::string y =
      s.pointwise("act", PointwiseMode::kRelu,
                  s.pointwise("bias", PointwiseMode::kBiasAdd,
                              s.conv_fprop("conv", "x", "w", {{1, 1}, {1, 1}, {1, 1}}), "b"));
  s.output(y, "nhwc");
  auto g = resolve(s);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto plan = session_->get_plan(*g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const int layers = 3;
  std::vector<Buffers> bufs(layers);
  for (auto& b : bufs) allocate(*g, b);
  // Layer i reads layer i-1's output.
  std::vector<BoundPlan> bound;
  for (int i = 0; i < layers; ++i) {
    auto ptrs = bufs[i].ptrs;
    if (i > 0) ptrs["x"] = bufs[i - 1].ptrs[y];
    auto b = session_->bind(*plan, ptrs);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    bound.push_back(std::move(*b));
  }
  for (auto& b : bound) ASSERT_TRUE(b.execute().ok());
  sync();
  const size_t ny = bufs[0].bytes[y];
  const auto eager = download(bufs[layers - 1].ptrs[y], ny);
  std::vector<BoundPlan*> steps;
  for (auto& b : bound) steps.push_back(&b);
  auto cg = CudaGraph::create(steps);
  ASSERT_TRUE(cg.ok()) << cg.status().ToString();
  ASSERT_EQ(cg->size(), static_cast<size_t>(layers));
  for (auto& b : bufs) poison(*g, b);
  ASSERT_TRUE(cg->launch().ok());
  sync();
  EXPECT_EQ(download(bufs[layers - 1].ptrs[y], ny), eager);
}

TEST_F(CudaGraphGpu, RunPlanWithCudaGraphIsBitIdenticalAndVerifies) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = session_->get_plan(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  RunOptions ro;
  ro.verify = true;
  ro.iters = 5;
  ro.warmup = 2;
  ro.samples = 2;
  ro.cuda_graph = true;
  auto run = run_plan(g, *plan, *session_->context(), ro);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->verified_ok);
  EXPECT_TRUE(run->cuda_graph.used);
  EXPECT_TRUE(run->cuda_graph.bit_identical);
  EXPECT_GT(run->cuda_graph.bytes_compared, 0);
  EXPECT_FALSE(run->cuda_graph.recording.empty());
  EXPECT_EQ(run->latency.iters, 5);
  EXPECT_EQ(run->gpu_time_ms.size(), 2u);
}

}  // namespace
}  // namespace fusebox
