// fusebox op family: pointwise ops (add, bias_add, relu, gelu, ...).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/pointwise.cpp (docs/architecture.md, "Adding an op").
#pragma once

#include <optional>
#include <string_view>

namespace fusebox {

enum class PointwiseMode {
  kAdd,       // y = a + b            (inputs a, b)
  kSub,       // y = a - b            (inputs a, b)
  kMul,       // y = a * b            (inputs a, b)
  kBiasAdd,   // y = x + bias         (inputs x, bias; bias broadcast, e.g. [1,K,1,1])
  kScale,     // y = x * scale        (inputs x, scale; scale a by-value scalar or tensor)
  kRelu,      // y = max(x, 0)        (input x)
  kGeluTanh,  // tanh approximation   (input x)
  kGeluErf,   // exact erf form       (input x)
  kSilu,      // x * sigmoid(x)       (input x)
  kSigmoid,   // (input x)
  kTanh,      // (input x)
  kReluBwd,   // y = x > 0 ? dy : 0   (inputs dy, x: the gradient and relu's forward input)
  // The other activations' backward, like relu_bwd: inputs dy and the forward's input x,
  // y = dy * f'(x) (the gradient rules of docs/training.md emit them).
  kGeluTanhBwd,  // f = gelu_tanh
  kGeluErfBwd,   // f = gelu_erf
  kSiluBwd,      // f = silu: s(x) * (1 + x * (1 - s(x))), s = sigmoid
  kSigmoidBwd,   // f = sigmoid: s(x) * (1 - s(x))
  kTanhBwd,      // f = tanh: 1 - tanh(x)^2
};

struct PointwiseAttrs {
  PointwiseMode mode = PointwiseMode::kAdd;
};

std::string_view pointwise_mode_name(PointwiseMode m);
std::optional<PointwiseMode> parse_pointwise_mode(std::string_view s);
bool pointwise_is_unary(PointwiseMode m);
// relu_bwd and the other activations' backward (inputs dy, x).
bool pointwise_is_activation_bwd(PointwiseMode m);

}  // namespace fusebox
