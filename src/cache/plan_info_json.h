// The provenance of a plan (PlanFileInfo) as JSON fields, and the payload
// checksum: shared by plan files (src/runtime/plan_file.cpp) and cache
// entries (src/cache/entry_codec.cpp), so both spell them the same way.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "fusebox/plan_file.h"

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

// Reads them back; throws nlohmann::json exceptions on a missing or mistyped field.
inline void read(const nlohmann::json& j, PlanFileInfo* i) {
  i->graph_fingerprint = j.at("graph").get<std::string>();
  i->engine = j.at("engine").get<std::string>();
  i->workspace_bytes = j.at("workspace_bytes").get<int64_t>();
  i->device_name = j.at("device").get<std::string>();
  i->sm_version = j.at("sm_version").get<int>();
  i->sm_count = j.at("sm_count").get<int>();
  i->built_deviceless = j.at("deviceless").get<bool>();
  i->cudnn_version = j.at("cudnn").get<int64_t>();
  i->frontend_version = j.at("frontend").get<std::string>();
  i->fusebox_version = j.at("fusebox").get<std::string>();
}

}  // namespace fusebox::plan_info_json
