// Row-wise FP8 quantization on the GPU (kernels/quantize.h, the serving engine's FP8 weights)
// against its host twin: random bf16 rows of several widths, a row of zeros, rows read with a
// leading dimension wider than the row; the e4m3 bytes and the scales must be identical.
// Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/runtime.h"
#include "kernels/quantize.h"

namespace fusebox::kernels {
namespace {

TEST(QuantizeGpu, TheKernelQuantizesAsTheHostTwin) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape {
    int64_t rows, cols, ld;
  };
  for (const Shape& sh :
       {Shape{1, 2048, 2048}, Shape{37, 64, 80}, Shape{16, 8192, 8192}, Shape{5, 300, 301}}) {
    std::vector<uint16_t> x(static_cast<size_t>(sh.rows * sh.ld));
    std::vector<float> dense(static_cast<size_t>(sh.rows * sh.cols));
    for (int64_t r = 0; r < sh.rows; ++r) {
      const float spread = std::exp2(static_cast<float>(static_cast<int>(rng() % 20) - 10));
      for (int64_t c = 0; c < sh.ld; ++c) {
        const float v = r == 1 ? 0.f : nd(rng) * spread;  // row 1 (where there is one): zeros
        x[static_cast<size_t>(r * sh.ld + c)] = float_to_bf16_bits(v);
        if (c < sh.cols)
          dense[static_cast<size_t>(r * sh.cols + c)] = bf16_bits_to_float(float_to_bf16_bits(v));
      }
    }
    std::vector<uint8_t> want_q(dense.size());
    std::vector<float> want_s(static_cast<size_t>(sh.rows));
    quantize_rows_fp8_host(dense.data(), sh.rows, sh.cols, want_q.data(), want_s.data());
    void *dx = nullptr, *dq = nullptr, *ds = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dq, want_q.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ds, want_s.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    Fp8Rows r;
    r.x = dx;
    r.rows = sh.rows;
    r.cols = sh.cols;
    r.ld = sh.ld;
    r.q = dq;
    r.scale = static_cast<float*>(ds);
    ASSERT_TRUE(quantize_rows_fp8(r, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got_q(want_q.size());
    std::vector<float> got_s(want_s.size());
    cudaMemcpy(got_q.data(), dq, got_q.size(), cudaMemcpyDeviceToHost);
    cudaMemcpy(got_s.data(), ds, got_s.size() * 4, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(ds);
    EXPECT_EQ(got_s, want_s) << sh.rows << "x" << sh.cols;
    size_t differ = 0;
    for (size_t i = 0; i < got_q.size(); ++i) differ += got_q[i] != want_q[i];
    EXPECT_EQ(differ, 0u) << sh.rows << "x" << sh.cols << ": e4m3 bytes differ";
  }
  Fp8Rows bad;
  bad.rows = 2;
  bad.cols = 4;
  bad.ld = 3;
  EXPECT_NE(quantize_rows_fp8(bad, nullptr).message().find("ld >= cols"), std::string::npos);
}

}  // namespace
}  // namespace fusebox::kernels
