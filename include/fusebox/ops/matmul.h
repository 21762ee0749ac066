// fusebox op family: matmul.
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/matmul.cpp (docs/architecture.md, "Adding an op").
#pragma once

namespace fusebox {

struct MatmulAttrs {};

}  // namespace fusebox
