// fusebox_common: the provenance of a plan (PlanFileInfo) as JSON fields, and
// the payload checksum: shared by plan files (src/runtime/plan_file.cpp) and
// cache entries (src/cache/entry_codec.cpp), so both spell them the same way.
// Header-only: users link fusebox_json and xxhash themselves.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "common/json_util.h"
#include "common/kernels_revision.h"
#include "fusebox/plan_info.h"

namespace fusebox::plan_info_json {

inline std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline std::string payload_xxh3(const uint8_t* data, size_t n) {
  static const uint8_t kEmpty = 0;
  return hex64(XXH3_64bits(n ? data : &kEmpty, n));
}

// Adds the provenance fields (not the format, which each container names) to `j`.
inline void write(const PlanFileInfo& i, nlohmann::json& j) {
  j["graph"] = i.graph_fingerprint;
  j["engine"] = i.engine;
  j["workspace_bytes"] = i.workspace_bytes;
  j["device"] = i.device_name;
  j["sm_version"] = i.sm_version;
  j["sm_count"] = i.sm_count;
  j["deviceless"] = i.built_deviceless;
  j["cudnn"] = i.cudnn_version;
  j["frontend"] = i.frontend_version;
  j["fusebox"] = i.fusebox_version;
  if (!i.fusebox_kernels.empty()) j["fusebox_kernels"] = i.fusebox_kernels;
  if (!i.plan_check.empty()) {
    j["plan_check"] = i.plan_check;
    j["plan_check_detail"] = i.plan_check_detail;
    j["plan_check_seal"] = i.plan_check_seal;
  }
}

// Reads them back; throws (nlohmann::json exceptions, std::out_of_range) on a
// missing or mistyped field or an integer out of range.
inline void read(const nlohmann::json& j, PlanFileInfo* i) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  i->graph_fingerprint = j.at("graph").get<std::string>();
  i->engine = j.at("engine").get<std::string>();
  i->workspace_bytes = common::json_int_at(j, "workspace_bytes", 0);
  i->device_name = j.at("device").get<std::string>();
  i->sm_version = static_cast<int>(common::json_int_at(j, "sm_version", 0, kIntMax));
  i->sm_count = static_cast<int>(common::json_int_at(j, "sm_count", 0, kIntMax));
  i->built_deviceless = j.at("deviceless").get<bool>();
  i->cudnn_version = common::json_int_at(j, "cudnn", 0);
  i->frontend_version = j.at("frontend").get<std::string>();
  i->fusebox_version = j.at("fusebox").get<std::string>();
  i->fusebox_kernels = j.value("fusebox_kernels", std::string());  // optional: older files have none
  // Optional (older entries and files have none): the plan check's verdict.
  if (j.contains("plan_check")) {
    i->plan_check = j.at("plan_check").get<std::string>();
    i->plan_check_detail = j.value("plan_check_detail", std::string());
    i->plan_check_seal = j.value("plan_check_seal", std::string());
  }
}

// The seal of a plan check verdict: XXH3-64 over the verdict, what it is a
// verdict on (graph, engine, GPU, cuDNN and frontend versions) and the
// payload's checksum. A verdict edited in a file, or moved to another payload,
// no longer matches and the plan is checked again. It detects edits and
// mix-ups, not a forger who recomputes it (the plan check is cheap to redo).
inline std::string seal(const PlanFileInfo& i, const std::string& payload_checksum) {
  const std::string text = "fusebox-plan-check-1\n" + i.plan_check + "\n" + i.plan_check_detail + "\n" +
                           i.graph_fingerprint + "\n" + i.engine + "\n" + i.device_name + "\n" +
                           std::to_string(i.sm_version) + "\n" + std::to_string(i.sm_count) + "\n" +
                           std::to_string(i.cudnn_version) + "\n" + i.frontend_version + "\n" +
                           payload_checksum + (i.fusebox_kernels.empty() ? "" : "\n" + i.fusebox_kernels);
  return hex64(XXH3_64bits(text.data(), text.size()));
}

// Whether `i` carries a passing verdict whose seal matches this payload; for a plan of fusebox's
// own kernels (serialized as their names: the code that runs is this build's), also one recorded
// under this build's kernels revision.
inline bool check_passed(const PlanFileInfo& i, const std::string& payload_checksum) {
  if (common::uses_fusebox_kernels(i.engine) && i.fusebox_kernels != common::kernels_revision()) return false;
  return i.plan_check == "pass" && !i.plan_check_seal.empty() &&
         i.plan_check_seal == seal(i, payload_checksum);
}

}  // namespace fusebox::plan_info_json
