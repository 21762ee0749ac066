// fusebox op family: transpose (a layout change written to memory). One of the op families of
// OpAttrs (fusebox/graph.h); its graph-layer definition is src/graph/ops/transpose.cpp
// (docs/architecture.md, "Adding an op").
#pragma once

#include <cstdint>
#include <vector>

namespace fusebox {

// JSON "transpose": input "x", output "y", "permutation": [p0, p1, ...], as torch.permute:
// y has dims x.dims[p0], x.dims[p1], ... and y[i0, i1, ...] = x at index j with j[p_k] = i_k.
// y is written to memory in its own layout (dense row-major unless declared), so e.g. an
// attention tensor [B,S,H,D] becomes [B,H,S,D] with permutation [0, 2, 1, 3]. y has x's dtype.
// It ends its graph: an op reading y in the same graph is split from it (the partition).
struct TransposeAttrs {
  std::vector<int64_t> permutation;
};

}  // namespace fusebox
