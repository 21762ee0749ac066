// fusebox: autotuning: build every admissible candidate plan, time each on
// the GPU, verify the winner, rank them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"
#include "fusebox/status.h"

namespace fusebox {

struct TunePolicy {
  std::vector<HeuristicMode> heuristics{HeuristicMode::kA, HeuristicMode::kB, HeuristicMode::kFallback};
  int warmup = 5;
  int iters = 20;
  int64_t max_workspace_bytes = -1;        // -1: no limit
  bool deterministic_only = false;         // drop NONDETERMINISTIC candidates
  bool allow_runtime_compilation = true;   // false: drop RUNTIME_COMPILATION candidates
  int top_k = 0;                           // >0: time only the first K admissible candidates
  double budget_ms = 0;                    // >0: stop timing once this much wall time is spent
  uint64_t seed = 1;
  bool verify_winner = true;
};

struct TuneEntry {
  EngineCandidate candidate;
  bool admissible = true;   // passed the policy's filters
  std::string skipped_why;  // filter, support check, build or execution failure
  bool timed = false;
  LatencyStats latency;
  bool heuristic_choice = false;  // the first supported candidate: what build_plan would pick
};

struct TuneResult {
  std::vector<TuneEntry> entries;  // timed ones first, fastest first; then the rest in candidate order
  int winner = -1;                 // index into entries
  int heuristic = -1;              // index into entries of the heuristic choice, if timed
  double speedup_over_heuristic = 0;
  double tuning_ms = 0;  // whole tune wall time
  int input_sets = 1;
  double flops = 0;  // the graph's useful work with the tuning inputs (sequence lengths)
  BuildReport report;
  Plan winner_plan;
  RunResult winner_run;  // the verification run of the winner
};

using TuneProgress = std::function<void(int done, int total, const std::string& engine)>;

// `ctx`'s GPU is the target. An error only when nothing could be timed.
Result<TuneResult> tune(const ResolvedGraph& g, GpuContext& ctx, const TunePolicy& policy,
                        const TuneProgress& progress = nullptr);

}  // namespace fusebox
