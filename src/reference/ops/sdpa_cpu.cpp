// fusebox: the CPU references of sdpa_fwd, sdpa_bwd and sdpa_fp8_fwd (and the
// driver side of sdpa_fp8_bwd, whose core is ops/sdpa_fp8_bwd_cpu.cpp), and
// the verification tolerances of the sdpa ops. Semantics: fusebox/ops/sdpa.h.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "ops/sdpa_dropout.h"
#include "ops/sdpa_fp8_bwd.h"
#include "ops/sdpa_paged.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

// An sdpa op's tensors by role: inputs as read, outputs to write.
struct SdpaTensors {
  std::map<std::string, const Values*, std::less<>> in;
  std::map<std::string, Values*, std::less<>> out;
  const Values& operator[](std::string_view role) const { return *in.find(role)->second; }
};

struct SdpaShape {
  int64_t B = 0, Hq = 0, Hk = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  int64_t group() const { return Hq / Hk; }  // query heads per kv head
};

// Checks every tensor of an sdpa op against the dims q, k and v imply, so the
// loops below can index them as dense logical arrays.
Result<SdpaShape> sdpa_shape(const ResolvedOp& op, const SdpaTensors& t) {
  const Values &q = t["q"], &k = t["k"], &v = t["v"];
  if (q.dims.size() != 4 || k.dims.size() != 4 || v.dims.size() != 4)
    return InvalidArgument(op_where(op) + "q, k and v must have rank 4; got q " + dims_string(q.dims) +
                           ", k " + dims_string(k.dims) + ", v " + dims_string(v.dims));
  SdpaShape s;
  s.B = q.dims[0], s.Hq = q.dims[1], s.Sq = q.dims[2], s.D = q.dims[3];
  s.Hk = k.dims[1], s.Skv = k.dims[2], s.Dv = v.dims[3];
  if (k.dims[0] != s.B || v.dims[0] != s.B || k.dims[3] != s.D || v.dims[1] != s.Hk || v.dims[2] != s.Skv ||
      s.Hk < 1 || s.Hq % s.Hk != 0)
    return InvalidArgument(op_where(op) + "inconsistent shapes: q " + dims_string(q.dims) + ", k " +
                           dims_string(k.dims) + ", v " + dims_string(v.dims));
  const std::vector<int64_t> o_dims = {s.B, s.Hq, s.Sq, s.Dv}, stats_dims = {s.B, s.Hq, s.Sq, 1},
                             len_dims = {s.B, 1, 1, 1};
  // The dims `role` must have, or {} for a single value (fp8 scales, amax).
  auto want = [&](std::string_view role) -> std::vector<int64_t> {
    if (role == "o" || role == "do") return o_dims;
    if (role == "stats") return stats_dims;
    if (role == "seq_len_q" || role == "seq_len_kv") return len_dims;
    if (role == "dropout_mask") return {s.B, s.Hq, s.Sq, s.Skv};
    if (role == "dsink_token") return {1, s.Hq, 1, 1};
    if (role == "block_mask") return sdpa_block_mask_dims(s.B, s.Hq, s.Sq, s.Skv);
    if (role == "dq") return q.dims;
    if (role == "dk") return k.dims;
    if (role == "dv") return v.dims;
    return {};
  };
  auto check = [&](const char* kind, std::string_view role, const std::vector<int64_t>& dims) -> Status {
    const std::string what =
        op_where(op) + kind + " '" + std::string(role) + "' has dims " + dims_string(dims);
    if (role == "q" || role == "k" || role == "v") return Status::Ok();
    if (role == "page_table_k" || role == "page_table_v") return Status::Ok();  // read by gather_pages()
    if (role == "sink_token") {
      if (dims == std::vector<int64_t>{1, s.Hq, 1, 1}) return Status::Ok();
      return InvalidArgument(what + " but q needs [1, Hq, 1, 1] = [1, " + std::to_string(s.Hq) + ", 1, 1]");
    }
    if (role == "bias") {
      if (dims.size() == 4 && (dims[0] == 1 || dims[0] == s.B) && (dims[1] == 1 || dims[1] == s.Hq) &&
          dims[2] == s.Sq && dims[3] == s.Skv)
        return Status::Ok();
      return InvalidArgument(what + " but q and k need [B or 1, Hq or 1, Sq, Skv] = [" + std::to_string(s.B) +
                             " or 1, " + std::to_string(s.Hq) + " or 1, " + std::to_string(s.Sq) + ", " +
                             std::to_string(s.Skv) + "]");
    }
    const std::vector<int64_t> w = want(role);
    if (w.empty() ? product(dims) == 1 : dims == w) return Status::Ok();
    return InvalidArgument(what + " but q, k and v need " + (w.empty() ? "one element" : dims_string(w)));
  };
  for (const auto& [role, x] : t.in) FUSEBOX_RETURN_IF_ERROR(check("input", role, x->dims));
  for (const auto& [role, x] : t.out) FUSEBOX_RETURN_IF_ERROR(check("output", role, x->dims));
  return s;
}

// Each sequence's length: seq_len_q/kv[b] with padding, else the full `full`.
Result<std::vector<int64_t>> sdpa_lengths(const ResolvedOp& op, const SdpaOptions& o, const SdpaTensors& t,
                                          const char* role, int64_t B, int64_t full) {
  std::vector<int64_t> len(static_cast<size_t>(B), full);
  if (!o.padding) return len;
  const Values& v = t[role];
  for (int64_t b = 0; b < B; ++b) {
    const double x = v.data[b];
    if (!(x >= 0 && x <= static_cast<double>(full) && x == std::floor(x)))
      return InvalidArgument(op_where(op) + "input '" + role + "' holds " + std::to_string(x) +
                             " for batch " + std::to_string(b) + ": each length must be an integer in [0, " +
                             std::to_string(full) + "]");
    len[b] = static_cast<int64_t>(x);
  }
  return len;
}

// The scores of one sdpa op, s(b, h, i, j) = scale * q_i . k_j [+ bias] [+ alibi],
// and which of them its mask keeps: sdpa_keeps() with each sequence's lengths,
// and the block mask's bit of the pair's tile (`block`, uint8 values as floats).
class SdpaScores {
 public:
  SdpaScores(const SdpaOptions& o, const SdpaShape& sh, double scale, const Values& q, const Values& k,
             const Values* bias, std::vector<int64_t> lq, std::vector<int64_t> lkv,
             const Values* block = nullptr)
      : o_(o),
        sh_(sh),
        scale_(scale),
        q_(q),
        k_(k),
        bias_(bias),
        lq_(std::move(lq)),
        lkv_(std::move(lkv)),
        block_(block) {
    if (block) {
      const std::vector<int64_t> bd = sdpa_block_mask_dims(sh.B, sh.Hq, sh.Sq, sh.Skv);
      block_row_bytes_ = bd[3];
      block_tile_rows_ = bd[2];
    }
    if (o.alibi) slopes_ = alibi_slopes(sh.Hq);
    if (bias) {  // [B or 1, Hq or 1, Sq, Skv]: stride 0 along a broadcast dim
      bias_h_stride_ = bias->dims[1] == 1 ? 0 : sh.Sq * sh.Skv;
      bias_b_stride_ = bias->dims[0] == 1 ? 0 : bias->dims[1] * sh.Sq * sh.Skv;
    }
  }

  int64_t lq(int64_t b) const { return lq_[b]; }
  int64_t lkv(int64_t b) const { return lkv_[b]; }
  bool keeps(int64_t b, int64_t i, int64_t j) const { return sdpa_keeps(o_, i, j, lq_[b], lkv_[b]); }
  // The block mask's verdict on (b, h, i, j); true without a block mask.
  bool tile_keeps(int64_t b, int64_t h, int64_t i, int64_t j) const {
    if (!block_) return true;
    const int64_t at = ((b * sh_.Hq + h) * block_tile_rows_ + i / kSdpaBlockTile) * block_row_bytes_ +
                       j / kSdpaBlockTile / 8;
    return sdpa_block_keeps(static_cast<unsigned>(block_->data[static_cast<size_t>(at)]), j);
  }

  double score(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const float* qr = q_.data.data() + ((b * sh_.Hq + h) * sh_.Sq + i) * sh_.D;
    const float* kr = k_.data.data() + ((b * sh_.Hk + h / sh_.group()) * sh_.Skv + j) * sh_.D;
    double dot = 0;
    for (int64_t d = 0; d < sh_.D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
    double s = scale_ * dot;
    if (bias_) s += bias_->data[b * bias_b_stride_ + h * bias_h_stride_ + i * sh_.Skv + j];
    if (!slopes_.empty()) s += slopes_[h] * static_cast<double>(j - i);
    return s;
  }

  // Row (b, h, i) into s[0, Skv): the score where kept, -inf elsewhere.
  // Returns the row's max, -inf when the row keeps no key.
  double row(int64_t b, int64_t h, int64_t i, std::vector<double>& s) const {
    double mx = -INFINITY;
    for (int64_t j = 0; j < sh_.Skv; ++j) {
      s[j] = keeps(b, i, j) && tile_keeps(b, h, i, j) ? score(b, h, i, j) : -INFINITY;
      mx = std::max(mx, s[j]);
    }
    return mx;
  }

 private:
  const SdpaOptions& o_;
  SdpaShape sh_;
  double scale_;
  const Values& q_;
  const Values& k_;
  const Values* bias_;
  std::vector<int64_t> lq_, lkv_;
  const Values* block_;
  int64_t block_row_bytes_ = 0, block_tile_rows_ = 0;
  std::vector<double> slopes_;
  int64_t bias_b_stride_ = 0, bias_h_stride_ = 0;
};

// fp8_e4m3(x), saturating, round to nearest even: what sdpa_fp8_fwd does to P * scale_s.
double round_to_e4m3(double x) {
  unsigned char b = 0;
  store_element(&b, DType::kFP8E4M3, x);
  return load_element(&b, DType::kFP8E4M3);
}

struct Fp8Scales {
  double descale_s = 1, descale_v = 1, scale_s = 1, scale_o = 1;
};

// Dropout as cuDNN applies it after the softmax: P' = P * M / (1 - p), with M
// the keep-mask it drew (the op's "dropout_mask" values, fed in as an input).
// Without dropout every factor is 1.
class SdpaDropout {
 public:
  SdpaDropout() = default;
  SdpaDropout(const Values* mask, double p, const SdpaShape& sh)
      : mask_(mask), scale_(1.0 / (1.0 - p)), Skv_(sh.Skv) {}
  // M / (1 - p) at row (b * Hq + h) * Sq + i, key j.
  double factor(int64_t row, int64_t j) const {
    return mask_ ? mask_->data[static_cast<size_t>(row * Skv_ + j)] * scale_ : 1.0;
  }

 private:
  const Values* mask_ = nullptr;
  double scale_ = 1;
  int64_t Skv_ = 0;
};

// sdpa_fwd (fp8 == nullptr) and sdpa_fp8_fwd, row by row: P = softmax of the
// kept scores, stats = their logsumexp (before dropout), P' = P * M / (1 - p)
// with dropout, o = P' @ v (fp8: amax_s = max P', P' rounded to e4m3 after
// scale_s, then the descales and scale_o, with both amax values).
// Rows i >= lq (padding) are don't care and stay 0; a row that keeps no key
// gets o = 0 and stats = -inf (the logsumexp of nothing), or sink[h] with
// attention sinks (`sink`: one logit per query head, in the softmax, no value).
void sdpa_forward(const SdpaScores& sc, const SdpaShape& sh, const Values& v, const SdpaDropout& drop,
                  const Fp8Scales* fp8, const Values* sink, Values* o, Values* stats, double* amax_s,
                  double* amax_o) {
  const int64_t rows = sh.B * sh.Hq * sh.Sq;
  std::vector<double> row_amax_s(fp8 ? rows : 0), row_amax_o(fp8 ? rows : 0);
  parallel_for(rows, static_cast<double>(sh.Skv) * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> s(static_cast<size_t>(sh.Skv)), acc(static_cast<size_t>(sh.Dv));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % sh.Sq, bh = row / sh.Sq, h = bh % sh.Hq, b = bh / sh.Hq;
      if (i >= sc.lq(b)) continue;
      const double sink_logit = sink ? static_cast<double>(sink->data[h]) : -INFINITY;
      const double mx = std::max(sc.row(b, h, i, s), sink_logit);
      if (mx == -INFINITY) {
        if (stats) stats->data[row] = -INFINITY;
        continue;
      }
      double sum = sink ? std::exp(sink_logit - mx) : 0.0;
      for (int64_t j = 0; j < sh.Skv; ++j) sum += std::exp(s[j] - mx);
      const double lse = mx + std::log(sum);
      if (stats) stats->data[row] = static_cast<float>(lse);
      std::fill(acc.begin(), acc.end(), 0.0);
      double p_max = 0;
      const float* vb = v.data.data() + (b * sh.Hk + h / sh.group()) * sh.Skv * sh.Dv;
      for (int64_t j = 0; j < sh.Skv; ++j) {
        if (s[j] == -INFINITY) continue;
        double p = std::exp(s[j] - lse) * drop.factor(row, j);
        if (fp8) {
          p_max = std::max(p_max, p);
          p = round_to_e4m3(p * fp8->scale_s);
        }
        const float* vr = vb + j * sh.Dv;
        for (int64_t d = 0; d < sh.Dv; ++d) acc[d] += p * vr[d];
      }
      float* orow = o->data.data() + row * sh.Dv;
      if (!fp8) {
        for (int64_t d = 0; d < sh.Dv; ++d) orow[d] = static_cast<float>(acc[d]);
        continue;
      }
      double o_max = 0;
      for (int64_t d = 0; d < sh.Dv; ++d) {
        const double out = fp8->descale_s * fp8->descale_v * acc[d];
        o_max = std::max(o_max, std::fabs(out));
        orow[d] = static_cast<float>(out * fp8->scale_o);
      }
      row_amax_s[row] = p_max;
      row_amax_o[row] = o_max;
    }
  });
  if (!fp8) return;
  *amax_s = *amax_o = 0;
  for (int64_t r = 0; r < rows; ++r)
    *amax_s = std::max(*amax_s, row_amax_s[r]), *amax_o = std::max(*amax_o, row_amax_o[r]);
}

// sdpa_bwd from the given o, do and stats, with P recomputed as exp(s - stats)
// and, with dropout, F = M / (1 - p) (else 1):
//   Di = do_i . o_i,  dP = F * (do @ v^T),  dS = P * (dP - Di),
//   dq = scale * dS @ k,  dk = scale * dS^T @ q,  dv = (P * F)^T @ do,
// dk and dv summed over the query heads that share a kv head. One pass per
// query row (Di, dq), then one per key row (dk, dv), so that each thread owns
// the rows it writes. Padded rows and keys (and keys no row keeps) stay 0.
// With attention sinks and `dsink`: dsink[h] = -sum over the rows of head h
// of exp(sink[h] - stats_i) * Di (the sink's probability takes from every
// key's, so d stats / d sink = P_sink; padded rows are not rows).
void sdpa_backward(const SdpaScores& sc, const SdpaShape& sh, double scale, const SdpaDropout& drop,
                   const SdpaTensors& t, Values* dq, Values* dk, Values* dv, const Values* sink,
                   Values* dsink) {
  const Values &q = t["q"], &k = t["k"], &v = t["v"], &o = t["o"], &dout = t["do"], &stats = t["stats"];
  const int64_t rows = sh.B * sh.Hq * sh.Sq, G = sh.group();
  std::vector<double> Di(static_cast<size_t>(rows));
  // P' (P after dropout) and dS of a kept (b, h, i, j).
  auto p_and_ds = [&](int64_t b, int64_t h, int64_t i, int64_t j, double* p_drop, double* ds) {
    const int64_t row = (b * sh.Hq + h) * sh.Sq + i;
    const double p = std::exp(sc.score(b, h, i, j) - stats.data[row]), f = drop.factor(row, j);
    *p_drop = p * f;
    const float* dor = dout.data.data() + row * sh.Dv;
    const float* vr = v.data.data() + ((b * sh.Hk + h / G) * sh.Skv + j) * sh.Dv;
    double dp = 0;
    for (int64_t d = 0; d < sh.Dv; ++d) dp += static_cast<double>(dor[d]) * vr[d];
    *ds = p * (f * dp - Di[row]);
  };
  parallel_for(rows, static_cast<double>(sh.Skv) * (2 * sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(sh.D));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % sh.Sq, bh = row / sh.Sq, h = bh % sh.Hq, b = bh / sh.Hq;
      if (i >= sc.lq(b)) continue;
      double di = 0;
      for (int64_t d = 0; d < sh.Dv; ++d)
        di += static_cast<double>(dout.data[row * sh.Dv + d]) * o.data[row * sh.Dv + d];
      Di[row] = di;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < sh.Skv; ++j) {
        if (!sc.keeps(b, i, j)) continue;
        double p, ds;
        p_and_ds(b, h, i, j, &p, &ds);
        const float* kr = k.data.data() + ((b * sh.Hk + h / G) * sh.Skv + j) * sh.D;
        for (int64_t d = 0; d < sh.D; ++d) acc[d] += ds * kr[d];
      }
      for (int64_t d = 0; d < sh.D; ++d) dq->data[row * sh.D + d] = static_cast<float>(scale * acc[d]);
    }
  });
  const int64_t keys = sh.B * sh.Hk * sh.Skv;
  parallel_for(keys, static_cast<double>(G * sh.Sq) * 2 * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> acc_k(static_cast<size_t>(sh.D)), acc_v(static_cast<size_t>(sh.Dv));
    for (int64_t key = begin; key < end; ++key) {
      const int64_t j = key % sh.Skv, bhk = key / sh.Skv, hk = bhk % sh.Hk, b = bhk / sh.Hk;
      if (j >= sc.lkv(b)) continue;
      std::fill(acc_k.begin(), acc_k.end(), 0.0);
      std::fill(acc_v.begin(), acc_v.end(), 0.0);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h)
        for (int64_t i = 0; i < sh.Sq; ++i) {
          if (!sc.keeps(b, i, j)) continue;
          double p, ds;
          p_and_ds(b, h, i, j, &p, &ds);
          const int64_t row = (b * sh.Hq + h) * sh.Sq + i;
          const float* qr = q.data.data() + row * sh.D;
          const float* dor = dout.data.data() + row * sh.Dv;
          for (int64_t d = 0; d < sh.D; ++d) acc_k[d] += ds * qr[d];
          for (int64_t d = 0; d < sh.Dv; ++d) acc_v[d] += p * dor[d];
        }
      for (int64_t d = 0; d < sh.D; ++d) dk->data[key * sh.D + d] = static_cast<float>(scale * acc_k[d]);
      for (int64_t d = 0; d < sh.Dv; ++d) dv->data[key * sh.Dv + d] = static_cast<float>(acc_v[d]);
    }
  });
  if (sink && dsink) {
    for (int64_t h = 0; h < sh.Hq; ++h) {
      double acc = 0;
      for (int64_t b = 0; b < sh.B; ++b)
        for (int64_t i = 0; i < sc.lq(b); ++i) {
          const int64_t row = (b * sh.Hq + h) * sh.Sq + i;
          acc += std::exp(static_cast<double>(sink->data[h]) - stats.data[row]) * Di[row];
        }
      dsink->data[h] = static_cast<float>(-acc);
    }
  }
}

// One value of a single-element input (an fp8 scale).
double single(const SdpaTensors& t, std::string_view role) { return t[role].data[0]; }

enum class SdpaKind { kFwd, kBwd, kFp8Fwd };

// sdpa_fwd, sdpa_bwd and sdpa_fp8_fwd on the gathered tensors. With dropout,
// t.in holds "dropout_mask".
Status run_sdpa(const ResolvedOp& op, const SdpaOptions& o, SdpaKind kind, const SdpaTensors& t) {
  FUSEBOX_ASSIGN_OR_RETURN(const SdpaShape sh, sdpa_shape(op, t));
  const bool dropout = o.dropout && *o.dropout > 0;
  const SdpaDropout drop = dropout ? SdpaDropout(&t["dropout_mask"], *o.dropout, sh) : SdpaDropout();
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<int64_t> lq, sdpa_lengths(op, o, t, "seq_len_q", sh.B, sh.Sq));
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<int64_t> lkv, sdpa_lengths(op, o, t, "seq_len_kv", sh.B, sh.Skv));
  const double attn_scale = o.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(sh.D)));
  const bool fp8 = kind == SdpaKind::kFp8Fwd;
  // fp8 q and k are descaled before the product: s = attn_scale * dq * dk * (q @ k^T).
  const double score_scale = fp8 ? attn_scale * single(t, "descale_q") * single(t, "descale_k") : attn_scale;
  const SdpaScores sc(o, sh, score_scale, t["q"], t["k"], o.bias ? &t["bias"] : nullptr, std::move(lq),
                      std::move(lkv), o.block_mask ? &t["block_mask"] : nullptr);
  auto out = [&](std::string_view role) -> Values* {
    auto it = t.out.find(role);
    return it == t.out.end() ? nullptr : it->second;
  };
  if (kind == SdpaKind::kBwd) {
    sdpa_backward(sc, sh, attn_scale, drop, t, out("dq"), out("dk"), out("dv"),
                  o.sink ? &t["sink_token"] : nullptr, out("dsink_token"));
    return Status::Ok();
  }
  Fp8Scales scales;
  if (fp8) {
    scales = {single(t, "descale_s"), single(t, "descale_v"), single(t, "scale_s"), single(t, "scale_o")};
  }
  double amax_s = 0, amax_o = 0;
  sdpa_forward(sc, sh, t["v"], drop, fp8 ? &scales : nullptr, o.sink ? &t["sink_token"] : nullptr, out("o"),
               out("stats"), &amax_s, &amax_o);
  if (fp8) {
    out("amax_s")->data[0] = static_cast<float>(amax_s);
    out("amax_o")->data[0] = static_cast<float>(amax_o);
  }
  return Status::Ok();
}

// The op's inputs by role (with dropout > 0 also "dropout_mask": the values
// cuDNN dumped, fed in as an input), and its outputs' buffers.
Status gather(CpuOpContext& ctx, const ResolvedOp& op, const SdpaOptions& o, SdpaTensors& t) {
  for (std::string_view r : op_input_roles(op.attrs)) {
    const std::string role(r);
    FUSEBOX_ASSIGN_OR_RETURN(t.in[role], ctx.in(role));
  }
  if (o.dropout && *o.dropout > 0) {
    FUSEBOX_ASSIGN_OR_RETURN(const std::string mask_name,
                             sdpa_dropout_mask_name(ctx.graph(), op, ctx.host_inputs()));
    FUSEBOX_ASSIGN_OR_RETURN(t.in["dropout_mask"],
                             ctx.tensor("dropout_mask", ctx.graph().find_tensor(mask_name)));
  }
  for (std::string_view r : op_output_roles(op.attrs)) {
    if (r == "dropout_mask") continue;  // cuDNN's RNG dump: an input to the reference, never computed
    const std::string role(r);
    FUSEBOX_ASSIGN_OR_RETURN(t.out[role], ctx.out(role));
  }
  return Status::Ok();
}

// Paged K/V: the dense [B, Hk, Skv, D] cache of pool `pool_role` as each
// sequence sees it through table `table_role` (SdpaOptions::paged), after
// checking every table entry.
Result<Values> gather_pages(const CpuOpContext& ctx, const ResolvedOp& op, const SdpaOptions& o,
                            const SdpaTensors& t, const char* pool_role, const char* table_role) {
  const Values &pool = t[pool_role], &table = t[table_role];
  const int64_t B = t["q"].dims.at(0);
  if (pool.dims.size() != 4 || table.dims.size() != 4 || table.dims[0] != B || !o.max_seq_len_kv)
    return InvalidArgument(op_where(op) + "paged input '" + pool_role + "' " + dims_string(pool.dims) +
                           " or '" + table_role + "' " + dims_string(table.dims) +
                           " is not a pool [num_pages, Hk, page_size, D] with a table [B, 1, max_pages, 1]");
  const int64_t pages = pool.dims[0], H = pool.dims[1], page_size = pool.dims[2], D = pool.dims[3];
  const int64_t max_pages = table.dims[2], Skv = *o.max_seq_len_kv;
  if (Skv > max_pages * page_size)
    return InvalidArgument(op_where(op) + "max_seq_len_kv " + std::to_string(Skv) + " exceeds the " +
                           std::to_string(max_pages) + " pages of " + std::to_string(page_size) +
                           " keys of input '" + table_role + "'");
  const std::string& name = ctx.graph().tensors[op.inputs.at(table_role)].name;
  FUSEBOX_RETURN_IF_ERROR(check_page_table(op, table_role, name, table.data, B, max_pages, pages));
  Values dense{{B, H, Skv, D}, std::vector<float>(static_cast<size_t>(B * H * Skv * D))};
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < Skv; ++j) {
        int64_t page = 0;
        const int64_t r = paged_row(table.data.data() + b * max_pages, page_size, j, &page);
        const float* src = pool.data.data() + ((page * H + h) * page_size + r) * D;
        std::copy(src, src + D, dense.data.begin() + ((b * H + h) * Skv + j) * D);
      }
  return dense;
}

// An FP8 K/V cache (SdpaFwdAttrs::fp8_kv): `role` (k or v) times its descale, one for the tensor
// or one per row of its last dim.
Result<Values> descaled(const ResolvedOp& op, const SdpaTensors& t, const char* role,
                        const char* scale_role) {
  const Values &x = t[role], &s = t[scale_role];
  Values out = x;
  const int64_t D = x.dims.empty() ? 1 : x.dims.back(), rows = D > 0 ? product(x.dims) / D : 0;
  const int64_t n = product(s.dims);
  if (n != 1 && n != rows)
    return InvalidArgument(op_where(op) + "input '" + scale_role + "' " + dims_string(s.dims) + " has " +
                           std::to_string(n) + " values: one, or one per row of '" + role + "' " +
                           dims_string(x.dims) + " (" + std::to_string(rows) + ")");
  for (int64_t r = 0; r < rows; ++r) {
    const float f = s.data[static_cast<size_t>(n == 1 ? 0 : r)];
    for (int64_t d = 0; d < D; ++d) out.data[static_cast<size_t>(r * D + d)] *= f;
  }
  return out;
}

Status run(CpuOpContext& ctx, const ResolvedOp& op, const SdpaOptions& o, SdpaKind kind,
           bool fp8_kv = false) {
  SdpaTensors t;
  FUSEBOX_RETURN_IF_ERROR(gather(ctx, op, o, t));
  Values real_k, real_v;  // with an FP8 cache: k and v descaled
  if (fp8_kv) {
    FUSEBOX_ASSIGN_OR_RETURN(real_k, descaled(op, t, "k", "descale_k"));
    FUSEBOX_ASSIGN_OR_RETURN(real_v, descaled(op, t, "v", "descale_v"));
    t.in["k"] = &real_k;
    t.in["v"] = &real_v;
    t.in.erase("descale_k");
    t.in.erase("descale_v");
  }
  Values dense_k, dense_v;  // with paged K/V: what t.in["k"], t.in["v"] point to
  if (o.paged) {
    FUSEBOX_ASSIGN_OR_RETURN(dense_k, gather_pages(ctx, op, o, t, "k", "page_table_k"));
    FUSEBOX_ASSIGN_OR_RETURN(dense_v, gather_pages(ctx, op, o, t, "v", "page_table_v"));
    t.in["k"] = &dense_k;
    t.in["v"] = &dense_v;
  }
  return run_sdpa(op, o, kind, t);
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& a) {
  return run(ctx, op, a, SdpaKind::kFwd, a.fp8_kv);
}
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& a) {
  return run(ctx, op, a, SdpaKind::kBwd);
}
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& a) {
  return run(ctx, op, a, SdpaKind::kFp8Fwd);
}
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& a) {
  SdpaTensors t;
  FUSEBOX_RETURN_IF_ERROR(gather(ctx, op, a, t));
  return sdpa_fp8_bwd_cpu(ctx.graph(), op, a, t.in, t.out);  // ops/sdpa_fp8_bwd_cpu.cpp
}

// Tolerances of the outputs that need more than their dtype's default
// (default_tolerance(), compare.cpp); sdpa_fp8_bwd's: ops/sdpa_fp8_bwd_cpu.cpp.
//   sdpa_bwd dq, dk, dv: cuDNN rounds P and dS to the io dtype before its
//     matmuls and sums over every kept key (and, for dk/dv, every row of the
//     group's heads): bf16 2e-2/8e-2, fp16 6e-3/3e-2, twice the forward's.
//   sdpa_fp8_fwd o: the e4m3 output rounding (rms 3.6% of each value) plus the
//     rounding of P to e4m3, which cuDNN may apply at another point (to
//     unnormalized exp(s - max)) than the documented softmax: 1e-1/3e-1.
//   sdpa_fp8_fwd amax_s: max(P) in fp32, 2e-2; amax_o: the max of O, which
//     carries the P rounding above, 1.5e-1.
// Wrong masks still fail: causal vs not, or a window off by one key, move the
// affected rows by 1/(kept keys) of their value, far above these for rows
// with few keys (the first rows of a causal mask, every row of a window).
Tolerance tolerance(const SdpaFwdAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

Tolerance tolerance(const SdpaBwdAttrs&, std::string_view, DType dtype) {
  return dtype == DType::kFP16 ? Tolerance{6e-3, 3e-2} : Tolerance{2e-2, 8e-2};
}

Tolerance tolerance(const SdpaFp8FwdAttrs&, std::string_view role, DType dtype) {
  if (role == "o") return {1e-1, 3e-1};
  if (role == "amax_s") return {2e-2, 2e-2};
  if (role == "amax_o") return {1.5e-1, 1.5e-1};
  return default_tolerance(dtype);
}

}  // namespace fusebox::reference_detail
