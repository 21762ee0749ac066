// fusebox op family: normalization (layernorm, rmsnorm and their backward ops).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/norm.cpp (docs/architecture.md, "Adding an op").
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace fusebox {

// ---- Normalization over the trailing dims (cuDNN's layer norm and RMS norm).
//
// x has rank >= 2. Its leading dims are rows, its trailing dims are normalized:
// the scale (and bias) has x's dims with the leading (row) dims set to 1, e.g.
// x [8192, 4096, 1, 1] (cuDNN's samples: [B*S, H, 1, 1]) with scale [1, 4096, 1, 1],
// or x [B, S, H] with scale [1, 1, H]. The first dim is always a row dim.
// For each row r over its n normalized elements:
//   layernorm: mean = sum(x) / n,  var = sum((x - mean)^2) / n  (biased),
//              inv_variance = 1 / sqrt(var + epsilon),
//              y = (x - mean) * inv_variance * scale + bias
//   rmsnorm:   inv_variance = 1 / sqrt(sum(x^2) / n + epsilon)   (no mean is taken),
//              y = x * inv_variance * scale [+ bias]
// The statistics (training phase) are fp32 tensors with x's dims on the row
// dims and 1 on the normalized ones: [8192, 1, 1, 1], [B, S, 1].
enum class NormPhase { kInference, kTraining };
std::string_view norm_phase_name(NormPhase p);  // "inference", "training"

// layernorm: inputs x, scale, bias; outputs "y" and, in the training phase,
// "mean" and "inv_variance" (naming them in a graph selects the phase).
struct LayerNormAttrs {
  double epsilon = 1e-5;  // by value, baked into the plan
  NormPhase phase = NormPhase::kInference;
};

// rmsnorm: inputs x, scale [, bias]; outputs "y" and, in the training phase,
// "inv_variance" (naming it selects the phase). Naming a "bias" input sets `bias`.
struct RmsNormAttrs {
  double epsilon = 1e-5;
  NormPhase phase = NormPhase::kInference;
  bool bias = false;
};

// ---- Backward (cuDNN's DLN and DRMSNorm), from the forward's saved statistics.
// With xhat = (x - mean) * inv_variance (rmsnorm: x * inv_variance), g = scale,
// and mean_n() the mean over a row's n normalized elements:
//   layernorm_bwd: dx = inv_variance * (g*dy - mean_n(g*dy) - xhat * mean_n(g*dy*xhat))
//   rmsnorm_bwd:   dx = inv_variance * (g*dy - xhat * mean_n(g*dy*xhat))
//   dscale = sum over rows of dy * xhat,  dbias = sum over rows of dy
// The statistics are inputs: the backward uses them as given (it does not
// recompute them from x).
// layernorm_bwd: inputs dy (like x), x, scale, mean, inv_variance (fp32, the
// forward's statistics dims); outputs "dx" (like x), "dscale", "dbias" (like scale).
struct LayerNormBwdAttrs {};
// rmsnorm_bwd: inputs dy, x, scale, inv_variance; outputs "dx", "dscale" and,
// when named (sets `dbias`), "dbias".
struct RmsNormBwdAttrs {
  bool dbias = false;
};

// The number of leading (row) dims of x that `scale_dims` leaves at 1: the
// smallest k >= 1 with scale_dims == [1] * k + x_dims[k:], or -1 when there
// is none (ranks differ, or scale is not x's trailing dims).
int64_t norm_row_dims(const std::vector<int64_t>& x_dims, const std::vector<int64_t>& scale_dims);

}  // namespace fusebox
