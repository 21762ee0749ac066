// fusebox kernels layer: token sampling on the GPU for the serving engine (issue 34), the same
// rule as the host's sample_token (fusebox/serve.h): temperature, then top-k, then top-p over the
// softmax, one draw from u in [0, 1) walking the tokens largest logit first (ties by index);
// greedy (the first largest logit) when the temperature is 0. Given the same logits and u it
// picks the same token as the host (both sum in double; only a draw within rounding of a
// boundary between two tokens could differ). No cuDNN here.
#pragma once

#include <cstdint>

#include "fusebox/status.h"

namespace fusebox::kernels {

// One row's sampling parameters and its uniform draw (the host's per-request generator).
struct SamplingRow {
  double temperature = 0;  // <= 0: greedy
  int64_t top_k = 0;       // 0: every token
  double top_p = 1;        // (0, 1]
  double u = 0;            // [0, 1)
};

// `rows` rows of `vocab` fp32 logits, row r at logits + r * row_stride (device); `params` (device,
// `rows` entries) and `tokens` (device, int32, `rows` entries) written. One thread block per row;
// asynchronous on `stream` (a cudaStream_t), capturable in a CUDA graph (no allocation, no sync).
// A sampled row costs a few passes over its logits per bit of a 64-bit key (a binary search per
// decision: top-k cut, top-p cut, the draw): correct first; a radix select would cut it 8x.
// `top_keys` (device, `rows` entries; optional): scratch for an argmax pre-pass over many blocks
// per row (a memset, then 2048 logits a block), which the greedy token and the softmax's shift
// then read. Without it one block per row finds the argmax, bound by its loads' latency (0.2 ms a
// row of 128k logits on the H200). The same tokens either way (a NaN logit aside: the pre-pass
// ranks it last).
Status sample_tokens(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                     const SamplingRow* params, int32_t* tokens, void* stream, uint64_t* top_keys = nullptr);

}  // namespace fusebox::kernels
