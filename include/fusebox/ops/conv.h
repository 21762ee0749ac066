// fusebox op family: convolution (conv_fprop).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/conv.cpp (docs/architecture.md, "Adding an op").
#pragma once

#include <cstdint>
#include <vector>

namespace fusebox {

struct ConvFpropAttrs {
  std::vector<int64_t> padding;   // per spatial dim; default 0
  std::vector<int64_t> stride;    // default 1
  std::vector<int64_t> dilation;  // default 1
};

}  // namespace fusebox
