// fusebox: token sampling on the GPU (kernels/sampling.h). Each token has a 64-bit key that
// orders the vocabulary as the host's stable sort does (larger logit first, then smaller index):
// the logit's bits made monotonic in the high word, the bitwise-negated index in the low word.
// Every decision of the host's rule is "the largest key t with F(tokens whose key >= t) above a
// bound" for a monotone F (a count or a probability mass), found by a binary search over the
// 64 key bits, each step one block-wide reduction over the row.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/sampling.h"

namespace fusebox::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 8;                      // the argmax pre-pass: loads in flight per thread
constexpr int64_t kChunk = kThreads * kPerThread;  // logits per block of the pre-pass

__device__ __forceinline__ uint64_t key_of(float v, int64_t i) {
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // monotonic in v
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint64_t>(~static_cast<uint32_t>(i));
}

// Block-wide sums (all threads get the result).
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  const double r = shared[0];
  __syncthreads();
  return r;
}

// The smallest key among the candidates (the last token of the walk).
__device__ uint64_t smallest_candidate(const float* logits, int64_t vocab, uint64_t keep_min,
                                       unsigned long long* shared) {
  unsigned long long m = ~0ull;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint64_t k = key_of(logits[i], i);
    if (k >= keep_min && k < m) m = k;
  }
  shared[threadIdx.x] = m;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s && shared[threadIdx.x + s] < shared[threadIdx.x])
      shared[threadIdx.x] = shared[threadIdx.x + s];
    __syncthreads();
  }
  const uint64_t r = shared[0];
  __syncthreads();
  return r;
}

// The argmax pre-pass: many blocks per row (one block per row is bound by the latency of its
// loads: 0.2 ms for a 128k vocabulary on the H200), each the largest key of a chunk, combined by
// an atomic maximum into top[row] (zeroed before). A NaN logit counts as the smallest.
__global__ void argmax_kernel(const float* logits, int64_t vocab, int64_t row_stride,
                              unsigned long long* top) {
  const int64_t row = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const float* x = logits + row * row_stride;
  float v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + j * kThreads + threadIdx.x;
    v[j] = i < vocab ? x[i] : NAN;
  }
  unsigned long long best = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + j * kThreads + threadIdx.x;
    if (i < vocab && v[j] == v[j]) {
      const unsigned long long k = key_of(v[j], i);
      if (k > best) best = k;
    }
  }
  for (int off = 16; off > 0; off /= 2) {
    const unsigned long long o = __shfl_xor_sync(0xFFFFFFFFu, best, off);
    if (o > best) best = o;
  }
  if ((threadIdx.x & 31) == 0 && best) atomicMax(top + row, best);
}

struct Row {
  const float* logits;
  int64_t vocab;
  float top;          // the largest logit
  double temp;        // the temperature (divided by, as the host does)
  uint64_t keep_min;  // tokens with key >= keep_min are candidates (0: all)
};

// Sum over tokens with key >= t (and >= r.keep_min) of their count (mass = false) or their
// unnormalized probability exp((l - top) / T) (mass = true).
__device__ double sum_from(const Row& r, uint64_t t, bool mass, double* shared) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < r.vocab; i += blockDim.x) {
    const float v = r.logits[i];
    const uint64_t k = key_of(v, i);
    if (k >= t && k >= r.keep_min) acc += mass ? exp((static_cast<double>(v) - r.top) / r.temp) : 1.0;
  }
  return block_sum(acc, shared);
}

// The largest key t with sum_from(t) > bound (a token's key; the predicate holds for t = 0
// whenever the whole sum exceeds the bound).
__device__ uint64_t largest_key_above(const Row& r, bool mass, double bound, double* shared) {
  uint64_t t = 0;
  for (int bit = 63; bit >= 0; --bit) {
    const uint64_t trial = t | (uint64_t{1} << bit);
    if (sum_from(r, trial, mass, shared) > bound) t = trial;
  }
  return t;
}

__global__ void sample_kernel(const float* logits, int64_t vocab, int64_t row_stride,
                              const SamplingRow* params, int32_t* tokens,
                              const unsigned long long* top_keys) {
  __shared__ double shared[kThreads];
  __shared__ float top_v;
  __shared__ int64_t top_i;
  const SamplingRow p = params[blockIdx.x];
  Row r{logits + static_cast<int64_t>(blockIdx.x) * row_stride, vocab, 0.f, 0.0, 0};
  // The first largest logit (the greedy token, and the softmax's shift): from the pre-pass, or
  // here with one block.
  if (top_keys) {
    if (threadIdx.x == 0) {
      const unsigned long long k = top_keys[blockIdx.x];
      top_i = k ? static_cast<int64_t>(~static_cast<uint32_t>(k & 0xFFFFFFFFu)) : 0;  // all NaN: token 0
      top_v = r.logits[top_i];
    }
    __syncthreads();
  } else {
    float best = -INFINITY;
    int64_t best_i = -1;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float v = r.logits[i];
      if (best_i < 0 || v > best) {  // within a thread indices rise: strict keeps the first
        best = v;
        best_i = i;
      }
    }
    if (threadIdx.x == 0) {
      top_v = -INFINITY;
      top_i = -1;
    }
    __syncthreads();
    for (int w = 0; w < blockDim.x; ++w) {  // a fixed order: the result does not depend on timing
      if (threadIdx.x == w && best_i >= 0 &&
          (top_i < 0 || best > top_v || (best == top_v && best_i < top_i))) {
        top_v = best;
        top_i = best_i;
      }
      __syncthreads();
    }
  }
  if (p.temperature <= 0 || vocab <= 0) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = static_cast<int32_t>(top_i);
    return;
  }
  r.top = top_v;
  r.temp = p.temperature;
  // top-k: the k-th largest key is the largest t with at least k tokens at or above it.
  if (p.top_k > 0 && p.top_k < vocab) {
    r.keep_min = largest_key_above(r, false, static_cast<double>(p.top_k) - 0.5, shared);
  }
  const double total = sum_from(r, 0, true, shared);
  // top-p: the smallest prefix whose mass reaches top_p ends at the largest t whose mass at or
  // above it reaches top_p * total.
  if (p.top_p < 1) {
    const double need = p.top_p * total;
    const uint64_t cut = largest_key_above(r, true, need * (1 - 1e-15) - 1e-300, shared);
    if (cut > r.keep_min) r.keep_min = cut;
  }
  const double kept = sum_from(r, 0, true, shared);
  // The draw: the first token (largest key first) whose running mass exceeds u * kept, i.e. the
  // largest t whose mass at or above it exceeds it.
  const double x = p.u * kept;
  uint64_t chosen = largest_key_above(r, true, x, shared);
  if (!(sum_from(r, chosen, true, shared) > x)) {
    // Rounding ran past the last kept token: the host takes that one too.
    __shared__ unsigned long long shared64[kThreads];
    chosen = smallest_candidate(r.logits, vocab, r.keep_min, shared64);
  }
  if (threadIdx.x == 0)
    tokens[blockIdx.x] = static_cast<int32_t>(~static_cast<uint32_t>(chosen & 0xFFFFFFFFu));
}

}  // namespace

Status sample_tokens(const float* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                     const SamplingRow* params, int32_t* tokens, void* stream, uint64_t* top_keys) {
  if (rows < 0 || vocab < 1 || vocab > INT32_MAX || row_stride < vocab) {
    return InvalidArgument("sample_tokens: " + std::to_string(rows) + " rows of " + std::to_string(vocab) +
                           " logits, row stride " + std::to_string(row_stride) +
                           ": the vocabulary must be 1..2^31-1 and the stride at least the vocabulary");
  }
  if (rows == 0) return Status::Ok();
  if (!logits || !params || !tokens) return InvalidArgument("sample_tokens: a null device pointer");
  const auto st = static_cast<cudaStream_t>(stream);
  auto* keys = reinterpret_cast<unsigned long long*>(top_keys);
  if (keys) {
    if (rows > 65535) return InvalidArgument("sample_tokens: over 65535 rows with the argmax pre-pass");
    const cudaError_t z = cudaMemsetAsync(keys, 0, static_cast<size_t>(rows) * sizeof(uint64_t), st);
    if (z != cudaSuccess)
      return Status(StatusCode::kCudaError, std::string("sample_tokens: ") + cudaGetErrorString(z));
    const dim3 grid(static_cast<unsigned>((vocab + kChunk - 1) / kChunk), static_cast<unsigned>(rows));
    argmax_kernel<<<grid, kThreads, 0, st>>>(logits, vocab, row_stride, keys);
  }
  sample_kernel<<<static_cast<unsigned>(rows), kThreads, 0, st>>>(logits, vocab, row_stride, params, tokens,
                                                                  keys);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return Status(StatusCode::kCudaError, std::string("sample_tokens: ") + cudaGetErrorString(err));
  }
  return Status::Ok();
}

}  // namespace fusebox::kernels
