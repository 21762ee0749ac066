// fusebox: rules cuDNN enforces only when a plan is built, checked by
// resolve() so that `fusebox check` refuses such graphs (InvalidArgument,
// exit 2) naming the tensor or op and the rule. docs/graph-format.md, "Rules
// cuDNN enforces".
#pragma once

#include <cstddef>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::graph_checks {

// cuDNN 9.19 refuses an operation graph of more than 250 operations
// ("numOps exceeds MAX_OPGRAPH_OPS", CUDNN_STATUS_BAD_PARAM, from
// build_operation_graph). Not documented; measured deviceless with pointwise
// chains: 250 build, 251 fail. conv_fprop, matmul and pointwise ops are one
// operation each; an sdpa op is several, so for graphs with sdpa ops this is
// a necessary condition only.
inline constexpr size_t kMaxCudnnOps = 250;

// Every check below, in order.
Status check_cudnn_rules(const ResolvedGraph& g);

// No two logical elements of a graph input or output share an address.
Status check_no_aliasing(const ResolvedGraph& g);
// At most kMaxCudnnOps ops.
Status check_op_count(const ResolvedGraph& g);

}  // namespace fusebox::graph_checks
