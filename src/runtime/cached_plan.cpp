#include "fusebox/cached_plan.h"

#include "common/plan_info_json.h"
#include "common/stopwatch.h"
#include "fusebox/plan_file.h"

namespace fusebox {
namespace {

std::string modes_string(const std::vector<HeuristicMode>& modes) {
  std::string s;
  for (auto m : modes) s += std::string(s.empty() ? "" : ",") + std::string(heuristic_mode_name(m));
  return s;
}

// New warnings of the cache since `before`.
void collect_warnings(const PlanCache* cache, size_t before, std::vector<std::string>* out) {
  if (!cache) return;
  const auto& w = cache->warnings();
  for (size_t i = before; i < w.size(); ++i) out->push_back(w[i]);
}

}  // namespace

std::string build_policy_key(const BuildOptions& o) {
  // No modes: the Session's default, each mode alone in turn.
  return "build;modes=" + (o.heuristics.empty() ? std::string("a>b>fallback") : modes_string(o.heuristics)) +
         ";engine=" + o.engine + ";max_ws=" + std::to_string(o.max_workspace_bytes);
}

std::string tune_policy_key(const TunePolicy& p) {
  // What changes the winner; measurement settings (warm-up, iterations, seed) do not.
  return "tune;modes=" + modes_string(p.heuristics) + ";max_ws=" + std::to_string(p.max_workspace_bytes) +
         ";det=" + std::to_string(p.deterministic_only) +
         ";rtc=" + std::to_string(p.allow_runtime_compilation) + ";top=" + std::to_string(p.top_k) +
         ";budget_ms=" + std::to_string(p.budget_ms) +
         // Timed inside CUDA graphs: its own entry (keys of eager-timed tunes are unchanged).
         (p.cuda_graph ? ";graph=1" : "");
}

std::string cache_key_for(const ResolvedGraph& g, const DeviceTarget& target, const std::string& policy) {
  SystemInfo s = system_info(/*enumerate_gpus=*/false);
  CacheKey k;
  k.graph_canonical = canonical_form(g);
  k.device_name = target.device_name;
  k.sm_version = target.sm_version;
  k.sm_count = target.sm_count;
  k.cudnn_version = s.cudnn_runtime_version;
  k.frontend_version = s.frontend_version;
  k.policy = policy;
  return cache_key_hash(k);
}

Result<CachedPlan> lookup_cached_plan(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                                      const std::string& policy_key, GpuContext* ctx, bool measure_repeat) {
  CachedPlan out;
  out.key = cache_key_for(g, target, policy_key);
  if (!cache || !cache->enabled()) return out;
  const size_t before = cache->warnings().size();
  common::Stopwatch watch;
  auto found = cache->lookup(out.key);
  out.lookup_ms = watch.ms();
  collect_warnings(cache, before, &out.warnings);
  if (!found.ok() || !found->has_value()) return out;
  CacheEntry entry = std::move(**found);
  // A 64-bit key could collide: the provenance must also fit.
  Status compat = check_plan_compatible(entry.info, g, target);
  if (!compat.ok()) {
    out.warnings.push_back("plan cache entry " + out.key + " ignored: " + compat.message());
    return out;
  }
  watch.restart();
  auto plan = deserialize_plan(g, entry.payload, target, ctx, entry.info.engine);
  out.deserialize_ms = watch.ms();
  if (!plan.ok()) {
    // Evicted, so that the rebuilt plan replaces it and later builds do not
    // trip on it again (even when this build fails or stores nothing).
    int64_t removed = 0;
    const bool evicted = !cache->read_only() && cache->remove(out.key, &removed).ok() && removed > 0;
    out.warnings.push_back("plan cache entry " + out.key + " could not be deserialized" +
                           (evicted ? " (deleted)" : "") +
                           ", rebuilding: " + plan.status().message().substr(0, 300));
    return out;
  }
  out.plan = std::move(plan).value();
  out.check_trusted = plan_info_json::check_passed(
      entry.info, plan_info_json::payload_xxh3(entry.payload.data(), entry.payload.size()));
  if (measure_repeat) {
    watch.restart();
    auto again = deserialize_plan(g, entry.payload, target, ctx, entry.info.engine);
    if (again.ok()) out.deserialize_again_ms = watch.ms();
  }
  entry.payload.clear();
  out.entry = std::move(entry);
  out.hit = true;
  return out;
}

void record_plan_check(PlanFileInfo& info, const PlanCheckRun& check, const std::string& payload_checksum) {
  if (!check.passed) return;  // a failing plan is never stored
  info.plan_check = "pass";
  info.plan_check_detail = check.detail.substr(0, 1000);
  info.plan_check_seal = plan_info_json::seal(info, payload_checksum);
}

bool store_plan(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                const std::string& policy_key, const Plan& plan, double tuned_median_ms,
                std::vector<std::string>* warnings, const PlanCheckRun* check) {
  if (!cache || !cache->enabled() || cache->read_only()) return false;
  // fusebox's own kernels are stored too, by name (Plan::serialize): what they carry is the plan
  // check's sealed verdict, so a warm start does not check them again.
  auto bytes = plan.serialize();
  if (!bytes.ok()) {
    warnings->push_back("plan not cached: " + bytes.status().message());
    return false;
  }
  CacheEntry e;
  e.key = cache_key_for(g, target, policy_key);
  e.info = make_plan_info(g, plan, target);
  e.tuned_median_ms = tuned_median_ms;
  e.payload = std::move(bytes).value();
  if (check)
    record_plan_check(e.info, *check, plan_info_json::payload_xxh3(e.payload.data(), e.payload.size()));
  const size_t before = cache->warnings().size();
  Status st = cache->store(e);
  collect_warnings(cache, before, warnings);
  if (!st.ok() && cache->warnings().size() == before) warnings->push_back("plan not cached: " + st.message());
  // store() is a no-op on a cache disabled meanwhile (e.g. found corrupt).
  return st.ok() && cache->enabled();
}

Result<CachedPlan> plan_through_cache(PlanCache* cache, const ResolvedGraph& g, const DeviceTarget& target,
                                      const BuildOptions& options, GpuContext* ctx,
                                      BuildReport* failed_report) {
  const std::string policy = build_policy_key(options);
  FUSEBOX_ASSIGN_OR_RETURN(CachedPlan out, lookup_cached_plan(cache, g, target, policy, ctx));
  if (out.hit) return out;
  auto built = build_plan(g, target, options, &out.report, ctx);
  if (!built.ok()) {
    if (failed_report) *failed_report = out.report;
    return built.status();
  }
  out.plan = std::move(built).value();
  out.stored = store_plan(cache, g, target, policy, out.plan, -1, &out.warnings);
  return out;
}

}  // namespace fusebox
