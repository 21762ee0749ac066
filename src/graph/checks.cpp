// Rules cuDNN enforces at build time, checked at resolve(): see graph/checks.h.
#include "checks.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/dims_string.h"

namespace fusebox::graph_checks {
namespace {

// Exact enumeration (for strides that interleave) is bounded per tensor and
// per graph: beyond it fusebox refuses what it cannot prove safe.
constexpr int64_t kMaxEnumeratedSpan = int64_t{1} << 22;
constexpr int64_t kEnumerationBudget = int64_t{1} << 24;

std::string coords_string(const std::vector<int64_t>& idx) { return common::dims_string(idx); }

// Whether two logical elements of (dims, strides) share an offset; `why` says
// which. Dims of size 1 never step. Fast path: dims sorted by stride nest
// (each stride beyond the largest offset the smaller ones reach).
bool aliases(const std::vector<int64_t>& dims, const std::vector<int64_t>& strides, int64_t* budget,
             std::string* why) {
  std::vector<size_t> order;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] > 1) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return strides[a] != strides[b] ? strides[a] < strides[b] : a < b; });
  int64_t span = 0;  // largest offset reached by the dims so far (resolve() bounds it by 2^62)
  bool nested = true;
  for (size_t i : order) {
    if (strides[i] <= span) nested = false;
    span += (dims[i] - 1) * strides[i];
  }
  if (nested) return false;

  // Two dims a, b collide iff some 0 < ka < dim[a], 0 < kb < dim[b] have
  // ka*stride[a] == kb*stride[b]; the smallest are stride[b]/g, stride[a]/g.
  for (size_t x = 0; x < order.size(); ++x) {
    for (size_t y = x + 1; y < order.size(); ++y) {
      const size_t a = order[x], b = order[y];
      if (strides[a] == 0) {
        *why = "dim " + std::to_string(a) + " (size " + std::to_string(dims[a]) + ") has stride 0";
        return true;
      }
      const int64_t g = std::gcd(strides[a], strides[b]);
      const int64_t ka = strides[b] / g, kb = strides[a] / g;
      if (ka < dims[a] && kb < dims[b]) {
        const size_t lo = std::min(a, b), hi = std::max(a, b);
        const int64_t klo = lo == a ? ka : kb, khi = lo == a ? kb : ka;
        *why = "dims " + std::to_string(lo) + " and " + std::to_string(hi) +
               " overlap: " + std::to_string(klo) + " step(s) along dim " + std::to_string(lo) + " and " +
               std::to_string(khi) + " along dim " + std::to_string(hi) + " both move " +
               std::to_string(klo * strides[lo]) + " elements";
        return true;
      }
    }
  }

  // Interleaved but no pair collides: three or more dims together may.
  int64_t elements = 1;
  for (size_t i : order) elements *= dims[i];  // <= 2^62, checked by resolve()
  if (elements > span + 1) {
    *why = std::to_string(elements) + " elements fit in " + std::to_string(span + 1) + " addresses";
    return true;
  }
  if (span + 1 > kMaxEnumeratedSpan || span + 1 > *budget) {
    *why =
        "dims sorted by stride do not nest and the tensor is too large for fusebox to prove that no two "
        "elements share an address";
    return true;
  }
  *budget -= span + 1;
  std::vector<bool> seen(static_cast<size_t>(span + 1));
  std::vector<int64_t> idx(dims.size(), 0);
  while (true) {
    int64_t off = 0;
    for (size_t i = 0; i < dims.size(); ++i) off += idx[i] * strides[i];
    if (seen[static_cast<size_t>(off)]) {
      *why = "the element at " + coords_string(idx) + " shares offset " + std::to_string(off) +
             " with an earlier one";
      return true;
    }
    seen[static_cast<size_t>(off)] = true;
    size_t d = dims.size();
    while (d > 0) {
      --d;
      if (++idx[d] < dims[d]) break;
      idx[d] = 0;
      if (d == 0) return false;
    }
    if (dims.empty()) return false;
  }
}

}  // namespace

Status check_no_aliasing(const ResolvedGraph& g) {
  int64_t budget = kEnumerationBudget;
  for (const ResolvedTensor& t : g.tensors) {
    if (t.is_virtual || t.scalar_value || t.strides.size() != t.dims.size()) continue;
    std::string why;
    if (aliases(t.dims, t.strides, &budget, &why)) {
      return InvalidArgument(
          "tensor '" + t.name + "' (" + (t.is_input ? "graph input" : "graph output") + ") dims " +
          common::dims_string(t.dims) + " strides " + common::dims_string(t.strides) +
          ": two logical elements share memory (" + why +
          "); cuDNN needs every element at its own address: give strides in which each dim's "
          "stride exceeds the largest offset the smaller-stride dims reach (e.g. packed "
          "strides, or omit 'strides')");
    }
  }
  return Status::Ok();
}

Status check_op_count(const ResolvedGraph& g) {
  if (g.ops.size() <= kMaxCudnnOps) return Status::Ok();
  const ResolvedOp& first_over = g.ops[kMaxCudnnOps];
  return InvalidArgument("graph '" + g.name + "' has " + std::to_string(g.ops.size()) +
                         " ops; cuDNN accepts at most " + std::to_string(kMaxCudnnOps) +
                         " operations in one graph (MAX_OPGRAPH_OPS; the first beyond it is [" +
                         std::string(op_type_name(first_over.attrs)) + " '" + first_over.name +
                         "']): split it into several graphs");
}

Status check_cudnn_rules(const ResolvedGraph& g) {
  FUSEBOX_RETURN_IF_ERROR(check_op_count(g));
  return check_no_aliasing(g);
}

}  // namespace fusebox::graph_checks
