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
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& attrs);
// ---- matmul: ops/matmul_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const MatmulAttrs& attrs);
// fold_matmul_batch_dims(): ops/matmul_fold.h

// ---- pointwise: ops/pointwise_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const PointwiseAttrs& attrs);
// ---- native ops (embedding, rope, cross_entropy): ops/native_lowering.cpp
// Ops fusebox runs only with its own kernel (OpTraits::native_only): no
// lowering. A graph of one alone never gets here (build_plan runs the kernel);
// one mixed with cuDNN ops is refused by the kernels layer first. The
// overloads keep the dispatch complete; `what` names the op in the refusal
// (native_lowering.cpp).
Status lower_native_op(LowerContext& ctx, std::string_view what);
inline Status lower_op(LowerContext& ctx, const ResolvedOp&, const EmbeddingAttrs&) {
  return lower_native_op(ctx, "an embedding lookup");
}
inline Status lower_op(LowerContext& ctx, const ResolvedOp&, const RopeAttrs&) {
  return lower_native_op(ctx, "rope (not lowered to cuDNN 9.24's RoPE operation yet)");
}
inline Status lower_op(LowerContext& ctx, const ResolvedOp&, const CrossEntropyAttrs&) {
  return lower_native_op(ctx, "softmax cross-entropy");
}
// ---- sdpa: ops/sdpa_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& attrs);
// ---- norm: ops/norm_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const LayerNormAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const RmsNormAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const LayerNormBwdAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const RmsNormBwdAttrs& attrs);
// ---- reduction: ops/reduction_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const ReductionAttrs& attrs);

// ---- pool: ops/pool_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const PoolAttrs& attrs);

// ---- batchnorm: ops/batchnorm_lowering.cpp
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs& attrs);
Status lower_op(LowerContext& ctx, const ResolvedOp& op, const BatchNormBwdAttrs& attrs);

}  // namespace fusebox::cudnn
