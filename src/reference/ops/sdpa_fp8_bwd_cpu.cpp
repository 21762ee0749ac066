// fusebox: CPU reference of sdpa_fp8_bwd (semantics: sdpa_fp8_bwd.h), fp64
// accumulation with cuDNN's two fp8 roundings (P8, dS8) emulated; its
// verification tolerance.
#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <functional>
#include <thread>
#include <tuple>
#include <variant>

#include "ops/ops.h"
#include "ops/sdpa_fp8_bwd.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

const std::vector<std::string>& sdpa_fp8_bwd_scale_roles() {
  static const std::vector<std::string> r = {"descale_q",  "descale_k", "descale_v",  "descale_o",
                                             "descale_do", "descale_s", "descale_dp", "scale_s",
                                             "scale_dq",   "scale_dk",  "scale_dv",   "scale_dp"};
  return r;
}

double round_to_fp8(double x, DType t) {
  if (std::isnan(x)) return x;
  return fp8_bits_to_float(float_to_fp8_bits(static_cast<float>(x), t), t);
}

// P (before dropout), F and dS (after attn_scale, unrounded) of a kept (b, h, i, j), in fp64, and
// the pairs the mask keeps: what the core and the ties both read.
class DsOf {
 public:
  explicit DsOf(const SdpaFp8BwdCpuArgs& a) : a_(a), sh_(a.sh), G_(a.sh.Hq / a.sh.Hk) {
    const SdpaFp8BwdScales& sc = a.sc;
    score_scale_ = a.attn_scale * sc.descale_q * sc.descale_k;
    const int64_t rows = sh_.B * sh_.Hq * sh_.Sq;
    Di_.assign(static_cast<size_t>(rows), 0.0);
    for (int64_t row = 0; row < rows; ++row) {
      double di = 0;
      for (int64_t d = 0; d < sh_.Dv; ++d)
        di += static_cast<double>(a.dout[row * sh_.Dv + d]) * a.o[row * sh_.Dv + d];
      Di_[row] = di * sc.descale_do * sc.descale_o;
    }
  }
  int64_t groups() const { return G_; }
  // fn(key, p, f, ds) for every key that query row `row` keeps (row, key: dense (b, h, i), (b, hk, j)).
  template <typename Fn>
  void over_keys(int64_t row, Fn&& fn) const {
    const int64_t i = row % sh_.Sq, bh = row / sh_.Sq, h = bh % sh_.Hq, b = bh / sh_.Hq;
    int64_t lo, hi;
    sdpa_kept_keys(a_.mask, i, a_.lq[b], a_.lkv[b], &lo, &hi);
    lo = std::max<int64_t>(lo, 0), hi = std::min(hi, sh_.Skv - 1);
    for (int64_t j = lo; j <= hi; ++j) {
      double p, f, ds;
      (*this)(b, h, i, j, &p, &f, &ds);
      fn((b * sh_.Hk + h / G_) * sh_.Skv + j, p, f, ds);
    }
  }
  // fn(row, p, f, ds) for every query row (the G heads of its group) that keeps key `key`.
  template <typename Fn>
  void over_rows(int64_t key, Fn&& fn) const {
    const int64_t j = key % sh_.Skv, bhk = key / sh_.Skv, hk = bhk % sh_.Hk, b = bhk / sh_.Hk;
    int64_t lo, hi;
    sdpa_kept_rows(a_.mask, j, a_.lq[b], a_.lkv[b], &lo, &hi);
    lo = std::max<int64_t>(lo, 0), hi = std::min(hi, sh_.Sq - 1);
    for (int64_t h = hk * G_; h < (hk + 1) * G_; ++h)
      for (int64_t i = lo; i <= hi; ++i) {
        double p, f, ds;
        (*this)(b, h, i, j, &p, &f, &ds);
        fn((b * sh_.Hq + h) * sh_.Sq + i, p, f, ds);
      }
  }
  void operator()(int64_t b, int64_t h, int64_t i, int64_t j, double* p, double* f, double* ds) const {
    const int64_t row = (b * sh_.Hq + h) * sh_.Sq + i, hk = h / G_;
    const float* qr = a_.q + row * sh_.D;
    const float* kr = a_.k + ((b * sh_.Hk + hk) * sh_.Skv + j) * sh_.D;
    double dot = 0;
    for (int64_t d = 0; d < sh_.D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
    *p = std::exp(score_scale_ * dot - a_.stats[row]);
    *f = a_.dropout_mask ? a_.dropout_mask[row * sh_.Skv + j] * a_.dropout_scale : 1.0;
    const float* dor = a_.dout + row * sh_.Dv;
    const float* vr = a_.v + ((b * sh_.Hk + hk) * sh_.Skv + j) * sh_.Dv;
    double dp = 0;
    for (int64_t d = 0; d < sh_.Dv; ++d) dp += static_cast<double>(dor[d]) * vr[d];
    dp *= a_.sc.descale_do * a_.sc.descale_v;
    *ds = *p * (*f * dp - Di_[row]) * a_.attn_scale;
  }

 private:
  const SdpaFp8BwdCpuArgs& a_;
  const SdpaFp8BwdShape& sh_;
  int64_t G_;
  double score_scale_ = 1;
  std::vector<double> Di_;
};

void sdpa_fp8_bwd_cpu_core(const SdpaFp8BwdCpuArgs& a, float* dq, float* dk, float* dv, double amax[4]) {
  const SdpaFp8BwdShape& sh = a.sh;
  const SdpaFp8BwdScales& sc = a.sc;
  const DsOf p_f_ds(a);
  const int64_t G = p_f_ds.groups(), rows = sh.B * sh.Hq * sh.Sq, keys = sh.B * sh.Hk * sh.Skv;
  std::vector<double> row_amax_dq(static_cast<size_t>(rows), 0.0),
      row_amax_dp(static_cast<size_t>(rows), 0.0);
  parallel_for(rows, static_cast<double>(sh.Skv) * (2 * sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(sh.D));
    for (int64_t row = begin; row < end; ++row) {
      std::fill(acc.begin(), acc.end(), 0.0);
      double dp_max = 0;
      p_f_ds.over_keys(row, [&](int64_t key, double, double, double ds) {
        dp_max = std::max(dp_max, std::fabs(ds));
        const double ds8 = round_to_fp8(ds * sc.scale_dp, a.ds_dtype);
        const float* kr = a.k + key * sh.D;
        for (int64_t d = 0; d < sh.D; ++d) acc[d] += ds8 * kr[d];
      });
      double dq_max = 0;
      for (int64_t d = 0; d < sh.D; ++d) {
        const double x = acc[d] * sc.descale_dp * sc.descale_k;
        dq_max = std::max(dq_max, std::fabs(x));
        dq[row * sh.D + d] = static_cast<float>(x * sc.scale_dq);
      }
      row_amax_dq[row] = dq_max;
      row_amax_dp[row] = dp_max;
    }
  });
  std::vector<double> key_amax_dk(static_cast<size_t>(keys), 0.0),
      key_amax_dv(static_cast<size_t>(keys), 0.0);
  parallel_for(keys, static_cast<double>(G * sh.Sq) * 2 * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> acc_k(static_cast<size_t>(sh.D)), acc_v(static_cast<size_t>(sh.Dv));
    for (int64_t key = begin; key < end; ++key) {
      std::fill(acc_k.begin(), acc_k.end(), 0.0);
      std::fill(acc_v.begin(), acc_v.end(), 0.0);
      p_f_ds.over_rows(key, [&](int64_t row, double p, double f, double ds) {
        const double p8 = round_to_fp8(p * f * sc.scale_s, a.p_dtype);
        const double ds8 = round_to_fp8(ds * sc.scale_dp, a.ds_dtype);
        const float* qr = a.q + row * sh.D;
        const float* dor = a.dout + row * sh.Dv;
        for (int64_t d = 0; d < sh.D; ++d) acc_k[d] += ds8 * qr[d];
        for (int64_t d = 0; d < sh.Dv; ++d) acc_v[d] += p8 * dor[d];
      });
      double k_max = 0, v_max = 0;
      for (int64_t d = 0; d < sh.D; ++d) {
        const double x = acc_k[d] * sc.descale_dp * sc.descale_q;
        k_max = std::max(k_max, std::fabs(x));
        dk[key * sh.D + d] = static_cast<float>(x * sc.scale_dk);
      }
      for (int64_t d = 0; d < sh.Dv; ++d) {
        const double x = acc_v[d] * sc.descale_s * sc.descale_do;
        v_max = std::max(v_max, std::fabs(x));
        dv[key * sh.Dv + d] = static_cast<float>(x * sc.scale_dv);
      }
      key_amax_dk[key] = k_max;
      key_amax_dv[key] = v_max;
    }
  });
  for (int n = 0; n < 4; ++n) amax[n] = 0;
  for (int64_t r = 0; r < rows; ++r)
    amax[0] = std::max(amax[0], row_amax_dq[r]), amax[3] = std::max(amax[3], row_amax_dp[r]);
  for (int64_t k = 0; k < keys; ++k)
    amax[1] = std::max(amax[1], key_amax_dk[k]), amax[2] = std::max(amax[2], key_amax_dv[k]);
}

Result<SdpaFp8BwdCpuArgs> sdpa_fp8_bwd_cpu_args(const ResolvedGraph& g, const ResolvedOp& op,
                                                const SdpaFp8BwdAttrs& attrs,
                                                const std::map<std::string, SdpaFp8BwdValues>& in) {
  const std::string where = op_where(op);
  const SdpaOptions* o = &attrs;
  if (o->bias || o->alibi) return NotSupported(where + "sdpa_fp8_bwd takes no bias and no ALiBi");
  auto get = [&](const std::string& role) -> const SdpaFp8BwdValues* {
    auto it = in.find(role);
    return it == in.end() ? nullptr : &it->second;
  };
  for (const char* role : {"q", "k", "v", "o", "do", "stats"})
    if (!get(role)) return InvalidArgument(where + "missing input '" + role + "'");
  const std::vector<int64_t>&qd = *get("q")->dims, &kd = *get("k")->dims, &vd = *get("v")->dims;
  if (qd.size() != 4 || kd.size() != 4 || vd.size() != 4)
    return InvalidArgument(where + "q, k and v must have rank 4");
  SdpaFp8BwdCpuArgs a;
  SdpaFp8BwdShape& sh = a.sh;
  sh = {qd[0], qd[1], kd[1], qd[2], kd[2], qd[3], vd[3]};
  if (kd[0] != sh.B || vd[0] != sh.B || kd[3] != sh.D || vd[1] != sh.Hk || vd[2] != sh.Skv || sh.Hk < 1 ||
      sh.Hq % sh.Hk != 0)
    return InvalidArgument(where + "inconsistent shapes: q " + dims_string(qd) + ", k " + dims_string(kd) +
                           ", v " + dims_string(vd));
  const std::vector<int64_t> od = {sh.B, sh.Hq, sh.Sq, sh.Dv}, sd = {sh.B, sh.Hq, sh.Sq, 1};
  for (const char* role : {"o", "do"})
    if (*get(role)->dims != od)
      return InvalidArgument(where + "input '" + role + "' has dims " + dims_string(*get(role)->dims) +
                             "; need " + dims_string(od));
  if (*get("stats")->dims != sd)
    return InvalidArgument(where + "input 'stats' has dims " + dims_string(*get("stats")->dims) + "; need " +
                           dims_string(sd));
  const std::vector<std::string>& roles = sdpa_fp8_bwd_scale_roles();
  double* scale_slots[12] = {&a.sc.descale_q,  &a.sc.descale_k, &a.sc.descale_v,  &a.sc.descale_o,
                             &a.sc.descale_do, &a.sc.descale_s, &a.sc.descale_dp, &a.sc.scale_s,
                             &a.sc.scale_dq,   &a.sc.scale_dk,  &a.sc.scale_dv,   &a.sc.scale_dp};
  for (size_t n = 0; n < roles.size(); ++n) {
    const SdpaFp8BwdValues* s = get(roles[n]);
    if (!s || s->data->size() != 1)
      return InvalidArgument(where + "input '" + roles[n] + "' must be one value");
    *scale_slots[n] = (*s->data)[0];
  }
  a.lq.assign(static_cast<size_t>(sh.B), sh.Sq);
  a.lkv.assign(static_cast<size_t>(sh.B), sh.Skv);
  if (o->padding) {
    for (auto [role, len, full] :
         {std::tuple{"seq_len_q", &a.lq, sh.Sq}, std::tuple{"seq_len_kv", &a.lkv, sh.Skv}}) {
      const SdpaFp8BwdValues* l = get(role);
      if (!l || static_cast<int64_t>(l->data->size()) != sh.B)
        return InvalidArgument(where + "input '" + role + "' must hold one length per batch");
      for (int64_t b = 0; b < sh.B; ++b) {
        const double x = (*l->data)[b];
        if (!(x >= 0 && x <= static_cast<double>(full) && x == std::floor(x)))
          return InvalidArgument(where + "input '" + role + "' holds " + std::to_string(x) + " for batch " +
                                 std::to_string(b) + ": each length must be an integer in [0, " +
                                 std::to_string(full) + "]");
        (*len)[b] = static_cast<int64_t>(x);
      }
    }
  }
  if (o->dropout && *o->dropout > 0) {
    const SdpaFp8BwdValues* m = get("dropout_mask");
    if (!m || *m->dims != std::vector<int64_t>{sh.B, sh.Hq, sh.Sq, sh.Skv})
      return InvalidArgument(where + "the dropout keep-mask must be given as [B, Hq, Sq, Skv]");
    a.dropout_mask = m->data->data();
    a.dropout_scale = 1.0 / (1.0 - *o->dropout);
  }
  a.mask = sdpa_mask_params(*o);
  a.attn_scale = o->attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(sh.D)));
  auto dtype_of = [&](const char* role) {
    auto it = op.inputs.find(role);
    return it == op.inputs.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size())
               ? DType::kFP8E4M3
               : g.tensors[it->second].dtype;
  };
  // P8 takes q's dtype, dS8 do's (fp32 test graphs: e4m3 for both).
  auto fp8_or_e4m3 = [](DType t) { return t == DType::kFP8E5M2 ? t : DType::kFP8E4M3; };
  a.p_dtype = fp8_or_e4m3(dtype_of("q"));
  a.ds_dtype = fp8_or_e4m3(dtype_of("do"));
  a.q = get("q")->data->data(), a.k = get("k")->data->data(), a.v = get("v")->data->data();
  a.o = get("o")->data->data(), a.dout = get("do")->data->data(), a.stats = get("stats")->data->data();
  return a;
}

namespace {

// The outputs dq, dk, dv of `out`, checked against the shapes of `a`.
Result<std::array<float*, 3>> gradient_outputs(const ResolvedOp& op, const SdpaFp8BwdCpuArgs& a,
                                               const std::map<std::string, std::vector<float>*>& out) {
  const SdpaFp8BwdShape& sh = a.sh;
  const char* grads[3] = {"dq", "dk", "dv"};
  const int64_t sizes[3] = {sh.B * sh.Hq * sh.Sq * sh.D, sh.B * sh.Hk * sh.Skv * sh.D,
                            sh.B * sh.Hk * sh.Skv * sh.Dv};
  std::array<float*, 3> dst{};
  for (int n = 0; n < 3; ++n) {
    auto it = out.find(grads[n]);
    if (it == out.end() || static_cast<int64_t>(it->second->size()) != sizes[n])
      return InvalidArgument(op_where(op) + "output '" + grads[n] + "' missing or of the wrong size");
    dst[n] = it->second->data();
  }
  return dst;
}

}  // namespace

Status sdpa_fp8_bwd_cpu(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFp8BwdAttrs& attrs,
                        const std::map<std::string, SdpaFp8BwdValues>& in,
                        const std::map<std::string, std::vector<float>*>& out) {
  FUSEBOX_ASSIGN_OR_RETURN(const SdpaFp8BwdCpuArgs a, sdpa_fp8_bwd_cpu_args(g, op, attrs, in));
  FUSEBOX_ASSIGN_OR_RETURN(const auto dst, gradient_outputs(op, a, out));
  double amax[4];
  sdpa_fp8_bwd_cpu_core(a, dst[0], dst[1], dst[2], amax);
  const char* amax_roles[4] = {"amax_dq", "amax_dk", "amax_dv", "amax_dp"};
  for (int n = 0; n < 4; ++n) {
    auto it = out.find(amax_roles[n]);
    if (it == out.end()) continue;
    if (it->second->size() != 1)
      return InvalidArgument(op_where(op) + "output '" + amax_roles[n] + "' must be one value");
    (*it->second)[0] = static_cast<float>(amax[n]);
  }
  return Status::Ok();
}

double fp8_tie_other_way(double x, DType t, double rel) {
  if (!std::isfinite(x)) return 0;
  const double lo = round_to_fp8(x * (1 - rel), t), hi = round_to_fp8(x * (1 + rel), t);
  if (lo == hi) return 0;
  const double cast = round_to_fp8(x, t);
  return (cast == lo ? hi : lo) - cast;
}

SdpaFp8BwdTies sdpa_fp8_bwd_ties(const SdpaFp8BwdCpuArgs& a, double rel) {
  const SdpaFp8BwdShape& sh = a.sh;
  const SdpaFp8BwdScales& sc = a.sc;
  const DsOf p_f_ds(a);
  const int64_t G = p_f_ds.groups(), rows = sh.B * sh.Hq * sh.Sq, keys = sh.B * sh.Hk * sh.Skv;
  SdpaFp8BwdTies t;
  t.by_row.resize(static_cast<size_t>(rows));
  t.ds_by_key.resize(static_cast<size_t>(keys));
  t.p_by_key.resize(static_cast<size_t>(keys));
  // Per query row (dq): the dS8 ties over its keys.
  parallel_for(rows, static_cast<double>(sh.Skv) * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      p_f_ds.over_keys(row, [&](int64_t key, double, double, double ds) {
        const double step = fp8_tie_other_way(ds * sc.scale_dp, a.ds_dtype, rel);
        if (step != 0) t.by_row[row].push_back({key, step});
      });
  });
  // Per key (dk, dv): the dS8 and P8 ties over the query rows that read it.
  parallel_for(keys, static_cast<double>(G * sh.Sq) * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    for (int64_t key = begin; key < end; ++key)
      p_f_ds.over_rows(key, [&](int64_t row, double p, double f, double ds) {
        const double step_s = fp8_tie_other_way(ds * sc.scale_dp, a.ds_dtype, rel);
        const double step_p = fp8_tie_other_way(p * f * sc.scale_s, a.p_dtype, rel);
        if (step_s != 0) t.ds_by_key[key].push_back({row, step_s});
        if (step_p != 0) t.p_by_key[key].push_back({row, step_p});
      });
  });
  return t;
}

Result<ResolvedGraph> sdpa_fp8_bwd_forward_of(const ResolvedGraph& g, const ResolvedOp& op,
                                              const std::map<std::string, HostTensor>& inputs) {
  const std::string where = op_where(op);
  const auto* bwd = std::get_if<SdpaFp8BwdAttrs>(&op.attrs);
  if (!bwd) return Internal(where + "not an sdpa_fp8_bwd op");
  auto tensor = [&](const std::map<std::string, int>& roles,
                    const std::string& role) -> Result<const ResolvedTensor*> {
    auto it = roles.find(role);
    if (it == roles.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size()))
      return InvalidArgument(where + "has no tensor '" + role + "'");
    return &g.tensors[it->second];
  };
  FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* descale_o, tensor(op.inputs, "descale_o"));
  double descale_o_value = 0;
  if (descale_o->scalar_value) {
    descale_o_value = *descale_o->scalar_value;
  } else {
    auto it = inputs.find(descale_o->name);
    if (it == inputs.end() || it->second.element_count() != 1)
      return InvalidArgument(where + "input 'descale_o' (tensor '" + descale_o->name +
                             "'): no single value given");
    descale_o_value = it->second.to_float_logical()[0];
  }
  if (!(descale_o_value != 0 && std::isfinite(descale_o_value)))
    return InvalidArgument(where + "input 'descale_o' is " + std::to_string(descale_o_value) +
                           ": the forward's scale_o = 1 / descale_o needs a finite nonzero value");
  ResolvedGraph f;
  f.name = g.name + "/" + op.name + ".forward";
  ResolvedOp fop;
  fop.name = op.name;
  SdpaFp8FwdAttrs attrs;
  static_cast<SdpaOptions&>(attrs) = *bwd;
  attrs.dropout.reset();
  attrs.dump_dropout_mask = false;
  attrs.generate_stats = true;
  fop.attrs = attrs;
  for (std::string_view r : op_input_roles(fop.attrs)) {
    const std::string role(r);
    fop.inputs[role] = static_cast<int>(f.tensors.size());
    if (role == "scale_o") {
      ResolvedTensor s = *descale_o;
      s.name = op.name + ".forward.scale_o";
      s.scalar_value = 1.0 / descale_o_value;
      s.dtype = DType::kFP32;
      f.tensors.push_back(std::move(s));
      continue;
    }
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, tensor(op.inputs, role));
    f.tensors.push_back(*t);
  }
  for (const char* role : {"o", "stats", "amax_s", "amax_o"}) {
    ResolvedTensor out;
    if (std::string_view(role) == "o" || std::string_view(role) == "stats") {
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, tensor(op.inputs, role));
      out = *t;
    } else {
      out.name = op.name + ".forward." + role;
      out.dims = {1, 1, 1, 1};
      out.strides = {1, 1, 1, 1};
      out.dtype = DType::kFP32;
    }
    out.is_input = false;
    out.is_output = true;
    out.is_virtual = false;
    out.scalar_value.reset();
    fop.outputs[role] = static_cast<int>(f.tensors.size());
    f.tensors.push_back(std::move(out));
  }
  f.ops.push_back(std::move(fop));
  return f;
}

// Tolerances of sdpa_fp8_bwd outputs. The references emulate cuDNN's two
// internal roundings (P8, dS8), so what is left is the output's own fp8
// rounding (the references do not round: e4m3 half-ulp 6.25%, rms about 2-3%
// of each value; e5m2 twice that) plus the rare internal value that lands on
// the other side of a rounding boundary (fp32 vs fp64) and moves by one fp8
// step:
//   dq, dk, dv: e4m3 {8e-2, 2.5e-1}, e5m2 {1.5e-1, 5e-1}.
//   amax_dp = max|dS|: no fp8 rounding before it, 2e-2.
//   amax_dq/dk/dv: max|X| can differ from the reference's by as much as X's largest elementwise
//     difference, which X's own check allows up to 2.5e-1 of max|X|: the same bound. Seed 7177
//     (tests/cases/wrong-values/sdpa_fp8_bwd_amax_dq_dS_rounding_tie.json) showed why: one dS
//     value, times scale_dp, lay 0.15% of a step from the e5m2 midpoint -288; the reference (fp64)
//     rounded it to -320, the GPU (fp32) to -256, which moved a causal row with three keys, and
//     with it max|dq|, by 12%. The amax is checked sharply against the output it describes
//     instead: check_fp8_amax() (sdpa_verification.cpp), to one fp8 step.
// A wrong scale moves values by the scale factor (>= 2x for any wrong
// power-of-two scale); a wrong mask (causal vs not) moves the first rows by
// O(1) of their value: both fail (tests/unit/reference_test_sdpa_fp8_bwd.cpp).
Tolerance tolerance(const SdpaFp8BwdAttrs&, std::string_view role, DType dtype) {
  if (role == "amax_dp") return {2e-2, 2e-2};
  if (role == "amax_dq" || role == "amax_dk" || role == "amax_dv") return {2.5e-1, 2.5e-1};
  if (dtype == DType::kFP8E5M2) return {1.5e-1, 5e-1};
  return {8e-2, 2.5e-1};
}

}  // namespace fusebox::reference_detail
