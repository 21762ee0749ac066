// The random inputs fusebox makes for an FP8 attention backward (graph layer, src/graph/ops/sdpa.cpp)
// put dq, dk and dv in e4m3's normal range, as delayed scaling would: with output scales near 1,
// dq and dk of unit-scale attention sat below 2^-6, where one quantum is tens of percent of a value,
// and the plan check refused the graph on the H100 (fusebox's sweep, 2026-12-05, seed 4288:
// tests/cases/no-engine/sdpa_fp8_bwd_d128_s256_small_gradients.json). Checked on the CPU reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "fusebox/reference.h"
#include "fusebox/runtime.h"
#include "test_util.h"

namespace fusebox {
namespace {

TEST(Fp8BwdInputs, GradientsLandInE4m3sNormalRange) {
  auto spec = load_graph_file(testing::source_dir() +
                              "/tests/cases/no-engine/sdpa_fp8_bwd_d128_s256_small_gradients.json");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  for (uint64_t seed : {1u, 2u}) {
    auto inputs = make_inputs(*g, seed);
    ASSERT_TRUE(inputs.ok()) << inputs.status().ToString();
    auto ref = reference_cpu(*g, *inputs);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    for (const char* out : {"dq", "dk", "dv"}) {
      std::vector<float> v = ref->at(out);
      ASSERT_FALSE(v.empty()) << out;
      for (float& x : v) x = std::fabs(x);
      std::sort(v.begin(), v.end());
      const float median = v[v.size() / 2], largest = v.back();
      EXPECT_GE(median, std::ldexp(1.0f, -6))
          << out << " seed " << seed << ": half the values are subnormal in e4m3";
      EXPECT_LE(largest, 448.0f) << out << " seed " << seed << ": past e4m3's largest value";
    }
  }
}

}  // namespace
}  // namespace fusebox
