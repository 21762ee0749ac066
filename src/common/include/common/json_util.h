// fusebox_common: nlohmann/json helpers for files fusebox does not trust.
// Header-only; users link fusebox_json. Never converts float (see
// docs/architecture.md, "nlohmann/json: doubles only").
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace fusebox::common {

// dump() that never throws: invalid UTF-8 (file names, foreign strings)
// becomes U+FFFD instead of a type_error.
template <typename Json>
std::string json_dump(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The integer j[key], in [lo, hi]. Throws std::out_of_range naming the key
// when it is missing, not an integer literal (1.0 and 1e3 are not), or out
// of range (including literals beyond int64). For parsers that already turn
// exceptions into ParseError.
inline int64_t json_int_at(const nlohmann::json& j, const char* key,
                           int64_t lo = std::numeric_limits<int64_t>::min(),
                           int64_t hi = std::numeric_limits<int64_t>::max()) {
  auto it = j.find(key);
  if (it == j.end()) throw std::out_of_range(std::string("field '") + key + "' is missing");
  const nlohmann::json& v = *it;
  if (!v.is_number_integer()) {
    throw std::out_of_range(std::string("field '") + key +
                            "' is not an integer: " + json_dump(v).substr(0, 40));
  }
  bool in_range = false;
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    in_range = u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    x = static_cast<int64_t>(u);
  } else {
    x = v.get<int64_t>();
    in_range = true;
  }
  if (!in_range || x < lo || x > hi) {
    throw std::out_of_range(std::string("field '") + key + "' = " + json_dump(v).substr(0, 40) +
                            " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return x;
}

}  // namespace fusebox::common
