// fusebox_common: "[16, 64, 56, 56]": how fusebox prints dims and strides in messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fusebox::common {

inline std::string dims_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

}  // namespace fusebox::common
