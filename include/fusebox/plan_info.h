// fusebox: the provenance of a serialized plan (engine, workspace, device,
// versions), as plan files and plan cache entries both record it.
//
// Owned by the plan cache layer (fusebox_cache), the lower of the two users:
// plan_file.h (runtime) includes it, so the cache never includes a runtime
// header.
#pragma once

#include <cstdint>
#include <string>

namespace fusebox {

struct PlanFileInfo {
  int format = 1;
  std::string graph_fingerprint;  // graph_fingerprint(g) (fusebox/graph.h)
  std::string engine;
  int64_t workspace_bytes = 0;
  std::string device_name;
  int sm_version = 0;
  int sm_count = 0;
  bool built_deviceless = false;
  int64_t cudnn_version = 0;  // the runtime that built it
  std::string frontend_version;
  std::string fusebox_version;
  // The revision of fusebox's own kernels in the build that wrote it (common/kernels_revision.h);
  // empty in files and entries from before 2026-12-06. A plan of fusebox's kernels is only their
  // names, so its verdict below is trusted only under the same revision.
  std::string fusebox_kernels;
  // The plan check (docs/architecture.md, "Plan check"): "pass" when this
  // plan ran once on a GPU of this kind on random inputs and matched the
  // reference; empty when it was never checked (built deviceless, or checked
  // off). Trusted only with a matching plan_check_seal (plan_info_json::seal
  // over these fields and the payload): an edited verdict is checked again.
  std::string plan_check;
  std::string plan_check_detail;  // what was compared, e.g. "y: rel_l2=1.2e-03 ... (0.8 ms)"
  std::string plan_check_seal;
};

}  // namespace fusebox
