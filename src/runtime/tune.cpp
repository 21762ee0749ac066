#include "fusebox/tune.h"

#include <algorithm>

#include "common/plan_parts.h"
#include "common/stopwatch.h"
#include "device_buffers.h"

namespace fusebox {

Result<TuneResult> tune(const ResolvedGraph& g, GpuContext& ctx, const TunePolicy& policy,
                        const TuneProgress& progress) {
  const common::Stopwatch elapsed;
  TuneResult result;
  FUSEBOX_ASSIGN_OR_RETURN(DeviceTarget target, DeviceTarget::live_gpu(ctx.device_id()));
  BuildOptions options;
  options.heuristics = policy.heuristics;
  options.max_workspace_bytes = policy.max_workspace_bytes;
  FUSEBOX_ASSIGN_OR_RETURN(CandidateSet set, CandidateSet::create(g, target, options, &result.report, &ctx));
  // Every candidate's support is checked; all of them are built up front (in parallel) only when
  // all are timed: with top_k each timed one is built as it comes (plan_at), so the candidates past
  // the first K, runtime-compiled ones among them, cost no build.
  set.check_all(/*build=*/policy.top_k <= 0);

  // Inputs once, rotated across copies so small problems are not timed from a warm L2.
  FUSEBOX_ASSIGN_OR_RETURN(auto inputs, make_inputs(g, policy.seed));
  result.flops = g.flops(input_values_for_flops(g, inputs));
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  runtime::GraphBuffers buffers;
  FUSEBOX_RETURN_IF_ERROR(buffers.prepare(g, inputs, runtime::rotation_sets_for(g), stream));
  result.input_sets = buffers.sets();

  int admissible = 0;
  bool heuristic_marked = false;
  for (const EngineCandidate& c : set.candidates()) {
    TuneEntry e;
    e.candidate = c;
    if (c.duplicate_of >= 0) {
      e.admissible = false;
      e.skipped_why = "duplicate of candidate " + std::to_string(c.duplicate_of);
    } else if (policy.deterministic_only && has_note(c.numerical_notes, "NONDETERMINISTIC")) {
      e.admissible = false;
      e.skipped_why = "filtered: nondeterministic";
    } else if (!policy.allow_runtime_compilation && has_note(c.behavior_notes, "RUNTIME_COMPILATION")) {
      e.admissible = false;
      e.skipped_why = "filtered: runtime compilation";
    } else if (!c.supported) {
      e.admissible = false;
      e.skipped_why = "not supported: " + c.support_message;
    } else if (policy.max_workspace_bytes >= 0 && c.workspace_bytes > policy.max_workspace_bytes) {
      e.admissible = false;
      e.skipped_why = "filtered: workspace " + std::to_string(c.workspace_bytes) + " bytes";
    }
    if (c.supported && !heuristic_marked) {
      e.heuristic_choice = heuristic_marked = true;  // what build_plan picks: the first that passes
    }
    if (e.admissible) ++admissible;
    result.entries.push_back(std::move(e));
  }
  const int to_time = policy.top_k > 0 ? std::min(policy.top_k, admissible) : admissible;

  // The time budget counts timing only (building every candidate above can take longer than a
  // small budget on its own), and never stops tuning before one candidate is timed: a budget
  // that leaves nothing timed would fail a graph that has engines.
  const common::Stopwatch timing;
  int done = 0;
  int timed = 0;
  for (TuneEntry& e : result.entries) {
    if (!e.admissible) continue;
    // fusebox's own kernel (the last candidate where it runs only when pinned) is timed whatever
    // top_k leaves: a policy that times cuDNN's first K still compares it.
    const bool own = e.candidate.name.rfind(common::kOwnKernelPrefix, 0) == 0;
    if (done >= to_time && !own) {
      e.skipped_why = "not timed: beyond --top";
      continue;
    }
    if (policy.budget_ms > 0 && timed > 0 && timing.ms() > policy.budget_ms) {
      e.skipped_why = "not timed: time budget spent";
      continue;
    }
    ++done;
    if (progress) progress(done, to_time, e.candidate.name);
    auto plan = set.plan_at(e.candidate.index);
    if (!plan.ok()) {
      e.skipped_why = "build failed: " + plan.status().message();
      continue;
    }
    e.candidate.workspace_bytes = plan->workspace_bytes();  // known once built (top_k: built here)
    if (policy.max_workspace_bytes >= 0 && plan->workspace_bytes() > policy.max_workspace_bytes) {
      e.admissible = false;
      e.skipped_why = "filtered: workspace " + std::to_string(plan->workspace_bytes()) + " bytes";
      continue;
    }
    runtime::DeviceBuffer workspace;
    Status st = workspace.allocate(static_cast<size_t>(plan->workspace_bytes()), "workspace");
    if (!st.ok()) {
      e.skipped_why = st.message();
      continue;
    }
    auto lat = policy.cuda_graph
                   ? runtime::time_plan_in_graph(*plan, ctx, buffers, workspace.get(), policy.warmup,
                                                 policy.iters, kTuneGraphReplays)
                   : runtime::time_plan(*plan, ctx, buffers, workspace.get(), policy.warmup, policy.iters);
    if (!lat.ok()) {
      e.skipped_why = "execution failed: " + lat.status().message();
      (void)cudaGetLastError();
      continue;
    }
    e.timed = true;
    e.latency = *lat;
    ++timed;
  }

  // Rank: timed first by median, then the rest in candidate order.
  std::stable_sort(result.entries.begin(), result.entries.end(), [](const TuneEntry& a, const TuneEntry& b) {
    if (a.timed != b.timed) return a.timed;
    return a.timed && a.latency.median_ms < b.latency.median_ms;
  });
  for (size_t i = 0; i < result.entries.size(); ++i) {
    if (result.entries[i].timed && result.winner < 0) result.winner = static_cast<int>(i);
    if (result.entries[i].heuristic_choice) result.heuristic = static_cast<int>(i);
  }
  if (result.winner < 0) {
    return NotSupported("tune: no candidate could be timed (" + std::to_string(result.entries.size()) +
                        " candidates, " + std::to_string(admissible) + " admissible)");
  }
  // The winner is the fastest candidate that verifies: every candidate tune
  // would choose is checked, in rank order, until one passes.
  FUSEBOX_ASSIGN_OR_RETURN(result.winner_plan, set.plan_at(result.entries[result.winner].candidate.index));
  if (policy.verify_winner) {
    RunOptions ro;
    ro.seed = policy.seed;
    ro.verify = true;
    ro.iters = 0;
    for (;;) {
      FUSEBOX_ASSIGN_OR_RETURN(result.winner_run, run_plan(g, result.winner_plan, ctx, ro));
      if (result.winner_run.verified_ok) break;
      TuneEntry& failed = result.entries[result.winner];
      for (const Comparison& c : result.winner_run.comparisons) {
        if (!c.pass) failed.verify_failed += (failed.verify_failed.empty() ? "" : "; ") + c.ToString();
      }
      ++result.rejected;
      int next = -1;
      for (int i = result.winner + 1; i < static_cast<int>(result.entries.size()); ++i) {
        if (result.entries[i].timed) {
          next = i;
          break;
        }
      }
      if (next < 0) break;  // none verifies: the result says so (winner_run.verified_ok false)
      result.winner = next;
      FUSEBOX_ASSIGN_OR_RETURN(result.winner_plan, set.plan_at(result.entries[next].candidate.index));
    }
  }
  const TuneEntry& w = result.entries[result.winner];
  if (result.heuristic >= 0 && result.entries[result.heuristic].timed) {
    result.speedup_over_heuristic = result.entries[result.heuristic].latency.median_ms / w.latency.median_ms;
  }
  result.tuning_ms = elapsed.ms();
  return result;
}

}  // namespace fusebox
