// fusebox: what a CPU reference of one op sees of the driver (private to the
// reference layer; the driver is reference_cpu.cpp).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"

namespace fusebox::reference_detail {

// A tensor's values in logical row-major order, with its dims.
struct Values {
  std::vector<int64_t> dims;
  std::vector<float> data;
};

// One op's tensors during a CPU reference run. Inputs are the values of
// earlier ops, by-value scalars or the caller's inputs (widened to float);
// outputs start as zeros and reach later ops only when the op succeeds.
class CpuOpContext {
 public:
  CpuOpContext(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
               std::vector<std::optional<Values>>& values, const ResolvedOp& op)
      : g_(g), inputs_(inputs), values_(values), op_(op) {}

  const ResolvedGraph& graph() const { return g_; }
  // The caller's inputs by tensor name.
  const std::map<std::string, HostTensor>& host_inputs() const { return inputs_; }

  // Input `role` of the op; InvalidArgument when it has none.
  Result<const Values*> in(const std::string& role);
  // Input `role` as the caller gave it, not widened to float (an op that reads a few values of a
  // large input); null when an earlier op computed it or it is a by-value scalar. The same errors
  // as in().
  Result<const HostTensor*> host_in(const std::string& role);
  // Tensor `idx` read as input `role` (the role names it in messages).
  Result<const Values*> tensor(const std::string& role, int idx);
  // Tensor `idx`'s caller data (host_in's answer for it).
  Result<const HostTensor*> host_tensor(const std::string& role, int idx);
  // The zeroed buffer of output `role`; InvalidArgument when the op has no valid one.
  Result<Values*> out(const std::string& role);

  // The driver's: makes the outputs visible to later ops.
  void commit();

 private:
  const ResolvedGraph& g_;
  const std::map<std::string, HostTensor>& inputs_;
  std::vector<std::optional<Values>>& values_;
  const ResolvedOp& op_;
  std::map<int, Values> outputs_;  // tensor index -> values (nodes do not move)
};

}  // namespace fusebox::reference_detail
