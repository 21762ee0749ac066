#include "common/json_text.h"

namespace fusebox::common {

JsonTextLimit scan_json_text(std::string_view text, int max_depth, size_t max_values, bool refuse_nul) {
  int depth = 0;
  size_t values = 1;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\0' && refuse_nul) return {JsonTextLimit::Kind::kNul, i};
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return {JsonTextLimit::Kind::kDepth, i};
    } else if (c == ']' || c == '}') {
      --depth;
    }
    if ((c == '[' || c == '{' || c == ',') && ++values > max_values) return {JsonTextLimit::Kind::kValues, i};
  }
  return {};
}

}  // namespace fusebox::common
