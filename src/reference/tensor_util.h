// fusebox: small shape helpers shared by the reference layer (private); the
// strided walks and message helpers it shares with other layers are in
// fusebox_common.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/dims_string.h"
#include "common/op_where.h"
#include "common/strided.h"
#include "fusebox/graph.h"

namespace fusebox::reference_detail {

using common::dense_row_major;
using common::dims_string;
using common::for_each_element;
using common::for_each_element_in;
using common::product;
using common::storage_span;

// "[conv_fprop 'conv1'] ": how reference messages name an op (with a trailing space).
inline std::string op_where(const ResolvedOp& op) {
  std::string s = common::op_where(op_type_name(op.attrs), op.name);
  s += ' ';
  return s;
}

// Pads `dims` on the left with 1s to `rank`.
inline std::vector<int64_t> left_pad(const std::vector<int64_t>& dims, size_t rank) {
  std::vector<int64_t> out(rank - std::min(rank, dims.size()), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

// Runs fn(begin, end) over [0, count) on a few threads when count *
// work_per_item is large enough to pay for them; on one thread if threads
// cannot start. Defined in reference_cpu.cpp.
void parallel_for(int64_t count, double work_per_item, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace fusebox::reference_detail
