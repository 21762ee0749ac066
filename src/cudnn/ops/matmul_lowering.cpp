// fusebox: the cuDNN lowering of matmul.
#include <algorithm>
#include <optional>

#include "ops/ops.h"

namespace fusebox::cudnn {

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const MatmulAttrs&) {
  FeTensor y = ctx.graph().matmul(
      ctx.in("a"), ctx.in("b"),
      fe::graph::Matmul_attributes().set_name(op.name).set_compute_data_type(to_fe(op.compute_dtype)));
  return ctx.bind_output("y", y);
}

std::optional<ResolvedGraph> fold_matmul_batch_dims(const ResolvedGraph& g, std::string* note) {
  bool has_matmul = false;
  for (const ResolvedOp& op : g.ops) {
    if (std::holds_alternative<MatmulAttrs>(op.attrs)) {
      has_matmul = true;
    } else if (!std::holds_alternative<PointwiseAttrs>(op.attrs)) {
      return std::nullopt;  // other ops read dims by index (reductions, norms)
    }
  }
  if (!has_matmul || g.tensors.empty()) return std::nullopt;
  const size_t rank = g.tensors[0].dims.size();
  if (rank < 4) return std::nullopt;
  const size_t lead = rank - 2;
  // The graph's batch dims: per leading position, the largest size any tensor has.
  std::vector<int64_t> batch(lead, 1);
  for (const ResolvedTensor& t : g.tensors) {
    if (t.dims.size() != rank) return std::nullopt;
    for (size_t i = 0; i < lead; ++i) batch[i] = std::max(batch[i], t.dims[i]);
  }
  int64_t folded = 1;
  for (int64_t b : batch) folded *= b;
  ResolvedGraph out = g;
  for (ResolvedTensor& t : out.tensors) {
    bool all_one = true, full = true;
    for (size_t i = 0; i < lead; ++i) {
      all_one = all_one && t.dims[i] == 1;
      full = full && t.dims[i] == batch[i];
    }
    if (!all_one && !full) return std::nullopt;  // broadcast along some batch dims only
    if (full && !all_one) {
      // Contiguous leading dims: each one's stride is the next one's span (size-1 dims skipped).
      int64_t expect = t.strides[lead - 1];
      for (size_t i = lead - 1; i-- > 0;) {
        expect *= t.dims[i + 1];
        if (t.dims[i] > 1 && t.strides[i] != expect) return std::nullopt;
      }
    }
    std::vector<int64_t> dims{all_one ? 1 : folded, t.dims[rank - 2], t.dims[rank - 1]};
    std::vector<int64_t> strides{t.strides[lead - 1], t.strides[rank - 2], t.strides[rank - 1]};
    if (all_one) strides[0] = dims[1] * dims[2];
    t.dims = std::move(dims);
    t.strides = std::move(strides);
  }
  if (note) {
    std::string b;
    for (int64_t d : batch) b += (b.empty() ? "" : ", ") + std::to_string(d);
    *note = "batch dims [" + b + "] folded into one of " + std::to_string(folded) +
            " (cuDNN's matmul takes rank-3 tensors; the same memory, read as [batch, M, N])";
  }
  return out;
}

}  // namespace fusebox::cudnn
