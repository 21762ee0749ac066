// fusebox_common: integer arithmetic that reports overflow instead of wrapping.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace fusebox::common {

inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of non-negative dims; nullopt on overflow or a negative dim.
inline std::optional<int64_t> checked_product(const std::vector<int64_t>& dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto next = checked_mul(p, d);
    if (!next) return std::nullopt;
    p = *next;
  }
  return p;
}

}  // namespace fusebox::common
