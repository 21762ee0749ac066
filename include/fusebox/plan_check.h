// fusebox: the plan check. The first time a plan (graph, engine and knobs,
// cuDNN version, GPU) is built or tuned on a GPU, it runs once on seeded
// random inputs against fusebox's reference, and only a plan that matches is
// served. The verdict is recorded with the plan (cache entry, plan file) so a
// warm start costs nothing more (docs/architecture.md, "Plan check").
#pragma once

#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/status.h"

namespace fusebox {

// One plan's check.
struct PlanCheckRun {
  bool passed = false;
  std::string detail;  // the comparisons ("y: rel_l2=... PASS"), or why the plan failed to execute
  double ms = 0;
};

// Runs `plan` for `g` once on ctx's GPU (inputs from `seed`, outputs poisoned
// with NaN) and compares every output with the reference: the CPU one for
// small graphs, the GPU one above `cpu_reference_max_flops`. A plan that fails
// to execute is a failed check; an error only when the check could not run
// at all (no reference for the graph, out of device memory).
Result<PlanCheckRun> check_plan_once(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx,
                                     uint64_t seed = 7, double cpu_reference_max_flops = 5e7);

struct RunResult;
// The comparisons of a verified run as the plan check records them (all of
// them when it passed, only the failing ones otherwise), with the reference used.
std::string plan_check_detail(const RunResult& r);

// What the plan check did for one get_plan (PlanReport::plan_check).
struct PlanCheckReport {
  // "off" (PlanRequest::check_plan false), "deviceless" (nothing runs; fusebox's
  // own kernels are checked like cuDNN's plans), "trusted" (a sealed
  // passing verdict came with the plan), "session" (fusebox's own kernel, which
  // passed on an equal graph earlier in this session), "other shapes" (a symbolic graph's plan at
  // a new shape, by execute-time override or the first shape's engine replayed with the kernel
  // cache, after that path passed the check at two other shapes: see detail; never sealed into a
  // plan file or cache entry), "passed" (checked now), "failed" (no candidate passed),
  // "unavailable" (the check could not run: see detail).
  std::string state = "off";
  std::string detail;  // the served plan's comparisons, or why no check ran
  double ms = 0;       // time spent checking (every plan checked)
  int plans_checked = 0;
  struct Rejected {
    std::string engine;
    std::string why;  // the failing comparison ("dx: 11232 non-finite, rel_l2=...")
  };
  std::vector<Rejected> rejected;  // plans that failed, in the order tried
  std::string text() const;        // one line for reports
};

}  // namespace fusebox
