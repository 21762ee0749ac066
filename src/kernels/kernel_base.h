// fusebox kernels layer (private): what every kernel of fusebox's own holds
// besides its launch: the engine name plans report, the tensors in launch
// order, and the "[op 'name']" prefix of its messages.
#pragma once

#include <string>
#include <vector>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

class KernelBase : public NativeKernel {
 public:
  const std::string& name() const override { return name_; }
  const std::vector<std::string>& tensors() const override { return tensors_; }

  std::string name_, where_;
  std::vector<std::string> tensors_;
};

}  // namespace fusebox::kernels
