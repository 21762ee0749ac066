// fusebox: plan files (`fusebox build --plan-out`, `fusebox run --plan`).
//
// A plan file is a header line of JSON (format, versions, device, engine,
// graph fingerprint, payload length and XXH3-64 checksum) followed by the
// frontend's serialized plan. Everything in the header is checked before the
// payload reaches cuDNN: a truncated, corrupt or foreign file is an error,
// never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_info.h"
#include "fusebox/status.h"

namespace fusebox {

// Writes atomically (temporary file, then rename).
Status write_plan_file(const std::string& path, const PlanFileInfo& info,
                       const std::vector<uint8_t>& payload);

struct PlanFile {
  PlanFileInfo info;
  std::vector<uint8_t> payload;
};
Result<PlanFile> read_plan_file(const std::string& path);

// Whether `file` may be used for graph `g` on `target` with this cuDNN:
// same graph, same SM version and SM count, same cuDNN and frontend versions.
Status check_plan_compatible(const PlanFileInfo& file, const ResolvedGraph& g, const DeviceTarget& target);

// The info describing a plan this process builds.
PlanFileInfo make_plan_info(const ResolvedGraph& g, const Plan& plan, const DeviceTarget& target);

}  // namespace fusebox
