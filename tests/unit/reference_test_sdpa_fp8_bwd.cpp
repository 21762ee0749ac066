// fusebox tests: the sdpa_fp8_bwd references (src/reference/ops/sdpa_fp8_bwd.h)
// against an independent loop over full score matrices with the same fp8
// rounding points; derived inputs; tolerances that reject wrong scales and masks.
#include "reference_test_sdpa_fp8_bwd.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::fp8_bwd_variants;
using testing_util::Fp8BwdCase;
using testing_util::Fp8BwdProblem;
using testing_util::host_from;
using testing_util::make_fp8_bwd;
using testing_util::r8;

// The independent computation: per (b, h) the full S, P, dP, dS matrices, with
// sdpa_keeps() as the mask. Real = double: fp64 like the CPU reference;
// float: fp32 arithmetic (as a GPU would), for the tolerance tests. kDs16: dS also rounded to fp16
// before its fp8 cast (a GPU whose dS is off by up to 2^-11: rounding ties cast the other way).
template <typename Real, bool kDs16 = false>
ReferenceOutputs by_hand(const Fp8BwdCase& c, const Fp8BwdProblem& p) {
  auto vals = [&](const char* n) { return p.inputs.at(n).to_float_logical(); };
  const std::vector<float> q = vals("q"), k = vals("k"), v = vals("v"), o = vals("o"), dout = vals("do"),
                           stats = vals("stats");
  auto s = [&](const char* n) { return static_cast<Real>(c.scales.at(n)); };
  const Real attn =
      static_cast<Real>(c.options.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(c.D))));
  const int64_t G = c.Hq / c.Hk;
  ReferenceOutputs r;
  r["dq"].assign(static_cast<size_t>(c.B * c.Hq * c.Sq * c.D), 0.0f);
  r["dk"].assign(static_cast<size_t>(c.B * c.Hk * c.Skv * c.D), 0.0f);
  r["dv"].assign(static_cast<size_t>(c.B * c.Hk * c.Skv * c.Dv), 0.0f);
  std::vector<Real> dk_acc(r["dk"].size(), 0), dv_acc(r["dv"].size(), 0);
  Real amax_dq = 0, amax_dp = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t lq = c.options.padding ? static_cast<int64_t>(c.seq_len_q[b]) : c.Sq;
    const int64_t lkv = c.options.padding ? static_cast<int64_t>(c.seq_len_kv[b]) : c.Skv;
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Sq + i;
        Real di = 0;
        for (int64_t d = 0; d < c.Dv; ++d) di += static_cast<Real>(dout[row * c.Dv + d]) * o[row * c.Dv + d];
        di = di * s("descale_do") * s("descale_o");
        std::vector<Real> dq_acc(static_cast<size_t>(c.D), 0);
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (!sdpa_keeps(c.options, i, j, lq, lkv)) continue;
          const int64_t kr = (b * c.Hk + hk) * c.Skv + j;
          Real qk = 0, dp = 0;
          for (int64_t d = 0; d < c.D; ++d) qk += static_cast<Real>(q[row * c.D + d]) * k[kr * c.D + d];
          for (int64_t d = 0; d < c.Dv; ++d) dp += static_cast<Real>(dout[row * c.Dv + d]) * v[kr * c.Dv + d];
          const Real sc = qk * attn * s("descale_q") * s("descale_k");
          const Real P = std::exp(sc - static_cast<Real>(stats[row]));
          const Real p8 = static_cast<Real>(r8(P * s("scale_s"), DType::kFP8E4M3));
          dp = dp * s("descale_do") * s("descale_v");
          Real ds = (dp - di) * P * attn;
          amax_dp = std::max(amax_dp, std::fabs(ds));
          if (kDs16) ds = static_cast<Real>(fp16_bits_to_float(float_to_fp16_bits(static_cast<float>(ds))));
          const Real ds8 = static_cast<Real>(r8(ds * s("scale_dp"), c.do_dtype));
          for (int64_t d = 0; d < c.D; ++d) {
            dq_acc[d] += ds8 * k[kr * c.D + d];
            dk_acc[kr * c.D + d] += ds8 * q[row * c.D + d];
          }
          for (int64_t d = 0; d < c.Dv; ++d) dv_acc[kr * c.Dv + d] += p8 * dout[row * c.Dv + d];
        }
        for (int64_t d = 0; d < c.D; ++d) {
          const Real x = dq_acc[d] * s("descale_dp") * s("descale_k");
          amax_dq = std::max(amax_dq, std::fabs(x));
          r["dq"][row * c.D + d] = static_cast<float>(x * s("scale_dq"));
        }
      }
    }
  }
  Real amax_dk = 0, amax_dv = 0;
  for (size_t e = 0; e < dk_acc.size(); ++e) {
    const Real x = dk_acc[e] * s("descale_dp") * s("descale_q");
    amax_dk = std::max(amax_dk, std::fabs(x));
    r["dk"][e] = static_cast<float>(x * s("scale_dk"));
  }
  for (size_t e = 0; e < dv_acc.size(); ++e) {
    const Real x = dv_acc[e] * s("descale_s") * s("descale_do");
    amax_dv = std::max(amax_dv, std::fabs(x));
    r["dv"][e] = static_cast<float>(x * s("scale_dv"));
  }
  r["amax_dq"] = {static_cast<float>(amax_dq)};
  r["amax_dk"] = {static_cast<float>(amax_dk)};
  r["amax_dv"] = {static_cast<float>(amax_dv)};
  r["amax_dp"] = {static_cast<float>(amax_dp)};
  return r;
}

const char* const kOutputs[] = {"dq", "dk", "dv", "amax_dq", "amax_dk", "amax_dv", "amax_dp"};

TEST(SdpaFp8BwdReferenceCpu, MatchesIndependentFp64Loop) {
  for (const auto& [name, c] : fp8_bwd_variants()) {
    SCOPED_TRACE(name);
    const Fp8BwdProblem p = make_fp8_bwd(c);
    auto ref = reference_cpu(p.g, p.inputs);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const ReferenceOutputs want = by_hand<double>(c, p);
    for (const char* out : kOutputs) {
      const Comparison cmp = compare(out, want.at(out), ref->at(out), {1e-6, 1e-5});
      EXPECT_TRUE(cmp.pass) << cmp.ToString();
    }
    EXPECT_GT(ref->at("amax_dp")[0], 0.0f);
    EXPECT_GT(ref->at("amax_dv")[0], 0.0f);
  }
}

// cuDNN computes in fp32 and writes fp8: the fp32 loop, outputs rounded to the
// output dtype, must pass tolerance_for() (loose enough), for each variant.
TEST(SdpaFp8BwdReferenceCpu, ToleranceAbsorbsFp32AndOutputRounding) {
  for (const auto& [name, c] : fp8_bwd_variants()) {
    SCOPED_TRACE(name);
    const Fp8BwdProblem p = make_fp8_bwd(c);
    auto ref = reference_cpu(p.g, p.inputs);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    ReferenceOutputs actual = by_hand<float>(c, p);
    for (const char* out : {"dq", "dk", "dv"})
      for (float& x : actual[out]) x = static_cast<float>(r8(x, DType::kFP8E4M3));
    for (const char* out : kOutputs) {
      const Comparison cmp = compare(out, ref->at(out), actual.at(out), tolerance_for(p.g, out));
      EXPECT_TRUE(cmp.pass) << cmp.ToString();
    }
  }
}

// Wrong scales and masks fail tolerance_for() (tight enough): the reference of
// a perturbed problem, rounded to fp8 like cuDNN's output, against the correct one.
TEST(SdpaFp8BwdReferenceCpu, WrongScaleOrMaskFails) {
  Fp8BwdCase base = fp8_bwd_variants()[1].second;  // causal
  base.Sq = base.Skv = 16;
  const Fp8BwdProblem good = make_fp8_bwd(base);
  auto ref = reference_cpu(good.g, good.inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto run_with = [&](const Fp8BwdCase& c) {
    Fp8BwdProblem p = make_fp8_bwd(c);
    for (const char* n : {"q", "k", "v", "o", "do", "stats"}) p.inputs[n] = good.inputs.at(n);  // same data
    auto r = reference_cpu(p.g, p.inputs);
    EXPECT_TRUE(r.ok());
    ReferenceOutputs out = *r;
    for (const char* o : {"dq", "dk", "dv"})
      for (float& x : out[o]) x = static_cast<float>(r8(x, DType::kFP8E4M3));
    return out;
  };
  auto fails = [&](const ReferenceOutputs& actual, const char* out) {
    return !compare(out, ref->at(out), actual.at(out), tolerance_for(good.g, out)).pass;
  };
  struct Wrong {
    const char* what;
    Fp8BwdCase c;
    std::vector<const char*> must_fail;
  };
  std::vector<Wrong> wrongs;
  auto scaled = [&](const char* role, double f) {
    Fp8BwdCase c = base;
    c.scales[role] *= f;
    return c;
  };
  // An output scale off by 2 (or an amax taken after it) moves the output 2x.
  wrongs.push_back({"scale_dq x2", scaled("scale_dq", 2), {"dq"}});
  wrongs.push_back({"scale_dk x0.5", scaled("scale_dk", 0.5), {"dk"}});
  wrongs.push_back({"scale_dv x2", scaled("scale_dv", 2), {"dv"}});
  // A descale of the dS matmuls: dq, dk and their amaxes.
  wrongs.push_back({"descale_dp x2", scaled("descale_dp", 2), {"dq", "dk", "amax_dq", "amax_dk"}});
  // descale_do enters everything but is not an output scale.
  wrongs.push_back({"descale_do x2", scaled("descale_do", 2), {"dq", "dk", "dv", "amax_dp", "amax_dv"}});
  // descale_o only through Di.
  wrongs.push_back({"descale_o x2", scaled("descale_o", 2), {"dq", "dk", "amax_dp"}});
  // attn_scale applied to dS or not (amax_dp before attn_scale).
  {
    Fp8BwdCase c = base;
    c.options.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.D)) * 1.25;
    wrongs.push_back({"attn_scale x1.25", c, {"dq", "dk", "amax_dp"}});
  }
  // Masks: no causal mask; causal with a sliding window of 4.
  {
    Fp8BwdCase c = base;
    c.options.causal = false;
    c.options.right_bound.reset();
    wrongs.push_back({"not causal", c, {"dq", "dk", "dv"}});
    Fp8BwdCase w = base;
    w.options.left_bound = 4;
    wrongs.push_back({"window 4", w, {"dq", "dk", "dv"}});
  }
  for (const Wrong& w : wrongs) {
    SCOPED_TRACE(w.what);
    const ReferenceOutputs actual = run_with(w.c);
    for (const char* out : w.must_fail) EXPECT_TRUE(fails(actual, out)) << out << " passed";
  }
}

// derive_sdpa_bwd_inputs: o = e4m3(O / descale_o) of the FP8 forward
// (descale_s, scale_s from the bwd's inputs), stats its logsumexp.
TEST(SdpaFp8BwdReferenceCpu, DerivedInputsAreTheFp8Forward) {
  Fp8BwdCase c = fp8_bwd_variants()[3].second;  // causal + padding
  const Fp8BwdProblem p = make_fp8_bwd(c);
  EXPECT_EQ(p.inputs.at("o").dtype, DType::kFP8E4M3);
  const std::vector<float> q = p.inputs.at("q").to_float_logical(), k = p.inputs.at("k").to_float_logical(),
                           v = p.inputs.at("v").to_float_logical(), o = p.inputs.at("o").to_float_logical(),
                           stats = p.inputs.at("stats").to_float_logical();
  const double scale = c.scales["descale_q"] * c.scales["descale_k"] / std::sqrt(static_cast<double>(c.D));
  const int64_t G = c.Hq / c.Hk;
  int checked = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t row = (b * c.Hq + h) * c.Sq + i, lq = c.seq_len_q[b], lkv = c.seq_len_kv[b];
        std::vector<double> s(c.Skv, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.Skv; ++j) {
          if (!sdpa_keeps(c.options, i, j, lq, lkv)) continue;
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d)
            dot += static_cast<double>(q[row * c.D + d]) * k[((b * c.Hk + h / G) * c.Skv + j) * c.D + d];
          s[j] = scale * dot;
          mx = std::max(mx, s[j]);
        }
        if (mx == -INFINITY) {
          EXPECT_TRUE(std::isinf(stats[row]) && stats[row] > 0) << row;
          for (int64_t d = 0; d < c.Dv; ++d) EXPECT_EQ(o[row * c.Dv + d], 0.0f);
          continue;
        }
        double sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        EXPECT_NEAR(stats[row], lse, 1e-5 * (1 + std::fabs(lse)));
        for (int64_t d = 0; d < c.Dv; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < c.Skv; ++j)
            if (s[j] != -INFINITY)
              acc += r8(std::exp(s[j] - lse) * c.scales["scale_s"], DType::kFP8E4M3) *
                     v[((b * c.Hk + h / G) * c.Skv + j) * c.Dv + d];
          const double O = c.scales["descale_s"] * c.scales["descale_v"] * acc;
          EXPECT_EQ(o[row * c.Dv + d], static_cast<float>(r8(O / c.scales["descale_o"], DType::kFP8E4M3)))
              << row;
          ++checked;
        }
      }
  EXPECT_GT(checked, 0);
}

// A graph file of the source tree (`path` from its root), its inputs random (the given values as
// given) and o and stats derived by the FP8 forward, as `run --verify` makes them.
void load_with_inputs(const std::string& path, std::optional<ResolvedGraph>& g,
                      std::map<std::string, HostTensor>& inputs) {
  auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + path);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto r = resolve(*spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  g = std::move(r).value();
  uint64_t seed = 1;
  for (const ResolvedTensor& t : g->tensors) {
    if (!t.is_input || t.scalar_value) continue;
    inputs[t.name] = t.values.empty() ? random_tensor(t, seed++) : host_from(t, t.values);
  }
  ASSERT_TRUE(derive_sdpa_bwd_inputs(*g, inputs).ok());
}

// The example graph resolves, derives and runs on the CPU reference; its
// amax values (printed) hint at scales (dq * scale_dq should reach e4m3's 448).
TEST(SdpaFp8BwdReferenceCpu, ExampleGraphRuns) {
  std::optional<ResolvedGraph> g;
  std::map<std::string, HostTensor> inputs;
  ASSERT_NO_FATAL_FAILURE(load_with_inputs("/examples/graphs/small/sdpa_fp8_bwd_small.json", g, inputs));
  auto ref = reference_cpu(*g, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const char* a : {"amax_dq", "amax_dk", "amax_dv", "amax_dp"}) {
    const float x = ref->at(a)[0];
    EXPECT_TRUE(std::isfinite(x) && x > 0) << a << " " << x;
    std::printf("  sdpa_fp8_bwd_small %s = %g\n", a, x);
  }
}

// Sweep seed 6097 (tests/cases/wrong-values/sdpa_fp8_bwd_saturating_dk.json): scale_dk 256 puts
// the largest dK' (about 2.6) at 655 in dk's e4m3, beyond its 448. cuDNN and fusebox's reference
// kernel both stored 448 there (their saturating cast) and were refused: the comparison held the
// unclamped reference (max_abs_rel 0.28 > 0.25). An engine that computes the op exactly and casts
// the outputs to e4m3 must pass tolerance_for() (which clamps the reference at the output's 448),
// and would fail without the clamp; an output clamped too low still fails.
TEST(SdpaFp8BwdReferenceCpu, OutputsBeyondTheFp8RangeCompareSaturated) {
  std::optional<ResolvedGraph> g;
  std::map<std::string, HostTensor> inputs;
  ASSERT_NO_FATAL_FAILURE(
      load_with_inputs("/tests/cases/wrong-values/sdpa_fp8_bwd_saturating_dk.json", g, inputs));
  auto ref = reference_cpu(*g, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const Tolerance tol = tolerance_for(*g, "dk");
  EXPECT_EQ(tol.saturate_at, 448.0);
  int64_t saturated = 0;
  for (const char* out : {"dq", "dk", "dv"}) {
    std::vector<float> stored = ref->at(out);
    for (float& x : stored) x = static_cast<float>(r8(x, DType::kFP8E4M3));
    const Comparison cmp = compare(out, ref->at(out), stored, tolerance_for(*g, out));
    EXPECT_TRUE(cmp.pass) << cmp.ToString();
    saturated += cmp.saturated;
  }
  EXPECT_GT(saturated, 0) << "the case no longer reaches past e4m3's range: pick another";
  std::vector<float> dk = ref->at("dk");
  for (float& x : dk) x = static_cast<float>(r8(x, DType::kFP8E4M3));
  Tolerance unclamped = tol;
  unclamped.saturate_at = 0;
  EXPECT_FALSE(compare("dk", ref->at("dk"), dk, unclamped).pass) << "the refusal this test replaced";
  for (float& x : dk) x = std::clamp(x, -224.f, 224.f);  // saturating at half the range: wrong
  EXPECT_FALSE(compare("dk", ref->at("dk"), dk, tol).pass);
}

// check_fp8_amax(): an fp8 output's amax against the output it describes. Seed 7177
// (tests/cases/wrong-values/sdpa_fp8_bwd_amax_dq_dS_rounding_tie.json): the GPU's amax_dq was
// 12% from the reference's (a dS rounding tie) but exactly max|dq| / scale_dq of its own dq.
// The reference's own outputs, cast as the engine casts, are consistent; an amax off by more
// than one fp8 step of max|X| * scale, or an output whose largest value moved, is not.
TEST(SdpaFp8BwdReferenceCpu, AmaxIsCheckedAgainstTheOutputItDescribes) {
  std::optional<ResolvedGraph> g;
  std::map<std::string, HostTensor> inputs;
  ASSERT_NO_FATAL_FAILURE(
      load_with_inputs("/tests/cases/wrong-values/sdpa_fp8_bwd_amax_dq_dS_rounding_tie.json", g, inputs));
  auto ref = reference_cpu(*g, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  std::map<std::string, std::vector<float>> written = *ref;
  for (const char* out : {"dq", "dk", "dv"})
    for (float& x : written.at(out)) x = static_cast<float>(r8(x, DType::kFP8E4M3));
  auto judge = [&](const std::map<std::string, std::vector<float>>& outs) {
    auto c = check_fp8_amax(*g, inputs, outs);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    std::map<std::string, Comparison> by;
    if (c.ok())
      for (const Comparison& x : *c) by[x.tensor] = x;
    return by;
  };
  auto ok = judge(written);
  ASSERT_EQ(ok.size(), 3u) << "amax_dq, amax_dk and amax_dv, each of its output (amax_dp has none)";
  for (const char* name : {"amax_dq of dq", "amax_dk of dk", "amax_dv of dv"})
    EXPECT_TRUE(ok.count(name) && ok.at(name).pass) << name << ": " << ok[name].ToString();
  for (float f : {1.25f, 0.75f}) {
    auto wrong = written;
    wrong.at("amax_dq")[0] *= f;
    auto c = judge(wrong);
    EXPECT_FALSE(c.at("amax_dq of dq").pass) << f;
    EXPECT_NE(c.at("amax_dq of dq").error.find("amax_dq * scale_dq"), std::string::npos)
        << c.at("amax_dq of dq").ToString();
    EXPECT_TRUE(c.at("amax_dk of dk").pass);
  }
  // dq's largest value written two fp8 steps lower: the amax no longer describes it.
  auto moved = written;
  std::vector<float>& dq = moved.at("dq");
  auto big =
      std::max_element(dq.begin(), dq.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); });
  for (float& x : dq)
    if (std::fabs(x) >= std::fabs(*big) * 0.8f) x *= 0.75f;
  EXPECT_FALSE(judge(moved).at("amax_dq of dq").pass);
}

// move_reference_within_fp8_ties(): the geometry of sweep seed 7312
// (tests/cases/wrong-values/sdpa_fp8_bwd_dS8_tie_saturating.json: GQA 2 over 1, Sq 256, Skv 64,
// D 128, do e5m2, dq and dk a third saturated), where an H100 cast dS * scale_dp = -2304.318 (an
// e5m2 midpoint 2304 + 1.4e-4) to -2048: dq's row and dk's row moved by 0.29 of the saturated
// max. Here the "GPU" is the fp32 loop with dS through fp16 (off by up to 2^-11, within the 2^-8
// the ties allow): the plain comparison fails, the ties explain it; a wrong scale or a row moved
// the same everywhere still fails.
TEST(SdpaFp8BwdReferenceCpu, RoundingTiesExplainOnlyWhatTheyReach) {
  Fp8BwdCase c;
  c.B = 2, c.Hq = 2, c.Hk = 1, c.Sq = 256, c.Skv = 64, c.D = 128, c.Dv = 128;
  c.do_dtype = DType::kFP8E5M2;
  c.options.attn_scale = 1.0;
  c.scales = {{"descale_q", 1},  {"descale_k", 1},         {"descale_v", 1},           {"descale_o", 0.0625},
              {"descale_do", 1}, {"descale_s", 1 / 448.0}, {"descale_dp", 1 / 1024.0}, {"scale_s", 448},
              {"scale_dq", 256}, {"scale_dk", 256},        {"scale_dv", 64},           {"scale_dp", 1024}};
  auto e4m3 = [](ReferenceOutputs out) {
    for (const char* o : {"dq", "dk", "dv"})
      for (float& x : out[o]) x = static_cast<float>(r8(x, DType::kFP8E4M3));
    return out;
  };
  bool shown = false;
  for (uint64_t seed = 1; seed <= 8 && !shown; ++seed) {
    const Fp8BwdProblem p = make_fp8_bwd(c, seed);
    auto ref = reference_cpu(p.g, p.inputs);
    ASSERT_TRUE(ref.ok()) << ref.status().ToString();
    const ReferenceOutputs gpu = e4m3(by_hand<float, true>(c, p));
    std::set<std::string> failing;
    for (const char* out : {"dq", "dk", "dv"})
      if (!compare(out, ref->at(out), gpu.at(out), tolerance_for(p.g, out)).pass) failing.insert(out);
    if (failing.empty()) continue;  // no tie of this seed moved a row far enough: the next one
    shown = true;
    SCOPED_TRACE("seed " + std::to_string(seed));
    ReferenceOutputs moved = *ref;
    auto n = move_reference_within_fp8_ties(p.g, p.inputs, gpu, failing, moved);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    for (const std::string& out : failing) {
      ASSERT_TRUE(n->count(out)) << out;
      EXPECT_GT(n->at(out).ties, 0) << out;
      EXPECT_GT(n->at(out).largest, 0.1 * 448) << out << ": the moves that explain a failure are large";
      const Comparison cmp = compare(out, moved.at(out), gpu.at(out), tolerance_for(p.g, out));
      EXPECT_TRUE(cmp.pass) << cmp.ToString();
    }
    // Wrong values are not explained: dq written with scale_dq x2, or one dq row moved by 160
    // everywhere (0.36 of the saturated range).
    ReferenceOutputs wrong = gpu;
    for (float& x : wrong["dq"]) x = static_cast<float>(r8(2.0 * x, DType::kFP8E4M3));
    ReferenceOutputs again = *ref;
    ASSERT_TRUE(move_reference_within_fp8_ties(p.g, p.inputs, wrong, {"dq"}, again).ok());
    EXPECT_FALSE(compare("dq", again.at("dq"), wrong.at("dq"), tolerance_for(p.g, "dq")).pass);
    const int64_t row = c.Sq / 2;  // any row: no tie moves a row by the same amount everywhere
    ReferenceOutputs shifted = *ref;
    for (int64_t d = 0; d < c.D; ++d) shifted["dq"][row * c.D + d] += 160.0f;
    shifted = e4m3(shifted);
    ReferenceOutputs third = *ref;
    ASSERT_TRUE(move_reference_within_fp8_ties(p.g, p.inputs, shifted, {"dq"}, third).ok());
    EXPECT_FALSE(compare("dq", third.at("dq"), shifted.at("dq"), tolerance_for(p.g, "dq")).pass);
    // The same shape as a tie, where there is none: one dq row moved by one e5m2 step of its
    // largest dS that lies far (more than 2^-6) from every midpoint, times that key's k.
    auto in = [&](const char* n) { return p.inputs.at(n).to_float_logical(); };
    const std::vector<float> q = in("q"), k = in("k"), v = in("v"), o = in("o"), dout = in("do"),
                             stats = in("stats");
    auto sc = [&](const char* n) { return c.scales.at(n); };
    double best = 0;
    int64_t best_row = -1, best_key = -1;
    for (int64_t r = 0; r < c.Sq; ++r) {  // batch 0, head 0 (key group 0)
      double di = 0;
      for (int64_t d = 0; d < c.Dv; ++d) di += static_cast<double>(dout[r * c.Dv + d]) * o[r * c.Dv + d];
      di *= sc("descale_do") * sc("descale_o");
      for (int64_t j = 0; j < c.Skv; ++j) {
        double qk = 0, dp = 0;
        for (int64_t d = 0; d < c.D; ++d) qk += static_cast<double>(q[r * c.D + d]) * k[j * c.D + d];
        for (int64_t d = 0; d < c.Dv; ++d) dp += static_cast<double>(dout[r * c.Dv + d]) * v[j * c.Dv + d];
        const double P = std::exp(qk * sc("descale_q") * sc("descale_k") - stats[r]);
        const double x = P * (dp * sc("descale_do") * sc("descale_v") - di) * sc("scale_dp");
        const bool far = r8(x * (1 - 1.0 / 64), DType::kFP8E5M2) == r8(x * (1 + 1.0 / 64), DType::kFP8E5M2);
        if (far && std::fabs(x) > best) best = std::fabs(x), best_row = r, best_key = j;
      }
    }
    ASSERT_GE(best_row, 0);
    const double cast = r8(best, DType::kFP8E5M2);
    const double step = r8(cast * 1.25, DType::kFP8E5M2) - cast;  // the next e5m2 value up
    ReferenceOutputs fake = *ref;
    for (int64_t d = 0; d < c.D; ++d)
      fake["dq"][best_row * c.D + d] += static_cast<float>(step * k[best_key * c.D + d] * sc("descale_dp") *
                                                           sc("descale_k") * sc("scale_dq"));
    fake = e4m3(fake);
    ASSERT_FALSE(compare("dq", ref->at("dq"), fake.at("dq"), tolerance_for(p.g, "dq")).pass)
        << "the fake flip is too small to fail: pick a larger dS";
    ReferenceOutputs fourth = *ref;
    ASSERT_TRUE(move_reference_within_fp8_ties(p.g, p.inputs, fake, {"dq"}, fourth).ok());
    EXPECT_FALSE(compare("dq", fourth.at("dq"), fake.at("dq"), tolerance_for(p.g, "dq")).pass);
  }
  EXPECT_TRUE(shown) << "no seed showed a rounding tie past the tolerance: widen the search";
}

}  // namespace
}  // namespace fusebox
