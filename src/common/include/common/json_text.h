// A linear scan of JSON text before any parser sees it. nlohmann::json recurses
// (in parsing, printing and comparing) and its DOM takes up to ~40 times the
// text's size, so nesting depth and the number of values are bounded first.
#pragma once

#include <cstddef>
#include <string_view>

namespace fusebox::common {

struct JsonTextLimit {
  enum class Kind { kNone, kDepth, kValues, kNul };
  Kind kind = Kind::kNone;
  size_t byte = 0;  // 0-based offset of the '[', '{' or ',' that went over the limit
};

// The first place, outside strings, where arrays and objects nest deeper than
// max_depth or where the values (counted one per '[', '{' or ',' plus one: an
// upper bound) exceed max_values; Kind::kNul at a NUL byte (never valid JSON,
// and nlohmann::json stops reading there, ignoring what follows) unless
// refuse_nul is false; Kind::kNone
// when the text stays within both.
JsonTextLimit scan_json_text(std::string_view text, int max_depth, size_t max_values, bool refuse_nul = true);

}  // namespace fusebox::common
