// fusebox_common: text that is safe to print and to put in JSON.
#pragma once

#include <string>
#include <string_view>

namespace fusebox::common {

// `s` with every byte a terminal could act on escaped as \xNN: C0 controls
// (ESC, CR, BEL, ...), DEL, C1 controls (U+0080..U+009F) and bytes that are
// not valid UTF-8. With keep_newlines, '\n' and '\t' pass (multi-line messages).
std::string printable(std::string_view s, bool keep_newlines = false);

// Whether printable(s) == s (cheap: no copy).
bool is_printable(std::string_view s, bool keep_newlines = false);

}  // namespace fusebox::common
