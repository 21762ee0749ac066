// fusebox op family: convolution (conv_fprop, conv_dgrad, conv_wgrad).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/conv.cpp (docs/architecture.md, "Adding an op").
//
// All three describe the same forward convolution y = conv(x, w) with
//   x [N, C, (D,) H, W], w [K, C/G, (T,) R, S], y [N, K, (O,) P, Q]
// (G = C / w's dim 1 groups) and the same padding, stride and dilation:
//   conv_fprop: x, w  -> y
//   conv_dgrad: dy, w -> dx  (dL/dx given dL/dy; dx has x's dims)
//   conv_wgrad: dy, x -> dw  (dL/dw given dL/dy; dw has w's dims)
#pragma once

#include <cstdint>
#include <vector>

namespace fusebox {

struct ConvFpropAttrs {
  std::vector<int64_t> padding;   // per spatial dim; default 0
  std::vector<int64_t> stride;    // default 1
  std::vector<int64_t> dilation;  // default 1
};

// The data gradient. `x_dims` (required) is the forward input's dims, i.e.
// dx's: with stride > 1 several input sizes give the same dy, and dy and w
// alone do not give the group count (C = G * w's dim 1).
struct ConvDgradAttrs {
  std::vector<int64_t> padding;
  std::vector<int64_t> stride;
  std::vector<int64_t> dilation;
  std::vector<int64_t> x_dims;  // [N, C, (D,) H, W]
};

// The weight gradient. `w_dims` (required) is the filter's dims, i.e. dw's:
// with stride > 1 several filter sizes give the same dy, and the group count
// is C / w_dims[1].
struct ConvWgradAttrs {
  std::vector<int64_t> padding;
  std::vector<int64_t> stride;
  std::vector<int64_t> dilation;
  std::vector<int64_t> w_dims;  // [K, C/G, (T,) R, S]
};

}  // namespace fusebox
