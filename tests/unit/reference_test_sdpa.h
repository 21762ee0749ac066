// fusebox tests: small SDPA problems built by hand (no resolve(): any head dim,
// fp32 q/k/v allowed), shared by the CPU and GPU reference tests.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox::testing_util {

enum class SdpaKind { kFwd, kBwd, kFp8Fwd };

struct SdpaCase {
  int64_t B = 2, Hq = 4, Hk = 2, Sq = 5, Skv = 6, D = 4, Dv = 3;
  SdpaOptions options;
  std::vector<double> seq_len_q, seq_len_kv;  // with options.padding, one per batch
  std::vector<int64_t> bias_dims;             // with options.bias: [B or 1, Hq or 1, Sq, Skv]
  DType dtype = DType::kFP32;                 // q, k, v, o, do (fp8 ops: e4m3 q, k, v; o stays this)
  bool bshd = false;                          // [B, S, H, D] memory for q, k, v, o, do
  double q_range = 2.0;                       // q in [-q_range, q_range]: peaky enough softmax rows
  // options.dropout adds inputs "seed" and "offset"; options.dump_dropout_mask
  // the output "dropout_mask", whose values (a Bernoulli(1 - dropout) keep-mask
  // drawn from the problem's seed, as cuDNN would dump it) go into the inputs.
};

// A keep-mask like cuDNN's RNG dump: each value 1 with probability `keep`, else 0.
inline HostTensor bernoulli_mask(const ResolvedTensor& t, double keep, uint64_t seed) {
  const HostTensor u = random_tensor(t, seed, 0.0, 1.0);
  std::vector<double> values;
  for (float x : u.to_float_logical()) values.push_back(x < keep ? 1.0 : 0.0);
  return host_from(t, values);
}

struct SdpaProblem {
  ResolvedGraph g;
  std::map<std::string, HostTensor> inputs;  // o and stats of sdpa_bwd are random until derived
};

// The fixed fp8 scales: P * scale_s spans e4m3's [0, 16], descales undo the scales.
inline const std::map<std::string, double>& fp8_scales() {
  static const std::map<std::string, double> s = {{"descale_q", 0.5},  {"descale_k", 1.5},
                                                  {"descale_v", 0.75}, {"descale_s", 1 / 16.0},
                                                  {"scale_s", 16.0},   {"scale_o", 2.0}};
  return s;
}

// One sdpa op "attn" over tensors named by role ("q", "k", ..., "dq"), with
// random inputs (seeded, like run_plan's) and the case's fixed lengths and scales.
inline SdpaProblem make_sdpa(const SdpaCase& c, SdpaKind kind, uint64_t seed = 1) {
  GraphBuilder b;
  b.g.name = "sdpa";
  auto strides = [&](const std::vector<int64_t>& d) {
    return c.bshd ? std::vector<int64_t>{d[1] * d[2] * d[3], d[3], d[1] * d[3], 1} : dense(d);
  };
  const DType in_dtype = kind == SdpaKind::kFp8Fwd ? DType::kFP8E4M3 : c.dtype;
  const std::vector<int64_t> qd = {c.B, c.Hq, c.Sq, c.D}, kd = {c.B, c.Hk, c.Skv, c.D},
                             vd = {c.B, c.Hk, c.Skv, c.Dv}, od = {c.B, c.Hq, c.Sq, c.Dv},
                             sd = {c.B, c.Hq, c.Sq, 1}, one = {1, 1, 1, 1};
  std::map<std::string, int> in, out;
  in["q"] = b.tensor("q", qd, in_dtype, strides(qd));
  in["k"] = b.tensor("k", kd, in_dtype, strides(kd));
  in["v"] = b.tensor("v", vd, in_dtype, strides(vd));
  if (kind == SdpaKind::kBwd) {
    in["o"] = b.tensor("o", od, c.dtype, strides(od));
    in["do"] = b.tensor("do", od, c.dtype, strides(od));
    in["stats"] = b.tensor("stats", sd);
  }
  if (kind == SdpaKind::kFp8Fwd)
    for (const auto& [role, value] : fp8_scales()) in[role] = b.tensor(role, one);
  if (c.options.padding) {
    in["seq_len_q"] = b.tensor("seq_len_q", {c.B, 1, 1, 1}, DType::kInt32);
    in["seq_len_kv"] = b.tensor("seq_len_kv", {c.B, 1, 1, 1}, DType::kInt32);
  }
  if (c.options.bias) in["bias"] = b.tensor("bias", c.bias_dims);
  if (c.options.dropout) {
    in["seed"] = b.tensor("seed", one, DType::kInt64);
    in["offset"] = b.tensor("offset", one, DType::kInt64);
  }
  if (kind == SdpaKind::kBwd) {
    out["dq"] = b.tensor("dq", qd, c.dtype);
    out["dk"] = b.tensor("dk", kd, c.dtype);
    out["dv"] = b.tensor("dv", vd, c.dtype);
  } else {
    out["o"] = b.tensor("o", od, kind == SdpaKind::kFp8Fwd ? DType::kFP8E4M3 : c.dtype, strides(od));
    out["stats"] = b.tensor("stats", sd);
  }
  if (kind == SdpaKind::kFp8Fwd) {
    out["amax_s"] = b.tensor("amax_s", one);
    out["amax_o"] = b.tensor("amax_o", one);
  }
  if (c.options.dump_dropout_mask) out["dropout_mask"] = b.tensor("dropout_mask", {c.B, c.Hq, c.Sq, c.Skv});
  OpAttrs attrs;
  if (kind == SdpaKind::kFwd) {
    SdpaFwdAttrs a;
    static_cast<SdpaOptions&>(a) = c.options;
    a.generate_stats = true;
    attrs = a;
  } else if (kind == SdpaKind::kFp8Fwd) {
    SdpaFp8FwdAttrs a;
    static_cast<SdpaOptions&>(a) = c.options;
    a.generate_stats = true;
    attrs = a;
  } else {
    SdpaBwdAttrs a;
    static_cast<SdpaOptions&>(a) = c.options;
    attrs = a;
  }
  b.op_outputs("attn", attrs, in, out);

  SdpaProblem p;
  for (const auto& [role, idx] : in) {
    const ResolvedTensor& t = b.g.tensors[idx];
    if (role == "seq_len_q")
      p.inputs[t.name] = host_from(t, c.seq_len_q);
    else if (role == "seq_len_kv")
      p.inputs[t.name] = host_from(t, c.seq_len_kv);
    else if (fp8_scales().count(role))
      p.inputs[t.name] = host_from(t, {fp8_scales().at(role)});
    else if (role == "seed")
      p.inputs[t.name] = host_from(t, {static_cast<double>(seed)});
    else if (role == "offset")
      p.inputs[t.name] = host_from(t, {0});
    else if (role == "q")
      p.inputs[t.name] = random_tensor(t, seed, -c.q_range, c.q_range);
    else
      p.inputs[t.name] = random_tensor(t, seed);
  }
  if (c.options.dump_dropout_mask) {
    const ResolvedTensor& t = b.g.tensors[out.at("dropout_mask")];
    p.inputs[t.name] = bernoulli_mask(t, 1.0 - c.options.dropout.value_or(0.0), seed);
  }
  p.g = std::move(b.g);
  return p;
}

}  // namespace fusebox::testing_util
