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
}

}  // namespace fusebox::plan_info_json
