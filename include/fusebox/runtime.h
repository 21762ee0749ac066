// fusebox: running a plan on a GPU with managed buffers and workspace,
// verifying it against the references and timing it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

struct RunOptions {
  uint64_t seed = 1;
  // Graph inputs given by the caller (others are random from `seed`).
  std::map<std::string, HostTensor> inputs;
  bool verify = false;
  // Above this many FLOPs the GPU reference is used instead of the CPU one.
  double cpu_reference_max_flops = 2e9;
  int warmup = 10;
  int iters = 50;  // 0: run once, no timing
  // Timed runs rotate through copies of the inputs totalling > 2x the L2
  // cache, so small problems are not timed out of a warm cache.
  bool rotate_inputs = true;
};

struct LatencyStats {
  int iters = 0;
  double median_ms = 0, min_ms = 0, p90_ms = 0, mean_ms = 0;
};

struct RunResult {
  std::string engine;
  int64_t workspace_bytes = 0;
  std::map<std::string, HostTensor> outputs;  // device results, as the graph lays them out
  std::map<std::string, HostTensor> inputs;   // what was fed in
  std::vector<Comparison> comparisons;        // when verified
  std::string reference_kind;                 // "cpu" or "gpu"
  bool verified_ok = true;
  LatencyStats latency;
  int input_sets = 1;  // input copies rotated through while timing
  double tflops = 0;  // graph flops / median
  double gbps = 0;    // non-virtual bytes / median
};

// Runs `plan` for `g` on ctx's GPU: uploads inputs, poisons outputs with NaN,
// allocates the workspace, executes, downloads, verifies, times.
// A verification mismatch is reported in RunResult (verified_ok = false) and
// as a kVerificationFailed status by verify_status().
Result<RunResult> run_plan(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx, const RunOptions& options);

Status verify_status(const RunResult& r);

}  // namespace fusebox
