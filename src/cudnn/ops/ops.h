// fusebox: the cuDNN layer's op registry (private to src/cudnn/). One
// lower_op() overload per OpAttrs alternative; lower() (lowering.cpp) calls
// them through std::visit, so an alternative without its lowering is a
// compile error. Adding an op: its line here, in its family's
// ops/<family>_lowering.cpp.
//
// Declare overloads for the concrete attrs types only: the sdpa ones derive
// from SdpaOptions, and an SdpaOptions overload would silently take a new
// sdpa op.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "internal.h"
#include "ops/matmul_fold.h"

namespace fusebox::cudnn {

using FeTensor = std::shared_ptr<fe::graph::Tensor_attributes>;

fe::DataType_t to_fe(DType t);  // lowering.cpp

struct LowerState;  // lowering.cpp: the frontend graph, its tensors and uids so far

// What the lowering of one op sees of the driver (lowering.cpp), which owns
// the frontend tensors and assigns every uid.
class LowerContext {
 public:
  LowerContext(LowerState& state, const ResolvedOp& op);

  FeGraph& graph() const;
  const ResolvedGraph& resolved() const;
  // "[conv_fprop 'conv1']": the start of the op's messages.
  const std::string& where() const { return where_; }
  // The frontend tensor of input `role`; nullptr when the op has none.
  FeTensor in(const char* role) const;
  // Gives the frontend's output `y` the name, dims, strides and dtype of the
  // op's output `role` (and, unless virtual, a uid and the output flag).
  Status bind_output(const std::string& role, const FeTensor& y);
  // A tensor the caller creates for the op to write (cuDNN's RNG dump):
  // output `role`, non-virtual, with its uid.
  FeTensor create_output(const std::string& role);
  // Records a choice the lowering made that the graph file does not show
  // (BuildReport::lowering_notes), prefixed with where().
  void note(const std::string& text);
  // The GPU the plans are built for (live or a device-properties file): for
  // what cuDNN runs only on some architectures.
  const DeviceTarget& target() const;

 private:
  LowerState& state_;
  const ResolvedOp& op_;
  std::string where_;
};

// ---- conv: ops/conv_lowering.cpp
// One per op of FUSEBOX_OP_TYPES (fusebox/graph.h), defined in ops/<family>_lowering.cpp; an
// op only fusebox's kernels run refuses in ops/native_lowering.cpp (lower_native_op).
#define FUSEBOX_LOWER_OP(T) Status lower_op(LowerContext& ctx, const ResolvedOp& op, const T& attrs);
FUSEBOX_OP_TYPES(FUSEBOX_LOWER_OP)
#undef FUSEBOX_LOWER_OP
Status lower_native_op(LowerContext& ctx, std::string_view what);

}  // namespace fusebox::cudnn
