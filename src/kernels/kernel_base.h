// fusebox kernels layer (private): what every kernel of fusebox's own holds
// besides its launch: the engine name plans report, the tensors in launch
// order, and the "[op 'name']" prefix of its messages.
#pragma once

#include <algorithm>
#include <cstdint>
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
