// fusebox graph layer: the facts of every op as data, one OpTraits entry per
// alternative of OpAttrs (issue 30). An entry inherits OpTraitsDefaults and
// states only what differs. A new op without an entry is a compile error
// (the primary template has no definition).
//
// What the entries hold, and who reads it:
//   family            the op family (its files: include/fusebox/ops/<family>.h,
//                     src/graph/ops/<family>.cpp, the reference and lowering)
//   bench_family      the BENCHMARKS.md section its graphs are timed in
//   json_fields       op-specific JSON fields accepted besides op, name, inputs,
//                     outputs, compute_dtype (an op whose fields depend on its
//                     attributes overloads json_fields() in its family file)
//   accepts_scalar_inputs  inputs may be by-value scalars (else tensors)
//   outputs_in_memory the op writes memory, not a fused epilogue: its outputs
//                     must be declared non-virtual
//   native_only       cuDNN 9.19 has no op for it: fusebox's own kernel runs it,
//                     alone in its graph (docs/architecture.md, "Native ops")
//   reads_forward_outputs  a backward op that reads its forward's o and stats
//                     (the runtime computes them from q, k, v when not given)
//   index_inputs      input roles whose values index memory (embedding ids):
//                     checked before a run
//   no_grad_inputs    input roles that never carry a gradient (ids, labels,
//                     angles, sequence lengths, seeds): derive_backward() leaves
//                     them out of the default wrt set (fusebox/autodiff.h)
//   not_bit_reproducible(g, op, a)  why two runs of one plan may differ in
//                     the last bits ("" when they may not)
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "fusebox/graph.h"

namespace fusebox::graph_ops {

template <typename T>
struct OpTraits;  // one specialization per alternative of OpAttrs, below

struct OpTraitsDefaults {
  static constexpr std::array<std::string_view, 0> json_fields{};
  static constexpr bool accepts_scalar_inputs = false;
  static constexpr bool outputs_in_memory = false;
  static constexpr bool native_only = false;
  static constexpr bool reads_forward_outputs = false;
  static constexpr std::array<std::string_view, 0> index_inputs{};
  static constexpr std::array<std::string_view, 0> no_grad_inputs{};
  template <typename A>
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp&, const A&) {
    return "";
  }
};

// ---- conv
template <>
struct OpTraits<ConvFpropAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv";
  static constexpr auto json_fields = std::to_array<std::string_view>({"padding", "stride", "dilation"});
};
template <>
struct OpTraits<ConvDgradAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv_bwd";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"padding", "stride", "dilation", "x_dims"});
};
template <>
struct OpTraits<ConvWgradAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "conv", bench_family = "conv_bwd";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"padding", "stride", "dilation", "w_dims"});
};

// ---- matmul, pointwise
template <>
struct OpTraits<MatmulAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "matmul", bench_family = "matmul";
};
template <>
struct OpTraits<PointwiseAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "pointwise", bench_family = "pointwise";
  static constexpr bool accepts_scalar_inputs = true;
};

// ---- sdpa: every output is written to memory (no epilogue fuses after it)
// A decode step (one query per sequence) may split the keys across thread blocks.
std::string sdpa_forward_not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op);
struct SdpaTraits : OpTraitsDefaults {
  static constexpr std::string_view family = "sdpa", bench_family = "sdpa";
  static constexpr auto json_fields =
      std::to_array<std::string_view>({"attn_scale", "causal", "alignment", "left_bound", "right_bound",
                                       "alibi", "dropout", "deterministic", "max_seq_len_kv"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>(
      {"seq_len_q", "seq_len_kv", "page_table_k", "page_table_v", "block_mask", "seed", "offset"});
};
template <>
struct OpTraits<SdpaFwdAttrs> : SdpaTraits {
  static std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFwdAttrs&) {
    return sdpa_forward_not_bit_reproducible(g, op);
  }
};
template <>
struct OpTraits<SdpaFp8FwdAttrs> : SdpaTraits {
  static std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op,
                                          const SdpaFp8FwdAttrs&) {
    return sdpa_forward_not_bit_reproducible(g, op);
  }
};
template <>
struct OpTraits<SdpaBwdAttrs> : SdpaTraits {
  static constexpr bool reads_forward_outputs = true;
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op, const SdpaBwdAttrs& a) {
    return a.deterministic
               ? ""
               : "op '" + op.name +
                     "' (sdpa backward) accumulates dq with atomics; \"deterministic\": true repeats";
  }
};
template <>
struct OpTraits<SdpaFp8BwdAttrs> : SdpaTraits {
  static constexpr bool reads_forward_outputs = true;
};

// ---- norm, batchnorm
template <>
struct OpTraits<LayerNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon"});
};
template <>
struct OpTraits<RmsNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon"});
};
template <>
struct OpTraits<LayerNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};
template <>
struct OpTraits<RmsNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "norm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};
template <>
struct OpTraits<BatchNormAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"epsilon", "momentum"});
};
template <>
struct OpTraits<BatchNormInferenceAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
};
template <>
struct OpTraits<BatchNormBwdAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "batchnorm", bench_family = "norm";
  static constexpr bool outputs_in_memory = true;
};

// ---- pool (its JSON fields depend on the mode: json_fields(PoolAttrs) in pool.cpp)
template <>
struct OpTraits<PoolAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "pool", bench_family = "pool";
};

// ---- reduction
template <>
struct OpTraits<ReductionAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "reduction", bench_family = "reduction";
  static constexpr auto json_fields = std::to_array<std::string_view>({"reduce_dims"});
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op, const ReductionAttrs&) {
    return "op '" + op.name + "' (a reduction) adds partial sums in no fixed order";
  }
};

// ---- embedding (fusebox's own kernel; memory-bound, timed with the reductions)
template <>
struct OpTraits<EmbeddingAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "embedding", bench_family = "reduction";
  static constexpr bool outputs_in_memory = true;
  static constexpr bool native_only = true;
  static constexpr auto index_inputs = std::to_array<std::string_view>({"ids"});
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"ids"});
  static std::string not_bit_reproducible(const ResolvedGraph&, const ResolvedOp& op,
                                          const EmbeddingAttrs& a) {
    return a.backward && !a.deterministic
               ? "op '" + op.name + "' (embedding_bwd) adds with atomics; \"deterministic\": true repeats"
               : "";
  }
};

// ---- rope (fusebox's own kernel on every cuDNN: include/fusebox/ops/rope.h)
template <>
struct OpTraits<RopeAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "rope", bench_family = "norm";
  static constexpr auto json_fields = std::to_array<std::string_view>({"layout", "rope_dim", "scale"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"freqs", "offset"});
  static constexpr bool native_only = true;
};

// ---- cross_entropy (fusebox's own kernel: include/fusebox/ops/cross_entropy.h)
template <>
struct OpTraits<CrossEntropyAttrs> : OpTraitsDefaults {
  static constexpr std::string_view family = "cross_entropy", bench_family = "reduction";
  static constexpr auto json_fields = std::to_array<std::string_view>({"ignore_index"});
  static constexpr bool outputs_in_memory = true;
  static constexpr auto no_grad_inputs = std::to_array<std::string_view>({"labels"});
  static constexpr bool native_only = true;
};

}  // namespace fusebox::graph_ops
