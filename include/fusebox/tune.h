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
  int64_t max_workspace_bytes = -1;       // -1: no limit
  bool deterministic_only = false;        // drop NONDETERMINISTIC candidates
  bool allow_runtime_compilation = true;  // false: drop RUNTIME_COMPILATION candidates
  int top_k = 0;                          // >0: time only the first K admissible candidates
  double budget_ms = 0;  // >0: stop timing once this much wall time is spent timing (the first admissible
                         // candidate is always timed)
  uint64_t seed = 1;
  // Verify the fastest candidate before it wins; one that fails is rejected
  // and the next fastest is verified, until one passes (the plan check).
  bool verify_winner = true;
  // How a candidate is timed. false: each of `iters` eager executes between
  // two CUDA events (what an eager caller's GPU sees, host launch gaps
  // included for tiny graphs). true: GPU time per execute inside one CUDA
  // graph of `iters` executes, replayed (what a caller that replays its plans
  // in CUDA graphs pays); candidates that cannot be recorded are skipped with
  // the reason. The two can rank small graphs differently (an engine with
  // the cheapest host call is not the one with the shortest kernel). The plan
  // cache keeps the two winners apart (tune_policy_key); a run with
  // PlanRequest::cuda_graph prefers the CUDA-graph winner.
  bool cuda_graph = false;
};

// TunePolicy::cuda_graph: replays of each candidate's CUDA graph timed (the median is kept).
inline constexpr int kTuneGraphReplays = 5;

struct TuneEntry {
  EngineCandidate candidate;
  bool admissible = true;   // passed the policy's filters
  std::string skipped_why;  // filter, support check, build or execution failure
  bool timed = false;
  LatencyStats latency;
  bool heuristic_choice = false;  // the first supported candidate: what build_plan would pick
  // Failed the verification run (TunePolicy::verify_winner): never the winner.
  // What failed, e.g. "dx: 11232 non-finite ... FAIL"; empty when it passed or was not run.
  std::string verify_failed;
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
  // With verify_winner: the fastest candidates that failed verification, in
  // rank order, before the winner that passed (verify_failed says why).
  int rejected = 0;
};

using TuneProgress = std::function<void(int done, int total, const std::string& engine)>;

// `ctx`'s GPU is the target. An error only when nothing could be timed.
Result<TuneResult> tune(const ResolvedGraph& g, GpuContext& ctx, const TunePolicy& policy,
                        const TuneProgress& progress = nullptr);

}  // namespace fusebox
