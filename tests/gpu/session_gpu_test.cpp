// Session on the GPU: a bound plan gives the same bits as the unbound
// execute, rebinding moves an output, the workspace arena grows to the
// largest bound plan, and the default policy finds an engine for the issue's
// dilated fp16 convolution. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "../deviceless/test_util.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {
namespace {

using testing::source_dir;

#define ASSERT_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

struct DeviceBuffers {
  std::map<std::string, void*> ptrs;
  std::map<std::string, size_t> bytes;
  ~DeviceBuffers() {
    for (auto& [n, p] : ptrs) cudaFree(p);
  }
};

class SessionGpu : public ::testing::Test {
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
  // Inputs uploaded, outputs poisoned with 0xFF.
  void allocate(const ResolvedGraph& g, DeviceBuffers& b) {
    auto inputs = make_inputs(g, 7);
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
    // The session's stream is non-blocking: nothing orders it after the legacy stream's memsets.
    ASSERT_CUDA(cudaDeviceSynchronize());
  }
  static std::vector<uint8_t> download(void* p, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_EQ(cudaMemcpy(out.data(), p, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void sync() {
    ASSERT_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(session_->context()->stream())));
  }

  std::unique_ptr<Session> session_;
};

class SessionGpuExample : public SessionGpu, public ::testing::WithParamInterface<std::string> {};

TEST_P(SessionGpuExample, BoundExecuteMatchesUnboundBitForBit) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/" + GetParam() + ".json");
  PlanReport rep;
  auto plan = session_->get_plan(g, {}, &rep);
  if (!plan.ok())
    GTEST_SKIP() << "no plan for this graph on this GPU: " << plan.status().message().substr(0, 200);
  DeviceBuffers unbound_bufs, bound_bufs;
  allocate(g, unbound_bufs);
  allocate(g, bound_bufs);
  void* ws = nullptr;
  if (plan->workspace_bytes() > 0) ASSERT_CUDA(cudaMalloc(&ws, plan->workspace_bytes()));
  ASSERT_TRUE(plan->execute(*session_->context(), unbound_bufs.ptrs, ws).ok());
  auto bound = session_->bind(*plan, bound_bufs.ptrs);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  EXPECT_GE(session_->workspace_bytes(), plan->workspace_bytes());
  std::printf("[ note ] %s: engine %s, bound path %s\n", g.name.c_str(), bound->engine_name().c_str(),
              bound->direct() ? "direct" : "frontend");
  ASSERT_TRUE(bound->execute().ok());
  sync();
  for (const auto& t : g.tensors) {
    if (!t.is_output) continue;
    EXPECT_EQ(download(unbound_bufs.ptrs[t.name], unbound_bufs.bytes[t.name]),
              download(bound_bufs.ptrs[t.name], bound_bufs.bytes[t.name]))
        << t.name;
  }
  if (ws) cudaFree(ws);
}

INSTANTIATE_TEST_SUITE_P(Small, SessionGpuExample,
                         ::testing::Values("conv_bias_relu_small", "matmul_bias_gelu_small", "sdpa_fwd_small",
                                           "sdpa_alibi_small"));

TEST_F(SessionGpu, RebindMovesOneTensor) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = session_->get_plan(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffers bufs;
  allocate(g, bufs);
  auto bound = session_->bind(*plan, bufs.ptrs);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  ASSERT_TRUE(bound->execute().ok());
  sync();
  const size_t n = bufs.bytes["y"];
  const auto first = download(bufs.ptrs["y"], n);

  void* other = nullptr;
  ASSERT_CUDA(cudaMalloc(&other, n));
  ASSERT_CUDA(cudaMemset(other, 0xFF, n));
  ASSERT_CUDA(cudaMemset(bufs.ptrs["y"], 0xFF, n));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const int slot = bound->slot_of("y");
  ASSERT_GE(slot, 0);
  EXPECT_EQ(bound->tensor_names()[slot], "y");
  ASSERT_TRUE(bound->rebind(slot, other).ok());
  ASSERT_TRUE(bound->execute().ok());
  sync();
  EXPECT_EQ(download(other, n), first) << "the rebound output holds the result";
  EXPECT_EQ(download(bufs.ptrs["y"], n), std::vector<uint8_t>(n, 0xFF)) << "the old output is untouched";

  // By name, back to the original buffer.
  ASSERT_TRUE(bound->rebind("y", bufs.ptrs["y"]).ok());
  ASSERT_TRUE(bound->execute().ok());
  sync();
  EXPECT_EQ(download(bufs.ptrs["y"], n), first);
  cudaFree(other);

  EXPECT_EQ(bound->rebind("no_such", other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bound->rebind(99, other).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bound->rebind(slot, nullptr).code(), StatusCode::kInvalidArgument);
}

TEST_F(SessionGpu, BindRefusesMissingAndUnknownTensors) {
  ResolvedGraph g = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = session_->get_plan(g);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  DeviceBuffers bufs;
  allocate(g, bufs);
  auto missing = bufs.ptrs;
  missing.erase("w");
  auto a = session_->bind(*plan, missing);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("'w'"), std::string::npos) << a.status().message();
  auto extra = bufs.ptrs;
  extra["zzz"] = bufs.ptrs["w"];
  auto b = session_->bind(*plan, extra);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("'zzz' is not a tensor"), std::string::npos) << b.status().message();
}

TEST_F(SessionGpu, ArenaGrowsToTheLargestBoundPlanAndOldBindingsFollow) {
  ResolvedGraph small = load(source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto p1 = session_->get_plan(small);
  ASSERT_TRUE(p1.ok()) << p1.status().ToString();
  DeviceBuffers b1;
  allocate(small, b1);
  auto bound1 = session_->bind(*p1, b1.ptrs);
  ASSERT_TRUE(bound1.ok());
  ASSERT_TRUE(bound1->execute().ok());
  sync();
  const auto before = download(b1.ptrs["y"], b1.bytes["y"]);
  const int64_t grown = session_->workspace_bytes() + (64 << 20);
  ASSERT_TRUE(session_->reserve_workspace(grown).ok());
  EXPECT_GE(session_->workspace_bytes(), grown);
  // The first binding sees the moved arena.
  ASSERT_CUDA(cudaMemset(b1.ptrs["y"], 0xFF, b1.bytes["y"]));
  ASSERT_CUDA(cudaDeviceSynchronize());
  ASSERT_TRUE(bound1->execute().ok());
  sync();
  EXPECT_EQ(download(b1.ptrs["y"], b1.bytes["y"]), before);
}

TEST_F(SessionGpu, DefaultPolicyRunsTheDilatedFp16ConvWithFp32Output) {
  // Issue #11: mode A has no engine for this graph; fallback has.
  const char* json = R"({
    "name": "conv_dilated_fp16_fp32out",
    "io_dtype": "fp16", "intermediate_dtype": "fp32", "compute_dtype": "fp32",
    "tensors": [
      {"name": "x", "dims": [2, 16, 20, 20], "layout": "nhwc"},
      {"name": "w", "dims": [16, 16, 3, 3], "layout": "nhwc"},
      {"name": "y", "dtype": "fp32", "layout": "nhwc"}
    ],
    "ops": [
      {"op": "conv_fprop", "name": "conv1", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "y"},
       "padding": [2, 2], "stride": [1, 1], "dilation": [2, 2]}
    ]
  })";
  auto spec = parse_graph_json(json);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  PlanReport rep;
  auto plan = session_->get_plan(*g, {}, &rep);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::printf("[ note ] served by heuristic mode %s after %zu attempt(s): %s\n", rep.heuristic_mode.c_str(),
              rep.attempts.size(), rep.source_text().c_str());
  EXPECT_EQ(rep.source, PlanSource::kBuilt);
  EXPECT_EQ(rep.attempts.back().modes.size(), 1u);
  RunOptions ro;
  ro.verify = true;
  ro.iters = 0;
  auto run = run_plan(*g, *plan, *session_->context(), ro);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_TRUE(run->verified_ok);
}

}  // namespace
}  // namespace fusebox
