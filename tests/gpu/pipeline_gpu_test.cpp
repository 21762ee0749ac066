// Pipelines on the GPU: two_convs and conv10 run eagerly (one bound plan per
// stage, one workspace arena), verified stage by stage and as a whole chain;
// a second run gives the same bits. Skipped without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "../deviceless/test_util.h"
#include "fusebox/pipeline_parallel.h"
#include "fusebox/pipeline_run.h"

namespace fusebox {
namespace {

using testing::source_dir;

class PipelineGpu : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
    auto s = Session::create();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    session_ = std::move(s).value();
  }
  Pipeline load(const std::string& name) {
    auto p = load_pipeline_file(source_dir() + "/examples/pipelines/" + name + ".json");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return std::move(p).value();
  }
  std::unique_ptr<Session> session_;
};

TEST_P(PipelineGpu, RunsAndVerifies) {
  const Pipeline p = load(GetParam());
  PipelineBuild b;
  ASSERT_TRUE(build_pipeline(*session_, p, {}, &b).ok());
  auto data = load_pipeline_data(p, 5);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  PipelineRunOptions o;
  o.verify = true;
  o.iters = 5;
  o.warmup = 1;
  o.profile = true;
  // conv10's stages through the GPU reference, two_convs' through the CPU one.
  if (p.name == "conv10") o.cpu_reference_max_flops = 0;
  auto r = run_pipeline(*session_, p, b.plans_by_stage(p), *data, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Status vs = pipeline_verify_status(p, *r);
  EXPECT_TRUE(vs.ok()) << vs.ToString();
  ASSERT_EQ(r->stages.size(), p.stages.size());
  for (const StageRun& s : r->stages) {
    EXPECT_FALSE(s.engine.empty());
    ASSERT_EQ(s.comparisons.size(), 1u);
    EXPECT_TRUE(s.comparisons[0].pass) << s.comparisons[0].ToString();
    EXPECT_EQ(s.comparisons[0].non_finite, 0);
    EXPECT_EQ(s.reference_kind, p.name == "conv10" ? "gpu" : "cpu");
    EXPECT_EQ(s.latency.iters, 5);  // profiled: each stage alone
    EXPECT_GT(s.latency.median_ms, 0);
    EXPECT_GT(s.flops, 0);
  }
  ASSERT_EQ(r->chain.size(), 1u);
  EXPECT_EQ(r->chain[0].tensor, "out");
  EXPECT_TRUE(r->chain[0].pass) << r->chain[0].ToString();
  EXPECT_EQ(r->peak_device_bytes, r->buffer_bytes + r->workspace_bytes);
  EXPECT_GT(r->latency.median_ms, 0);
  std::printf("[ pipeline ] %s: %zu stages, median %.4f ms, peak %lld bytes, chain %s\n", p.name.c_str(),
              p.stages.size(), r->latency.median_ms, static_cast<long long>(r->peak_device_bytes),
              r->chain[0].ToString().c_str());
}

TEST_P(PipelineGpu, ExecutorIsDeterministic) {
  const Pipeline p = load(GetParam());
  PipelineBuild b;
  ASSERT_TRUE(build_pipeline(*session_, p, {}, &b).ok());
  auto data = load_pipeline_data(p, 9);
  ASSERT_TRUE(data.ok());
  auto ex = PipelineExecutor::create(*session_, p, b.plans_by_stage(p), *data);
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  ASSERT_EQ((*ex)->steps().size(), p.stages.size());
  EXPECT_EQ((*ex)->step_stages(), p.order);
  const int out = p.find_buffer("out");
  ASSERT_TRUE((*ex)->execute().ok());
  auto first = (*ex)->download(out);
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*ex)->execute().ok());
  auto second = (*ex)->download(out);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->data, second->data) << "two eager runs differ";
}

// The whole pipeline as one CUDA graph: every buffer a stage writes equals the
// eager run's byte for byte (run_pipeline fails otherwise), and both are timed.
TEST_P(PipelineGpu, CudaGraphMatchesEagerBitForBit) {
  const Pipeline p = load(GetParam());
  PipelineBuild b;
  ASSERT_TRUE(build_pipeline(*session_, p, {}, &b).ok());
  auto data = load_pipeline_data(p, 13);
  ASSERT_TRUE(data.ok());
  PipelineRunOptions o;
  o.cuda_graph = true;
  o.iters = 20;
  o.warmup = 2;
  auto r = run_pipeline(*session_, p, b.plans_by_stage(p), *data, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->cuda_graph.used);
  EXPECT_TRUE(r->cuda_graph.bit_identical);
  EXPECT_TRUE(r->cuda_graph.mismatches.empty());
  int64_t written = 0;
  for (size_t bi = 0; bi < p.buffers.size(); ++bi)
    if (p.buffers[bi].kind == BufferKind::kOutput || p.buffers[bi].kind == BufferKind::kIntermediate)
      written += buffer_tensor(p, static_cast<int>(bi)).storage_bytes();
  EXPECT_EQ(r->cuda_graph.bytes_compared, written);
  EXPECT_FALSE(r->cuda_graph.recording.empty());
  EXPECT_GT(r->latency.median_ms, 0);
  EXPECT_GT(r->eager_latency.median_ms, 0);
  std::printf("[ pipeline ] %s: CUDA graph (%s) median %.4f ms, eager %.4f ms (%.2fx)\n", p.name.c_str(),
              r->cuda_graph.recording.c_str(), r->latency.median_ms, r->eager_latency.median_ms,
              r->eager_latency.median_ms / r->latency.median_ms);
}

INSTANTIATE_TEST_SUITE_P(Examples, PipelineGpu, ::testing::Values("two_convs", "conv10"));

// Data parallel (pipeline run --devices): two_convs_dyn at N=5 split 3 + 2
// over two sessions (devices 0,1 where there are two GPUs, else 0,0), every
// share verified, the stacked output equal to one device's run of N=5 within
// the chain's tolerance (a share's batch may pick another engine).
TEST(PipelineDataParallelGpu, SplitsVerifiesAndStacks) {
  const int gpus = gpu_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  auto full = load_pipeline_file(source_dir() + "/examples/pipelines/two_convs_dyn.json", {{"N", 5}});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  auto data = load_pipeline_data(*full, 11);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  DataParallelOptions o;
  o.devices = {0, gpus > 1 ? 1 : 0};
  o.run.verify = true;
  o.run.iters = 5;
  o.run.warmup = 1;
  auto r = run_pipeline_data_parallel(*full, *data, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->shares.size(), 2u);
  EXPECT_EQ(r->shares[0].batch, 3);
  EXPECT_EQ(r->shares[1].offset, 3);
  EXPECT_TRUE(r->verified_ok);
  for (size_t i = 0; i < r->shares.size(); ++i) {
    Status vs = pipeline_verify_status(r->share_pipelines[i], r->shares[i].result);
    EXPECT_TRUE(vs.ok()) << vs.ToString();
  }
  ASSERT_EQ(r->outputs.count("out"), 1u);
  const HostTensor& stacked = r->outputs.at("out");
  EXPECT_EQ(stacked.dims[0], 5);

  auto session = Session::create();
  ASSERT_TRUE(session.ok());
  PipelineBuild b;
  ASSERT_TRUE(build_pipeline(**session, *full, {}, &b).ok());
  PipelineRunOptions one;
  one.iters = 0;
  auto whole = run_pipeline(**session, *full, b.plans_by_stage(*full), *data, one);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const int out = full->find_buffer("out");
  Comparison c = compare("out", whole->outputs.at("out").to_float_logical(), stacked.to_float_logical(),
                         chain_tolerance(*full, out));
  EXPECT_TRUE(c.pass) << c.ToString();
  std::printf("[ pipeline ] two_convs_dyn N=5 over devices %d,%d: %s; wall %.1f ms\n", o.devices[0],
              o.devices[1], c.ToString().c_str(), r->wall_ms);
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Views (split_convs): conv1 writes hidden [2, 16, 5, 5]; each half is read, through a view at
// its offset, by a batch-1 conv. Every stage verifies on its own inputs (the view's bytes as the
// device holds them), the CUDA graph equals the eager run, and the two halves together equal
// two_convs' output (the same weights, the same seeded image, the second conv at batch 2).
TEST(PipelineViewsGpu, SplitConvsMatchTwoConvs) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  auto session = Session::create();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  auto split = load_pipeline_file(source_dir() + "/examples/pipelines/split_convs.json");
  auto whole = load_pipeline_file(source_dir() + "/examples/pipelines/two_convs.json");
  ASSERT_TRUE(split.ok() && whole.ok()) << split.status().ToString() << whole.status().ToString();
  PipelineBuild bs, bw;
  ASSERT_TRUE(build_pipeline(**session, *split, {}, &bs).ok());
  ASSERT_TRUE(build_pipeline(**session, *whole, {}, &bw).ok());
  auto ds = load_pipeline_data(*split, 5);
  auto dw = load_pipeline_data(*whole, 5);
  ASSERT_TRUE(ds.ok() && dw.ok());
  PipelineRunOptions o;
  o.verify = true;
  o.cuda_graph = true;
  o.iters = 5;
  o.warmup = 1;
  auto rs = run_pipeline(**session, *split, bs.plans_by_stage(*split), *ds, o);
  ASSERT_TRUE(rs.ok()) << rs.status().ToString();
  Status vs = pipeline_verify_status(*split, *rs);
  EXPECT_TRUE(vs.ok()) << vs.ToString();
  EXPECT_EQ(rs->chain.size(), 2u);
  EXPECT_TRUE(rs->cuda_graph.bit_identical);
  PipelineRunOptions one;
  one.iters = 0;
  auto rw = run_pipeline(**session, *whole, bw.plans_by_stage(*whole), *dw, one);
  ASSERT_TRUE(rw.ok()) << rw.status().ToString();
  std::vector<float> halves = rs->outputs.at("out_0").to_float_logical();
  const std::vector<float> second = rs->outputs.at("out_1").to_float_logical();
  halves.insert(halves.end(), second.begin(), second.end());
  Comparison c = compare("out", rw->outputs.at("out").to_float_logical(), halves,
                         chain_tolerance(*whole, whole->find_buffer("out")));
  EXPECT_TRUE(c.pass) << c.ToString();
  std::printf("[ pipeline ] split_convs (views) against two_convs: %s\n", c.ToString().c_str());
}

}  // namespace
}  // namespace fusebox
