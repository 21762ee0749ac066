// fusebox: getting a plan through the plan cache. A hit means no heuristics,
// no build and no tuning; a miss builds (or tunes) and stores. Any cache
// problem degrades to a miss with a warning, never to an error.
#pragma once

#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_cache.h"
#include "fusebox/plan_check.h"
#include "fusebox/status.h"
#include "fusebox/tune.h"

namespace fusebox {

struct CachedPlan {
  Plan plan;
  bool hit = false;
  std::string key;
  CacheEntry entry;           // on a hit: the provenance (payload emptied)
  BuildReport report;         // on a miss: the five steps
  bool stored = false;        // on a miss: the new plan was written to the cache
  double lookup_ms = 0;       // cache lookup, checksum included
  double deserialize_ms = 0;  // frontend deserialize on a hit (the first in a process also loads
                              // cuDNN's engine libraries)
  // With measure_repeat: a second deserialize of the same entry, timed. The
  // per-graph cost once the libraries are loaded; deserialize_ms minus this
  // is the one-time load. -1 when not measured.
  double deserialize_again_ms = -1;
  // On a hit: the entry carries a passing plan check verdict whose seal
  // matches its payload (fusebox/plan_check.h): no need to check it again.
  bool check_trusted = false;
  std::vector<std::string> warnings;
};

// The policy part of a cache key.
std::string build_policy_key(const BuildOptions& options);
std::string tune_policy_key(const TunePolicy& policy);
std::string cache_key_for(const ResolvedGraph& g, const DeviceTarget& target, const std::string& policy);

// Looks `g` up under `policy_key`, else builds with `options` and stores.
// `cache` may be null (no cache). `ctx` as for build_plan. When the build
// fails, *failed_report (if given) receives the steps that ran.
Result<CachedPlan> plan_through_cache(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                                      const BuildOptions& options, GpuContext* ctx,
                                      BuildReport* failed_report = nullptr);

// Looks up a plan stored under `policy_key` only (no build on a miss):
// result.hit tells. Used by `run` to find a tuned plan first.
Result<CachedPlan> lookup_cached_plan(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                                      const std::string& policy_key, GpuContext* ctx,
                                      bool measure_repeat = false);

// Stores a plan under `policy_key` (tuned_median_ms < 0: heuristic choice),
// with `check`'s passing verdict sealed into the entry when given.
// A failure becomes a warning in `warnings`. True only if it was stored (not
// with no cache, a disabled or read-only one, or a failed write).
bool store_plan(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                const std::string& policy_key, const Plan& plan, double tuned_median_ms,
                std::vector<std::string>* warnings, const PlanCheckRun* check = nullptr);
// Writes `check`'s passing verdict into `info` and seals it for the payload
// with checksum `payload_checksum` (plan_info_json::payload_xxh3).
void record_plan_check(PlanFileInfo& info, const PlanCheckRun& check, const std::string& payload_checksum);

}  // namespace fusebox
