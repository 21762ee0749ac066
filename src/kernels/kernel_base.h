// fusebox kernels layer (private): what every kernel of fusebox's own holds
// besides its launch: the engine name plans report, the tensors in launch
// order, and the "[op 'name']" prefix of its messages.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// Blocks of `threads` for a grid-stride loop over `work` items: enough for one
// item per thread, capped (the loop covers the rest), at least one.
inline int grid_stride_blocks(int64_t work, int threads) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, 65535LL * 8)));
}

// The tensor bound to `role` in an op's inputs or outputs, or null when the op has none.
inline const ResolvedTensor* role_tensor(const ResolvedGraph& g, const std::map<std::string, int>& roles,
                                         const char* role) {
  auto it = roles.find(role);
  return it == roles.end() ? nullptr : &g.tensors[static_cast<size_t>(it->second)];
}

// No gaps between a tensor's elements (some order of its dims packs them).
inline bool dense(const ResolvedTensor& t) { return t.storage_elements() == t.element_count(); }

// The dim of stride 1 and extent > 1, or -1.
inline int contiguous_dim(const ResolvedTensor& t) {
  for (size_t k = 0; k < t.dims.size(); ++k)
    if (t.strides[k] == 1 && t.dims[k] > 1) return static_cast<int>(k);
  return -1;
}

// A rank-4 tensor's strides, passed to a kernel by value.
struct Strides4 {
  int64_t s[4] = {};
};
inline Strides4 strides4(const ResolvedTensor& t) {
  Strides4 s;
  for (int i = 0; i < 4; ++i) s.s[i] = t.strides.at(static_cast<size_t>(i));
  return s;
}

class KernelBase : public NativeKernel {
 public:
  const std::string& name() const override { return name_; }
  const std::vector<std::string>& tensors() const override { return tensors_; }

  std::string name_, where_;
  std::vector<std::string> tensors_;
};

}  // namespace fusebox::kernels
