#include "fusebox/plan_check.h"

#include <cuda_runtime_api.h>

#include <cstdio>

#include "common/stopwatch.h"
#include "fusebox/runtime.h"

namespace fusebox {

Result<PlanCheckRun> check_plan_once(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx, uint64_t seed,
                                     double cpu_reference_max_flops) {
  const common::Stopwatch watch;
  RunOptions o;
  o.seed = seed;
  o.verify = true;
  o.iters = 0;
  o.warmup = 0;
  o.rotate_inputs = false;
  o.cpu_reference_max_flops = cpu_reference_max_flops;
  PlanCheckRun out;
  auto r = run_plan(g, plan, ctx, o);
  if (!r.ok()) {
    const StatusCode code = r.status().code();
    // The reference or the inputs could not be made: no verdict either way.
    if (code == StatusCode::kNotSupported || code == StatusCode::kInvalidArgument ||
        code == StatusCode::kInternal) {
      return r.status().WithContext("plan check");
    }
    (void)cudaGetLastError();  // a failed launch must not poison the next candidate's check
    out.passed = false;
    const std::string& m = r.status().message();
    out.detail = "execution failed: " + m.substr(0, m.find('\n'));
    out.ms = watch.ms();
    return out;
  }
  out.passed = r->verified_ok;
  out.detail = plan_check_detail(*r);
  out.ms = watch.ms();
  return out;
}

std::string plan_check_detail(const RunResult& r) {
  std::string detail;
  for (const Comparison& c : r.comparisons) {
    if (!r.verified_ok && c.pass) continue;  // a failure names only what failed
    detail += (detail.empty() ? "" : "; ") + c.ToString();
  }
  return detail + " (" + r.reference_kind + " reference)";
}

std::string PlanCheckReport::text() const {
  char ms_text[32];
  std::snprintf(ms_text, sizeof ms_text, "%.2f ms", ms);
  std::string s;
  if (state == "off") {
    s = "off (--no-plan-check): the plan was served unchecked";
  } else if (state == "deviceless") {
    s = "not run (deviceless: it runs on the GPU's first build or load)";
  } else if (state == "trusted") {
    s = "passed earlier on this GPU and cuDNN (recorded with the plan): not run again";
  } else if (state == "other shapes") {
    s = "not run at this shape: " + detail;
  } else if (state == "session") {
    s = "passed earlier in this session (fusebox's kernel on an equal graph): not run again";
  } else if (state == "passed") {
    s = "passed (" + std::to_string(plans_checked) + " plan" + (plans_checked == 1 ? "" : "s") +
        " checked, " + ms_text + ")";
  } else if (state == "failed") {
    s = "FAILED: no candidate matched the reference (" + std::to_string(plans_checked) + " checked, " +
        ms_text + ")";
  } else {
    s = state + (detail.empty() ? "" : ": " + detail);
  }
  for (const auto& r : rejected) s += "\n    rejected " + r.engine + ": " + r.why;
  return s;
}

}  // namespace fusebox
