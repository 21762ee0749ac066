// Token sampling on the GPU (kernels/sampling.h, issue 34) against the host's rule
// (fusebox/serve.h sample_token): for random logits with ties and masked (-inf) tokens, and every
// mix of greedy, temperature, top-k and top-p, the GPU picks the host's token for the same u,
// row by row, rows strided apart in memory. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusebox/runtime.h"
#include "fusebox/serve.h"
#include "kernels/sampling.h"

namespace fusebox {
namespace {

TEST(SamplingGpu, PicksTheHostsTokenForEveryRule) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  constexpr int64_t kVocab = 5003, kStride = 5120;
  std::mt19937_64 rng(20261205);
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<kernels::SamplingRow> rows;
  for (double t : {0.0, 0.3, 1.0, 1.7})
    for (int64_t k : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{64}, kVocab})
      for (double p : {1.0, 0.95, 0.5, 0.05})
        for (int d = 0; d < 2; ++d) rows.push_back({t, k, p, uniform(rng)});
  rows.push_back({1.0, 0, 1.0, 0.0});
  rows.push_back({1.0, 0, 1.0, std::nextafter(1.0, 0.0)});
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<float> logits(static_cast<size_t>(n * kStride), 1e30f);  // padding: never read
  for (int64_t r = 0; r < n; ++r) {
    float* row = logits.data() + r * kStride;
    for (int64_t i = 0; i < kVocab; ++i) row[i] = normal(rng);
    for (int64_t i = 0; i < kVocab; i += 97) row[i] = row[(i * 7 + 13) % kVocab];  // ties
    for (int64_t i = 5; i < kVocab; i += 211) row[i] = -INFINITY;                  // masked tokens
  }
  float* d_logits = nullptr;
  kernels::SamplingRow* d_rows = nullptr;
  int32_t* d_tokens = nullptr;
  ASSERT_EQ(cudaMalloc(&d_logits, logits.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_rows, rows.size() * sizeof(kernels::SamplingRow)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_tokens, rows.size() * sizeof(int32_t)), cudaSuccess);
  cudaMemcpy(d_logits, logits.data(), logits.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(kernels::SamplingRow), cudaMemcpyHostToDevice);
  uint64_t* d_keys = nullptr;  // the argmax pre-pass's scratch
  ASSERT_EQ(cudaMalloc(&d_keys, rows.size() * sizeof(uint64_t)), cudaSuccess);
  for (uint64_t* keys : {static_cast<uint64_t*>(nullptr), d_keys}) {
    // Twice with the pre-pass: its scratch is cleared each call.
    for (int again = 0; again < (keys ? 2 : 1); ++again) {
      Status st = kernels::sample_tokens(d_logits, n, kVocab, kStride, d_rows, d_tokens, nullptr, keys);
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::vector<int32_t> got(rows.size());
      ASSERT_EQ(cudaMemcpy(got.data(), d_tokens, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost),
                cudaSuccess);
      int differ = 0;
      for (int64_t r = 0; r < n; ++r) {
        const kernels::SamplingRow& p = rows[static_cast<size_t>(r)];
        const std::vector<float> row(logits.begin() + r * kStride, logits.begin() + r * kStride + kVocab);
        SamplingParams sp;
        sp.temperature = p.temperature;
        sp.top_k = p.top_k;
        sp.top_p = p.top_p;
        const int32_t want = sample_token(row, sp, p.u);
        if (got[static_cast<size_t>(r)] != want) ++differ;
        EXPECT_EQ(got[static_cast<size_t>(r)], want) << "row " << r << ": T " << p.temperature << ", top_k "
                                                     << p.top_k << ", top_p " << p.top_p << ", u " << p.u;
      }
      std::printf("[ note ] %lld rows sampled on the GPU (%s), %d differ from the host\n",
                  static_cast<long long>(n), keys ? "argmax pre-pass" : "one block a row", differ);
    }
  }
  cudaFree(d_keys);
  // Bad arguments are refused before any launch.
  EXPECT_FALSE(kernels::sample_tokens(d_logits, n, 0, kStride, d_rows, d_tokens, nullptr).ok());
  EXPECT_FALSE(kernels::sample_tokens(d_logits, n, kVocab, kVocab - 1, d_rows, d_tokens, nullptr).ok());
  cudaFree(d_logits);
  cudaFree(d_rows);
  cudaFree(d_tokens);
}

}  // namespace
}  // namespace fusebox
