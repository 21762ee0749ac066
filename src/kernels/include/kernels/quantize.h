// fusebox kernels layer: row-wise FP8 (e4m3) quantization, the serving engine's FP8 weights
// (issue 34): each row of a bf16 matrix [rows, cols] becomes e4m3 values q and one fp32 scale,
// x ~= q * scale, with scale = max|x| / 448 over the row (1 for a row of zeros), q = x / scale
// rounded to nearest even and saturated. The activations of a step are quantized on the GPU by
// token (quantize_rows_fp8), the weights on the host by output channel
// (quantize_rows_fp8_host, the tests' reference too). No cuDNN here.
#pragma once

#include <cstdint>

#include "fusebox/status.h"

namespace fusebox::kernels {

constexpr float kE4M3Max = 448.f;

struct Fp8Rows {
  const void* x = nullptr;  // bf16 [rows, cols], rows `ld` elements apart
  int64_t rows = 0, cols = 0, ld = 0;
  void* q = nullptr;       // e4m3 [rows, cols], dense
  float* scale = nullptr;  // [rows]
};

// Enqueues the quantization on `stream` (a cudaStream_t); capturable in a CUDA graph.
Status quantize_rows_fp8(const Fp8Rows& r, void* stream);

// The same rule on the host over fp32 rows (dense [rows, cols]): e4m3 bytes and the scales.
void quantize_rows_fp8_host(const float* x, int64_t rows, int64_t cols, uint8_t* q, float* scale);

}  // namespace fusebox::kernels
