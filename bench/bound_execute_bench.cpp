// Host overhead of one execute: a BoundPlan against the bare cuDNN backend
// call (cudnnBackendExecute on the same execution plan and variant pack) and
// the unbound Plan::execute (name lookups, the frontend's per-call variant
// pack), in one process, on one tiny graph. Median nanoseconds per call of
// the host call only; the stream is drained between batches, outside timing.
// Then the same plan 100 times in one CUDA graph (fusebox/cuda_graph.h): host
// and GPU cost per execute replayed, next to 100 eager bound executes.
//
// Then (issue #11) a chain of 10 conv+bias+relu 3x3 layers (NHWC bf16, 64
// channels, 56x56, batch 1 and 8; each layer's output the next one's input;
// one Session and arena): eager BoundPlan launches against one CUDA graph of
// the 10 plans. GPU time: `--calls` forwards back to back between two CUDA
// events, divided by the calls, `--samples` times; latency: one forward, host
// clock until the stream is synchronized, `--samples` times. Medians.
//
//   build/bound_execute_bench [GRAPH.json] [--iters N] [--rounds R] [--calls C] [--samples S]
//                             [--no-chain] [--json FILE]
//
// --json FILE: the results as one JSON document (fusebox_tools.bench.bench_run --part runtime).
// Needs a GPU; without one it says so and exits 0.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fusebox/cuda_graph.h"
#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

using namespace fusebox;

namespace {

int die(const std::string& what, const Status& st) {
  std::fprintf(stderr, "bound_execute_bench: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// Per-call host times (ns) of `call`, `iters` calls per round, the stream
// drained after each batch of 64 (never timed).
std::vector<double> time_calls(const std::function<bool()>& call, void* stream, int iters) {
  std::vector<double> ns;
  ns.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const bool ok = call();
    const auto t1 = std::chrono::steady_clock::now();
    if (!ok) return {};
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    if (i % 64 == 63) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  }
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return ns;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// GPU time (ms) of `calls` back-to-back `call`s between two events, divided by `calls`, `samples` times.
std::vector<double> gpu_samples(const std::function<bool()>& call, cudaStream_t stream, int calls,
                                int samples) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> out;
  for (int s = 0; s < samples; ++s) {
    cudaEventRecord(e0, stream);
    for (int i = 0; i < calls; ++i) {
      if (!call()) return {};
    }
    cudaEventRecord(e1, stream);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    out.push_back(static_cast<double>(ms) / calls);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return out;
}

// Host time (ms) of one `call` until the stream is synchronized, `samples` times.
std::vector<double> latency_samples(const std::function<bool()>& call, cudaStream_t stream, int samples) {
  cudaStreamSynchronize(stream);
  std::vector<double> out;
  for (int s = 0; s < samples; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!call()) return {};
    cudaStreamSynchronize(stream);
    out.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return out;
}

// Device buffers for every non-virtual tensor of `g`, inputs from make_inputs(seed).
bool upload_inputs(const ResolvedGraph& g, uint64_t seed, std::map<std::string, void*>& out,
                   std::vector<void*>& owned) {
  auto inputs = make_inputs(g, seed);
  if (!inputs.ok()) {
    std::fprintf(stderr, "bound_execute_bench: inputs: %s\n", inputs.status().ToString().c_str());
    return false;
  }
  for (const auto& t : g.tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    void* p = nullptr;
    const size_t n = static_cast<size_t>(std::max<int64_t>(t.storage_bytes(), 256));
    if (cudaMalloc(&p, n) != cudaSuccess) return false;
    owned.push_back(p);
    auto it = inputs->find(t.name);
    if (it != inputs->end()) {
      cudaMemcpy(p, it->second.data.data(), it->second.data.size(), cudaMemcpyHostToDevice);
    } else {
      cudaMemset(p, 0, n);
    }
    out[t.name] = p;
  }
  return true;
}

nlohmann::json side(const std::vector<double>& gpu_ms, const std::vector<double>& latency_ms) {
  return {{"gpu_ms", gpu_ms}, {"latency_ms", latency_ms}};
}

// Runs `eager`, keeps the `bytes` at `out`, poisons them, runs `replay`: *same says whether the
// replay wrote the same bytes. False when a run fails.
bool same_bytes(const std::function<bool()>& eager, const std::function<bool()>& replay, void* out,
                size_t bytes, cudaStream_t stream, bool* same) {
  std::vector<uint8_t> a(bytes), c(bytes);
  if (!eager()) return false;
  cudaStreamSynchronize(stream);
  cudaMemcpy(a.data(), out, bytes, cudaMemcpyDeviceToHost);
  cudaMemsetAsync(out, 0xFF, bytes, stream);
  if (!replay()) return false;
  cudaStreamSynchronize(stream);
  cudaMemcpy(c.data(), out, bytes, cudaMemcpyDeviceToHost);
  *same = a == c;
  return true;
}

// The graph tuned inside CUDA graphs (`tune --cuda-graph`): the engine whose execute is fastest
// when replayed, which for small graphs need not be the heuristics' choice. No plan cache.
Result<Plan> tuned_in_graph(Session& session, const ResolvedGraph& g, double* tune_ms) {
  TunePolicy policy;
  policy.cuda_graph = true;
  policy.warmup = 3;
  policy.iters = 20;
  auto t = session.tune(g, policy);
  if (!t.ok()) return t.status();
  *tune_ms = t->result.tuning_ms;
  return std::move(t->plan);
}

// One layer of the chain: conv 3x3 (padding 1) + bias + relu, NHWC bf16.
ResolvedGraph chain_layer(int64_t batch, int64_t channels, int64_t hw) {
  GraphSpec s;
  s.name = "conv3x3_bias_relu_c" + std::to_string(channels) + "_" + std::to_string(hw) + "_b" +
           std::to_string(batch);
  s.io_dtype = DType::kBF16;
  s.tensor("x", {batch, channels, hw, hw}, "nhwc");
  s.tensor("w", {channels, channels, 3, 3}, "nhwc");
  s.tensor("b", {1, channels, 1, 1}, "nhwc");
  const std::string y =
      s.pointwise("act", PointwiseMode::kRelu,
                  s.pointwise("bias", PointwiseMode::kBiasAdd,
                              s.conv_fprop("conv", "x", "w", {{1, 1}, {1, 1}, {1, 1}}), "b"));
  s.output(y, "nhwc");
  auto g = resolve(s);
  if (!g.ok()) {
    std::fprintf(stderr, "bound_execute_bench: chain layer: %s\n", g.status().ToString().c_str());
    std::exit(1);
  }
  return *g;
}

// The 10-layer chain at one batch size: eager launches against one CUDA graph.
bool bench_chain(Session& session, int64_t batch, int layers, int calls, int samples, nlohmann::json& out) {
  const int64_t channels = 64, hw = 56;
  ResolvedGraph g = chain_layer(batch, channels, hw);
  PlanReport rep;
  auto plan = session.get_plan(g, {}, &rep);
  if (!plan.ok()) {
    std::fprintf(stderr, "bound_execute_bench: chain plan: %s\n", plan.status().ToString().c_str());
    return false;
  }
  const std::string y = g.tensors[g.output_tensors().front()].name;
  std::vector<void*> owned;
  std::vector<std::map<std::string, void*>> layer_bufs(layers);
  std::vector<BoundPlan> bound;
  for (int i = 0; i < layers; ++i) {
    if (!upload_inputs(g, 100 + i, layer_bufs[i], owned)) return false;
    if (i > 0) layer_bufs[i]["x"] = layer_bufs[i - 1][y];  // fed by the layer before
    auto b = session.bind(*plan, layer_bufs[i]);
    if (!b.ok()) {
      std::fprintf(stderr, "bound_execute_bench: chain bind: %s\n", b.status().ToString().c_str());
      return false;
    }
    bound.push_back(std::move(*b));
  }
  std::vector<BoundPlan*> steps;
  for (auto& b : bound) steps.push_back(&b);
  auto cg = CudaGraph::create(steps);
  if (!cg.ok()) {
    std::fprintf(stderr, "bound_execute_bench: chain CUDA graph: %s\n", cg.status().ToString().c_str());
    return false;
  }
  auto stream = static_cast<cudaStream_t>(session.context()->stream());
  auto eager = [&] {
    for (auto& b : bound) {
      if (!b.execute().ok()) return false;
    }
    return true;
  };
  auto replay = [&] { return cg->launch().ok(); };
  // Warm-up, and the two must agree bit for bit.
  const size_t ny = static_cast<size_t>(g.tensors[g.output_tensors().front()].storage_bytes());
  void* last = layer_bufs[layers - 1][y];
  bool identical = false;
  if (!same_bytes(eager, replay, last, ny, stream, &identical)) return false;
  for (int i = 0; i < 10; ++i) {
    if (!eager() || !replay()) return false;
  }
  // Interleaved, so drift hits both alike.
  std::vector<double> eg, el, gg, gl;
  for (int s = 0; s < samples; ++s) {
    auto v = gpu_samples(eager, stream, calls, 1);
    auto w = gpu_samples(replay, stream, calls, 1);
    auto x = latency_samples(eager, stream, 1);
    auto z = latency_samples(replay, stream, 1);
    if (v.empty() || w.empty() || x.empty() || z.empty()) return false;
    eg.push_back(v[0]);
    gg.push_back(w[0]);
    el.push_back(x[0]);
    gl.push_back(z[0]);
  }
  nlohmann::json recordings = nlohmann::json::array();
  for (const auto& st : cg->steps()) recordings.push_back(std::string(graph_recording_name(st.recording)));
  out = {{"name", "conv3x3_chain" + std::to_string(layers) + "_b" + std::to_string(batch)},
         {"batch", batch},
         {"layers", layers},
         {"channels", channels},
         {"hw", hw},
         {"dtype", "bf16"},
         {"layout", "nhwc"},
         {"engine", plan->engine_name()},
         {"plan", rep.source_text()},
         {"recordings", recordings},
         {"why_not_native", cg->steps()[0].why_not_native},
         {"bit_identical", identical},
         {"calls_per_sample", calls},
         {"flops", g.flops() * layers},
         {"fusebox", {{"eager", side(eg, el)}, {"cuda_graph", side(gg, gl)}}}};
  std::printf(
      "chain of %d conv+bias+relu 3x3 (64 ch, 56x56, bf16 NHWC), batch %lld, engine %s, recording %s%s\n",
      layers, static_cast<long long>(batch), plan->engine_name().c_str(),
      std::string(graph_recording_name(cg->steps()[0].recording)).c_str(),
      identical ? "" : " -- OUTPUTS DIFFER FROM EAGER");
  std::printf("  %-28s %12s %12s\n", "per forward (10 layers)", "GPU us", "latency us");
  std::printf("  %-28s %12.1f %12.1f\n", "eager BoundPlan launches", median(eg) * 1e3, median(el) * 1e3);
  std::printf("  %-28s %12.1f %12.1f\n", "CUDA graph replay", median(gg) * 1e3, median(gl) * 1e3);
  std::printf("  eager / replay: GPU time %.2fx, latency %.2fx (issue #11 target: >= 2x)\n",
              median(eg) / median(gg), median(el) / median(gl));
  // The same chain with the layer's engine tuned inside CUDA graphs, replayed (its outputs
  // against its own eager run: another engine may round differently from the heuristic one).
  double tune_ms = 0;
  auto tuned = tuned_in_graph(session, g, &tune_ms);
  bool tuned_identical = true;
  if (!tuned.ok()) {
    out["tuned_in_graph"] = {{"error", tuned.status().ToString()}};
  } else if (tuned->engine_name() == plan->engine_name()) {
    out["tuned_in_graph"] = {
        {"engine", tuned->engine_name()}, {"same_as_heuristic", true}, {"tune_ms", tune_ms}};
    std::printf("  tuned in a CUDA graph: %s, the heuristics' engine\n", tuned->engine_name().c_str());
  } else {
    std::vector<BoundPlan> tb;
    for (int i = 0; i < layers; ++i) {
      auto b = session.bind(*tuned, layer_bufs[i]);
      if (!b.ok()) return false;
      tb.push_back(std::move(*b));
    }
    std::vector<BoundPlan*> tsteps;
    for (auto& b : tb) tsteps.push_back(&b);
    auto tcg = CudaGraph::create(tsteps);
    if (!tcg.ok()) {
      std::fprintf(stderr, "bound_execute_bench: tuned chain CUDA graph: %s\n",
                   tcg.status().ToString().c_str());
      return false;
    }
    auto teager = [&] {
      for (auto& b : tb) {
        if (!b.execute().ok()) return false;
      }
      return true;
    };
    auto treplay = [&] { return tcg->launch().ok(); };
    if (!same_bytes(teager, treplay, last, ny, stream, &tuned_identical)) return false;
    for (int i = 0; i < 10; ++i) {
      if (!treplay()) return false;
    }
    std::vector<double> tg, tl;
    for (int s = 0; s < samples; ++s) {
      auto w = gpu_samples(treplay, stream, calls, 1);
      auto z = latency_samples(treplay, stream, 1);
      if (w.empty() || z.empty()) return false;
      tg.push_back(w[0]);
      tl.push_back(z[0]);
    }
    out["tuned_in_graph"] = {{"engine", tuned->engine_name()},
                             {"same_as_heuristic", false},
                             {"tune_ms", tune_ms},
                             {"bit_identical", tuned_identical},
                             {"cuda_graph", side(tg, tl)}};
    std::printf("  %-28s %12.1f %12.1f  (%s, tuned in a CUDA graph%s)\n", "CUDA graph replay, tuned",
                median(tg) * 1e3, median(tl) * 1e3, tuned->engine_name().c_str(),
                tuned_identical ? "" : " -- OUTPUTS DIFFER FROM ITS EAGER RUN");
    *tcg = CudaGraph();
  }
  *cg = CudaGraph();  // before the plans it records
  bound.clear();
  for (void* p : owned) cudaFree(p);
  return identical && tuned_identical;
}

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path =
      std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/conv_bias_relu_small.json";
  int iters = 2000, rounds = 5, calls = 50, samples = 10;
  bool chain = true;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(64, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--calls") && i + 1 < argc) {
      calls = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--samples") && i + 1 < argc) {
      samples = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--no-chain")) {
      chain = false;
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr,
                   "usage: %s [GRAPH.json] [--iters N] [--rounds R] [--calls C] [--samples S] [--no-chain] "
                   "[--json FILE]\n",
                   argv[0]);
      return 2;
    } else {
      graph_path = argv[i];
    }
  }
  if (gpu_count() == 0) {
    std::printf(
        "bound_execute_bench: skipped: no CUDA GPU visible (this benchmark times executions on a GPU)\n");
    return 0;
  }
  auto spec = load_graph_file(graph_path);
  if (!spec.ok()) return die(graph_path, spec.status());
  auto g = resolve(*spec);
  if (!g.ok()) return die(graph_path, g.status());
  auto session = Session::create();
  if (!session.ok()) return die("session", session.status());
  PlanReport rep;
  auto plan = (*session)->get_plan(*g, {}, &rep);
  if (!plan.ok()) return die("plan", plan.status());

  std::map<std::string, void*> buffers;
  std::vector<void*> owned;
  if (!upload_inputs(*g, 1, buffers, owned)) return 1;
  auto bound = (*session)->bind(*plan, buffers);
  if (!bound.ok()) return die("bind", bound.status());
  void* workspace = nullptr;
  if (plan->workspace_bytes() > 0) cudaMalloc(&workspace, plan->workspace_bytes());
  GpuContext& ctx = *(*session)->context();
  void* stream = ctx.stream();

  auto handle = static_cast<cudnnHandle_t>(bound->cudnn_handle());
  auto backend_plan = static_cast<cudnnBackendDescriptor_t>(bound->backend_plan());
  auto pack = static_cast<cudnnBackendDescriptor_t>(bound->backend_variant_pack());
  std::printf("graph %s (%s), engine %s, workspace %lld B, plan %s, bound path: %s\n", g->name.c_str(),
              graph_path.c_str(), plan->engine_name().c_str(),
              static_cast<long long>(plan->workspace_bytes()), rep.source_text().c_str(),
              bound->direct() ? "direct (prebuilt variant pack)" : "frontend pointer array");

  struct Row {
    const char* name;
    std::function<bool()> call;
    std::vector<double> ns;
  };
  std::vector<Row> rows;
  rows.push_back({"BoundPlan::execute", [&] { return bound->execute().ok(); }, {}});
  if (bound->direct()) {
    rows.push_back({"cudnnBackendExecute (bare)",
                    [&] { return cudnnBackendExecute(handle, backend_plan, pack) == CUDNN_STATUS_SUCCESS; },
                    {}});
  }
  rows.push_back(
      {"Plan::execute (unbound)", [&] { return plan->execute(ctx, buffers, workspace).ok(); }, {}});
  // The same execute recorded once as a CUDA graph of one step and launched: the host's cost for
  // a caller that replays single plans instead of calling the backend each time.
  auto one = CudaGraph::create({&*bound});
  if (!one.ok()) return die("CUDA graph of one execute", one.status());
  rows.push_back({"CudaGraph::launch (one execute)", [&] { return one->launch().ok(); }, {}});
  // Warm-up (loads the kernels), then rounds interleaved so drift hits every row alike.
  for (auto& r : rows) {
    if (time_calls(r.call, stream, 64).empty()) {
      std::fprintf(stderr, "bound_execute_bench: %s failed\n", r.name);
      return 1;
    }
  }
  for (int round = 0; round < rounds; ++round) {
    for (auto& r : rows) {
      auto ns = time_calls(r.call, stream, iters);
      if (ns.empty()) {
        std::fprintf(stderr, "bound_execute_bench: %s failed\n", r.name);
        return 1;
      }
      r.ns.insert(r.ns.end(), ns.begin(), ns.end());
    }
  }
  std::printf("%-30s %14s %14s\n", "call", "median ns", "calls");
  for (const auto& r : rows) std::printf("%-30s %14.0f %14zu\n", r.name, median(r.ns), r.ns.size());
  nlohmann::json host = {{"graph", g->name},
                         {"engine", plan->engine_name()},
                         {"bound_path", bound->direct() ? "direct" : "frontend"},
                         {"rows", nlohmann::json::array()}};
  for (const auto& r : rows)
    host["rows"].push_back({{"call", r.name}, {"host_ns", median(r.ns)}, {"calls", r.ns.size()}});
  if (bound->direct()) {
    const double ratio = median(rows[0].ns) / median(rows[1].ns);
    std::printf("bound / bare: %.3f (issue #11 target: <= 1.2)\n", ratio);
    host["bound_over_bare"] = ratio;
  }

  // The same plan 100 times in one CUDA graph: cost per execute replayed.
  const int in_graph = 100;
  std::vector<BoundPlan*> hundred(in_graph, &*bound);
  auto cg = CudaGraph::create(hundred);
  if (!cg.ok()) return die("CUDA graph of " + std::to_string(in_graph) + " executes", cg.status());
  auto cstream = static_cast<cudaStream_t>(stream);
  auto replay = [&] { return cg->launch().ok(); };
  auto eager100 = [&] {
    for (int i = 0; i < in_graph; ++i) {
      if (!bound->execute().ok()) return false;
    }
    return true;
  };
  for (int i = 0; i < 5; ++i) {
    if (!replay() || !eager100()) return die("warm-up", Status(StatusCode::kInternal, "launch failed"));
  }
  cudaStreamSynchronize(cstream);
  // Host: one launch of the graph (the stream drained after each, outside timing).
  std::vector<double> launch_ns;
  for (int i = 0; i < std::max(64, iters / 20); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!replay()) return die("launch", Status(StatusCode::kInternal, "launch failed"));
    launch_ns.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    cudaStreamSynchronize(cstream);
  }
  std::vector<double> graph_gpu, eager_gpu;
  for (int r = 0; r < std::max(rounds, 5); ++r) {
    auto a = gpu_samples(replay, cstream, 1, 1);
    auto b = gpu_samples(eager100, cstream, 1, 1);
    if (a.empty() || b.empty())
      return die("CUDA graph timing", Status(StatusCode::kInternal, "launch failed"));
    graph_gpu.push_back(a[0] * 1e6 / in_graph);  // ns per execute
    eager_gpu.push_back(b[0] * 1e6 / in_graph);
  }
  const auto& steps = cg->steps();
  std::printf("CUDA graph of %d executes (%s recording%s%s):\n", in_graph,
              std::string(graph_recording_name(steps[0].recording)).c_str(),
              steps[0].why_not_native.empty() ? "" : ": ", steps[0].why_not_native.c_str());
  std::printf("%-44s %14s\n", "per execute", "median ns");
  std::printf("%-44s %14.0f\n", "host: cudaGraphLaunch / 100", median(launch_ns) / in_graph);
  std::printf("%-44s %14.0f\n", "GPU: graph replay / 100", median(graph_gpu));
  std::printf("%-44s %14.0f\n", "GPU: 100 eager BoundPlan::execute / 100", median(eager_gpu));
  std::printf("replay per graph: %.2f us on the GPU (issue #11 target: <= 2 us)\n", median(graph_gpu) / 1e3);
  host["cuda_graph"] = {{"executes_per_graph", in_graph},
                        {"recording", std::string(graph_recording_name(steps[0].recording))},
                        {"why_not_native", steps[0].why_not_native},
                        {"launch_host_ns_per_execute", median(launch_ns) / in_graph},
                        {"replay_gpu_ns_per_execute", median(graph_gpu)},
                        {"eager_gpu_ns_per_execute", median(eager_gpu)},
                        {"replay_gpu_ns_samples", graph_gpu},
                        {"eager_gpu_ns_samples", eager_gpu}};
  *cg = CudaGraph();

  // The engine fastest when replayed (tune --cuda-graph), in the same graph of 100 executes.
  double tune_ms = 0;
  auto tuned = tuned_in_graph(**session, *g, &tune_ms);
  if (!tuned.ok()) {
    host["cuda_graph_tuned"] = {{"error", tuned.status().ToString()}};
    std::fprintf(stderr, "bound_execute_bench: tune in a CUDA graph: %s\n",
                 tuned.status().ToString().c_str());
  } else {
    auto tb = (*session)->bind(*tuned, buffers);
    if (!tb.ok()) return die("bind of the tuned plan", tb.status());
    auto tcg = CudaGraph::create(std::vector<BoundPlan*>(in_graph, &*tb));
    if (!tcg.ok()) return die("CUDA graph of the tuned plan", tcg.status());
    auto treplay = [&] { return tcg->launch().ok(); };
    for (int i = 0; i < 5; ++i) {
      if (!treplay()) return die("warm-up", Status(StatusCode::kInternal, "launch failed"));
    }
    std::vector<double> tuned_gpu;
    for (int r = 0; r < std::max(rounds, 5); ++r) {
      auto a = gpu_samples(treplay, cstream, 1, 1);
      if (a.empty()) return die("CUDA graph timing", Status(StatusCode::kInternal, "launch failed"));
      tuned_gpu.push_back(a[0] * 1e6 / in_graph);
    }
    std::printf("%-44s %14.0f  (%s, tuned in a CUDA graph in %.0f ms)\n",
                "GPU: graph replay / 100, tuned engine", median(tuned_gpu), tuned->engine_name().c_str(),
                tune_ms);
    host["cuda_graph_tuned"] = {{"engine", tuned->engine_name()},
                                {"tune_ms", tune_ms},
                                {"replay_gpu_ns_per_execute", median(tuned_gpu)},
                                {"replay_gpu_ns_samples", tuned_gpu}};
    *tcg = CudaGraph();
  }

  nlohmann::json doc = {{"host_overhead", host}, {"chain", nlohmann::json::array()}};
  bool ok = true;
  if (chain) {
    for (int64_t batch : {1, 8}) {
      nlohmann::json row;
      ok = bench_chain(**session, batch, 10, calls, samples, row) && ok;
      if (!row.is_null()) doc["chain"].push_back(row);
    }
  }
  for (void* p : owned) cudaFree(p);
  if (workspace) cudaFree(workspace);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << doc.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "bound_execute_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  if (!ok)
    std::fprintf(stderr, "bound_execute_bench: a chain failed or its CUDA graph differed from eager\n");
  return ok ? 0 : 1;
}
