// fusebox: small shape helpers shared by the reference layer (private).
#pragma once

#include "fusebox/graph.h"
#include "graph/dims_string.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <functional>
#include <vector>

namespace fusebox::reference_detail {

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

using ::fusebox::dims_string;

// "[conv_fprop 'conv1'] ": how reference messages name an op.
inline std::string op_where(const ResolvedOp& op) {
  std::string s = "[";  // appended piecewise: GCC 12 flags "[" + std::string(...) with a false -Wrestrict
  s.append(op_type_name(op.attrs)).append(" '").append(op.name).append("'] ");
  return s;
}

// Pads `dims` on the left with 1s to `rank`.
inline std::vector<int64_t> left_pad(const std::vector<int64_t>& dims, size_t rank) {
  std::vector<int64_t> out(rank - std::min(rank, dims.size()), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

// Calls fn(logical_index, storage_offset) for the elements with logical
// (row-major) indices [begin, end), in order; the offset is in elements,
// following `strides`.
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

// Runs fn(begin, end) over [0, count) on a few threads when count *
// work_per_item is large enough to pay for them; on one thread if threads
// cannot start. Defined in reference_cpu.cpp.
void parallel_for(int64_t count, double work_per_item, const std::function<void(int64_t, int64_t)>& fn);

// The same for every element.
template <typename Fn>
void for_each_element(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, Fn&& fn) {
  for_each_element_in(dims, strides, 0, product(dims), fn);
}

}  // namespace fusebox::reference_detail
