// fusebox kernels layer: which graphs fusebox runs itself, and the kernel for one.
#include "kernels/native_kernel.h"

#include <variant>

#include "common/op_where.h"
#include "embedding.h"

namespace fusebox::kernels {

namespace {
bool is_native(const ResolvedOp& op) { return std::holds_alternative<EmbeddingAttrs>(op.attrs); }
}  // namespace

bool has_native_op(const ResolvedGraph& g) {
  for (const ResolvedOp& op : g.ops)
    if (is_native(op)) return true;
  return false;
}

Result<std::shared_ptr<const NativeKernel>> make_native_kernel(const ResolvedGraph& g) {
  const ResolvedOp* native = nullptr;
  std::string others;
  for (const ResolvedOp& op : g.ops) {
    if (is_native(op) && !native) {
      native = &op;
    } else {
      others += (others.empty() ? "" : ", ") + std::string(op_type_name(op.attrs)) + " '" + op.name + "'";
    }
  }
  if (!native) return InvalidArgument("graph '" + g.name + "' has no op fusebox runs with its own kernel");
  const std::string where = common::op_where(op_type_name(native->attrs), native->name);
  if (!others.empty()) {
    return InvalidArgument(where + " fusebox runs " + std::string(op_type_name(native->attrs)) +
                           " with a CUDA kernel of its own (cuDNN 9.19 has no op for it), so it must be the only op "
                           "of its graph; graph '" + g.name + "' also has " + others +
                           ": move them to another graph (in a pipeline, a stage of their own)");
  }
  return make_embedding_kernel(g, *native, std::get<EmbeddingAttrs>(native->attrs));
}

}  // namespace fusebox::kernels
