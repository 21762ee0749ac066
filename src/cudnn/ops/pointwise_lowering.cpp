// fusebox: the cuDNN lowering of the pointwise ops, and the broadcast fold of a graph of them
// (ops/pointwise_fold.h).
#include <algorithm>
#include <optional>

#include "ops/ops.h"
#include "ops/pointwise_fold.h"

namespace fusebox::cudnn {
namespace {

fe::PointwiseMode_t to_fe(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd:
      return fe::PointwiseMode_t::ADD;
    case PointwiseMode::kSub:
      return fe::PointwiseMode_t::SUB;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale:
      return fe::PointwiseMode_t::MUL;
    case PointwiseMode::kRelu:
      return fe::PointwiseMode_t::RELU_FWD;
    case PointwiseMode::kGeluTanh:
      return fe::PointwiseMode_t::GELU_APPROX_TANH_FWD;
    case PointwiseMode::kGeluErf:
      return fe::PointwiseMode_t::GELU_FWD;
    case PointwiseMode::kSilu:
      return fe::PointwiseMode_t::SWISH_FWD;
    case PointwiseMode::kSigmoid:
      return fe::PointwiseMode_t::SIGMOID_FWD;
    case PointwiseMode::kTanh:
      return fe::PointwiseMode_t::TANH_FWD;
    case PointwiseMode::kReluBwd:
      return fe::PointwiseMode_t::RELU_BWD;
    case PointwiseMode::kGeluTanhBwd:
      return fe::PointwiseMode_t::GELU_APPROX_TANH_BWD;
    case PointwiseMode::kGeluErfBwd:
      return fe::PointwiseMode_t::GELU_BWD;
    case PointwiseMode::kSiluBwd:
      return fe::PointwiseMode_t::SWISH_BWD;
    case PointwiseMode::kSigmoidBwd:
      return fe::PointwiseMode_t::SIGMOID_BWD;
    case PointwiseMode::kTanhBwd:
      return fe::PointwiseMode_t::TANH_BWD;
  }
  return fe::PointwiseMode_t::NOT_SET;
}

}  // namespace

Status lower_op(LowerContext& ctx, const ResolvedOp& op, const PointwiseAttrs& pw) {
  auto attrs = fe::graph::Pointwise_attributes()
                   .set_name(op.name)
                   .set_mode(to_fe(pw.mode))
                   .set_compute_data_type(to_fe(op.compute_dtype));
  if (pw.mode == PointwiseMode::kSilu || pw.mode == PointwiseMode::kSiluBwd) attrs.set_swish_beta(1.0f);
  FeTensor a, b;
  switch (pw.mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
      a = ctx.in("a");
      b = ctx.in("b");
      break;
    case PointwiseMode::kBiasAdd:
      a = ctx.in("x");
      b = ctx.in("bias");
      break;
    case PointwiseMode::kScale:
      a = ctx.in("x");
      b = ctx.in("scale");
      break;
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      a = ctx.in("dy");
      b = ctx.in("x");
      break;  // IN_0 = dy, IN_1 = x
    default:
      a = ctx.in("x");
      break;
  }
  FeTensor y = b ? ctx.graph().pointwise(a, b, attrs) : ctx.graph().pointwise(a, attrs);
  return ctx.bind_output("y", y);
}

}  // namespace fusebox::cudnn

namespace fusebox::cudnn {
namespace {

// The dims of size > 1 of `out` that in-memory input `in` broadcasts over.
int broadcast_dim_count(const ResolvedTensor& in, const ResolvedTensor& out) {
  if (in.dims.size() != out.dims.size()) return 0;
  int n = 0;
  for (size_t i = 0; i < in.dims.size(); ++i) n += in.dims[i] == 1 && out.dims[i] > 1;
  return n;
}

bool pointwise_only(const ResolvedGraph& g) {
  if (g.ops.empty()) return false;
  for (const ResolvedOp& op : g.ops)
    if (!std::holds_alternative<PointwiseAttrs>(op.attrs)) return false;
  return true;
}

}  // namespace

bool pointwise_broadcast_eng1_gets_wrong(const ResolvedGraph& g) {
  if (!pointwise_only(g)) return false;
  for (const ResolvedOp& op : g.ops) {
    auto y = op.outputs.find("y");
    if (y == op.outputs.end()) continue;
    const ResolvedTensor& out = g.tensors[static_cast<size_t>(y->second)];
    for (const auto& [role, ti] : op.inputs) {
      const ResolvedTensor& in = g.tensors[static_cast<size_t>(ti)];
      if (in.is_virtual || in.scalar_value) continue;
      // Rank 4 and up is left to the plan check: eng1 broadcast [1,C,1,1] over NHWC right in
      // every lowered batchnorm_inference of the sweeps.
      const size_t rank = out.dims.size();
      const int n = broadcast_dim_count(in, out);
      if ((rank == 3 && n >= 2) || (rank <= 2 && n >= 1)) return true;
    }
  }
  return false;
}

std::optional<ResolvedGraph> fold_pointwise_broadcast_dims(const ResolvedGraph& g, std::string* note) {
  if (!pointwise_broadcast_eng1_gets_wrong(g)) return std::nullopt;
  const size_t rank = g.tensors.front().dims.size();
  std::vector<int64_t> full(rank, 1);  // the graph's dims: per dim the largest size any tensor has
  for (const ResolvedTensor& t : g.tensors) {
    if (t.dims.size() != rank || t.strides.size() != rank) return std::nullopt;
    for (size_t i = 0; i < rank; ++i) full[i] = std::max(full[i], t.dims[i]);
  }
  for (const ResolvedTensor& t : g.tensors) {
    for (size_t i = 0; i < rank; ++i)
      if (t.dims[i] != 1 && t.dims[i] != full[i]) return std::nullopt;
  }
  // Groups of adjacent dims of size > 1 that every tensor holds alike.
  std::vector<std::vector<size_t>> groups;
  for (size_t j = 0; j < rank; ++j) {
    if (full[j] == 1) continue;
    bool merge = !groups.empty();
    if (merge) {
      const size_t i = groups.back().back();
      for (const ResolvedTensor& t : g.tensors) {
        const bool ones = t.dims[i] == 1 && t.dims[j] == 1;
        const bool spans = t.dims[i] > 1 && t.dims[j] > 1 && t.strides[i] == t.strides[j] * t.dims[j];
        if (!ones && !spans) merge = false;
      }
    }
    if (merge) {
      groups.back().push_back(j);
    } else {
      groups.push_back({j});
    }
  }
  const size_t folded_rank = std::max<size_t>(3, groups.size());
  const size_t pad = folded_rank - groups.size();
  ResolvedGraph out = g;
  for (ResolvedTensor& t : out.tensors) {
    std::vector<int64_t> dims(folded_rank, 1), strides(folded_rank, 1);
    for (size_t k = 0; k < groups.size(); ++k) {
      int64_t n = 1;
      for (size_t d : groups[k]) n *= t.dims[d];
      dims[pad + k] = n;
      strides[pad + k] = t.strides[groups[k].back()];
    }
    // Size-1 dims: the stride a packed layout gives them (cuDNN never steps along them).
    for (size_t k = folded_rank; k-- > 0;) {
      if (dims[k] == 1) strides[k] = k + 1 < folded_rank ? strides[k + 1] * dims[k + 1] : 1;
    }
    t.dims = std::move(dims);
    t.strides = std::move(strides);
  }
  if (pointwise_broadcast_eng1_gets_wrong(out)) return std::nullopt;
  if (note) {
    auto list = [](const std::vector<int64_t>& v) {
      std::string s;
      for (int64_t d : v) s += (s.empty() ? "" : ", ") + std::to_string(d);
      return "[" + s + "]";
    };
    std::vector<int64_t> folded(folded_rank, 1);
    for (const ResolvedTensor& t : out.tensors)
      for (size_t k = 0; k < folded_rank; ++k) folded[k] = std::max(folded[k], t.dims[k]);
    *note = "dims " + list(full) + " folded to " + list(folded) +
            " (cuDNN 9.19's pointwise engine broadcasts an input wrongly over two dims; the same memory, "
            "read with the broadcast dims merged)";
  }
  return out;
}

}  // namespace fusebox::cudnn
