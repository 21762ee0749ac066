// fusebox: the reports as JSON documents, one serializer per report, shared by
// the CLI (`--json`), the C API (fusebox_plan_report_json) and Python
// (Plan.report()), so that all three print the same document (issue 30).
// Each returns one JSON object as text; the fields are documented in
// docs/cli.md (build, run) and docs/c-api.md.
#pragma once

#include <string>

#include "fusebox/plan.h"
#include "fusebox/plan_check.h"
#include "fusebox/reference.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {

// The five steps: device, steps, workspace limit, dropped candidates, engine, notes, total_ms.
std::string build_report_json(const BuildReport& r);
// Where a plan came from and what it cost (source, cache, plan check, partition, ...), without the build.
std::string plan_report_json(const PlanReport& r);
// plan_report_json with the serving build's report as "build": what the C API and Python give.
std::string plan_report_with_build_json(const PlanReport& r);
std::string plan_check_report_json(const PlanCheckReport& c);
// One output compared with the reference (tensor, rel_l2, max errors, tolerance, pass).
std::string comparison_json(const Comparison& c);
// A run as a CUDA graph against the eager run; "null" when no graph was used.
std::string cuda_graph_run_json(const CudaGraphRun& cg);

}  // namespace fusebox
