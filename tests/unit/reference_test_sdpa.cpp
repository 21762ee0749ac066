// SDPA references on the CPU: masks, bias, ALiBi, padding, GQA; sdpa_bwd
// against finite differences of the forward; sdpa_fp8_fwd against an fp64
// loop with the P rounding emulated; backward-input derivation and
// don't-care masking; dropout through a fixed (dumped) keep-mask, and the
// checks of a dumped mask.
#include "reference_test_sdpa.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "../../src/reference/ops/sdpa_mask.h"
#include "fusebox/reference.h"

namespace fusebox {
namespace {

using testing_util::make_sdpa;
using testing_util::SdpaCase;
using testing_util::SdpaKind;
using testing_util::SdpaProblem;

ReferenceOutputs run_cpu(const SdpaProblem& p) {
  auto r = reference_cpu(p.g, p.inputs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReferenceOutputs{};
}

// ---------------------------------------------------------------- mask intervals

// The kernels' closed-form intervals agree with sdpa_keeps() everywhere.
TEST(SdpaMaskIntervals, MatchSdpaKeeps) {
  int cases = 0;
  for (int align = 0; align < 2; ++align)
    for (int right = -1; right <= 2; ++right)
      for (int left = 0; left <= 3; ++left)
        for (int padding = 0; padding < 2; ++padding)
          for (int64_t lq : {0, 1, 3, 7})
            for (int64_t lkv : {0, 1, 4, 9}) {
              SdpaOptions o;
              o.alignment = align ? SdpaAlignment::kBottomRight : SdpaAlignment::kTopLeft;
              if (right >= 0) o.right_bound = right;
              if (left > 0) o.left_bound = left;
              o.padding = padding;
              if (!padding && (lq == 0 || lkv == 0)) continue;
              const auto m = reference_detail::sdpa_mask_params(o);
              // Without padding the lengths are the full sizes, so indices stay below them.
              const int64_t Sq = padding ? 8 : lq, Skv = padding ? 10 : lkv;
              for (int64_t i = 0; i < Sq; ++i) {
                int64_t lo, hi;
                reference_detail::sdpa_kept_keys(m, i, lq, lkv, &lo, &hi);
                for (int64_t j = 0; j < Skv; ++j)
                  ASSERT_EQ(sdpa_keeps(o, i, j, lq, lkv), j >= lo && j <= hi)
                      << "keys: align " << align << " right " << right << " left " << left << " padding "
                      << padding << " lq " << lq << " lkv " << lkv << " i " << i << " j " << j;
              }
              for (int64_t j = 0; j < Skv; ++j) {
                int64_t lo, hi;
                reference_detail::sdpa_kept_rows(m, j, lq, lkv, &lo, &hi);
                for (int64_t i = 0; i < Sq; ++i)
                  ASSERT_EQ(sdpa_keeps(o, i, j, lq, lkv), i >= lo && i <= hi)
                      << "rows: align " << align << " right " << right << " left " << left << " lq " << lq
                      << " lkv " << lkv << " i " << i << " j " << j;
              }
              ++cases;
            }
  EXPECT_GT(cases, 500);
}

// ---------------------------------------------------------------- forward by hand

// q = 0 makes every score its bias/ALiBi term, so P is known in closed form.
SdpaCase zero_q_case() {
  SdpaCase c;
  c.B = 1, c.Hq = 2, c.Hk = 1, c.Sq = 3, c.Skv = 3, c.D = 2, c.Dv = 1;
  return c;
}

void zero_q(SdpaProblem& p) {
  p.inputs["q"] = testing_util::host_from(p.g.tensors[p.g.find_tensor("q")], std::vector<double>(12, 0.0));
}

// Softmax-weighted mean of v over `scores` (kept entries only).
double softmax_mean(const std::vector<double>& scores, const std::vector<double>& v) {
  double mx = -INFINITY, sum = 0, acc = 0;
  for (double s : scores) mx = std::max(mx, s);
  for (size_t j = 0; j < scores.size(); ++j)
    sum += std::exp(scores[j] - mx), acc += std::exp(scores[j] - mx) * v[j];
  return acc / sum;
}

TEST(SdpaReferenceCpu, BiasIsAddedToTheScores) {
  SdpaCase c = zero_q_case();
  c.options.bias = true;
  c.bias_dims = {1, 1, 3, 3};  // broadcast over B and heads
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  zero_q(p);
  const ReferenceOutputs r = run_cpu(p);
  const std::vector<float> bias = p.inputs.at("bias").to_float_logical(),
                           v = p.inputs.at("v").to_float_logical();
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) {
      const std::vector<double> s = {bias[i * 3], bias[i * 3 + 1], bias[i * 3 + 2]};
      EXPECT_NEAR(r.at("o")[h * 3 + i], softmax_mean(s, {v[0], v[1], v[2]}), 1e-6) << h << "," << i;
    }
}

TEST(SdpaReferenceCpu, AlibiAddsSlopeTimesDistance) {
  SdpaCase c = zero_q_case();
  c.options.alibi = true;
  c.options.causal = true;
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  zero_q(p);
  const ReferenceOutputs r = run_cpu(p);
  const std::vector<float> v = p.inputs.at("v").to_float_logical();
  const std::vector<double> slopes = alibi_slopes(2);  // 2^-4, 2^-8
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 3; ++i) {
      std::vector<double> s, vv;
      for (int64_t j = 0; j <= i; ++j)
        s.push_back(slopes[h] * static_cast<double>(j - i)), vv.push_back(v[j]);
      EXPECT_NEAR(r.at("o")[h * 3 + i], softmax_mean(s, vv), 1e-6) << h << "," << i;
    }
}

// A sequence of lengths (lq, lkv) gives, in its first lq rows, exactly what an
// unpadded problem of those sizes gives; the rows past lq are 0.
TEST(SdpaReferenceCpu, PaddingEqualsTruncation) {
  SdpaCase c;
  c.B = 1, c.Sq = 5, c.Skv = 6;
  c.options.padding = true;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  c.seq_len_q = {3};
  c.seq_len_kv = {4};
  SdpaProblem padded = make_sdpa(c, SdpaKind::kFwd);
  SdpaCase t = c;
  t.Sq = 3, t.Skv = 4;
  t.options.padding = false;
  SdpaProblem cut = make_sdpa(t, SdpaKind::kFwd);
  for (const char* name : {"q", "k", "v"}) {  // the first rows of the padded inputs
    const ResolvedTensor& big = padded.g.tensors[padded.g.find_tensor(name)];
    const ResolvedTensor& small = cut.g.tensors[cut.g.find_tensor(name)];
    std::vector<double> vals;
    for (int64_t b = 0; b < small.dims[0]; ++b)
      for (int64_t h = 0; h < small.dims[1]; ++h)
        for (int64_t s = 0; s < small.dims[2]; ++s)
          for (int64_t d = 0; d < small.dims[3]; ++d) vals.push_back(padded.inputs.at(name).at({b, h, s, d}));
    (void)big;
    cut.inputs[name] = testing_util::host_from(small, vals);
  }
  const ReferenceOutputs rp = run_cpu(padded), rc = run_cpu(cut);
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t i = 0; i < c.Sq; ++i) {
      EXPECT_EQ(rp.at("stats")[h * c.Sq + i], i < 3 ? rc.at("stats")[h * 3 + i] : 0.0f) << h << "," << i;
      for (int64_t d = 0; d < c.Dv; ++d)
        EXPECT_EQ(rp.at("o")[(h * c.Sq + i) * c.Dv + d], i < 3 ? rc.at("o")[(h * 3 + i) * c.Dv + d] : 0.0f);
    }
}

// Bottom-right causal with more queries than keys: the first Sq - Skv rows keep
// no key (o = 0, stats = -inf); the last row sees every key.
TEST(SdpaReferenceCpu, BottomRightEmptyRows) {
  SdpaCase c;
  c.B = 1, c.Hq = 1, c.Hk = 1, c.Sq = 5, c.Skv = 3;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  const ReferenceOutputs r = run_cpu(make_sdpa(c, SdpaKind::kFwd));
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r.at("stats")[i], -INFINITY) << i;
    for (int64_t d = 0; d < c.Dv; ++d) EXPECT_EQ(r.at("o")[i * c.Dv + d], 0.0f);
  }
  // row 2 sees key 0 only: o = v_0
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  for (int64_t d = 0; d < c.Dv; ++d)
    EXPECT_NEAR(r.at("o")[2 * c.Dv + d], p.inputs.at("v").at({0, 0, 0, d}), 1e-7);
  EXPECT_TRUE(std::isfinite(r.at("stats")[4]));
}

TEST(SdpaReferenceCpu, BadLengthNamesOpAndTensor) {
  SdpaCase c;
  c.options.padding = true;
  c.seq_len_q = {3, 9};  // Sq = 5
  c.seq_len_kv = {2, 2};
  auto r = reference_cpu(make_sdpa(c, SdpaKind::kFwd).g, make_sdpa(c, SdpaKind::kFwd).inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("[sdpa_fwd 'attn'] input 'seq_len_q'"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("[0, 5]"), std::string::npos) << r.status().message();
}

// ---------------------------------------------------------------- backward vs finite differences

// dL/dx of L = sum(o * do) by central differences of the CPU forward, for
// every element of input `name` (fp32, so perturbations are exact enough).
std::vector<float> numeric_gradient(SdpaProblem fwd, const std::string& name,
                                    const std::vector<float>& dout) {
  const ResolvedTensor& t = fwd.g.tensors[fwd.g.find_tensor(name)];
  const std::vector<float> x = fwd.inputs.at(name).to_float_logical();
  const double h = 1e-2;
  auto loss = [&](const std::vector<double>& values) {
    fwd.inputs[name] = testing_util::host_from(t, values);
    const std::vector<float> o = run_cpu(fwd).at("o");
    double l = 0;
    for (size_t e = 0; e < o.size(); ++e) l += static_cast<double>(o[e]) * dout[e];
    return l;
  };
  std::vector<float> grad(x.size());
  std::vector<double> xs(x.begin(), x.end());
  for (size_t e = 0; e < x.size(); ++e) {
    xs[e] = x[e] + h;
    const double up = loss(xs);
    xs[e] = x[e] - h;
    const double down = loss(xs);
    xs[e] = x[e];
    grad[e] = static_cast<float>((up - down) / (2 * h));
  }
  return grad;
}

void expect_gradients_match_finite_differences(const SdpaCase& c) {
  SdpaProblem bwd = make_sdpa(c, SdpaKind::kBwd), fwd = make_sdpa(c, SdpaKind::kFwd);
  for (auto& [name, h] : fwd.inputs) h = bwd.inputs.at(name);
  const Status st = derive_sdpa_bwd_inputs(bwd.g, bwd.inputs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto grads = reference_cpu(bwd.g, bwd.inputs);
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();
  const std::vector<float> dout = bwd.inputs.at("do").to_float_logical();
  for (auto [grad, input] : {std::pair{"dq", "q"}, std::pair{"dk", "k"}, std::pair{"dv", "v"}}) {
    const std::vector<float> numeric = numeric_gradient(fwd, input, dout);
    const Comparison cmp = compare(grad, numeric, grads->at(grad), Tolerance{2e-3, 5e-3});
    EXPECT_TRUE(cmp.pass) << cmp.ToString();
    double norm = 0;
    for (float g : numeric) norm += g * g;
    EXPECT_GT(norm, 1e-4) << grad << " is all zero: the case tests nothing";
  }
}

TEST(SdpaBwdReferenceCpu, NoMaskMatchesFiniteDifferences) { expect_gradients_match_finite_differences({}); }

TEST(SdpaBwdReferenceCpu, CausalGqaMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.causal = true;
  c.Hq = 4, c.Hk = 1;  // four query heads share each kv gradient
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, PaddingMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.padding = true;
  c.seq_len_q = {3, 5};
  c.seq_len_kv = {6, 2};
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, PaddingBottomRightCausalMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.padding = true;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  c.seq_len_q = {4, 2};
  c.seq_len_kv = {3, 6};  // batch 0: rows 0 keeps no key
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, BiasMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.bias = true;
  c.bias_dims = {2, 1, 5, 6};
  expect_gradients_match_finite_differences(c);
  c.bias_dims = {1, 4, 5, 6};
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, AlibiMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.alibi = true;
  c.options.causal = true;
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, SlidingWindowMatchesFiniteDifferences) {
  SdpaCase c;
  c.options.causal = true;
  c.options.left_bound = 2;
  expect_gradients_match_finite_differences(c);
  c.options.causal = false;  // a band: j in (i - 3, i + 1]
  c.options.right_bound = 1;
  c.options.left_bound = 3;
  expect_gradients_match_finite_differences(c);
}

TEST(SdpaBwdReferenceCpu, BottomRightMoreQueriesThanKeysMatchesFiniteDifferences) {
  SdpaCase c;
  c.Sq = 6, c.Skv = 4;  // rows 0 and 1 keep no key
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  expect_gradients_match_finite_differences(c);
}

// ---------------------------------------------------------------- derived inputs, don't care

TEST(SdpaDeriveBwdInputs, OIsTheForwardRoundedInItsLayoutAndStatsInfWhereEmpty) {
  SdpaCase c;
  c.dtype = DType::kBF16;
  c.bshd = true;
  c.Sq = 6, c.Skv = 4;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  SdpaProblem bwd = make_sdpa(c, SdpaKind::kBwd), fwd = make_sdpa(c, SdpaKind::kFwd);
  for (auto& [name, h] : fwd.inputs) h = bwd.inputs.at(name);
  ASSERT_TRUE(derive_sdpa_bwd_inputs(bwd.g, bwd.inputs).ok());
  const ReferenceOutputs f = run_cpu(fwd);
  const HostTensor& o = bwd.inputs.at("o");
  EXPECT_EQ(o.dtype, DType::kBF16);
  EXPECT_EQ(o.strides, bwd.g.tensors[bwd.g.find_tensor("o")].strides);
  const std::vector<float> ov = o.to_float_logical(), sv = bwd.inputs.at("stats").to_float_logical();
  for (size_t e = 0; e < ov.size(); ++e)
    EXPECT_EQ(ov[e], bf16_bits_to_float(float_to_bf16_bits(f.at("o")[e]))) << e;
  for (size_t r = 0; r < sv.size(); ++r) {
    if (r % c.Sq < 2)
      EXPECT_EQ(sv[r], INFINITY) << r;  // rows 0, 1 keep no key
    else
      EXPECT_EQ(sv[r], f.at("stats")[r]) << r;
  }
}

TEST(SdpaMaskDontCare, ZeroesPaddedAndEmptyRowsAndPaddedKeys) {
  SdpaCase c;
  c.Sq = 4, c.Skv = 3;
  c.options.padding = true;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  c.seq_len_q = {4, 2};
  c.seq_len_kv = {3, 1};
  // batch 0: off = -1, row 0 keeps no key; batch 1: off = -1 too, row 0 keeps no key, rows 2, 3
  // are padded, and so are key rows 1, 2
  for (SdpaKind kind : {SdpaKind::kFwd, SdpaKind::kBwd}) {
    SdpaProblem p = make_sdpa(c, kind);
    std::map<std::string, std::vector<float>> outs;
    for (int i : p.g.output_tensors()) outs[p.g.tensors[i].name].assign(p.g.tensors[i].element_count(), 1.0f);
    const Status st = mask_dont_care(p.g, p.inputs, outs);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (auto& [name, v] : outs) {
      const ResolvedTensor& t = p.g.tensors[p.g.find_tensor(name)];
      const bool key_rows = name == "dk" || name == "dv";
      for (int64_t e = 0; e < t.element_count(); ++e) {
        const int64_t row = e / t.dims[3], i = row % t.dims[2], b = row / (t.dims[1] * t.dims[2]);
        const bool zero = key_rows ? (b == 1 && i >= 1) : (i == 0 || (b == 1 && i >= 2));
        EXPECT_EQ(v[e], zero ? 0.0f : 1.0f) << name << " b " << b << " row " << i;
      }
    }
  }
}

// ---------------------------------------------------------------- fp8

// sdpa_fp8_fwd against an independent fp64 loop that rounds P * scale_s to e4m3.
TEST(SdpaFp8ReferenceCpu, MatchesFp64WithRoundedP) {
  SdpaCase c;
  c.B = 1, c.Hq = 2, c.Hk = 1, c.Sq = 4, c.Skv = 7, c.D = 16, c.Dv = 16;
  c.options.causal = true;
  c.options.attn_scale = 0.5;
  SdpaProblem p = make_sdpa(c, SdpaKind::kFp8Fwd);
  const ReferenceOutputs r = run_cpu(p);
  const auto& sc = testing_util::fp8_scales();
  const HostTensor &q = p.inputs.at("q"), &k = p.inputs.at("k"), &v = p.inputs.at("v");
  double amax_s = 0, amax_o = 0, rounding_effect = 0;
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t i = 0; i < c.Sq; ++i) {
      std::vector<double> s;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < c.D; ++d) dot += q.at({0, h, i, d}) * k.at({0, 0, j, d});
        s.push_back(0.5 * sc.at("descale_q") * sc.at("descale_k") * dot);
      }
      double mx = -INFINITY, sum = 0;
      for (double x : s) mx = std::max(mx, x);
      for (double x : s) sum += std::exp(x - mx);
      EXPECT_NEAR(r.at("stats")[h * c.Sq + i], mx + std::log(sum), 1e-5);
      for (int64_t d = 0; d < c.Dv; ++d) {
        double acc = 0, exact = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const double pj = std::exp(s[j] - mx) / sum;
          amax_s = std::max(amax_s, pj);
          const float p8 = fp8_bits_to_float(
              float_to_fp8_bits(static_cast<float>(pj * sc.at("scale_s")), DType::kFP8E4M3), DType::kFP8E4M3);
          acc += p8 * v.at({0, 0, j, d});
          exact += pj * sc.at("scale_s") * v.at({0, 0, j, d});
        }
        const double O = sc.at("descale_s") * sc.at("descale_v") * acc;
        rounding_effect = std::max(rounding_effect, std::fabs(acc - exact));
        amax_o = std::max(amax_o, std::fabs(O));
        EXPECT_NEAR(r.at("o")[(h * c.Sq + i) * c.Dv + d], O * sc.at("scale_o"), 1e-5)
            << h << "," << i << "," << d;
      }
    }
  EXPECT_FLOAT_EQ(r.at("amax_s")[0], static_cast<float>(amax_s));
  EXPECT_FLOAT_EQ(r.at("amax_o")[0], static_cast<float>(amax_o));
  EXPECT_EQ(amax_s, 1.0);            // causal row 0 keeps one key
  EXPECT_GT(rounding_effect, 1e-3);  // the e4m3 rounding of P is visible at this size
}

// ---------------------------------------------------------------- dropout

using testing_util::bernoulli_mask;

// A causal GQA case with dropout and the keep-mask dumped (and fed back in).
SdpaCase dropout_case(double p = 0.3) {
  SdpaCase c;
  c.options.causal = true;
  c.options.dropout = p;
  c.options.dump_dropout_mask = true;
  return c;
}

// Independent fp64 loop for a top-left causal case: P = softmax, stats before
// dropout, P' = P * M / (1 - p), o = P' @ v; fp8: amax_s = max P', P' * scale_s
// rounded to e4m3, descales and scale_o.
struct ByHand {
  std::vector<double> o, stats;
  double amax_s = 0, amax_o = 0;
  int64_t dropped = 0, kept = 0;  // mask values at the positions the causal mask keeps
};

ByHand dropout_forward_by_hand(const SdpaCase& c, const SdpaProblem& p, bool fp8) {
  const auto& sc = testing_util::fp8_scales();
  const HostTensor &q = p.inputs.at("q"), &k = p.inputs.at("k"), &v = p.inputs.at("v");
  const std::vector<float> mask = p.inputs.at("dropout_mask").to_float_logical();
  const double drop = *c.options.dropout, G = static_cast<double>(c.Hq / c.Hk);
  const double scale =
      (fp8 ? sc.at("descale_q") * sc.at("descale_k") : 1.0) / std::sqrt(static_cast<double>(c.D));
  ByHand r;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const int64_t hk = static_cast<int64_t>(h / G), row = (b * c.Hq + h) * c.Sq + i;
        std::vector<double> s;
        for (int64_t j = 0; j <= std::min(i, c.Skv - 1); ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.D; ++d) dot += q.at({b, h, i, d}) * k.at({b, hk, j, d});
          s.push_back(scale * dot);
        }
        double mx = -INFINITY, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        for (double x : s) sum += std::exp(x - mx);
        const double lse = mx + std::log(sum);
        r.stats.push_back(lse);
        for (size_t j = 0; j < s.size(); ++j) (mask[row * c.Skv + j] == 0 ? r.dropped : r.kept)++;
        for (int64_t d = 0; d < c.Dv; ++d) {
          double acc = 0;
          for (size_t j = 0; j < s.size(); ++j) {
            double pj = std::exp(s[j] - lse) * mask[row * c.Skv + j] / (1 - drop);
            r.amax_s = std::max(r.amax_s, pj);
            if (fp8)
              pj = fp8_bits_to_float(
                  float_to_fp8_bits(static_cast<float>(pj * sc.at("scale_s")), DType::kFP8E4M3),
                  DType::kFP8E4M3);
            acc += pj * v.at({b, hk, static_cast<int64_t>(j), d});
          }
          const double O = fp8 ? sc.at("descale_s") * sc.at("descale_v") * acc : acc;
          r.amax_o = std::max(r.amax_o, std::fabs(O));
          r.o.push_back(fp8 ? O * sc.at("scale_o") : O);
        }
      }
  return r;
}

TEST(SdpaDropoutReferenceCpu, ForwardMatchesFp64ByHand) {
  const SdpaCase c = dropout_case();
  const SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  const ReferenceOutputs r = run_cpu(p);
  EXPECT_EQ(r.count("dropout_mask"), 0u) << "the reference must not produce the mask";
  const ByHand want = dropout_forward_by_hand(c, p, false);
  EXPECT_GT(want.dropped, 5);  // the mask drops something, and keeps most
  EXPECT_GT(want.kept, want.dropped);
  ASSERT_EQ(r.at("o").size(), want.o.size());
  for (size_t e = 0; e < want.o.size(); ++e) EXPECT_NEAR(r.at("o")[e], want.o[e], 1e-5) << e;
  for (size_t e = 0; e < want.stats.size(); ++e) EXPECT_NEAR(r.at("stats")[e], want.stats[e], 1e-5) << e;
  // Dropout changes o (else the test would not see it).
  SdpaCase none = c;
  none.options.dropout.reset();
  none.options.dump_dropout_mask = false;
  const ReferenceOutputs plain = run_cpu(make_sdpa(none, SdpaKind::kFwd));
  EXPECT_FALSE(compare("o", plain.at("o"), r.at("o"), Tolerance{1e-2, 1e-2}).pass);
  EXPECT_EQ(plain.at("stats"), r.at("stats"));  // stats are taken before dropout
}

// sdpa_fp8_fwd: amax_s is the max of P after dropout (which can exceed 1), and
// P' is what rounds to e4m3.
TEST(SdpaDropoutReferenceCpu, Fp8ForwardAmaxSAfterDropout) {
  SdpaCase c = dropout_case(0.5);
  c.B = 1, c.Hq = 2, c.Hk = 1, c.Sq = 4, c.Skv = 7, c.D = 16, c.Dv = 16;
  const SdpaProblem p = make_sdpa(c, SdpaKind::kFp8Fwd);
  const ReferenceOutputs r = run_cpu(p);
  EXPECT_EQ(r.count("dropout_mask"), 0u);
  const ByHand want = dropout_forward_by_hand(c, p, true);
  for (size_t e = 0; e < want.o.size(); ++e) EXPECT_NEAR(r.at("o")[e], want.o[e], 1e-5) << e;
  for (size_t e = 0; e < want.stats.size(); ++e) EXPECT_NEAR(r.at("stats")[e], want.stats[e], 1e-5) << e;
  EXPECT_FLOAT_EQ(r.at("amax_s")[0], static_cast<float>(want.amax_s));
  EXPECT_FLOAT_EQ(r.at("amax_o")[0], static_cast<float>(want.amax_o));
  EXPECT_GT(want.amax_s, 1.0);  // P' = 2 P: row 0 keeps one key with P = 1, unless dropped
}

// With a fixed mask the dropout forward is a deterministic function of q, k, v:
// the backward (fed that forward's own o, and the derived stats) is its gradient.
void expect_dropout_gradients_match_finite_differences(const SdpaCase& c) {
  SdpaProblem bwd = make_sdpa(c, SdpaKind::kBwd), fwd = make_sdpa(c, SdpaKind::kFwd);
  for (auto& [name, h] : fwd.inputs) h = bwd.inputs.at(name);
  const Status st = derive_sdpa_bwd_inputs(bwd.g, bwd.inputs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The derived o is the dropout-free one; the true gradient needs the forward's own (through Di).
  const ReferenceOutputs f = run_cpu(fwd);
  const std::vector<float>& o = f.at("o");
  bwd.inputs["o"] =
      testing_util::host_from(bwd.g.tensors[bwd.g.find_tensor("o")], std::vector<double>(o.begin(), o.end()));
  auto grads = reference_cpu(bwd.g, bwd.inputs);
  ASSERT_TRUE(grads.ok()) << grads.status().ToString();
  EXPECT_EQ(grads->count("dropout_mask"), 0u);
  const std::vector<float> dout = bwd.inputs.at("do").to_float_logical();
  for (auto [grad, input] : {std::pair{"dq", "q"}, std::pair{"dk", "k"}, std::pair{"dv", "v"}}) {
    const std::vector<float> numeric = numeric_gradient(fwd, input, dout);
    const Comparison cmp = compare(grad, numeric, grads->at(grad), Tolerance{2e-3, 5e-3});
    EXPECT_TRUE(cmp.pass) << cmp.ToString();
    double norm = 0;
    for (float g : numeric) norm += g * g;
    EXPECT_GT(norm, 1e-4) << grad << " is all zero: the case tests nothing";
  }
  // Without the dropout in the backward the gradients would differ.
  SdpaProblem plain = bwd;
  std::get<SdpaBwdAttrs>(plain.g.ops[0].attrs).dropout = 0.0;
  auto wrong = reference_cpu(plain.g, plain.inputs);
  ASSERT_TRUE(wrong.ok()) << wrong.status().ToString();
  EXPECT_FALSE(compare("dv", grads->at("dv"), wrong->at("dv"), Tolerance{2e-3, 5e-3}).pass);
}

TEST(SdpaDropoutBwdReferenceCpu, CausalGqaMatchesFiniteDifferences) {
  expect_dropout_gradients_match_finite_differences(dropout_case());
}

TEST(SdpaDropoutBwdReferenceCpu, PaddingBiasMatchesFiniteDifferences) {
  SdpaCase c = dropout_case(0.5);
  c.options.causal = false;
  c.options.padding = true;
  c.seq_len_q = {3, 5};
  c.seq_len_kv = {6, 2};
  c.options.bias = true;
  c.bias_dims = {1, 4, 5, 6};
  expect_dropout_gradients_match_finite_differences(c);
}

// derive_sdpa_bwd_inputs with dropout: stats exactly, o of the dropout-free forward.
TEST(SdpaDropoutDeriveBwdInputs, StatsExactOFromTheDropoutFreeForward) {
  SdpaCase c = dropout_case();
  c.options.dump_dropout_mask = false;  // derivation needs no mask
  SdpaProblem bwd = make_sdpa(c, SdpaKind::kBwd);
  const Status st = derive_sdpa_bwd_inputs(bwd.g, bwd.inputs);
  ASSERT_TRUE(st.ok()) << st.ToString();
  SdpaCase none = c;
  none.options.dropout.reset();
  SdpaProblem fwd = make_sdpa(none, SdpaKind::kFwd);
  for (auto& [name, h] : fwd.inputs) h = bwd.inputs.at(name);
  const ReferenceOutputs f = run_cpu(fwd);
  EXPECT_EQ(bwd.inputs.at("o").to_float_logical(), f.at("o"));
  EXPECT_EQ(bwd.inputs.at("stats").to_float_logical(), f.at("stats"));
}

// Dropout exactly 0 is no dropout: the mask (here dropping half) is ignored.
TEST(SdpaDropoutReferenceCpu, ZeroProbabilityEqualsNoDropout) {
  for (SdpaKind kind : {SdpaKind::kFwd, SdpaKind::kBwd, SdpaKind::kFp8Fwd}) {
    SdpaCase zero = dropout_case(0.0), none = zero;
    none.options.dropout.reset();
    none.options.dump_dropout_mask = false;
    SdpaProblem pz = make_sdpa(zero, kind), pn = make_sdpa(none, kind);
    const ResolvedTensor& mt = pz.g.tensors[pz.g.find_tensor("dropout_mask")];
    pz.inputs["dropout_mask"] = bernoulli_mask(mt, 0.5, 3);
    if (kind == SdpaKind::kBwd) {
      ASSERT_TRUE(derive_sdpa_bwd_inputs(pn.g, pn.inputs).ok());
      for (const char* name : {"o", "stats"}) pz.inputs[name] = pn.inputs.at(name);
    }
    const ReferenceOutputs rz = run_cpu(pz), rn = run_cpu(pn);
    EXPECT_EQ(rz, rn) << static_cast<int>(kind);
    // Without a mask output or values too.
    pz.inputs.erase("dropout_mask");
    EXPECT_TRUE(reference_cpu(pz.g, pz.inputs).ok());
  }
}

TEST(SdpaDropoutReferenceCpu, MissingMaskIsNotSupported) {
  // No "dropout_mask" output.
  SdpaCase c = dropout_case(0.1);
  c.options.dump_dropout_mask = false;
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  auto r = reference_cpu(p.g, p.inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("[sdpa_fwd 'attn'] dropout 0.1"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("declare a 'dropout_mask' output to verify dropout"), std::string::npos)
      << r.status().message();
  // The output is declared but its values were not fed in.
  SdpaProblem b = make_sdpa(dropout_case(0.1), SdpaKind::kBwd);
  b.inputs.erase("dropout_mask");
  r = reference_cpu(b.g, b.inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(r.status().message().find("[sdpa_bwd 'attn']"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'dropout_mask' output 'dropout_mask'"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("declare a 'dropout_mask' output to verify dropout"), std::string::npos)
      << r.status().message();
  // A mask of the wrong dims is an error, not a silent misread.
  SdpaProblem w = make_sdpa(dropout_case(0.1), SdpaKind::kFwd);
  ResolvedTensor small = w.g.tensors[w.g.find_tensor("dropout_mask")];
  small.dims = {2, 4, 5, 5};
  small.strides = testing_util::dense(small.dims);
  w.inputs["dropout_mask"] = bernoulli_mask(small, 0.9, 1);
  r = reference_cpu(w.g, w.inputs);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
}

TEST(SdpaDropoutMaskDontCare, LeavesTheMaskAlone) {
  SdpaCase c = dropout_case();
  c.Sq = 4, c.Skv = 3;
  c.options.padding = true;
  c.seq_len_q = {4, 2};
  c.seq_len_kv = {3, 1};
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  std::map<std::string, std::vector<float>> outs;
  for (int i : p.g.output_tensors()) outs[p.g.tensors[i].name].assign(p.g.tensors[i].element_count(), 1.0f);
  ASSERT_TRUE(outs.count("dropout_mask"));
  ASSERT_TRUE(mask_dont_care(p.g, p.inputs, outs).ok());
  for (float x : outs.at("dropout_mask")) ASSERT_EQ(x, 1.0f);
}

// ---------------------------------------------------------------- dumped mask checks

std::vector<float> bernoulli_sample(size_t n, double keep, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> m(n);
  for (float& x : m) x = u(rng) < keep ? 1.0f : 0.0f;
  return m;
}

TEST(CheckDropoutMask, BernoulliSamplesPass) {
  for (double p : {0.0, 0.1, 0.5, 0.9})
    for (size_t n : {size_t{100}, size_t{100000}}) {
      const Comparison c = check_dropout_mask("m", bernoulli_sample(n, 1 - p, 42 + n), p);
      EXPECT_TRUE(c.pass) << p << " " << n << ": " << c.ToString();
      EXPECT_TRUE(c.error.empty()) << c.error;
      EXPECT_EQ(c.elements, static_cast<int64_t>(n));
      EXPECT_LE(c.rel_l2, c.tolerance.rel_l2);
    }
}

TEST(CheckDropoutMask, WrongFractionFails) {
  const std::vector<float> ones(100000, 1.0f);
  Comparison c = check_dropout_mask("m", ones, 0.2);
  EXPECT_FALSE(c.pass);
  EXPECT_NEAR(c.rel_l2, 0.2, 1e-12);
  EXPECT_NE(c.error.find("kept fraction"), std::string::npos) << c.error;
  EXPECT_NE(c.ToString().find("FAIL"), std::string::npos);
  // Drawn with p = 0.3 but checked against 0.2: 0.1 off, far beyond 6 sigma at n = 1e5.
  c = check_dropout_mask("m", bernoulli_sample(100000, 0.7, 5), 0.2);
  EXPECT_FALSE(c.pass) << c.ToString();
  // Only the counted positions count: ones elsewhere do not matter.
  std::vector<float> m = bernoulli_sample(20000, 0.8, 9);
  std::vector<uint8_t> counted(40000, 0);
  std::fill(counted.begin(), counted.begin() + 20000, 1);
  m.resize(40000, 1.0f);
  EXPECT_FALSE(check_dropout_mask("m", m, 0.2).pass);
  c = check_dropout_mask("m", m, 0.2, &counted);
  EXPECT_TRUE(c.pass) << c.ToString();
  EXPECT_EQ(c.elements, 20000);
}

TEST(CheckDropoutMask, NonBinaryValuesFail) {
  std::vector<float> m = bernoulli_sample(1000, 0.9, 3);
  m[17] = 0.5f;
  Comparison c = check_dropout_mask("m", m, 0.1);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.worst_index, 17);
  EXPECT_EQ(c.max_abs, 0.5);
  EXPECT_NE(c.error.find("neither 0 nor 1"), std::string::npos) << c.error;
  m[17] = 1.0f / (1 - 0.1f);  // a scaled mask is not a keep-mask either
  EXPECT_FALSE(check_dropout_mask("m", m, 0.1).pass);
  m[17] = NAN;
  c = check_dropout_mask("m", m, 0.1);
  EXPECT_FALSE(c.pass);
  EXPECT_EQ(c.non_finite, 1);
  EXPECT_FALSE(check_dropout_mask("m", m, 1.0).pass);  // p outside [0, 1)
  const std::vector<uint8_t> three(3, 1);
  c = check_dropout_mask("m", m, 0.1, &three);  // sizes differ
  EXPECT_FALSE(c.pass);
  EXPECT_NE(c.error.find("size mismatch"), std::string::npos) << c.error;
}

// check_dropout_masks counts the positions the attention mask keeps only
// (cuDNN may leave the rest unwritten), and skips dropout 0.
TEST(CheckDropoutMask, GraphChecksKeptPositionsOnly) {
  SdpaCase c = dropout_case(0.25);
  c.B = 2, c.Hq = 4, c.Hk = 2, c.Sq = 64, c.Skv = 80;
  c.options.padding = true;
  c.seq_len_q = {64, 30};
  c.seq_len_kv = {70, 80};
  SdpaProblem p = make_sdpa(c, SdpaKind::kFwd);
  std::vector<float> mask = p.inputs.at("dropout_mask").to_float_logical();
  int64_t kept_pairs = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i)
        for (int64_t j = 0; j < c.Skv; ++j) {
          const bool keeps = sdpa_keeps(c.options, i, j, static_cast<int64_t>(c.seq_len_q[b]),
                                        static_cast<int64_t>(c.seq_len_kv[b]));
          if (keeps)
            ++kept_pairs;
          else
            mask[((b * c.Hq + h) * c.Sq + i) * c.Skv + j] = 0.5f;  // garbage where nothing reads it
        }
  std::map<std::string, std::vector<float>> outs = {{"dropout_mask", mask}, {"o", {}}};
  auto r = check_dropout_masks(p.g, p.inputs, outs);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_TRUE(r->front().pass) << r->front().ToString();
  EXPECT_EQ(r->front().elements, kept_pairs);
  EXPECT_EQ(r->front().tensor, "dropout_mask");
  // All ones where it counts: fails.
  for (float& x : outs["dropout_mask"]) x = x == 0.0f ? 1.0f : x;
  r = check_dropout_masks(p.g, p.inputs, outs);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->front().pass);
  // Wrong size: an error.
  outs["dropout_mask"].pop_back();
  EXPECT_EQ(check_dropout_masks(p.g, p.inputs, outs).status().code(), StatusCode::kInvalidArgument);
  // Absent: nothing to check; dropout 0: skipped.
  outs.erase("dropout_mask");
  EXPECT_TRUE(check_dropout_masks(p.g, p.inputs, outs)->empty());
  SdpaProblem z = make_sdpa(dropout_case(0.0), SdpaKind::kFwd);
  EXPECT_TRUE(check_dropout_masks(z.g, z.inputs, {{"dropout_mask", std::vector<float>(240, 0.5f)}})->empty());
}

// ---------------------------------------------------------------- tolerances

TEST(SdpaTolerance, PerOpOverrides) {
  SdpaCase c;
  c.dtype = DType::kBF16;
  const SdpaProblem bwd = make_sdpa(c, SdpaKind::kBwd), fp8 = make_sdpa(c, SdpaKind::kFp8Fwd),
                    fwd = make_sdpa(c, SdpaKind::kFwd);
  EXPECT_EQ(tolerance_for(bwd.g, "dq").rel_l2, 2e-2);
  EXPECT_EQ(tolerance_for(fp8.g, "o").rel_l2, 1e-1);
  EXPECT_EQ(tolerance_for(fp8.g, "amax_o").rel_l2, 1.5e-1);
  EXPECT_EQ(tolerance_for(fwd.g, "o").rel_l2, default_tolerance(DType::kBF16).rel_l2);
  EXPECT_EQ(tolerance_for(fwd.g, "stats").rel_l2, default_tolerance(DType::kFP32).rel_l2);
  c.dtype = DType::kFP16;
  EXPECT_EQ(tolerance_for(make_sdpa(c, SdpaKind::kBwd).g, "dk").rel_l2, 6e-3);
}

// A wrong mask fails at the bf16 forward tolerance, even off by one key.
TEST(SdpaTolerance, WrongMasksFail) {
  SdpaCase c;
  c.B = 1, c.Hq = 2, c.Hk = 2, c.Sq = 64, c.Skv = 64, c.D = 32, c.Dv = 32;
  c.q_range = 1.0;
  c.options.causal = true;
  c.options.left_bound = 16;
  const ReferenceOutputs right = run_cpu(make_sdpa(c, SdpaKind::kFwd));
  for (int variant = 0; variant < 3; ++variant) {
    SdpaCase w = c;
    if (variant == 0) w.options.left_bound = 17;
    if (variant == 1) w.options.right_bound = 1, w.options.causal = false;
    if (variant == 2) w.options.left_bound.reset();
    const Comparison cmp = compare("o", right.at("o"), run_cpu(make_sdpa(w, SdpaKind::kFwd)).at("o"),
                                   default_tolerance(DType::kBF16));
    EXPECT_FALSE(cmp.pass) << "variant " << variant << ": " << cmp.ToString();
  }
}

}  // namespace
}  // namespace fusebox
