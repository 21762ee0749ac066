// fusebox_common: element counts and walks over strided (dims, strides)
// layouts, for the layers that touch tensor data on the host (references,
// runtime inputs). Offsets and strides are in elements.
#pragma once

#include <cstdint>
#include <vector>

namespace fusebox::common {

inline int64_t product(const std::vector<int64_t>& dims) {
  int64_t p = 1;
  for (int64_t d : dims) p *= d;
  return p;
}

// Elements of memory touched by (dims, strides): 1 + sum((dim-1)*stride); 0 if empty.
inline int64_t storage_span(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  int64_t span = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] <= 0) return 0;
    span += (dims[i] - 1) * (i < strides.size() ? strides[i] : 0);
  }
  return span;
}

inline std::vector<int64_t> dense_row_major(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dims[i + 1];
  return s;
}

// Whether element i in logical (row-major) order sits at storage offset i: the row-major strides,
// where a dim of extent 1 may have any stride (NHWC tensors with H = W = 1, say).
inline bool logical_is_storage_order(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] == 1) continue;
    if (i >= strides.size() || strides[i] != expect) return false;
    expect *= dims[i];
  }
  return true;
}

// Calls fn(logical_index, storage_offset) for the elements with logical
// (row-major) indices [begin, end), in order; the offset follows `strides`.
template <typename Fn>
void for_each_element_in(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, int64_t begin,
                         int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const size_t rank = dims.size();
  std::vector<int64_t> idx(rank, 0);
  int64_t offset = 0, rest = begin;
  for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
    idx[d] = rest % dims[d];
    rest /= dims[d];
    offset += idx[d] * strides[d];
  }
  for (int64_t i = begin; i < end; ++i) {
    fn(i, offset);
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < dims[d]) {
        offset += strides[d];
        break;
      }
      offset -= (dims[d] - 1) * strides[d];
      idx[d] = 0;
    }
  }
}

// The same for every element.
template <typename Fn>
void for_each_element(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, Fn&& fn) {
  for_each_element_in(dims, strides, 0, product(dims), fn);
}

}  // namespace fusebox::common
