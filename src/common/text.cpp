// fusebox_common: printable text (see common/text.h).
#include "common/text.h"

#include <cstdint>
#include <cstdio>

namespace fusebox::common {
namespace {

// Length of the valid UTF-8 sequence at s[i] (1..4), or 0 if invalid;
// *cp receives the code point.
size_t utf8_sequence(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n = 0;
  uint32_t v = 0, min = 0;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if ((c & 0xE0) == 0xC0) {
    n = 2, v = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, v = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;  // overlong, too large, surrogate
  *cp = v;
  return n;
}

bool is_control(uint32_t cp, bool keep_newlines) {
  if (keep_newlines && (cp == '\n' || cp == '\t')) return false;
  return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F);
}

void append_escaped(std::string* out, std::string_view bytes) {
  for (unsigned char c : bytes) {
    char buf[5];
    std::snprintf(buf, sizeof buf, "\\x%02X", c);
    out->append(buf, 4);
  }
}

}  // namespace

bool is_printable(std::string_view s, bool keep_newlines) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, &cp);
    if (n == 0 || is_control(cp, keep_newlines)) return false;
    i += n;
  }
  return true;
}

std::string printable(std::string_view s, bool keep_newlines) {
  if (is_printable(s, keep_newlines)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_sequence(s, i, &cp);
    if (n == 0) {
      append_escaped(&out, s.substr(i, 1));
      i += 1;
    } else {
      if (is_control(cp, keep_newlines)) {
        append_escaped(&out, s.substr(i, n));
      } else {
        out.append(s.substr(i, n));
      }
      i += n;
    }
  }
  return out;
}

}  // namespace fusebox::common
