// fusebox GPU tests: the sdpa_fp8_bwd GPU reference (src/reference/ops/sdpa_fp8_bwd_gpu.cu)
// against the CPU reference, and its speed at a large shape.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "../unit/reference_test_sdpa_fp8_bwd.h"
#include "fusebox/reference.h"

namespace fusebox {
namespace {

using testing_util::Fp8BwdCase;
using testing_util::make_fp8_bwd;

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  return gpu_reference_available();
}

// fp32 on the GPU vs fp64 on the CPU: the pre-rounding values differ at fp32
// precision, so a P8 or dS8 near a rounding boundary may land one fp8 step
// apart; outputs are otherwise close.
void expect_gpu_matches_cpu(const testing_util::Fp8BwdProblem& p) {
  auto cpu = reference_cpu(p.g, p.inputs);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  auto gpu = reference_gpu_host(p.g, p.inputs);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  for (const auto& [name, want] : *cpu) {
    const bool amax = name.rfind("amax_", 0) == 0;
    const Comparison c =
        compare(name, want, gpu->at(name), amax ? Tolerance{1e-2, 1e-2} : Tolerance{1e-2, 5e-2});
    EXPECT_TRUE(c.pass) << c.ToString();
  }
}

TEST(ReferenceGpuSdpaFp8Bwd, MatchesCpuEveryVariant) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  for (auto [name, c] : testing_util::fp8_bwd_variants()) {
    SCOPED_TRACE(name);
    expect_gpu_matches_cpu(make_fp8_bwd(c));
    c.D = c.Dv = 64;  // a realistic head dim, more keys than one chunk row of threads
    c.Sq = 150, c.Skv = 200;
    if (c.options.padding) c.seq_len_q = {150, 77}, c.seq_len_kv = {200, 31};
    expect_gpu_matches_cpu(make_fp8_bwd(c));
  }
}

// derive_sdpa_bwd_inputs on the GPU (cpu_max_flops 0) gives the CPU's o and stats.
TEST(ReferenceGpuSdpaFp8Bwd, DeriveOnGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  Fp8BwdCase c = testing_util::fp8_bwd_variants()[3].second;  // causal + padding
  auto cpu = make_fp8_bwd(c), gpu = make_fp8_bwd(c);
  ASSERT_TRUE(derive_sdpa_bwd_inputs(gpu.g, gpu.inputs, 0).ok());
  for (const char* name : {"o", "stats"}) {
    const std::vector<float> a = gpu.inputs.at(name).to_float_logical(),
                             b = cpu.inputs.at(name).to_float_logical();
    ASSERT_EQ(a.size(), b.size());
    for (size_t e = 0; e < a.size(); ++e) {
      if (std::isinf(b[e]))
        EXPECT_EQ(a[e], b[e]) << name << " " << e;
      else
        EXPECT_NEAR(a[e], b[e], 7e-2 * (1 + std::fabs(b[e]))) << name << " " << e;  // an e4m3 step
    }
  }
}

// A large causal problem runs within tens of seconds (B=4 H=16 S=8192 D=128
// is the target; this is a quarter of it). Prints the time and the amaxes.
TEST(ReferenceGpuSdpaFp8Bwd, LargeShapeTime) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  Fp8BwdCase c;
  c.B = 1, c.Hq = 16, c.Hk = 16, c.Sq = c.Skv = 8192, c.D = c.Dv = 128;
  c.options.causal = true;
  c.options.right_bound = 0;
  auto p = make_fp8_bwd(c);  // derives o and stats on the GPU (above cpu_max_flops)
  const auto t0 = std::chrono::steady_clock::now();
  auto gpu = reference_gpu_host(p.g, p.inputs);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  std::printf("  sdpa_fp8_bwd GPU reference B=1 H=16 S=8192 D=128 causal: %.2f s\n", s);
  for (const char* a : {"amax_dq", "amax_dk", "amax_dv", "amax_dp"}) {
    const float x = gpu->at(a)[0];
    EXPECT_TRUE(std::isfinite(x) && x > 0) << a;
    std::printf("  %s = %g\n", a, x);
  }
  EXPECT_LT(s, 60.0);
}

}  // namespace
}  // namespace fusebox
