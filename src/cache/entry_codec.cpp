#include "entry_codec.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/json_util.h"
#include "common/plan_payload_check.h"

namespace fusebox::cache_internal {

std::string encode_entry_meta(const CacheEntry& e, const uint8_t* payload, size_t n) {
  const PlanFileInfo& i = e.info;
  nlohmann::json m = {{"magic", kEntryMagic},
                      {"format", kPlanCacheFormatVersion},
                      {"key", e.key},
                      {"plan_format", i.format},
                      {"tuned_median_ms", e.tuned_median_ms},
                      {"created_utc", e.created_utc},
                      {"payload_bytes", static_cast<int64_t>(n)},
                      {"xxh3", payload_xxh3(payload, n)}};
  plan_info_json::write(i, m);
  // Replace, not throw, on invalid UTF-8 in caller strings.
  return common::json_dump(m);
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
    const int64_t promised = common::json_int_at(m, "payload_bytes");
    if (promised <= 0 || promised > kMaxPayloadBytes) {
      return bad("implausible payload length " + std::to_string(promised));
    }
    if (static_cast<uint64_t>(promised) != n) {
      return bad("truncated or padded: metadata promises " + std::to_string(promised) +
                 " payload bytes, row has " + std::to_string(n));
    }
    if (m.at("xxh3").get<std::string>() != payload_xxh3(payload, n)) return bad("payload checksum mismatch");
    // What PlanCache::lookup() returns goes to the cuDNN frontend: check it as it will be read.
    if (Status p = common::check_plan_payload(payload, n, "plan cache entry " + std::string(key)); !p.ok())
      return p;

    CacheEntry e;
    e.key = std::string(key);
    e.info.format =
        static_cast<int>(common::json_int_at(m, "plan_format", 0, std::numeric_limits<int>::max()));
    plan_info_json::read(m, &e.info);
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
