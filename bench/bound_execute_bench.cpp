// Host overhead of one execute: a BoundPlan against the bare cuDNN backend
// call (cudnnBackendExecute on the same execution plan and variant pack) and
// the unbound Plan::execute (name lookups, the frontend's per-call variant
// pack), in one process, on one tiny graph. Median nanoseconds per call of
// the host call only; the stream is drained between batches, outside timing.
//
//   build/bound_execute_bench [GRAPH.json] [--iters N] [--rounds R]
//
// Needs a GPU; without one it says so and exits 0.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
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

}  // namespace

int main(int argc, char** argv) {
  std::string graph_path =
      std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/conv_bias_relu_small.json";
  int iters = 2000, rounds = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(64, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [GRAPH.json] [--iters N] [--rounds R]\n", argv[0]);
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
  for (const auto& t : g->tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<int64_t>(t.storage_bytes(), 256)) != cudaSuccess) {
      std::fprintf(stderr, "bound_execute_bench: cudaMalloc failed\n");
      return 1;
    }
    cudaMemset(p, 0, std::max<int64_t>(t.storage_bytes(), 256));
    buffers[t.name] = p;
  }
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
  if (bound->direct()) {
    const double ratio = median(rows[0].ns) / median(rows[1].ns);
    std::printf("bound / bare: %.3f (issue #11 target: <= 1.2)\n", ratio);
  }
  for (auto& [name, p] : buffers) cudaFree(p);
  if (workspace) cudaFree(workspace);
  return 0;
}
