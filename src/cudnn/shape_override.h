// Private to src/cudnn/, free of cuDNN types (unit-tested deviceless): what a plan built for one
// shape of a symbolic graph is told at execute to serve another (shape_override.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::cudnn {

// Execute-time shape override (plan_at_shape): the non-virtual tensors whose dims or strides
// differ from the shape the plan was built for, as cuDNN takes them.
struct ShapeOverride {
  std::vector<int64_t> uids;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<int64_t>> strides;
};

// The overrides taking `built` (the graph a plan was built for) to `g` (the same symbolic graph
// at another shape), both as lowered (matmul batch dims folded): InvalidArgument naming what
// differs beyond dims and strides (another graph, op attributes, by-value scalars, tensors).
// Pure: no cuDNN call.
Result<ShapeOverride> shape_override_between(const ResolvedGraph& built, const ResolvedGraph& g);

}  // namespace fusebox::cudnn
