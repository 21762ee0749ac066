// fusebox op family: embedding (a table lookup), one of the op families of
// OpAttrs (fusebox/graph.h); its graph-layer definition is
// src/graph/ops/embedding.cpp (docs/architecture.md, "Adding an op").
//
// cuDNN 9.19 has no gather op: its paged_cache_load runs only inside SDPA
// graphs (alone it has no engine on the H200: "mmaNodeCount == 0 &&
// !is_pointwise_fusion", 2026-12-01). fusebox runs this op with a CUDA kernel
// of its own (src/kernels/), so it must be alone in its graph: a pipeline
// stage of its own (docs/architecture.md, "Native ops").
//
//   ids   int32 [N, 1, 1, 1]
//   table [V, H, 1, 1] (a row of H per id; bf16, fp16 or fp32)
//   add   [P, H, 1, 1], optional, P dividing N (e.g. BERT's position rows plus
//         its token-type row, P = the sequence length)
//   y     [N, H, 1, 1]: y[n, h] = table[ids[n], h] + add[n % P, h], summed in
//         fp32 and rounded once to y's dtype (bf16, fp16 or fp32; default the
//         graph's io dtype)
// Rows are contiguous (the H dim has stride 1). An id outside [0, V) reads
// nothing: its row of y is NaN, in the kernel and in the references; ids
// known before a run (the graph's values, --inputs files, a pipeline's
// inputs) are checked first, the error naming the position and the value.
#pragma once

namespace fusebox {

// embedding_bwd (the table's gradient, a scatter-add; issue 33):
//   ids    int32 [N, 1, 1, 1], as the forward's
//   dy     [N, H, 1, 1]: dL/dy of the forward (bf16, fp16 or fp32; rows contiguous)
//   dtable fp32 [V, H, 1, 1] with V = "rows": dtable[v, h] = sum over n with ids[n] = v
//          of dy[n, h], summed in fp32 (a row no id names is 0). An id outside [0, V)
//          adds nothing (known ids are checked before a run, as for the forward).
//   "deterministic": true sums each column in the order of n (bit-reproducible,
//   slower); otherwise the kernel adds with atomics, in no fixed order.
// The forward's `add` gets no gradient from it (the gradient rule refuses one).
struct EmbeddingAttrs {
  bool add = false;            // the optional input `add` is given
  bool backward = false;       // "embedding_bwd"
  int64_t rows = 0;            // embedding_bwd: V, the table's rows (required)
  bool deterministic = false;  // embedding_bwd: no atomics
};

}  // namespace fusebox
