// fusebox's own embedding kernel (src/kernels/embedding.cu) on the GPU: both
// paths (eight bf16 values per thread, and one value of any dtype) against the
// references, eager and in a CUDA graph; ids outside the table refused before
// a run, and NaN rows (no read outside the table) when they reach the kernel.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"

namespace fusebox {
namespace {

#define ASSERT_CUDA(x) ASSERT_EQ((x), cudaSuccess) << #x

std::string graph_json(int64_t n, int64_t v, int64_t h, int64_t p, const char* table_dtype,
                       const char* add_dtype, const char* y_dtype) {
  const std::string add = p > 0 ? R"(, {"name": "add", "dims": [)" + std::to_string(p) + ", " +
                                      std::to_string(h) + R"(, 1, 1], "dtype": ")" + add_dtype + R"("})"
                                : "";
  return R"({"name": "emb", "io_dtype": "bf16", "tensors": [
    {"name": "ids", "dims": [)" +
         std::to_string(n) + R"(, 1, 1, 1], "dtype": "int32"},
    {"name": "table", "dims": [)" +
         std::to_string(v) + ", " + std::to_string(h) + R"(, 1, 1], "dtype": ")" + table_dtype + R"("})" +
         add + R"(, {"name": "y", "dtype": ")" + y_dtype + R"("}],
  "ops": [{"op": "embedding", "name": "embed", "inputs": {"ids": "ids", "table": "table")" +
         (p > 0 ? R"(, "add": "add")" : "") + R"(}, "outputs": {"y": "y"}}]})";
}

class EmbeddingGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
    auto ctx = GpuContext::create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
    auto t = DeviceTarget::live_gpu(0);
    ASSERT_TRUE(t.ok());
    target_ = *t;
  }
  ResolvedGraph load(const std::string& json) {
    auto spec = parse_graph_json(json);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return *g;
  }
  std::unique_ptr<GpuContext> ctx_;
  DeviceTarget target_;
};

TEST_F(EmbeddingGpu, BothPathsMatchTheReferencesEagerAndAsACudaGraph) {
  struct Case {
    int64_t n, v, h, p;
    const char *table, *add, *y;
  };
  const Case cases[] = {
      {4096, 30522, 384, 128, "bf16", "bf16", "bf16"},  // MiniLM's shape: the eight-value path
      {300, 1000, 60, 30, "bf16", "bf16", "bf16"},      // H % 8 != 0: one value per thread
      {256, 500, 64, 16, "fp32", "bf16", "fp16"},       // mixed dtypes
      {256, 500, 64, 0, "fp16", "bf16", "fp32"},        // no add
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.h) + " " + c.table + "/" + c.add + "/" + c.y + (c.p ? "" : " no add"));
    ResolvedGraph g = load(graph_json(c.n, c.v, c.h, c.p, c.table, c.add, c.y));
    BuildReport report;
    auto plan = build_plan(g, target_, BuildOptions{}, &report, ctx_.get());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_TRUE(plan->native());
    EXPECT_EQ(plan->engine_name(), "fusebox_embedding");
    for (bool graph : {false, true}) {
      RunOptions opt;
      opt.verify = true;
      opt.iters = 0;
      opt.seed = 11;
      opt.cuda_graph = graph;
      auto r = run_plan(g, *plan, *ctx_, opt);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->verified_ok);
      for (const auto& cmp : r->comparisons) {
        EXPECT_TRUE(cmp.pass) << cmp.ToString();
        EXPECT_EQ(cmp.non_finite, 0);
      }
    }
  }
}

TEST_F(EmbeddingGpu, IdsOutsideTheTableAreRefusedOrGiveNanRows) {
  ResolvedGraph g = load(graph_json(4, 16, 8, 0, "bf16", "bf16", "fp32"));
  auto plan = build_plan(g, target_, BuildOptions{}, nullptr, ctx_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  // Known before the run: refused, naming the position.
  HostTensor ids = HostTensor::like(g.tensors[g.find_tensor("ids")]);
  const int32_t bad[4] = {0, -1, 16, 2};
  std::memcpy(ids.data.data(), bad, sizeof bad);
  RunOptions opt;
  opt.iters = 0;
  opt.inputs["ids"] = ids;
  auto r = run_plan(g, *plan, *ctx_, opt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ids[1] = -1 is outside table 'table' of 16 rows"), std::string::npos)
      << r.status().message();
  // Reaching the kernel anyway (ids written on the GPU): NaN rows, nothing read outside the table.
  void *d_ids = nullptr, *d_table = nullptr, *d_y = nullptr;
  ASSERT_CUDA(cudaMalloc(&d_ids, sizeof bad));
  ASSERT_CUDA(cudaMalloc(&d_table, 16 * 8 * 2));
  ASSERT_CUDA(cudaMalloc(&d_y, 4 * 8 * 4));
  ASSERT_CUDA(cudaMemcpy(d_ids, bad, sizeof bad, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(d_table, 0x3f, 16 * 8 * 2));  // bf16 0x3f3f: about 0.75
  Status st = plan->execute(*ctx_, {{"ids", d_ids}, {"table", d_table}, {"y", d_y}}, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(ctx_->stream())));
  float y[32];
  ASSERT_CUDA(cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost));
  for (int h = 0; h < 8; ++h) {
    EXPECT_FALSE(std::isnan(y[0 * 8 + h]));
    EXPECT_TRUE(std::isnan(y[1 * 8 + h]));
    EXPECT_TRUE(std::isnan(y[2 * 8 + h]));
    EXPECT_FLOAT_EQ(y[3 * 8 + h], y[0 * 8 + h]);
  }
  cudaFree(d_ids);
  cudaFree(d_table);
  cudaFree(d_y);
}

}  // namespace
}  // namespace fusebox
