// fusebox: the facts of every op, as data (issue 30). One entry per op attribute type, in the
// op's family file (src/graph/ops/<family>.cpp; src/graph/ops/traits.h says what an entry
// holds); these functions read it for any op, so code outside the graph layer asks a fact instead of
// testing the op's type. `fusebox ops --json` prints op_catalog().
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fusebox/graph.h"

namespace fusebox {

struct OpTraitsInfo {
  std::string_view family;        // the op family: "conv", "matmul", "pointwise", "sdpa", "norm", ...
  std::string_view bench_family;  // the BENCHMARKS.md section its graphs are timed in
  std::vector<std::string_view> json_fields;  // op-specific JSON fields (docs/graph-format.md)
  bool accepts_scalar_inputs = false;         // inputs may be by-value scalars
  bool outputs_in_memory = false;             // outputs must be non-virtual (the op writes memory)
  bool native_only = false;  // cuDNN 9.19 has no op: fusebox's own kernel runs it, alone in its graph
  bool reads_forward_outputs = false;          // a backward op reading its forward's o and stats
  std::vector<std::string_view> index_inputs;  // input roles whose values index memory: checked before a run
  std::vector<std::string_view>
      no_grad_inputs;        // input roles that never carry a gradient (fusebox/autodiff.h)
  bool sums_inputs = false;  // adds many values of its input (a sum, a mean): see partition.h
};

// The traits of an op, from its attributes.
OpTraitsInfo op_traits(const OpAttrs& attrs);

// Why two runs of one plan of `g` may differ in the last bits because of `op`
// (atomics, a split-K decode), or "" when they may not.
std::string op_not_bit_reproducible(const ResolvedGraph& g, const ResolvedOp& op);

// Every op type a graph file may name (pointwise's modes, each pool), with its
// roles (those of the op's default attributes, optional ones included) and traits.
struct OpCatalogEntry {
  std::string_view name;
  std::vector<std::string_view> input_roles, output_roles;
  OpTraitsInfo traits;
};
std::vector<OpCatalogEntry> op_catalog();

}  // namespace fusebox
