// fusebox graph layer: the facts of every op as data, one OpTraits entry per
// alternative of OpAttrs (issue 30), written in the op's family file
// (src/graph/ops/<family>.cpp) and followed there by FUSEBOX_OP_TRAITS(T),
// which defines the layer's two reads of it (traits_info, not_bit_reproducible,
// declared for every op of the list in ops.h: an op without them fails to link).
// An entry inherits OpTraitsDefaults and states only what differs.
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
//   sums_inputs(a)    the op adds many values of its input (a sum, a mean): an
//                     input rounded to fewer bits before it loses precision
//                     under cancellation, so the partitioner narrows a
//                     temporary it reads only as a last resort (partition.h)
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/op_traits.h"

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
  template <typename A>
  static bool sums_inputs(const A&) {
    return false;
  }
};

// Op-specific JSON fields accepted besides op, name, inputs, outputs, compute_dtype: the entry's,
// unless the family overloads this for an op whose fields depend on its attributes.
template <typename T>
std::vector<std::string_view> json_fields(const T&) {
  return {OpTraits<T>::json_fields.begin(), OpTraits<T>::json_fields.end()};
}
std::vector<std::string_view> json_fields(const PoolAttrs& a);       // by mode (pool.cpp)
std::vector<std::string_view> json_fields(const EmbeddingAttrs& a);  // embedding_bwd: rows, deterministic

// An entry as the runtime struct fusebox/op_traits.h publishes.
template <typename T>
OpTraitsInfo traits_info_of(const T& a) {
  using Tr = OpTraits<T>;
  OpTraitsInfo t;
  t.family = Tr::family;
  t.bench_family = Tr::bench_family;
  t.json_fields = json_fields(a);
  t.accepts_scalar_inputs = Tr::accepts_scalar_inputs;
  t.outputs_in_memory = Tr::outputs_in_memory;
  t.native_only = Tr::native_only;
  t.reads_forward_outputs = Tr::reads_forward_outputs;
  t.index_inputs.assign(Tr::index_inputs.begin(), Tr::index_inputs.end());
  t.no_grad_inputs.assign(Tr::no_grad_inputs.begin(), Tr::no_grad_inputs.end());
  t.sums_inputs = Tr::sums_inputs(a);
  return t;
}

// After an op's entry, in its family file: the definitions ops.h declares for it.
#define FUSEBOX_OP_TRAITS(T)                                                                   \
  OpTraitsInfo traits_info(const T& a) { return traits_info_of(a); }                           \
  std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op, const T& a) { \
    return OpTraits<T>::not_bit_reproducible(g, op, a);                                        \
  }

}  // namespace fusebox::graph_ops
