// fusebox graph layer: the registration point of the op families.
//
// Every alternative T of OpAttrs (fusebox/graph.h) has one overload of each
// function below, written in the family's file (src/graph/ops/<family>.cpp).
// Callers dispatch with std::visit over a generic lambda (visit_op), so an
// alternative without its overload is a compile error, never a runtime
// default. To add an op: its attrs in include/fusebox/ops/<family>.h and a line
// in FUSEBOX_OP_TYPES (which declares everything below for it), then
// src/graph/ops/<family>.cpp with its traits entry (docs/architecture.md,
// "Adding an op").
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "canonical_writer.h"
#include "fusebox/graph.h"
#include "json_reader.h"
#include "traits.h"

namespace fusebox::graph_ops {

// What resolve() gives an op's inference: its tensors by role, and a way to
// finish an output (dims, strides: declared else `dense`, dtype: declared
// else `dflt`).
struct InferContext {
  std::string where;  // "[conv_fprop 'conv1']"
  ResolvedOp& op;
  std::vector<ResolvedTensor>& tensors;
  DType io_dtype;
  std::function<Status(const std::string& role, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& dense, DType dflt)>
      finish_output;

  ResolvedTensor& in(std::string_view role) const { return tensors[op.inputs.at(std::string(role))]; }
  ResolvedTensor& out(std::string_view role) const { return tensors[op.outputs.at(std::string(role))]; }
  // "[op 'name'] input 'role' ('tensor')"
  std::string in_where(std::string_view role) const;
  std::string out_where(std::string_view role) const;
};

// What flops() sees: the op's tensors, and data values of inputs where known
// (sequence lengths), by tensor name.
struct FlopsContext {
  const ResolvedGraph& g;
  const ResolvedOp& op;
  const std::map<std::string, std::vector<double>>& inputs;
  const ResolvedTensor& in(std::string_view role) const { return g.tensors[op.inputs.at(std::string(role))]; }
  const ResolvedTensor& out(std::string_view role) const {
    return g.tensors[op.outputs.at(std::string(role))];
  }
};

// What a gradient rule (grad(), below; docs/training.md) sees while
// derive_backward() writes the backward graph: the forward op, the gradients
// flowing into its outputs, and ways to read forward values, emit backward
// ops and hand gradients to its inputs. Implemented in src/graph/autodiff.cpp.
class GradContext {
 public:
  virtual ~GradContext() = default;
  virtual const ResolvedOp& op() const = 0;
  virtual const ResolvedGraph& forward() const = 0;
  // "[matmul 'fc1']", for messages.
  virtual std::string where() const = 0;
  bool has_in(std::string_view role) const { return op().inputs.count(std::string(role)) > 0; }
  bool has_out(std::string_view role) const { return op().outputs.count(std::string(role)) > 0; }
  const ResolvedTensor& in_tensor(std::string_view role) const {
    return forward().tensors[op().inputs.at(std::string(role))];
  }
  const ResolvedTensor& out_tensor(std::string_view role) const {
    return forward().tensors[op().outputs.at(std::string(role))];
  }
  // The backward tensor holding dL/d(output `role`), "" when no gradient reaches it.
  virtual std::string dy(std::string_view role) const = 0;
  // BackwardOptions::deterministic: emit backward ops without atomics where there is a choice.
  virtual bool deterministic() const = 0;
  // Whether input `role` needs a gradient (on a path from a wrt input, floating point).
  virtual bool wants(std::string_view role) const = 0;
  // The forward value of input / output `role` in the backward graph: the saved
  // tensor, or a recomputation of a virtual one.
  virtual Result<std::string> in(std::string_view role) = 0;
  virtual Result<std::string> out(std::string_view role) = 0;
  // Input `role` with its last two dims swapped, a view of the saved tensor (no
  // copy). InvalidArgument when the input is virtual (it has no memory to view).
  virtual Result<std::string> in_transposed(std::string_view role) = 0;
  // Adds one backward op (named "<forward op>.<what>"), inputs by role; returns its
  // output tensors by role: virtual, unless the op writes memory (its traits).
  virtual Result<std::map<std::string, std::string>> emit(std::string_view what, OpAttrs attrs,
                                                          std::map<std::string, std::string> inputs,
                                                          std::vector<std::string> output_roles = {}) = 0;
  // emit() of a pointwise op; returns "y".
  Result<std::string> pointwise(std::string_view what, PointwiseMode mode, const std::string& a,
                                const std::string& b = "");
  // A by-value fp32 scalar tensor of the backward graph.
  virtual std::string scalar(double value) = 0;
  // Hands `g` (a backward tensor, the input's dims or broadcast-larger) to
  // input `role`: summed over the dims the input was broadcast along, added to
  // what other consumers of the tensor gave.
  virtual Status add_grad(std::string_view role, const std::string& g) = 0;
  // add_grad(input, emitted[output]) for each pair whose input the op has and wants.
  Status hand(const std::map<std::string, std::string>& emitted,
              std::initializer_list<std::pair<const char*, const char*>> input_output);
  // NotSupported: the op has no gradient rule, or lacks what it needs.
  Status no_rule(std::string_view why) const;
};

// The per-op functions. For each family: the JSON type names it owns
// (type_names/make_attrs), roles, JSON attributes, inference, canonical form,
// human-readable attributes and FLOPs.
#define FUSEBOX_GRAPH_OP_FUNCTIONS(T)                                                                  \
  std::string_view type_name(const T&);                                                                \
  std::vector<std::string_view> input_roles(const T&);                                                 \
  std::vector<std::string_view> output_roles(const T&);                                                \
  Status parse_json(const JsonReader& r, const nlohmann::json& v, const std::string& path, OpSpec& op, \
                    T& a);                                                                             \
  void write_json(const T& a, nlohmann::ordered_json& j);                                              \
  Status infer(const InferContext& ctx, T& a);                                                         \
  void canonical(const T& a, CanonicalWriter& w);                                                      \
  void describe(const T& a, std::ostream& os);                                                         \
  /* the resolved attributes for `fusebox check --json` (defaults applied; docs/cli.md) */             \
  void resolved_json(const FlopsContext& ctx, const T& a, nlohmann::ordered_json& j);                  \
  double flops(const FlopsContext& ctx, const T& a);                                                   \
  /* the gradient rule: the backward of one op (docs/training.md); no_rule() where there is none */    \
  Status grad(GradContext& ctx, const T& a);                                                           \
  /* its traits entry (traits.h), defined by FUSEBOX_OP_TRAITS(T) after the entry */                   \
  OpTraitsInfo traits_info(const T& a);                                                                \
  std::string not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op, const T& a);

// conv.cpp
FUSEBOX_OP_TYPES(FUSEBOX_GRAPH_OP_FUNCTIONS)
#undef FUSEBOX_GRAPH_OP_FUNCTIONS

// Extra text for a wrong set of output roles (e.g. generate_stats): none unless overloaded.
template <typename T>
std::string output_roles_hint(const T&) {
  return "";
}
std::string output_roles_hint(const LayerNormAttrs& a);
std::string output_roles_hint(const RmsNormAttrs& a);
std::string output_roles_hint(const RmsNormBwdAttrs& a);
std::string output_roles_hint(const BatchNormAttrs& a);
std::string output_roles_hint(const SdpaFwdAttrs& a);
std::string output_roles_hint(const SdpaBwdAttrs& a);
std::string output_roles_hint(const SdpaFp8FwdAttrs& a);
std::string output_roles_hint(const SdpaFp8BwdAttrs& a);

// The JSON type names each family owns, and the attrs a name denotes
// (pointwise owns one per mode).
#define FUSEBOX_GRAPH_OP_NAMES(T)                                  \
  std::vector<std::string_view> type_names(std::type_identity<T>); \
  std::optional<OpAttrs> make_attrs(std::string_view type_name, std::type_identity<T>);
FUSEBOX_OP_TYPES(FUSEBOX_GRAPH_OP_NAMES)
#undef FUSEBOX_GRAPH_OP_NAMES

// Dispatch: fn(attrs) for the op's alternative.
template <typename Attrs, typename Fn>
decltype(auto) visit_op(Attrs&& attrs, Fn&& fn) {
  return std::visit(std::forward<Fn>(fn), std::forward<Attrs>(attrs));
}

// The attrs for a JSON type name, over every alternative; nullopt if none owns it.
std::optional<OpAttrs> attrs_for_type_name(std::string_view name);
// Every op type name, for error messages ("accepted ops are ...").
std::string accepted_type_names();

// Shared helpers of the family files.
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;  // a dim, stride, padding, ... (cuDNN's int32)
std::string squote(const std::string& s);            // 'name'
Status check_dtype_in(const std::string& what, DType got, std::initializer_list<DType> allowed,
                      const std::string& why);

}  // namespace fusebox::graph_ops
