// fusebox tests: small sdpa_fp8_bwd problems built by hand (no resolve()),
// shared by the CPU and GPU reference tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox::testing_util {

struct Fp8BwdCase {
  int64_t B = 2, Hq = 4, Hk = 2, Sq = 7, Skv = 9, D = 16, Dv = 16;
  SdpaOptions options;
  std::vector<double> seq_len_q, seq_len_kv;  // with options.padding
  DType do_dtype = DType::kFP8E4M3;
  std::map<std::string, double> scales = {
      {"descale_q", 0.5},   {"descale_k", 1.5},      {"descale_v", 0.75},      {"descale_o", 0.5},
      {"descale_do", 0.25}, {"descale_s", 1 / 16.0}, {"descale_dp", 1 / 64.0}, {"scale_s", 16.0},
      {"scale_dq", 4.0},    {"scale_dk", 2.0},       {"scale_dv", 8.0},        {"scale_dp", 64.0}};
};

struct Fp8BwdProblem {
  ResolvedGraph g;
  std::map<std::string, HostTensor> inputs;
};

// One sdpa_fp8_bwd op "attn" over tensors named by role; random q, k, v, do;
// o and stats derived from the FP8 forward (derive_sdpa_bwd_inputs).
inline Fp8BwdProblem make_fp8_bwd(const Fp8BwdCase& c, uint64_t seed = 7) {
  GraphBuilder b;
  b.g.name = "sdpa_fp8_bwd";
  const std::vector<int64_t> qd = {c.B, c.Hq, c.Sq, c.D}, kd = {c.B, c.Hk, c.Skv, c.D},
                             vd = {c.B, c.Hk, c.Skv, c.Dv}, od = {c.B, c.Hq, c.Sq, c.Dv},
                             sd = {c.B, c.Hq, c.Sq, 1}, one = {1, 1, 1, 1};
  std::map<std::string, int> in, out;
  in["q"] = b.tensor("q", qd, DType::kFP8E4M3);
  in["k"] = b.tensor("k", kd, DType::kFP8E4M3);
  in["v"] = b.tensor("v", vd, DType::kFP8E4M3);
  in["o"] = b.tensor("o", od, DType::kFP8E4M3);
  in["do"] = b.tensor("do", od, c.do_dtype);
  in["stats"] = b.tensor("stats", sd);
  for (const auto& [role, v] : c.scales) in[role] = b.tensor(role, one);
  if (c.options.padding) {
    in["seq_len_q"] = b.tensor("seq_len_q", {c.B, 1, 1, 1}, DType::kInt32);
    in["seq_len_kv"] = b.tensor("seq_len_kv", {c.B, 1, 1, 1}, DType::kInt32);
  }
  out["dq"] = b.tensor("dq", qd, DType::kFP8E4M3);
  out["dk"] = b.tensor("dk", kd, DType::kFP8E4M3);
  out["dv"] = b.tensor("dv", vd, DType::kFP8E4M3);
  for (const char* r : {"amax_dq", "amax_dk", "amax_dv", "amax_dp"}) out[r] = b.tensor(r, one);
  SdpaFp8BwdAttrs attrs;
  static_cast<SdpaOptions&>(attrs) = c.options;
  b.op_outputs("attn", attrs, in, out);
  Fp8BwdProblem p;
  for (const auto& [role, idx] : in) {
    const ResolvedTensor& t = b.g.tensors[idx];
    if (role == "seq_len_q")
      p.inputs[t.name] = host_from(t, c.seq_len_q);
    else if (role == "seq_len_kv")
      p.inputs[t.name] = host_from(t, c.seq_len_kv);
    else if (c.scales.count(role))
      p.inputs[t.name] = host_from(t, {c.scales.at(role)});
    else if (role == "q")
      p.inputs[t.name] = random_tensor(t, seed, -2.0, 2.0);
    else
      p.inputs[t.name] = random_tensor(t, seed + idx, -1.0, 1.0);
  }
  p.g = std::move(b.g);
  EXPECT_TRUE(derive_sdpa_bwd_inputs(p.g, p.inputs).ok());
  return p;
}

// fp8 rounding (saturating, nearest even).
inline double r8(double x, DType t) {
  return fp8_bits_to_float(float_to_fp8_bits(static_cast<float>(x), t), t);
}

// The variants both reference tests run.
inline std::vector<std::pair<std::string, Fp8BwdCase>> fp8_bwd_variants() {
  std::vector<std::pair<std::string, Fp8BwdCase>> v;
  Fp8BwdCase c;
  v.push_back({"plain_gqa", c});
  c.options.causal = true;
  c.options.right_bound = 0;
  v.push_back({"causal", c});
  Fp8BwdCase w = c;
  w.options.left_bound = 3;
  v.push_back({"causal_window3", w});
  Fp8BwdCase pad = c;
  pad.options.padding = true;
  pad.seq_len_q = {5, 7};
  pad.seq_len_kv = {9, 4};
  v.push_back({"causal_padding", pad});
  Fp8BwdCase br = c;
  br.options.alignment = SdpaAlignment::kBottomRight;
  br.Hk = 1;  // multi-query
  v.push_back({"bottom_right_mqa", br});
  Fp8BwdCase e5 = c;
  e5.do_dtype = DType::kFP8E5M2;
  e5.D = 32;
  e5.Dv = 16;
  v.push_back({"do_e5m2_dv16", e5});
  return v;
}

}  // namespace fusebox::testing_util
