// Real cuDNN plan builds for the H200 on a machine without a GPU, from the
// device-properties file in devices/.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "fusebox/cudnn_features.h"
#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_file.h"
#include "lm_graphs.h"
#include "test_util.h"

namespace fusebox {
namespace {

using testing::example_graphs;
using testing::stem;

// Graphs cuDNN 9.19 has a precompiled engine for on sm_90. The others need
// runtime-compiled (NVRTC + CUDA driver) or cuBLASLt engines, which cuDNN
// cannot finalize without a GPU driver. Plain conv_dgrad and conv_wgrad (2-D,
// 3-D, grouped) build; conv_dgrad + relu_bwd needs the runtime-fusion engine.
const std::set<std::string> kDevicelessBuildable = {
    "conv_bias_relu", "conv_bias_relu_small", "conv_grouped_small", "conv_dgrad", "conv_dgrad_small",
    "conv_wgrad", "conv_wgrad_small", "conv3d_dgrad_grouped_small", "conv3d_wgrad_grouped_small",
    // Symbolic, at their default shapes (graph-format.md, "Symbolic dims").
    "conv_bias_relu_dyn", "conv_bias_relu_dyn_small"};
// Examples cuDNN 9.19 runs on no GPU fusebox can target (block masks: no engine
// on Hopper, refused below cuDNN 9.26 on Blackwell): fusebox refuses them for
// the H200 at validate (SdpaSupportMatrix.BlockMaskNeedsBlackwell).
const std::set<std::string> kNeedsBlackwell = {"sdpa_block_mask", "sdpa_block_mask_small"};
// Examples fusebox runs with its own kernel, an op cuDNN 9.19 has none for
// (embedding) or runs much slower (kernels::faster_native_kernel): a plan
// with one step and no cuDNN engine, for any target. Example -> engine.
const std::map<std::string, std::string> kNativeKernel = {
    {"embedding", "fusebox_embedding"},
    {"embedding_small", "fusebox_embedding"},
    {"global_avg_pool", "fusebox_global_avg_pool"},
    {"global_avg_pool_small", "fusebox_global_avg_pool"},
    {"layernorm_train", "fusebox_layernorm"},
    {"layernorm_small", "fusebox_layernorm"},
    {"layernorm_bsh_small", "fusebox_layernorm"},
    {"rmsnorm_train", "fusebox_rmsnorm"},
    {"rmsnorm_bias_small", "fusebox_rmsnorm"},
    {"reduce_sum_bias_grad", "fusebox_reduce_rows"},
    {"reduce_sum_bias_grad_small", "fusebox_reduce_rows"},
    {"max_pool_resnet_stem", "fusebox_pool"},
    {"max_pool_small", "fusebox_pool"},
    {"avg_pool_small", "fusebox_pool"},
    {"rope", "fusebox_rope"},
    {"rope_small", "fusebox_rope"},
    {"rope_decode_small", "fusebox_rope"},
    {"rope_bwd_small", "fusebox_rope_bwd"},
    {"cross_entropy", "fusebox_cross_entropy"},
    {"cross_entropy_small", "fusebox_cross_entropy"},
    {"cross_entropy_bwd_small", "fusebox_cross_entropy_bwd"},
    {"embedding_bwd_small", "fusebox_embedding_bwd"},
    {"quantize_fp8_cast_transpose", "fusebox_quantize"},
    {"quantize_fp8_transposed", "fusebox_quantize"},
    {"quantize_fp16_batched_small", "fusebox_quantize"},
    {"quantize_small", "fusebox_quantize"},
    {"quantize_transposed_small", "fusebox_quantize"},
    {"quantize_two_copies_small", "fusebox_quantize"},
    {"swiglu_fp8_cast", "fusebox_pointwise_quantize"},
    {"swiglu_bwd_fp8_cast", "fusebox_pointwise_quantize"},
    {"swiglu_bwd_fp8_cast_small", "fusebox_pointwise_quantize"},
    {"add_fp8_cast_small", "fusebox_pointwise_quantize"},
    {"matmul_decode_silu", "fusebox_gemv"}};
// Of those, the ones whose kernel needs a workspace (none since the paged decode attention, measured
// slower than cuDNN's engine, runs only when pinned).
const std::set<std::string> kNativeWorkspace = {};
// Of those, the ones only fusebox runs (cuDNN has no op for them on 9.19, and fusebox
// does not lower to 9.24's RoPE yet): no cuDNN engine to pin instead.
const std::set<std::string> kOnlyFusebox = {
    "fusebox_embedding",         "fusebox_rope",          "fusebox_rope_bwd", "fusebox_cross_entropy",
    "fusebox_cross_entropy_bwd", "fusebox_embedding_bwd", "fusebox_quantize", "fusebox_pointwise_quantize"};

DeviceTarget h200() {
  auto t = DeviceTarget::from_file(testing::devprop_path());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? *t : DeviceTarget{};
}

ResolvedGraph load(const std::string& path) {
  auto spec = load_graph_file(path);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return *g;
}

TEST(DevicePropertiesFile, DescribesTheH200) {
  DeviceTarget t = h200();
  EXPECT_TRUE(t.deviceless());
  EXPECT_EQ(t.device_name, "NVIDIA H200");
  EXPECT_EQ(t.sm_version, 90);
  EXPECT_EQ(t.sm_count, 132);
}

TEST(DevicePropertiesFile, RejectsBadFiles) {
  EXPECT_EQ(DeviceTarget::from_file("/nonexistent/h200.devprop").status().code(), StatusCode::kIoError);
  auto not_json = DeviceTarget::from_properties_json("this is not json", "bad.devprop");
  EXPECT_EQ(not_json.status().code(), StatusCode::kParseError);
  EXPECT_NE(not_json.status().message().find("bad.devprop"), std::string::npos);
  auto wrong_json = DeviceTarget::from_properties_json(R"({"name": "conv"})", "graph.json");
  EXPECT_EQ(wrong_json.status().code(), StatusCode::kParseError);
  EXPECT_NE(wrong_json.status().message().find("deviceVer"), std::string::npos);
}

TEST(HeuristicModes, ParseAndReject) {
  auto m = parse_heuristic_modes("a,b,fallback");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 3u);
  auto bad = parse_heuristic_modes("a,z");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'z'"), std::string::npos);
}

class DevicelessExample : public ::testing::TestWithParam<std::string> {};

TEST_P(DevicelessExample, RunsTheFiveStepsForTheH200) {
  const std::string path = GetParam();
  ResolvedGraph g = load(path);
  BuildReport report;
  auto plan = build_plan(g, h200(), BuildOptions{}, &report);
  EXPECT_TRUE(report.deviceless);
  if (kNeedsBlackwell.count(stem(path))) {  // refused for the H200 at validate, saying why
    ASSERT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
    EXPECT_NE(plan.status().message().find("need a Blackwell GPU (sm_100"), std::string::npos)
        << plan.status().message();
    ASSERT_EQ(report.steps.size(), 1u);
    return;
  }
  if (auto native = kNativeKernel.find(stem(path)); native != kNativeKernel.end()) {
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_TRUE(plan->native());
    EXPECT_EQ(plan->engine_name(), native->second);
    if (kNativeWorkspace.count(stem(path))) {
      EXPECT_GT(plan->workspace_bytes(), 0);
    } else {
      EXPECT_EQ(plan->workspace_bytes(), 0);
    }
    ASSERT_EQ(report.steps.size(), 1u);
    EXPECT_EQ(report.steps[0].name, "validate");
    ASSERT_EQ(report.lowering_notes.size(), 1u);
    EXPECT_NE(report.lowering_notes[0].find("fusebox's own CUDA kernel"), std::string::npos);
    if (!kOnlyFusebox.count(native->second)) {  // cuDNN runs it too: the note says why not, and how to get it
      EXPECT_NE(report.lowering_notes[0].find("slower"), std::string::npos) << report.lowering_notes[0];
      EXPECT_NE(report.lowering_notes[0].find("pin a cuDNN engine"), std::string::npos)
          << report.lowering_notes[0];
    }
    // Serialized by name (one part over the graph, no cuDNN bytes), read back as the same kernel.
    auto bytes = plan->serialize();
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto again = deserialize_plan(g, *bytes, h200(), nullptr);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_TRUE(again->native());
    EXPECT_EQ(again->engine_name(), plan->engine_name());
    EXPECT_EQ(again->part_count(), 0);
    return;
  }
  ASSERT_GE(report.steps.size(), 3u);
  EXPECT_EQ(report.steps[0].name, "validate");
  EXPECT_TRUE(report.steps[0].status.ok()) << report.steps[0].status.ToString();
  EXPECT_EQ(report.steps[1].name, "build_operation_graph");
  EXPECT_TRUE(report.steps[1].status.ok()) << report.steps[1].status.ToString();
  for (const auto& s : report.steps) EXPECT_GE(s.ms, 0.0);

  // With a GPU driver present (the GPU machine) cuDNN can finalize every
  // engine, so the limitation below only shows on machines without one.
  if (!kDevicelessBuildable.count(stem(path)) && gpu_count() == 0) {
    // The failure must be explained, not a bare "no plans".
    ASSERT_FALSE(plan.ok()) << stem(path) << " now builds deviceless: add it to kDevicelessBuildable";
    EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported);
    EXPECT_NE(plan.status().message().find("without a GPU"), std::string::npos) << plan.status().message();
    return;
  }
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_EQ(report.steps.size(), 5u);
  const char* names[] = {"validate", "build_operation_graph", "create_execution_plans", "check_support",
                         "build_plans"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(report.steps[i].name, names[i]);
    EXPECT_TRUE(report.steps[i].status.ok()) << report.steps[i].status.ToString();
  }
  EXPECT_GT(report.candidate_plans, 0);
  EXPECT_EQ(report.engine.rfind("eng", 0), 0u) << report.engine;
  EXPECT_EQ(plan->engine_name(), report.engine);
  EXPECT_GE(plan->workspace_bytes(), 0);
  // The built plan's behavior notes are read (the session's static-shape policy keys on them): what
  // builds without a driver is precompiled, never RUNTIME_COMPILATION.
  EXPECT_TRUE(report.notes_known);
  if (gpu_count() == 0) {
    EXPECT_EQ(std::count(report.behavior_notes.begin(), report.behavior_notes.end(), "RUNTIME_COMPILATION"),
              0);
  }

  // Serialize, write a plan file, read it back, deserialize without a handle.
  auto bytes = plan->serialize();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  ASSERT_GT(bytes->size(), 100u);
  const std::string file = ::testing::TempDir() + "/" + stem(path) + ".plan";
  ASSERT_TRUE(write_plan_file(file, make_plan_info(g, *plan, h200()), *bytes).ok());
  auto pf = read_plan_file(file);
  ASSERT_TRUE(pf.ok()) << pf.status().ToString();
  EXPECT_EQ(pf->payload, *bytes);
  EXPECT_TRUE(pf->info.built_deviceless);
  EXPECT_EQ(pf->info.engine, plan->engine_name());
  EXPECT_TRUE(check_plan_compatible(pf->info, g, h200()).ok());
  auto again = deserialize_plan(g, pf->payload, h200(), nullptr);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->workspace_bytes(), plan->workspace_bytes());
  std::remove(file.c_str());
}

TEST_P(DevicelessExample, ListsEveryCandidateEngine) {
  const std::string path = GetParam();
  if (kNeedsBlackwell.count(stem(path))) {
    ResolvedGraph g = load(path);
    auto engines = list_engines(g, h200(), BuildOptions{}, /*build_each=*/false, nullptr);
    ASSERT_FALSE(engines.ok());
    EXPECT_NE(engines.status().message().find("need a Blackwell GPU (sm_100"), std::string::npos)
        << engines.status().message();
    GTEST_SKIP() << stem(path) << ": refused for the H200 by design (see RunsTheFiveStepsForTheH200)";
  }
  if (auto native = kNativeKernel.find(stem(path));
      native != kNativeKernel.end()) {  // one candidate: fusebox's kernel
    ResolvedGraph g = load(path);
    auto engines = list_engines(g, h200(), BuildOptions{}, /*build_each=*/true, nullptr);
    ASSERT_TRUE(engines.ok()) << engines.status().ToString();
    ASSERT_EQ(engines->size(), 1u);
    EXPECT_EQ(engines->front().name, native->second);
    EXPECT_TRUE(engines->front().supported);
    BuildOptions pin;
    pin.engine = "eng0";
    auto pinned = build_plan(g, h200(), pin, nullptr);
    if (kOnlyFusebox.count(native->second)) {  // only fusebox runs it
      ASSERT_FALSE(pinned.ok());
      EXPECT_NE(pinned.status().message().find(native->second + " (fusebox's own kernel)"), std::string::npos)
          << pinned.status().message();
    } else {  // cuDNN runs it too: a pinned cuDNN engine goes to cuDNN (deviceless here: may be refused)
      EXPECT_FALSE(pinned.ok() && pinned->native());
      BuildOptions cudnn_only;
      cudnn_only.native_kernels = false;
      auto listed = list_engines(g, h200(), cudnn_only, /*build_each=*/false, nullptr);
      if (listed.ok()) {
        for (const auto& e : *listed) EXPECT_NE(e.name.rfind("fusebox_", 0), 0u) << e.name;
      }
    }
    return;
  }
  if (!kDevicelessBuildable.count(stem(path)) && gpu_count() == 0) {
    GTEST_SKIP() << stem(path)
                 << ": no deviceless engines without a GPU driver (see RunsTheFiveStepsForTheH200)";
  }
  ResolvedGraph g = load(path);
  BuildOptions options;
  options.heuristics = {HeuristicMode::kA, HeuristicMode::kFallback};
  auto engines = list_engines(g, h200(), options, /*build_each=*/true, nullptr);
  ASSERT_TRUE(engines.ok()) << engines.status().ToString();
  // Some graphs have a single engine in cuDNN 9.19 (FP8 SDPA backward on the H200).
  ASSERT_FALSE(engines->empty());
  int supported = 0;
  std::set<std::string> names;
  for (const auto& e : *engines) {
    EXPECT_EQ(e.name.rfind("eng" + std::to_string(e.engine_id), 0), 0u) << e.name;
    // The knobs are exactly the ones the name spells out.
    size_t spelled = 0;
    for (const auto& [k, v] : e.knobs) {
      EXPECT_NE(e.name.find("_" + k + "=" + std::to_string(v)), std::string::npos)
          << e.name << " lacks " << k;
      spelled += 1;
    }
    EXPECT_EQ(spelled, static_cast<size_t>(std::count(e.name.begin(), e.name.end(), '='))) << e.name;
    EXPECT_TRUE(e.numerical_notes.empty() || e.numerical_notes.front() != "NOT_SET") << e.name;
    names.insert(e.name);
    if (e.supported) {
      ++supported;
      EXPECT_GE(e.workspace_bytes, 0) << e.name;
    } else {
      EXPECT_FALSE(e.support_message.empty()) << e.name;
    }
  }
  EXPECT_GT(supported, 0);

  // Pin the last supported engine by name and get exactly it.
  std::string pinned;
  for (const auto& e : *engines) {
    if (e.supported) pinned = e.name;
  }
  BuildOptions pin = options;
  pin.engine = pinned;
  BuildReport report;
  auto plan = build_plan(g, h200(), pin, &report);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->engine_name(), pinned);

  pin.engine = "eng999_k1=1";
  auto missing = build_plan(g, h200(), pin, nullptr);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("eng999_k1=1"), std::string::npos);
  EXPECT_NE(missing.status().message().find(*names.begin()), std::string::npos)
      << "should list the candidates";
}

INSTANTIATE_TEST_SUITE_P(Examples, DevicelessExample, ::testing::ValuesIn(example_graphs()),
                         [](const auto& info) { return stem(info.param); });

// Builds from several threads at once (`pipeline run --devices 0,0` builds a session per thread):
// cuDNN's diagnostics are captured by redirecting the process's stdout and stderr while a build
// runs, and overlapping captures once left stdout pointing into a deleted file: everything the
// command printed afterwards was lost. After concurrent builds, stdout and stderr must be the files
// they were before.
TEST(ConcurrentBuilds, LeaveStdoutAndStderrWhereTheyWere) {
  auto identity = [](int fd) {
    struct stat st {};
    EXPECT_EQ(fstat(fd, &st), 0);
    return std::make_pair(st.st_dev, st.st_ino);
  };
  std::fflush(stdout);
  const auto out_before = identity(1), err_before = identity(2);
  // One graph that builds deviceless and one that fails (its failure is where cuDNN prints): a
  // layernorm with bf16 params (cuDNN's norm engines are compiled at run time, so need a driver;
  // with fp32 params fusebox's own kernel would take it, without cuDNN).
  const ResolvedGraph ok_graph =
      load(testing::source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto bad_spec = parse_graph_json(R"({"name": "ln", "io_dtype": "bf16", "tensors": [
      {"name": "x", "dims": [64, 128, 1, 1], "layout": "nhwc"}, {"name": "scale", "dims": [1, 128, 1, 1], "layout": "nhwc"},
      {"name": "bias", "dims": [1, 128, 1, 1], "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
    "ops": [{"op": "layernorm", "name": "ln", "inputs": {"x": "x", "scale": "scale", "bias": "bias"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(bad_spec.ok()) << bad_spec.status().ToString();
  auto bad_resolved = resolve(*bad_spec);
  ASSERT_TRUE(bad_resolved.ok()) << bad_resolved.status().ToString();
  const ResolvedGraph bad_graph = *bad_resolved;
  const DeviceTarget target = h200();
  std::vector<std::thread> threads;
  std::atomic<int> built{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3; ++i) {
        BuildReport report;
        auto plan = build_plan((t + i) % 2 ? bad_graph : ok_graph, target, BuildOptions{}, &report);
        if (plan.ok()) ++built;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GE(built.load(), 6);
  EXPECT_EQ(identity(1), out_before) << "stdout no longer the file it was before the builds";
  EXPECT_EQ(identity(2), err_before) << "stderr no longer the file it was before the builds";
}

TEST(PlanFile, RejectsCorruptFiles) {
  ResolvedGraph g = load(testing::source_dir() + "/examples/graphs/small/conv_bias_relu_small.json");
  auto plan = build_plan(g, h200(), BuildOptions{}, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto bytes = plan->serialize();
  ASSERT_TRUE(bytes.ok());
  const std::string file = ::testing::TempDir() + "/corrupt.plan";
  ASSERT_TRUE(write_plan_file(file, make_plan_info(g, *plan, h200()), *bytes).ok());
  std::string good;
  {
    FILE* f = std::fopen(file.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) good.append(buf, n);
    std::fclose(f);
  }
  auto write = [&](const std::string& content) {
    FILE* f = std::fopen(file.c_str(), "wb");
    std::fwrite(content.data(), 1, content.size(), f);
    std::fclose(f);
  };
  // Truncated, bit-flipped payload, bad header, empty.
  write(good.substr(0, good.size() - 10));
  EXPECT_EQ(read_plan_file(file).status().code(), StatusCode::kParseError);
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x10;
  write(flipped);
  auto f2 = read_plan_file(file);
  ASSERT_FALSE(f2.ok());
  EXPECT_NE(f2.status().message().find("checksum"), std::string::npos);
  write("{\"magic\": \"nope\"}\nxxxx");
  EXPECT_EQ(read_plan_file(file).status().code(), StatusCode::kParseError);
  write("");
  EXPECT_FALSE(read_plan_file(file).ok());
  std::remove(file.c_str());

  // A plan for another graph is refused.
  ResolvedGraph other = load(testing::source_dir() + "/examples/graphs/conv_bias_relu.json");
  PlanFileInfo info = make_plan_info(g, *plan, h200());
  EXPECT_FALSE(check_plan_compatible(info, other, h200()).ok());
}

// The support matrix (issue #13, item 4): a combination cuDNN 9.19 refuses on
// Hopper fails at the first step with the frontend's reason, not later with a
// bare "no engine". FP8 forward with bottom-right alignment is Blackwell-only.
TEST(SdpaSupportMatrix, Fp8BottomRightRefusedWithCudnnsReason) {
  auto spec = load_graph_file(testing::source_dir() + "/examples/graphs/small/sdpa_fp8_small.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  std::get<SdpaFp8FwdAttrs>(spec->ops[0].attrs).alignment = SdpaAlignment::kBottomRight;
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();  // fusebox leaves the decision to cuDNN
  BuildReport report;
  auto plan = build_plan(*g, h200(), BuildOptions{}, &report);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
  ASSERT_FALSE(report.steps.empty());
  EXPECT_EQ(report.steps[0].name, "validate");
  EXPECT_FALSE(report.steps[0].status.ok());
  EXPECT_NE(plan.status().message().find("Blackwell"), std::string::npos) << plan.status().message();
}

// A paged K/V graph lowers (page tables, max_seq_len_kv) and passes the
// frontend's validation and operation-graph build for the H200.
TEST(SdpaSupportMatrix, PagedForwardValidates) {
  auto spec = load_graph_file(testing::source_dir() + "/examples/graphs/small/sdpa_paged_decode_small.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  BuildReport report;
  (void)build_plan(*g, h200(), BuildOptions{}, &report);
  ASSERT_GE(report.steps.size(), 2u);
  EXPECT_TRUE(report.steps[0].status.ok()) << report.steps[0].status.ToString();
  EXPECT_TRUE(report.steps[1].status.ok()) << report.steps[1].status.ToString();
  // One query per sequence, bottom-right causal: the band masks nothing and
  // is left out of the frontend graph, said in the report.
  ASSERT_EQ(report.lowering_notes.size(), 1u);
  EXPECT_NE(report.lowering_notes[0].find("[sdpa_fwd 'attn']: the causal mask is left out"),
            std::string::npos)
      << report.lowering_notes[0];
}

// cuDNN 9.19 runs block masks only on Blackwell (the H200 said so on
// 2026-12-01: "Block mask is only supported on Blackwell"): for an H200 target
// fusebox refuses them at validate, before any cuDNN call, naming the op, the
// tensor and what this GPU offers instead. On Blackwell frontend 1.32 refuses
// them below cuDNN 9.26: with cuDNN 9.19 they run nowhere.
TEST(SdpaSupportMatrix, BlockMaskNeedsBlackwell) {
  auto spec = load_graph_file(testing::source_dir() + "/examples/graphs/small/sdpa_block_mask_small.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  BuildReport report;
  auto refused = build_plan(*g, h200(), BuildOptions{}, &report);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported) << refused.status().ToString();
  ASSERT_EQ(report.steps.size(), 1u);
  EXPECT_EQ(report.steps[0].name, "validate");
  for (const char* part : {"[sdpa_fwd 'attn']", "input 'block_mask' ('blocks')",
                           "need a Blackwell GPU (sm_100", "cuDNN 9.26", "the target is NVIDIA H200",
                           "(sm_90)", "Block mask is only supported on Blackwell", "left_bound", "bias"}) {
    EXPECT_NE(refused.status().message().find(part), std::string::npos) << part << "\n"
                                                                        << refused.status().message();
  }

  // A Blackwell target (sm_100, the H200's properties otherwise): the mask
  // lowers onto the unified node, whose validation refuses it below cuDNN 9.26
  // (fusebox/cudnn_features.h, "sdpa_block_mask") and accepts it from 9.26.
  DeviceTarget blackwell = h200();
  blackwell.sm_version = 100;
  BuildReport rb;
  auto plan = build_plan(*g, blackwell, BuildOptions{}, &rb);
  ASSERT_GE(rb.steps.size(), 1u);
  EXPECT_EQ(rb.steps[0].name, "validate");
  if (cudnn_feature_active("sdpa_block_mask", system_info(false).cudnn_runtime_version)) {
    EXPECT_TRUE(rb.steps[0].status.ok()) << rb.steps[0].status.ToString();
    return;  // past validate; whether a deviceless build for this made-up GPU finds an engine is cuDNN's
  }
  ASSERT_FALSE(plan.ok());
  ASSERT_EQ(rb.steps.size(), 1u);
  EXPECT_EQ(plan.status().code(), StatusCode::kNotSupported) << plan.status().ToString();
  EXPECT_NE(plan.status().message().find("Unified SDPA with Block_mask on SM10x requires cuDNN 9.26.0"),
            std::string::npos)
      << plan.status().message();
}

// A paged prefill (several queries per sequence) keeps its causal mask.
TEST(SdpaSupportMatrix, PrefillKeepsItsCausalMask) {
  auto spec = load_graph_file(testing::source_dir() + "/examples/graphs/small/sdpa_paged_prefill_small.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  ASSERT_TRUE(std::get<SdpaFwdAttrs>(g->ops[0].attrs).right_bound.has_value());
  BuildReport report;
  (void)build_plan(*g, h200(), BuildOptions{}, &report);
  ASSERT_GE(report.steps.size(), 2u);
  EXPECT_TRUE(report.steps[0].status.ok()) << report.steps[0].status.ToString();
  EXPECT_TRUE(report.lowering_notes.empty()) << report.lowering_notes[0];
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// An embedding (fusebox's own kernel) shares its graph with no cuDNN op: the
// build says which ops to move, before any cuDNN call.
TEST(NativeKernel, EmbeddingMustBeAloneInItsGraph) {
  auto spec = parse_graph_json(R"({"name": "mixed", "io_dtype": "bf16", "tensors": [
    {"name": "ids", "dims": [8, 1, 1, 1], "dtype": "int32"}, {"name": "table", "dims": [20, 16, 1, 1]},
    {"name": "e", "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}],
  "ops": [{"op": "embedding", "name": "embed", "inputs": {"ids": "ids", "table": "table"}, "outputs": {"y": "e"}},
          {"op": "relu", "name": "act", "inputs": {"x": "e"}, "outputs": {"y": "y"}}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  BuildReport report;
  auto plan = build_plan(*g, h200(), BuildOptions{}, &report);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << plan.status().ToString();
  for (const char* part :
       {"[embedding 'embed']", "must be the only op of its graph", "relu 'act'", "a stage of their own"})
    EXPECT_NE(plan.status().message().find(part), std::string::npos) << part << "\n"
                                                                     << plan.status().message();
}

// The graphs fusebox's own kernels take from cuDNN (kernels::faster_native_kernel) only in the
// form they serve; anything else, or a pinned cuDNN engine, goes to cuDNN as before.
TEST(FasterNativeKernel, TakesOnlyItsFormAndYieldsToAPinnedEngine) {
  auto build = [](const std::string& json, const std::string& engine = "") {
    auto spec = parse_graph_json(json);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    BuildOptions o;
    o.engine = engine;
    return build_plan(*g, h200(), o, nullptr);
  };
  auto ln = [](const char* x_dims, const char* s_dims, const char* params, const char* y_extra) {
    return std::string(R"({"name": "ln", "io_dtype": "bf16", "tensors": [{"name": "x", "dims": )") + x_dims +
           R"(}, {"name": "scale", "dims": )" + s_dims + R"(, "dtype": ")" + params +
           R"("}, {"name": "bias", "dims": )" + s_dims + R"(, "dtype": ")" + params + R"("}, {"name": "y")" +
           y_extra + R"(}], "ops": [{"op": "layernorm",
           "name": "ln", "inputs": {"x": "x", "scale": "scale", "bias": "bias"}, "outputs": {"y": "y"}}]})";
  };
  auto native = [](const Result<Plan>& p) { return p.ok() && p->native(); };
  EXPECT_TRUE(native(build(ln("[64, 128]", "[1, 128]", "fp32", ""))));
  EXPECT_FALSE(native(build(ln("[64, 128]", "[1, 128]", "bf16", ""))));  // params of x's dtype: cuDNN is fast
  EXPECT_FALSE(
      native(build(ln("[64, 128]", "[1, 128]", "fp32", R"(, "dtype": "fp32")"))));  // y not x's dtype
  EXPECT_FALSE(native(build(ln("[4, 20000]", "[1, 20000]", "fp32", ""))));          // a row past 16,384
  // The pinned engine: the kernel's own name takes it; any other goes to cuDNN (here deviceless: refused by
  // cuDNN).
  EXPECT_TRUE(native(build(ln("[64, 128]", "[1, 128]", "fp32", ""), "fusebox_layernorm")));
  auto pinned = build(ln("[64, 128]", "[1, 128]", "fp32", ""), "eng0");
  EXPECT_FALSE(native(pinned));
  if (!pinned.ok()) EXPECT_EQ(pinned.status().message().find("fusebox_layernorm"), std::string::npos);
  // Pools: a global average, any dtype -> fusebox_global_avg_pool; any other bf16 pool -> fusebox_pool
  // (cuDNN's fast resample engine is barred for bf16); an fp16 window pool -> cuDNN.
  auto pool = [](const char* op, const char* dtype = "bf16") {
    return std::string(R"({"name": "p", "io_dtype": ")") + dtype +
           R"(", "tensors": [{"name": "x", "dims": [2, 16, 7, 7],
      "layout": "nhwc"}, {"name": "y", "layout": "nhwc"}], "ops": [)" +
           op + "]}";
  };
  auto engine = [](const Result<Plan>& p) { return p.ok() ? p->engine_name() : p.status().ToString(); };
  EXPECT_EQ(
      engine(build(pool(
          R"({"op": "global_avg_pool", "name": "g", "inputs": {"x": "x"}, "outputs": {"y": "y"}})", "fp16"))),
      "fusebox_global_avg_pool");
  EXPECT_EQ(
      engine(build(pool(
          R"({"op": "avg_pool", "name": "g", "window": [7, 7], "inputs": {"x": "x"}, "outputs": {"y": "y"}})"))),
      "fusebox_global_avg_pool");
  EXPECT_EQ(
      engine(build(pool(
          R"({"op": "avg_pool", "name": "g", "window": [3, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})"))),
      "fusebox_pool");
  EXPECT_EQ(
      engine(build(pool(
          R"({"op": "max_pool", "name": "g", "window": [3, 3], "stride": [2, 2], "padding": [1, 1], "inputs": {"x": "x"}, "outputs": {"y": "y"}})"))),
      "fusebox_pool");
  EXPECT_FALSE(native(build(pool(
      R"({"op": "max_pool", "name": "g", "window": [3, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})",
      "fp16"))));
  // A sum keeping the innermost dims: the kernel; keeping an outer dim, or max: cuDNN.
  auto reduce = [](const char* op, const char* y_dtype) {
    return std::string(R"({"name": "r", "io_dtype": "bf16", "tensors": [{"name": "x", "dims": [4, 16, 7, 7],
      "layout": "nhwc"}, {"name": "y", "dtype": ")") +
           y_dtype + R"("}], "ops": [)" + op + "]}";
  };
  EXPECT_TRUE(native(build(reduce(
      R"({"op": "reduce_sum", "name": "r", "reduce_dims": [0, 2, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})",
      "fp32"))));
  EXPECT_FALSE(native(build(reduce(
      R"({"op": "reduce_sum", "name": "r", "reduce_dims": [0, 2, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})",
      "bf16"))));
  EXPECT_FALSE(native(build(reduce(
      R"({"op": "reduce_sum", "name": "r", "reduce_dims": [2, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})",
      "fp32"))));
  EXPECT_FALSE(native(build(reduce(
      R"({"op": "reduce_max", "name": "r", "reduce_dims": [0, 2, 3], "inputs": {"x": "x"}, "outputs": {"y": "y"}})",
      "fp32"))));
  // A pointwise graph (fusebox_pointwise, only when pinned: slower than cuDNN so far):
  // y1 = silu(x) * g, y2 = x + b. Not with an output another op reads, or a broadcast bias of more
  // than one value; not by default.
  auto pw = [](const char* b_dims, const char* y1_extra, const std::string& third) {
    return std::string(
               R"({"name": "pw", "io_dtype": "bf16", "tensors": [{"name": "x", "dims": [4, 6, 8]},)") +
           R"({"name": "g", "dims": [4, 6, 8]}, {"name": "b", "dims": )" + b_dims + R"(}, {"name": "y1")" +
           y1_extra + R"(}, {"name": "y2"}], "ops": [)" +
           R"({"op": "silu", "name": "s", "inputs": {"x": "x"}, "outputs": {"y": "s"}},)" +
           R"({"op": "mul", "name": "m", "inputs": {"a": "s", "b": "g"}, "outputs": {"y": "y1"}},)" + third +
           "]}";
  };
  const std::string add_xb =
      R"({"op": "add", "name": "a", "inputs": {"a": "x", "b": "b"}, "outputs": {"y": "y2"}})";
  const std::string add_y1b =
      R"({"op": "add", "name": "a", "inputs": {"a": "y1", "b": "b"}, "outputs": {"y": "y2"}})";
  const std::string pin = "fusebox_pointwise";
  EXPECT_TRUE(native(build(pw("[4, 6, 8]", "", add_xb), pin)));
  EXPECT_TRUE(native(build(pw("[1, 1, 1]", R"(, "dtype": "fp32")", add_xb), pin)));  // one value, fp32 out
  EXPECT_FALSE(native(build(pw("[1, 1, 8]", "", add_xb), pin)));                     // a broadcast bias
  EXPECT_FALSE(native(build(pw("[4, 6, 8]", "", add_y1b), pin)));                    // y1 read by an op
  EXPECT_FALSE(native(build(pw("[4, 6, 8]", "", add_xb))));                          // not by default
  const std::string one =
      std::string(R"({"name": "pw1", "io_dtype": "bf16", "tensors": [{"name": "x", "dims": [4, 8]},)") +
      R"({"name": "y"}], "ops": [{"op": "silu", "name": "s", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]})";
  EXPECT_TRUE(native(build(one, pin)));
  // The gated-MLP forms run compiled, by default. SwiGLU: y = silu(a) * b, and its backward da = silu_bwd(dy
  // * b, a), db = dy * silu(a), with the ops in any order, a product's operands either way round, the tensors
  // in any order; one 16-bit dtype throughout and whole vectors of 8 elements. Anything else (another
  // formula, fp32, a mixed dtype, 6 * 5 elements) stays pinned-only.
  auto swiglu = [](const char* io, const char* dims, const std::string& tensors, const std::string& ops) {
    std::string t = tensors;
    for (size_t at; (at = t.find("DIMS")) != std::string::npos;) t.replace(at, 4, dims);
    return std::string(R"({"name": "glu", "io_dtype": ")") + io +
           R"(", "intermediate_dtype": "fp32", "tensors": [)" + t + R"(], "ops": [)" + ops + "]}";
  };
  auto op = [](const char* type, const char* inputs, const char* y) {
    return std::string(R"({"op": ")") + type + R"(", "name": ")" + y + R"(", "inputs": {)" + inputs +
           R"(}, "outputs": {"y": ")" + y + R"("}})";
  };
  const std::string fwd_tensors =
      R"({"name": "b", "dims": DIMS}, {"name": "a", "dims": DIMS}, {"name": "y"})";
  const std::string fwd_ops = op("silu", R"("x": "a")", "g") + "," + op("mul", R"("a": "b", "b": "g")", "y");
  EXPECT_TRUE(native(build(swiglu("bf16", "[4, 6, 8]", fwd_tensors, fwd_ops))));
  EXPECT_TRUE(native(build(swiglu("fp16", "[4, 6, 8]", fwd_tensors, fwd_ops))));
  EXPECT_FALSE(native(build(swiglu("fp32", "[4, 6, 8]", fwd_tensors, fwd_ops))));
  EXPECT_FALSE(native(build(swiglu("bf16", "[1, 6, 5]", fwd_tensors, fwd_ops))));
  EXPECT_FALSE(native(
      build(swiglu("bf16", "[4, 6, 8]", fwd_tensors,
                   op("sigmoid", R"("x": "a")", "g") + "," + op("mul", R"("a": "b", "b": "g")", "y")))));
  EXPECT_FALSE(native(build(
      swiglu("bf16", "[4, 6, 8]",
             R"({"name": "b", "dims": DIMS}, {"name": "a", "dims": DIMS}, {"name": "y", "dtype": "fp32"})",
             fwd_ops))));
  const std::string bwd_tensors =
      R"({"name": "dy", "dims": DIMS}, {"name": "b", "dims": DIMS}, {"name": "a", "dims": DIMS}, )"
      R"({"name": "a.grad"}, {"name": "b.grad"})";
  // As `fusebox backward` derives it, and in another order.
  const std::string bwd_ops = op("mul", R"("a": "dy", "b": "b")", "t") + "," +
                              op("silu", R"("x": "a")", "s") + "," +
                              op("mul", R"("a": "dy", "b": "s")", "b.grad") + "," +
                              op("silu_bwd", R"("dy": "t", "x": "a")", "a.grad");
  const std::string bwd_ops2 =
      op("silu", R"("x": "a")", "s") + "," + op("mul", R"("a": "s", "b": "dy")", "b.grad") + "," +
      op("mul", R"("a": "b", "b": "dy")", "t") + "," + op("silu_bwd", R"("dy": "t", "x": "a")", "a.grad");
  EXPECT_TRUE(native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors, bwd_ops))));
  EXPECT_TRUE(native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors, bwd_ops2))));
  // GeGLU (either GELU) the same way; an activation and a backward of two different functions, no.
  auto glu_bwd = [&](const char* act, const char* act_bwd) {
    return op("mul", R"("a": "dy", "b": "b")", "t") + "," + op(act, R"("x": "a")", "s") + "," +
           op("mul", R"("a": "dy", "b": "s")", "b.grad") + "," +
           op(act_bwd, R"("dy": "t", "x": "a")", "a.grad");
  };
  EXPECT_TRUE(
      native(build(swiglu("fp16", "[2, 64, 96]", bwd_tensors, glu_bwd("gelu_tanh", "gelu_tanh_bwd")))));
  EXPECT_TRUE(native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors, glu_bwd("gelu_erf", "gelu_erf_bwd")))));
  EXPECT_FALSE(
      native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors, glu_bwd("gelu_erf", "gelu_tanh_bwd")))));
  EXPECT_TRUE(native(
      build(swiglu("bf16", "[4, 6, 8]", fwd_tensors,
                   op("gelu_tanh", R"("x": "a")", "g") + "," + op("mul", R"("a": "g", "b": "b")", "y")))));
  // silu_bwd's operands the other way round, or silu of the wrong input: another function.
  EXPECT_FALSE(
      native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors,
                          op("mul", R"("a": "dy", "b": "b")", "t") + "," + op("silu", R"("x": "a")", "s") +
                              "," + op("mul", R"("a": "dy", "b": "s")", "b.grad") + "," +
                              op("silu_bwd", R"("dy": "a", "x": "t")", "a.grad")))));
  EXPECT_FALSE(
      native(build(swiglu("bf16", "[2, 64, 96]", bwd_tensors,
                          op("mul", R"("a": "dy", "b": "b")", "t") + "," + op("silu", R"("x": "b")", "s") +
                              "," + op("mul", R"("a": "dy", "b": "s")", "b.grad") + "," +
                              op("silu_bwd", R"("dy": "t", "x": "a")", "a.grad")))));
}

// A paged attention over an FP8 cache (sdpa_fwd with descale_k, descale_v) takes fusebox_sdpa_decode
// by default (cuDNN has no such SDPA), one query row a sequence or several (a prompt); the same op
// over unpaged K and V finds no cuDNN engine and says so by name (deviceless: no GPU reference either).
TEST(FasterNativeKernel, AnFp8CacheDecodeTakesTheDecodeKernel) {
  auto json = [](int sq) {
    const std::string q = "[4, 8, " + std::to_string(sq) + ", 64]";
    return R"({"name": "d", "io_dtype": "bf16", "tensors": [{"name": "q", "dims": )" + q +
           R"(, "layout": "bshd"}, {"name": "k", "dims": [20, 2, 16, 64], "dtype": "fp8_e4m3"},
      {"name": "v", "dims": [20, 2, 16, 64], "dtype": "fp8_e4m3"}, {"name": "dk", "dims": [20, 2, 16, 1], "dtype": "fp32"},
      {"name": "dv", "dims": [1, 1, 1, 1], "dtype": "fp32"}, {"name": "t", "dims": [4, 1, 5, 1], "dtype": "int32"},
      {"name": "lq", "dims": [4, 1, 1, 1], "dtype": "int32"}, {"name": "lkv", "dims": [4, 1, 1, 1], "dtype": "int32"},
      {"name": "o", "layout": "bshd"}], "ops": [{"op": "sdpa_fwd", "name": "attn", "causal": true,
      "alignment": "bottom_right", "inputs": {"q": "q", "k": "k", "v": "v", "descale_k": "dk", "descale_v": "dv",
      "seq_len_q": "lq", "seq_len_kv": "lkv", "page_table_k": "t", "page_table_v": "t"}, "outputs": {"o": "o"}}]})";
  };
  auto build = [](const std::string& text) {
    auto spec = parse_graph_json(text);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return build_plan(*g, h200(), BuildOptions{}, nullptr);
  };
  auto decode = build(json(1));
  ASSERT_TRUE(decode.ok()) << decode.status().ToString();
  EXPECT_EQ(decode->engine_name(), "fusebox_sdpa_decode");
  auto prefill = build(json(3));
  ASSERT_TRUE(prefill.ok()) << prefill.status().ToString();
  EXPECT_EQ(prefill->engine_name(), "fusebox_sdpa_decode");
  EXPECT_EQ(prefill->workspace_bytes(), 0) << "a block per query row takes all its keys";
  // The same prompt over K and V of [batch, KV heads, 40 keys, D]: no page tables.
  std::string unpaged = json(3);
  auto replace_all = [&unpaged](const std::string& from, const std::string& to) {
    for (size_t at = unpaged.find(from); at != std::string::npos; at = unpaged.find(from, at + to.size()))
      unpaged.replace(at, from.size(), to);
  };
  replace_all("[20, 2, 16, 64]", "[4, 2, 40, 64]");
  replace_all("[20, 2, 16, 1]", "[4, 2, 40, 1]");
  replace_all(R"({"name": "t", "dims": [4, 1, 5, 1], "dtype": "int32"},)", "");
  replace_all(R"(, "page_table_k": "t", "page_table_v": "t")", "");
  auto dense = build(unpaged);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.status().message().find("FP8 K/V cache"), std::string::npos) << dense.status().ToString();
}

// A graph whose kernel of fusebox's runs only when pinned (a bf16 paged decode: cuDNN's engine is
// the default) lists that kernel as its last candidate, after cuDNN's, so that `engines` shows it
// and `tune` times it; a pinned cuDNN engine lists no other.
TEST(FasterNativeKernel, APinnedOnlyKernelIsTheLastCandidate) {
  const std::string json = R"({"name": "d", "io_dtype": "bf16", "tensors": [
      {"name": "q", "dims": [4, 8, 1, 64], "layout": "bshd"}, {"name": "k", "dims": [20, 2, 16, 64]},
      {"name": "v", "dims": [20, 2, 16, 64]}, {"name": "t", "dims": [4, 1, 5, 1], "dtype": "int32"},
      {"name": "lq", "dims": [4, 1, 1, 1], "dtype": "int32"}, {"name": "lkv", "dims": [4, 1, 1, 1], "dtype": "int32"},
      {"name": "o", "layout": "bshd"}], "ops": [{"op": "sdpa_fwd", "name": "attn", "causal": true,
      "alignment": "bottom_right", "inputs": {"q": "q", "k": "k", "v": "v", "seq_len_q": "lq",
      "seq_len_kv": "lkv", "page_table_k": "t", "page_table_v": "t"}, "outputs": {"o": "o"}}]})";
  auto spec = parse_graph_json(json);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto listed = list_engines(*g, h200(), BuildOptions{}, false, nullptr);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_GE(listed->size(), 2u);
  const EngineCandidate& last = listed->back();
  EXPECT_EQ(last.name, "fusebox_sdpa_decode");
  EXPECT_TRUE(last.supported);
  EXPECT_EQ(last.index, static_cast<int64_t>(listed->size()) - 1);
  for (size_t i = 0; i + 1 < listed->size(); ++i) EXPECT_NE((*listed)[i].name, "fusebox_sdpa_decode");
  BuildOptions pinned;
  pinned.engine = (*listed)[0].name;
  auto only_cudnn = list_engines(*g, h200(), pinned, false, nullptr);
  ASSERT_TRUE(only_cudnn.ok()) << only_cudnn.status().ToString();
  for (const auto& c : *only_cudnn) EXPECT_NE(c.name, "fusebox_sdpa_decode");
  BuildOptions no_native;
  no_native.native_kernels = false;
  auto without = list_engines(*g, h200(), no_native, false, nullptr);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(without->size(), listed->size() - 1);
}

// A matmul of at most 8 rows, alone or with one pointwise epilogue, takes fusebox_gemv (the serving
// engine's decode GEMMs; fusebox_skinny_gemm for 9 to 64 rows when pinned); more rows, small weights, a
// transposed weight, fp8, two epilogues, an epilogue that is not pointwise on the product, or a pinned cuDNN
// engine: cuDNN.
TEST(FasterNativeKernel, AFewRowMatmulWithItsEpilogueTakesTheGemvKernel) {
  // y = epilogue(a [1, m, k] x w [1, k, n]); `extra` adds tensors, `epi` the ops after the matmul.
  auto gemm = [](int m, int k, int n, const std::string& epi = "", const std::string& extra = "",
                 const char* io = "bf16", const char* w_layout = "", const char* y_fields = "") {
    const std::string out = epi.empty() ? "y" : "z";
    return std::string(R"({"name": "g", "io_dtype": ")") + io +
           R"(", "tensors": [{"name": "a", "dims": [1, )" + std::to_string(m) + ", " + std::to_string(k) +
           R"(]}, {"name": "w", "dims": [1, )" + std::to_string(k) + ", " + std::to_string(n) + "]" +
           w_layout + R"(}, {"name": "y")" + y_fields + "}" + extra +
           R"(], "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "w"}, "outputs": {"y": ")" +
           out + R"("}})" + epi + "]}";
  };
  auto build = [](const std::string& json, const std::string& engine = "") -> std::string {
    auto spec = parse_graph_json(json);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << json;
    if (!spec.ok()) return "";
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << json;
    if (!g.ok()) return "";
    BuildOptions o;
    o.engine = engine;
    auto plan = build_plan(*g, h200(), o, nullptr);
    return plan.ok() ? plan->engine_name() : plan.status().ToString();
  };
  const std::string r = R"(, {"name": "r", "dims": [1, 1, 2048]})";
  const std::string r9 = R"(, {"name": "r9", "dims": [1, 9, 2048]})";
  auto unary = [](const char* op) {
    return std::string(R"(, {"op": ")") + op +
           R"(", "name": "e", "inputs": {"x": "z"}, "outputs": {"y": "y"}})";
  };
  auto binary = [](const char* op, const char* a, const char* b) {
    return std::string(R"(, {"op": ")") + op + R"(", "name": "e", "inputs": {"a": ")" + a + R"(", "b": ")" +
           b + R"("}, "outputs": {"y": "y"}})";
  };
  EXPECT_EQ(build(gemm(1, 2048, 2048)), "fusebox_gemv");
  EXPECT_EQ(build(gemm(8, 2048, 3072)), "fusebox_gemv");
  EXPECT_EQ(build(gemm(3, 1000, 1100, "", "", "fp16")), "fusebox_gemv");  // unaligned sizes: one value a load
  for (const char* act : {"silu", "relu", "gelu_tanh", "gelu_erf", "sigmoid", "tanh"})
    EXPECT_EQ(build(gemm(1, 2048, 2048, unary(act))), "fusebox_gemv") << act;
  EXPECT_EQ(build(gemm(1, 2048, 2048, binary("add", "z", "r"), r)), "fusebox_gemv");
  EXPECT_EQ(build(gemm(1, 2048, 2048, binary("mul", "r", "z"), r)), "fusebox_gemv");
  EXPECT_EQ(build(gemm(1, 2048, 2048, binary("sub", "r", "z"), r)), "fusebox_gemv");
  // The LM head: fp32 logits.
  EXPECT_EQ(build(gemm(1, 2048, 32768, "", "", "bf16", "", R"(, "dtype": "fp32")")), "fusebox_gemv");
  auto native = [](const std::string& engine) { return engine.rfind("fusebox_", 0) == 0; };
  // 9 to 64 rows: cuDNN by default (the tensor-core form measured slower, skinny_gemm.h); pinned,
  // fusebox_skinny_gemm with its epilogues, not past 64 rows nor with sizes not multiples of 8.
  EXPECT_FALSE(native(build(gemm(16, 2048, 2048)))) << "16 rows";
  const std::string skinny = "fusebox_skinny_gemm";
  EXPECT_EQ(build(gemm(16, 2048, 2048), skinny), skinny);
  EXPECT_EQ(build(gemm(64, 2048, 8192, unary("silu")), skinny), skinny);
  EXPECT_EQ(build(gemm(9, 8192, 2048, binary("add", "z", "r9"), r9), skinny), skinny);
  EXPECT_EQ(build(gemm(40, 2048, 2048, "", "", "fp16"), skinny), skinny);
  EXPECT_EQ(build(gemm(64, 512, 512), skinny), skinny) << "small weights";
  EXPECT_FALSE(native(build(gemm(65, 2048, 2048), skinny))) << "65 rows";
  EXPECT_FALSE(native(build(gemm(16, 1000, 1100), skinny))) << "sizes not multiples of 8";
  EXPECT_FALSE(native(build(gemm(1, 64, 64)))) << "small weights";
  EXPECT_FALSE(native(build(gemm(1, 16384, 128)))) << "few columns (one block)";
  EXPECT_FALSE(native(build(gemm(1, 2048, 128256, "", "", "bf16", "", R"(, "dtype": "fp32")"))))
      << "an LM head of 2^28 weights: cuDNN reads it near the copy peak";
  EXPECT_FALSE(native(build(gemm(1, 2048, 2048, "", "", "bf16", R"(, "layout": "col_major")"))))
      << "w transposed";
  EXPECT_FALSE(native(build(gemm(
      1, 2048, 2048,
      R"(, {"op": "silu", "name": "e", "inputs": {"x": "z"}, "outputs": {"y": "s"}}, {"op": "relu", "name": "e2", "inputs": {"x": "s"}, "outputs": {"y": "y"}})"))))
      << "two epilogues";
  EXPECT_FALSE(native(build(gemm(1, 2048, 2048, binary("add", "z", "z"))))) << "z twice";
  // a pinned cuDNN engine: not fusebox's (deviceless, cuDNN may refuse it, which is fine here)
  EXPECT_FALSE(native(build(gemm(1, 2048, 2048), "eng0")));
  EXPECT_EQ(build(gemm(1, 2048, 2048), "fusebox_gemv"), "fusebox_gemv");
  // Pinned (the serving engine's deterministic mode): more rows and any weight size; not past 256 rows.
  EXPECT_EQ(build(gemm(64, 2048, 2048), "fusebox_gemv"), "fusebox_gemv");
  EXPECT_EQ(build(gemm(37, 64, 64), "fusebox_gemv"), "fusebox_gemv");
  EXPECT_EQ(build(gemm(256, 64, 8), "fusebox_gemv"), "fusebox_gemv");
  EXPECT_FALSE(native(build(gemm(257, 64, 64), "fusebox_gemv"))) << "257 rows";

  // An RMSNorm before it (the prologue): x [1, m, k] normalized over k, its y (virtual) the matmul's a.
  auto normed = [](int m, const std::string& norm_fields, const std::string& epi, const char* xn = "",
                   const char* scale_dims = "[1, 1, 2048]") {
    return std::string(R"({"name": "g", "io_dtype": "bf16", "tensors": [{"name": "x", "dims": [1, )") +
           std::to_string(m) + R"(, 2048]}, {"name": "scale", "dims": )" + scale_dims +
           R"(, "dtype": "fp32"}, {"name": "w", "dims": [1, 2048, 8192]}, {"name": "y"})" + xn +
           R"(], "ops": [{"op": "rmsnorm", "name": "n", "inputs": {"x": "x", "scale": "scale"}, "outputs": {"y": "xn")" +
           norm_fields +
           R"(}}, {"op": "matmul", "name": "mm", "inputs": {"a": "xn", "b": "w"}, "outputs": {"y": ")" +
           (epi.empty() ? "y" : "z") + R"("}})" + epi + "]}";
  };
  EXPECT_EQ(build(normed(1, "", "")), "fusebox_gemv");
  EXPECT_EQ(build(normed(8, "", unary("silu"))), "fusebox_gemv");
  EXPECT_FALSE(native(build(normed(16, "", "")))) << "16 rows";
  EXPECT_FALSE(native(build(normed(1, "", "", R"(, {"name": "xn"})")))) << "the normalized x stored";
  EXPECT_FALSE(
      native(build(normed(1, R"(, "inv_variance": "inv")", "", R"(, {"name": "inv", "dtype": "fp32"})"))))
      << "training phase";
  EXPECT_FALSE(native(build(normed(2, "", "", "", "[1, 2, 2048]")))) << "normalized over rows too";

  // Gated (a SwiGLU's gate and up projections): act(a w_gate) * (a w_up), the ops in any order the
  // graph keeps them, with or without the RMSNorm before them.
  auto gated = [](int m, const std::string& ops, const char* w_up_fields = "", const char* extra = "",
                  bool norm = true) {
    return std::string(R"({"name": "g", "io_dtype": "bf16", "tensors": [{"name": ")") + (norm ? "x" : "a") +
           R"(", "dims": [1, )" + std::to_string(m) + R"(, 2048]}, )" +
           (norm ? R"({"name": "scale", "dims": [1, 1, 2048], "dtype": "fp32"}, )" : "") +
           R"({"name": "wg", "dims": [1, 2048, 8192]}, {"name": "wu", "dims": [1, 2048, 8192])" +
           w_up_fields + R"(}, {"name": "y"})" + extra + R"(], "ops": [)" +
           (norm
                ? R"({"op": "rmsnorm", "name": "n", "inputs": {"x": "x", "scale": "scale"}, "outputs": {"y": "a"}}, )"
                : "") +
           ops + "]}";
  };
  const std::string
      mm_g = R"({"op": "matmul", "name": "g", "inputs": {"a": "a", "b": "wg"}, "outputs": {"y": "zg"}})",
      mm_u = R"({"op": "matmul", "name": "u", "inputs": {"a": "a", "b": "wu"}, "outputs": {"y": "zu"}})",
      act = R"({"op": "silu", "name": "s", "inputs": {"x": "zg"}, "outputs": {"y": "sg"}})",
      mul = R"({"op": "mul", "name": "m", "inputs": {"a": "sg", "b": "zu"}, "outputs": {"y": "y"}})",
      mul_rev = R"({"op": "mul", "name": "m", "inputs": {"a": "zu", "b": "sg"}, "outputs": {"y": "y"}})";
  const std::string swiglu = mm_g + ", " + act + ", " + mm_u + ", " + mul;
  EXPECT_EQ(build(gated(1, swiglu)), "fusebox_gemv");
  EXPECT_EQ(build(gated(8, mm_u + ", " + mm_g + ", " + act + ", " + mul_rev)), "fusebox_gemv");
  EXPECT_EQ(build(gated(4, mm_g + ", " + mm_u + ", " + act + ", " + mul)), "fusebox_gemv");
  EXPECT_EQ(build(gated(2, swiglu, "", "", false)), "fusebox_gemv") << "without the norm";
  EXPECT_FALSE(native(build(gated(1, swiglu, R"(, "layout": "col_major")")))) << "w_up transposed";
  EXPECT_FALSE(native(build(gated(1, swiglu, "", R"(, {"name": "sg"})")))) << "the gate's activations stored";
  EXPECT_FALSE(native(build(gated(1, swiglu, "", R"(, {"name": "zu"})")))) << "the up product stored";
  EXPECT_FALSE(native(build(gated(
      1, mm_g + ", " + act + ", " + mm_u +
             R"(, {"op": "add", "name": "m", "inputs": {"a": "sg", "b": "zu"}, "outputs": {"y": "y"}})"))))
      << "add, not mul";
  EXPECT_FALSE(native(build(gated(16, swiglu)))) << "16 rows";
  EXPECT_EQ(build(gated(16, swiglu), "fusebox_gemv"), "fusebox_gemv")
      << "pinned: more rows, in block rows of 4";
}

// The serving engine's GEMM graphs (serve::gemm_graph) as its decode buckets of 1 to 8 rows build
// them: the few-row kernel for each epilogue and the fp32 logits; FP8 weights and 16 rows: cuDNN.
TEST(FasterNativeKernel, TheServingEnginesDecodeGemmsTakeTheGemvKernel) {
  auto engine = [](int64_t n, serve::Epilogue e, bool fp32_out, bool fp8) -> std::string {
    auto g = serve::gemm_graph(n, 2048, 8192, e, fp32_out, fp8);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    if (!g.ok()) return "";
    auto plan = build_plan(g->graph, h200(), BuildOptions{}, nullptr);
    return plan.ok() ? plan->engine_name() : plan.status().ToString();
  };
  using serve::Epilogue;
  for (int64_t n : {1, 2, 4, 8})
    for (Epilogue e : {Epilogue::kNone, Epilogue::kResidual, Epilogue::kSilu, Epilogue::kMul})
      EXPECT_EQ(engine(n, e, false, false), "fusebox_gemv") << n << " rows, epilogue " << static_cast<int>(e);
  EXPECT_EQ(engine(1, Epilogue::kNone, true, false), "fusebox_gemv");
  EXPECT_NE(engine(16, Epilogue::kNone, false, false), "fusebox_gemv");
  EXPECT_NE(engine(1, Epilogue::kNone, false, true), "fusebox_gemv");
  // With the RMSNorm before the GEMM (the decode buckets' QKV, gate, up and logits): one kernel.
  LmModelConfig m;
  m.dim = 2048;
  for (int64_t n : {1, 8})
    for (auto [e, fp32_out] : {std::pair{Epilogue::kNone, false}, std::pair{Epilogue::kSilu, false},
                               std::pair{Epilogue::kMul, false}, std::pair{Epilogue::kNone, true}}) {
      auto g = serve::normed_gemm_graph(m, n, 2048, 8192, e, fp32_out);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      auto plan = build_plan(g->graph, h200(), BuildOptions{}, nullptr);
      EXPECT_EQ(plan.ok() ? plan->engine_name() : plan.status().ToString(), "fusebox_gemv") << g->key;
    }
  // The SwiGLU's gate and up projections as one graph (serve::normed_swiglu_graph): the gated form.
  for (int64_t n : {1, 2, 4, 8}) {
    auto g = serve::normed_swiglu_graph(m, n, 2048, 8192);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto plan = build_plan(g->graph, h200(), BuildOptions{}, nullptr);
    EXPECT_EQ(plan.ok() ? plan->engine_name() : plan.status().ToString(), "fusebox_gemv") << g->key;
  }
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Sweep seed 6121 (tests/cases/no-engine/sdpa_fwd_sliding_window_sq_gt_skv_keep_mask.json): an
// attention forward cuDNN 9.19 refuses (a sliding window with more queries than keys) that asks
// for its dropout keep-mask at dropout 0. The reference kernels now take it (every element kept:
// the mask is all ones), so the session's last resort runs it; a mask of any other probability
// still needs cuDNN's generator and is refused, naming the op.
TEST(ReferenceKernelBuild, TakesAKeepMaskOfDropoutZeroOnly) {
  auto g =
      load(testing::source_dir() + "/tests/cases/no-engine/sdpa_fwd_sliding_window_sq_gt_skv_keep_mask.json");
  BuildOptions pinned;
  pinned.engine = "fusebox_reference";
  auto plan = build_plan(g, h200(), pinned, nullptr, nullptr);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->engine_name(), "fusebox_reference");
  for (ResolvedOp& op : g.ops)
    if (auto* a = std::get_if<SdpaFwdAttrs>(&op.attrs)) a->dropout = 0.1;
  auto refused = build_plan(g, h200(), pinned, nullptr, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(refused.status().message().find("op 'attn' draws a dropout mask"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Quantize ops after a compiled pointwise form (FP8 training's casts fused into the stage that
// computes their input) take fusebox_pointwise_quantize, deviceless as on a GPU; quantize after any
// other pointwise graph is refused as "not supported", so that the session splits the graph into parts.
TEST(NativeKernel, CastsAfterAPointwiseFormTakeThePointwiseQuantizeKernel) {
  for (const char* name : {"swiglu_fp8_cast", "swiglu_bwd_fp8_cast", "small/swiglu_bwd_fp8_cast_small",
                           "small/add_fp8_cast_small"}) {
    const ResolvedGraph g = load(testing::source_dir() + "/examples/graphs/" + name + ".json");
    auto plan = build_plan(g, h200(), BuildOptions{}, nullptr);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().ToString();
    EXPECT_EQ(plan->engine_name(), "fusebox_pointwise_quantize") << name;
  }
  auto build = [](const std::string& op, const std::string& y_decl) {
    auto spec = parse_graph_json(R"({"name": "q", "io_dtype": "bf16", "tensors": [
      {"name": "a", "dims": [1, 64, 64]}, {"name": "b", "dims": [1, 64, 64]}, {"name": "r", "virtual": true},
      {"name": "scale", "dims": [1, 1, 1], "dtype": "fp32"}, )" +
                                 y_decl + R"(],
      "ops": [)" + op + R"(, {"op": "quantize", "name": "cast", "inputs": {"x": "r", "scale": "scale"},
      "outputs": {"y": "y8"}}]})");
    EXPECT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString();
    return build_plan(*g, h200(), BuildOptions{}, nullptr);
  };
  const std::string add =
      R"({"op": "add", "name": "s", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "r"}})";
  const std::string sub =
      R"({"op": "sub", "name": "s", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "r"}})";
  const std::string flat = R"({"name": "y8", "dtype": "fp8_e4m3"})";
  EXPECT_TRUE(build(add, flat).ok());
  // Not a form, or a copy neither in the form's layout nor transposed: not supported (parts).
  for (const auto& [op, y] :
       {std::pair{sub, flat},
        std::pair{add, std::string(R"({"name": "y8", "dtype": "fp8_e4m3", "dims": [1, 64, 64],
                                                             "strides": [8192, 128, 1]})")}}) {
    auto p = build(op, y);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), StatusCode::kNotSupported) << p.status().ToString();
    EXPECT_NE(p.status().message().find("[quantize 'cast']"), std::string::npos) << p.status().ToString();
  }
}

}  // namespace
}  // namespace fusebox
