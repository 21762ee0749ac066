// fusebox op family: cross_entropy (softmax cross-entropy, forward and
// backward), one of the op families of OpAttrs (fusebox/graph.h); its
// graph-layer definition is src/graph/ops/cross_entropy.cpp (docs/architecture.md,
// "Adding an op"). The loss of a language model's output projection (issue 33).
//
// cross_entropy:
//   logits  [N, V, 1, 1] (bf16, fp16 or fp32; rows of V contiguous values)
//   labels  [N, 1, 1, 1] int32: the class of each row
//   loss    [N, 1, 1, 1] fp32: lse[n] - logits[n, labels[n]] (no reduction:
//           a mean over the batch is the caller's dloss = 1/N)
//   lse     [N, 1, 1, 1] fp32, optional: log(sum_v exp(logits[n, v])), saved
//           for the backward
// cross_entropy_bwd:
//   logits, labels as above; lse from the forward; dloss [N, 1, 1, 1] fp32
//   dlogits [N, V, 1, 1]: (exp(logits - lse) - onehot(labels)) * dloss[n],
//           rounded once to its dtype (default the graph's io dtype)
// A row whose label is `ignore_index` (default -100, as PyTorch's) has loss 0
// and gradient 0. Any other label outside [0, V) gives a NaN loss (and NaN
// gradient row). Everything is computed in fp32 from the logits as stored.
//
// cuDNN has no op for it: fusebox's own kernel runs it (src/kernels/cross_entropy.cu),
// alone in its graph (a pipeline stage of its own).
#pragma once

#include <cstdint>

namespace fusebox {

struct CrossEntropyAttrs {
  bool backward = false;  // "cross_entropy_bwd"
  bool lse = false;       // the forward writes the optional output `lse`
  int64_t ignore_index = -100;
};

}  // namespace fusebox
