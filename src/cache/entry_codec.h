// Private to src/cache: how one cache row's metadata is written and checked.
// Pure functions with no SQLite, so the fuzzer (fuzz/plan_cache_entry_fuzzer.cpp)
// drives exactly the validation that lookup() uses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/plan_info_json.h"
#include "fusebox/plan_cache.h"
#include "fusebox/status.h"

namespace fusebox::cache_internal {

inline constexpr const char* kEntryMagic = "FUSEBOX-PLAN-CACHE";
inline constexpr size_t kMaxMetaBytes = 64 * 1024;
inline constexpr int64_t kMaxPayloadBytes = int64_t{256} << 20;

using plan_info_json::hex64;
using plan_info_json::payload_xxh3;

// The `meta` column for `entry` (entry.key, .info, .tuned_median_ms,
// .created_utc) and a payload of n bytes at `payload`.
std::string encode_entry_meta(const CacheEntry& entry, const uint8_t* payload, size_t n);

// Checks a stored row: meta is JSON with our magic and format, names `key`,
// has every provenance field with the right type, and promises exactly n
// payload bytes with this XXH3. On success fills *out (key, info,
// tuned_median_ms, created_utc, payload_bytes; not the payload nor
// last_used_utc). Never throws; `out` may be null.
Status validate_entry_bytes(std::string_view key, std::string_view meta, const uint8_t* payload, size_t n,
                            CacheEntry* out);

}  // namespace fusebox::cache_internal
