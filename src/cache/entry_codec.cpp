#include "cache/entry_codec.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>

namespace fusebox::cache_internal {

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string payload_xxh3(const uint8_t* data, size_t n) {
  // XXH3 accepts (nullptr, 0); keep the pointer valid anyway.
  static const uint8_t kEmpty = 0;
  return hex64(XXH3_64bits(n ? data : &kEmpty, n));
}

std::string encode_entry_meta(const CacheEntry& e, const uint8_t* payload, size_t n) {
  const PlanFileInfo& i = e.info;
  nlohmann::json m = {{"magic", kEntryMagic},
                      {"format", kPlanCacheFormatVersion},
                      {"key", e.key},
                      {"plan_format", i.format},
                      {"graph", i.graph_fingerprint},
                      {"engine", i.engine},
                      {"workspace_bytes", i.workspace_bytes},
                      {"device", i.device_name},
                      {"sm_version", i.sm_version},
                      {"sm_count", i.sm_count},
                      {"deviceless", i.built_deviceless},
                      {"cudnn", i.cudnn_version},
                      {"frontend", i.frontend_version},
                      {"fusebox", i.fusebox_version},
                      {"tuned_median_ms", e.tuned_median_ms},
                      {"created_utc", e.created_utc},
                      {"payload_bytes", static_cast<int64_t>(n)},
                      {"xxh3", payload_xxh3(payload, n)}};
  // Replace, not throw, on invalid UTF-8 in caller strings.
  return m.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status validate_entry_bytes(std::string_view key, std::string_view meta, const uint8_t* payload, size_t n,
                            CacheEntry* out) {
  auto bad = [&](const std::string& why) {
    return ParseError("plan cache entry " + std::string(key) + ": " + why);
  };
  if (meta.size() > kMaxMetaBytes)
    return bad("metadata too large (" + std::to_string(meta.size()) + " bytes)");
  try {
    auto m = nlohmann::json::parse(meta.begin(), meta.end(), nullptr, /*allow_exceptions=*/false);
    if (m.is_discarded() || !m.is_object()) return bad("metadata is not a JSON object");
    if (!m.contains("magic") || !m["magic"].is_string() || m["magic"].get<std::string>() != kEntryMagic) {
      return bad("bad magic");
    }
    if (!m.contains("format") || !m["format"].is_number_integer() ||
        m["format"].get<int64_t>() != kPlanCacheFormatVersion) {
      return bad("unsupported entry format (expected " + std::to_string(kPlanCacheFormatVersion) + ")");
    }
    if (m.at("key").get<std::string>() != key) return bad("metadata names a different key");
    const int64_t promised = m.at("payload_bytes").get<int64_t>();
    if (promised <= 0 || promised > kMaxPayloadBytes) {
      return bad("implausible payload length " + std::to_string(promised));
    }
    if (static_cast<uint64_t>(promised) != n) {
      return bad("truncated or padded: metadata promises " + std::to_string(promised) +
                 " payload bytes, row has " + std::to_string(n));
    }
    if (m.at("xxh3").get<std::string>() != payload_xxh3(payload, n)) return bad("payload checksum mismatch");

    CacheEntry e;
    e.key = std::string(key);
    e.info.format = m.at("plan_format").get<int>();
    e.info.graph_fingerprint = m.at("graph").get<std::string>();
    e.info.engine = m.at("engine").get<std::string>();
    e.info.workspace_bytes = m.at("workspace_bytes").get<int64_t>();
    e.info.device_name = m.at("device").get<std::string>();
    e.info.sm_version = m.at("sm_version").get<int>();
    e.info.sm_count = m.at("sm_count").get<int>();
    e.info.built_deviceless = m.at("deviceless").get<bool>();
    e.info.cudnn_version = m.at("cudnn").get<int64_t>();
    e.info.frontend_version = m.at("frontend").get<std::string>();
    e.info.fusebox_version = m.at("fusebox").get<std::string>();
    e.tuned_median_ms = m.at("tuned_median_ms").get<double>();
    e.created_utc = m.at("created_utc").get<std::string>();
    e.payload_bytes = promised;
    if (e.info.workspace_bytes < 0) return bad("negative workspace_bytes");
    if (!std::isfinite(e.tuned_median_ms)) return bad("tuned_median_ms is not finite");
    if (out) *out = std::move(e);
  } catch (const std::exception& ex) {
    return bad(std::string("bad metadata: ") + ex.what());
  }
  return Status::Ok();
}

}  // namespace fusebox::cache_internal
