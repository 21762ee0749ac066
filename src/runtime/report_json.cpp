// fusebox runtime layer: the reports as JSON (include/fusebox/report_json.h).
#include "fusebox/report_json.h"

#include <nlohmann/json.hpp>

#include "common/json_util.h"

namespace fusebox {

namespace {

std::string text(const nlohmann::json& j) { return common::json_dump(j, -1); }

nlohmann::json build_json(const BuildReport& r) {
  nlohmann::json steps = nlohmann::json::array();
  for (const auto& s : r.steps) {
    steps.push_back({{"name", s.name}, {"ms", s.ms}, {"ok", s.status.ok()}, {"message", s.status.message()}});
  }
  nlohmann::json dropped = nlohmann::json::array();
  for (const auto& d : r.dropped) {
    dropped.push_back(
        {{"index", d.index}, {"engine", d.name}, {"workspace_bytes", d.workspace_bytes}, {"why", d.why}});
  }
  return {{"device", {{"name", r.device_name}, {"sm_version", r.sm_version}, {"deviceless", r.deviceless}}},
          {"steps", steps},
          {"workspace_limit", r.workspace_limit},
          {"dropped", dropped},
          {"candidate_plans", r.candidate_plans},
          {"engine", r.engine},
          {"plan_index", r.plan_index},
          {"behavior_notes", r.notes_known ? nlohmann::json(r.behavior_notes) : nlohmann::json(nullptr)},
          {"lowering_notes", r.lowering_notes},
          {"excluded", r.excluded},
          {"workspace_bytes", r.workspace_bytes},
          {"total_ms", r.total_ms()}};
}

nlohmann::json plan_check_json(const PlanCheckReport& c) {
  nlohmann::json rejected = nlohmann::json::array();
  for (const auto& r : c.rejected) rejected.push_back({{"engine", r.engine}, {"why", r.why}});
  return {{"state", c.state},
          {"detail", c.detail},
          {"ms", c.ms},
          {"plans_checked", c.plans_checked},
          {"rejected", rejected}};
}

nlohmann::json partition_json(const PlanReport& r) {
  nlohmann::json parts = nlohmann::json::array();
  for (const auto& p : r.partition_parts) {
    parts.push_back({{"first_op", p.first_op},
                     {"op_count", p.op_count},
                     {"engine", p.engine},
                     {"workspace_bytes", p.workspace_bytes}});
  }
  return {{"summary", r.partition},
          {"cuts", r.partition_cuts},
          {"narrowed", r.partition_narrowed},
          {"temporary_bytes", r.partition_temporary_bytes},
          {"parts", parts}};
}

nlohmann::json plan_json(const PlanReport& r) {
  nlohmann::json attempts = nlohmann::json::array();
  for (const auto& a : r.attempts) {
    std::string modes;
    for (auto m : a.modes)
      modes += std::string(modes.empty() ? "" : ",") + std::string(heuristic_mode_name(m));
    attempts.push_back({{"modes", modes},
                        {"ok", a.status.ok()},
                        {"message", a.status.message().substr(0, a.status.message().find('\n'))},
                        {"ms", a.report.total_ms()}});
  }
  return {{"source", plan_source_name(r.source)},
          {"source_text", r.source_text()},
          {"heuristic_mode", r.heuristic_mode},
          {"attempts", attempts},
          {"engine", r.engine},
          {"workspace_bytes", r.workspace_bytes},
          {"cache", r.cache},
          {"cache_key", r.cache_key},
          {"stored", r.stored},
          {"lookup_ms", r.lookup_ms},
          {"deserialize_ms", r.deserialize_ms},
          {"total_ms", r.total_ms},
          {"shape", r.shape},
          {"dynamic_shape", r.dynamic_shape},
          {"kernel_cache", r.kernel_cache},
          {"kernel_cache_builds_before", r.kernel_cache_builds_before},
          {"dynamic_fallback", r.dynamic_fallback},
          {"dynamic_failed_ms", r.dynamic_failed_ms},
          {"static_policy", r.static_policy},
          {"static_probe_ms", r.static_probe_ms},
          {"engine_replayed", r.engine_replayed},
          {"replay_failed", r.replay_failed},
          {"override_shape", r.override_shape},
          {"override_built_shape", r.override_built_shape},
          {"override_ms", r.override_ms},
          {"override_refused", r.override_refused},
          {"plan_check", plan_check_json(r.plan_check)},
          {"partition", partition_json(r)},
          {"reference_fallback", r.reference_fallback}};
}

}  // namespace

std::string build_report_json(const BuildReport& r) { return text(build_json(r)); }

std::string plan_report_json(const PlanReport& r) { return text(plan_json(r)); }

std::string plan_report_with_build_json(const PlanReport& r) {
  nlohmann::json j = plan_json(r);
  j["build"] = build_json(r.build);
  return text(j);
}

std::string plan_check_report_json(const PlanCheckReport& c) { return text(plan_check_json(c)); }

std::string comparison_json(const Comparison& c) {
  return text({{"tensor", c.tensor},
               {"elements", c.elements},
               {"rel_l2", c.rel_l2},
               {"max_abs", c.max_abs},
               {"max_abs_rel", c.max_abs_rel},
               {"non_finite", c.non_finite},
               {"saturated", c.saturated},
               {"ties_taken", c.ties_taken},
               {"tie_largest_move", c.tie_largest_move},
               {"tie_search_error", c.tie_search_error},
               {"tol_rel_l2", c.tolerance.rel_l2},
               {"tol_max_abs_rel", c.tolerance.max_abs_rel},
               {"pass", c.pass}});
}

std::string cuda_graph_run_json(const CudaGraphRun& cg) {
  if (!cg.used) return "null";
  return text({{"recording", cg.recording},
               {"why_not_native", cg.why_not_native},
               {"bit_identical_to_eager", cg.bit_identical},
               {"bytes_compared", cg.bytes_compared},
               {"not_bit_reproducible",
                cg.not_reproducible.empty() ? nlohmann::json(nullptr) : nlohmann::json(cg.not_reproducible)},
               {"within_tolerance_of_eager",
                cg.not_reproducible.empty() ? nlohmann::json(nullptr) : nlohmann::json(cg.within_tolerance)},
               {"mismatches", cg.mismatches},
               {"create_ms", cg.create_ms}});
}

}  // namespace fusebox
