// fusebox: splitting a graph no engine runs whole into parts that do have
// engines (issue 29, "every valid graph runs"). Pure graph logic: which parts
// have engines is asked of a support oracle, so the decisions are testable
// without cuDNN (a fake oracle) and the cuDNN layer supplies the real one.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox {

// One part: consecutive ops of the whole graph (in its topological order),
// as a graph of their own. Tensors keep their names; a virtual tensor of the
// whole graph that crosses a cut is a non-virtual output of the part that
// makes it and an input of the parts that read it (a temporary).
struct GraphPart {
  int first_op = 0;  // index into the whole graph's ops
  int op_count = 0;
  ResolvedGraph graph;
  std::string why_cut;  // why this part ends where it does ("" for the last part)
};

struct GraphPartition {
  std::vector<GraphPart> parts;
  // Whole-graph virtual tensors that become buffers between parts, by index
  // into the whole graph's tensors, with their bytes.
  std::vector<int> temporaries;
  // Each temporary's dtype, by tensor index: the intermediate dtype where the
  // parts take it, else the io dtype (what fused engines write to memory).
  std::map<int, DType> temporary_dtypes;
  int64_t temporary_bytes = 0;  // each rounded up to 256 bytes
  // Temporaries stored in fewer bits than the intermediate dtype though a later op sums them
  // (op_traits' sums_inputs), each with why: done only when no partition (the last resort
  // included) writes them in the intermediate dtype. Reported with the plan.
  std::vector<std::string> narrowed;
  std::string summary()
      const;  // "2 parts: [conv_dgrad 'dgrad'] | [relu_bwd 'drelu'] (temporaries: dgrad_out 838 KB)"
};

// The sub-graph of `g` made of ops [first, first + count): tensors crossing
// the cut become non-virtual (their dims kept, laid out like their producer's
// input, in the intermediate dtype unless `temporary_dtypes` names another).
// Resolved and canonicalized like any graph.
Result<ResolvedGraph> graph_part(const ResolvedGraph& g, int first, int count,
                                 const std::map<int, DType>& temporary_dtypes = {});

// The partition of `g` into the given consecutive op ranges ({first, count},
// covering every op from 0 in order): the parts and the temporaries between
// them. What a stored partitioned plan is rebuilt from.
Result<GraphPartition> partition_at(const ResolvedGraph& g, const std::vector<std::pair<int, int>>& ranges,
                                    const std::map<int, DType>& temporary_dtypes = {});

// The independent groups of g's ops: ops joined by a tensor one of them writes and another reads
// are in one group (shared graph inputs join nothing). groups[i] is op i's group, numbered from 0
// in the order of each group's first op. cuDNN runs one connected graph: on the H100 and H200
// (cuDNN 9.19, 2026-12-05) every engine that accepted two independent matmuls in one graph (a
// training step's da and dw, both reading dy) wrote part of one output and none of another, so
// a graph of several groups is refused by the cuDNN lowering and its groups run as parts.
std::vector<int> independent_op_groups(const ResolvedGraph& g);

// Whether one part has an engine: Ok, or why not.
using SupportOracle = std::function<Status(const ResolvedGraph& part)>;

// The fewest consecutive parts the oracle accepts, largest first part first
// (greedy over the topological order). A part's outgoing temporaries are
// tried in the intermediate dtype, then in the io dtype; a temporary that a later op sums
// (a reduce_sum or reduce_mean, directly or through pointwise ops) only in the intermediate dtype, unless no
// partition is found that way (then it is narrowed and `narrowed` says so). A graph the oracle accepts whole
// is one part. When a single op is refused, NotSupported naming the op, its tensors and the oracle's reason.
Result<GraphPartition> partition_graph(const ResolvedGraph& g, const SupportOracle& oracle);

// The same, with a last resort for a single op (fusebox's reference kernels, issue 29): first
// without it; then each op the oracle refused alone in every form it was asked (and never
// accepted alone) may be served by `last_resort` (asked about that op alone, after the oracle
// refused it again), and the partition is tried again, until it succeeds or no new op qualifies.
// So a part that only needed other temporaries' dtypes keeps its engine.
Result<GraphPartition> partition_graph(const ResolvedGraph& g, const SupportOracle& oracle,
                                       const SupportOracle& last_resort);

}  // namespace fusebox
