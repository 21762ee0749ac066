// fusebox op family: rope (rotary position embedding, forward and backward),
// one of the op families of OpAttrs (fusebox/graph.h); its graph-layer
// definition is src/graph/ops/rope.cpp (docs/architecture.md, "Adding an op").
//
//   x       [B, H, S, D] (q or k, any strides; bf16, fp16 or fp32); for
//           rope_bwd the gradient dy of the same shape
//   freqs   [1, 1, P, R/2] fp32: the angle of rotated pair i at position p
//           (raw angles, as cuDNN's and Transformer Engine's RoPE take them;
//           for Llama, freqs[p, i] = p * base^(-2i/R)). P >= S.
//   offset  [B, 1, 1, 1] int32, optional: sequence s of batch b is at position
//           offset[b] + s (decode: the tokens already in the KV cache);
//           without it, position s. A position outside [0, P) gives NaN.
//   y       [B, H, S, D] (dx for rope_bwd): y's dtype defaults to the graph's io dtype
//
// The head dim splits like cuDNN's ROPE_FWD: the leading D - R values pass
// through scaled, the trailing R = rope_dim rotate (rope_dim 0 or absent: R = D).
// With c = cos(theta), s = sin(theta), theta = freqs[pos, i], alpha = scale:
//   layout "half" (GPT-NeoX, Llama in Hugging Face): pair i is (i, i + R/2)
//     y[i]       = alpha * (x[i] c - x[i + R/2] s)
//     y[i + R/2] = alpha * (x[i + R/2] c + x[i] s)
//   layout "interleaved" (GPT-J, Meta's Llama): pair i is (2i, 2i + 1), same formulas
// rope_bwd is the transpose (rotation by -theta): dx = alpha * R(-theta) dy,
// the gradient of rope with respect to x; freqs get no gradient.
// Computed in fp32, rounded once to y's dtype.
//
// Every cuDNN version: fusebox's own kernel runs it (src/kernels/rope.cu), so it
// is alone in its graph (a pipeline stage of its own). cuDNN >= 9.24 has a RoPE
// op (fusebox/cudnn_features.h, "rope") that takes one angle per element and
// fuses into SDPA graphs; fusebox does not lower to it yet.
#pragma once

#include <cstdint>

namespace fusebox {

enum class RopeLayout { kHalf, kInterleaved };

struct RopeAttrs {
  bool backward = false;  // "rope_bwd": dy -> dx
  RopeLayout layout = RopeLayout::kHalf;
  int64_t rope_dim = 0;  // R; 0 = the whole head dim
  double scale = 1.0;    // alpha
  bool offset = false;   // the optional input `offset` is given
};

}  // namespace fusebox
