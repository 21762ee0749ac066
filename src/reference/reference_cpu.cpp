// fusebox: CPU reference. Every op accumulates in double; tensors between ops
// are kept as fp32 in logical row-major order (cuDNN keeps virtual tensors in
// the fp32 intermediate dtype). Outputs are not rounded to their dtype: the
// comparison tolerances absorb that rounding.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <map>
#include <string_view>
#include <optional>
#include <thread>

#include "fusebox/reference.h"
#include "reference/sdpa_dropout.h"
#include "reference/sdpa_fp8_bwd.h"
#include "reference/tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::parallel_for;
using reference_detail::product;

namespace {

// A tensor's values in logical row-major order, with its dims.
struct Values {
  std::vector<int64_t> dims;
  std::vector<float> data;
};


std::string op_where(const ResolvedOp& op) {
  std::string s = "[";  // appended piecewise: GCC 12 flags "[" + std::string(...) with a false -Wrestrict
  s.append(op_type_name(op.attrs)).append(" '").append(op.name).append("'] ");
  return s;
}

// Pads `dims` on the left with 1s to `rank`.
std::vector<int64_t> left_pad(const std::vector<int64_t>& dims, size_t rank) {
  std::vector<int64_t> out(rank - std::min(rank, dims.size()), 1);
  out.insert(out.end(), dims.begin(), dims.end());
  return out;
}

// Row-major strides of `in_dims` broadcast to `out_dims` (0 where a dim is 1).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in_dims, const std::vector<int64_t>& out_dims) {
  const std::vector<int64_t> padded = left_pad(in_dims, out_dims.size());
  std::vector<int64_t> s = reference_detail::dense_row_major(padded);
  for (size_t i = 0; i < padded.size(); ++i)
    if (padded[i] == 1) s[i] = 0;
  return s;
}

Status check_broadcast(const ResolvedOp& op, const std::string& role, const std::vector<int64_t>& in_dims,
                       const std::vector<int64_t>& out_dims) {
  if (product(in_dims) == 1) return Status::Ok();  // a scalar broadcasts to anything
  if (in_dims.size() > out_dims.size())
    return InvalidArgument(op_where(op) + "input '" + role + "' dims " + dims_string(in_dims) +
                           " have more dims than output " + dims_string(out_dims));
  const std::vector<int64_t> p = left_pad(in_dims, out_dims.size());
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != 1 && p[i] != out_dims[i])
      return InvalidArgument(op_where(op) + "input '" + role + "' dims " + dims_string(in_dims) +
                             " do not broadcast to output dims " + dims_string(out_dims));
  return Status::Ok();
}

double apply_unary(PointwiseMode m, double x) {
  switch (m) {
    case PointwiseMode::kRelu: return x > 0 ? x : 0.0;
    case PointwiseMode::kGeluTanh: {
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    }
    case PointwiseMode::kGeluErf: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case PointwiseMode::kSilu: return x / (1.0 + std::exp(-x));
    case PointwiseMode::kSigmoid: return 1.0 / (1.0 + std::exp(-x));
    case PointwiseMode::kTanh: return std::tanh(x);
    default: return x;
  }
}

double apply_binary(PointwiseMode m, double a, double b) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd: return a + b;
    case PointwiseMode::kSub: return a - b;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale: return a * b;
    default: return a;
  }
}

Status run_pointwise(const ResolvedOp& op, PointwiseMode mode, const std::vector<const Values*>& in,
                     const std::vector<std::string>& roles, Values* out) {
  const int64_t n = product(out->dims);
  for (size_t i = 0; i < in.size(); ++i) FUSEBOX_RETURN_IF_ERROR(check_broadcast(op, roles[i], in[i]->dims, out->dims));
  const size_t rank = out->dims.size();
  std::vector<std::vector<int64_t>> bstr;
  for (const Values* v : in)
    bstr.push_back(product(v->dims) == 1 ? std::vector<int64_t>(rank, 0) : broadcast_strides(v->dims, out->dims));
  const bool unary = in.size() == 1;
  parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(rank);
    for (int64_t i = begin; i < end; ++i) {
      int64_t rem = i, off0 = 0, off1 = 0;
      for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
        const int64_t c = rem % out->dims[d];
        rem /= out->dims[d];
        off0 += c * bstr[0][d];
        if (!unary) off1 += c * bstr[1][d];
      }
      const double a = in[0]->data[off0];
      out->data[i] = static_cast<float>(unary ? apply_unary(mode, a) : apply_binary(mode, a, in[1]->data[off1]));
    }
  });
  return Status::Ok();
}

// Integer division rounding toward -inf / +inf (b > 0).
int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }

int64_t attr_or(const std::vector<int64_t>& v, size_t i, int64_t dflt) { return i < v.size() ? v[i] : dflt; }

Status run_conv(const ResolvedOp& op, const ConvFpropAttrs& attrs, const Values& x, const Values& w, Values* y) {
  const size_t rank = x.dims.size();
  if (rank < 3 || rank > 5 || w.dims.size() != rank || y->dims.size() != rank)
    return InvalidArgument(op_where(op) + "x, w and y must have the same rank, 3 to 5; got x " + dims_string(x.dims) +
                           ", w " + dims_string(w.dims) + ", y " + dims_string(y->dims));
  const size_t ns = rank - 2;
  // Spatial dims padded to 3 (D, H, W), leading ones of size 1.
  int64_t in_sp[3] = {1, 1, 1}, f_sp[3] = {1, 1, 1}, out_sp[3] = {1, 1, 1};
  int64_t pad[3] = {0, 0, 0}, str[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  for (size_t i = 0; i < ns; ++i) {
    const size_t j = 3 - ns + i;
    in_sp[j] = x.dims[2 + i];
    f_sp[j] = w.dims[2 + i];
    out_sp[j] = y->dims[2 + i];
    pad[j] = attr_or(attrs.padding, i, 0);
    str[j] = attr_or(attrs.stride, i, 1);
    dil[j] = attr_or(attrs.dilation, i, 1);
    if (str[j] < 1 || dil[j] < 1 || pad[j] < 0)
      return InvalidArgument(op_where(op) + "stride and dilation must be >= 1 and padding >= 0");
    const int64_t expect = (in_sp[j] + 2 * pad[j] - dil[j] * (f_sp[j] - 1) - 1) / str[j] + 1;
    if (expect != out_sp[j])
      return InvalidArgument(op_where(op) + "output 'y' dims " + dims_string(y->dims) + " do not match the " +
                             "convolution of x " + dims_string(x.dims) + " with w " + dims_string(w.dims));
  }
  const int64_t N = x.dims[0], C = x.dims[1], K = w.dims[0], Cg = w.dims[1];
  if (Cg <= 0 || C % Cg != 0 || K % (C / Cg) != 0 || y->dims[0] != N || y->dims[1] != K)
    return InvalidArgument(op_where(op) + "channel mismatch: x " + dims_string(x.dims) + ", w " + dims_string(w.dims) +
                           ", y " + dims_string(y->dims));
  const int64_t groups = C / Cg, Kg = K / groups;
  const int64_t in_plane = in_sp[0] * in_sp[1] * in_sp[2], f_plane = f_sp[0] * f_sp[1] * f_sp[2];
  const int64_t out_plane = out_sp[0] * out_sp[1] * out_sp[2];

  // Per (n, k) plane: loop over filter taps outermost and output columns
  // innermost, so the hot loop is a contiguous, branch-free axpy.
  parallel_for(N * K, static_cast<double>(out_plane) * Cg * f_plane, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(out_plane));
    for (int64_t nk = begin; nk < end; ++nk) {
      const int64_t n = nk / K, k = nk % K, g = k / Kg;
      const float* xn = x.data.data() + (n * C + g * Cg) * in_plane;
      const float* wk = w.data.data() + k * Cg * f_plane;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t c = 0; c < Cg; ++c)
        for (int64_t t = 0; t < f_sp[0]; ++t)
          for (int64_t r = 0; r < f_sp[1]; ++r)
            for (int64_t s = 0; s < f_sp[2]; ++s) {
              const double wv = wk[((c * f_sp[0] + t) * f_sp[1] + r) * f_sp[2] + s];
              // Output columns whose input column ow*stride - pad + s*dil lies inside the row.
              const int64_t shift = s * dil[2] - pad[2];
              const int64_t ow_lo = std::max<int64_t>(0, ceil_div(-shift, str[2]));
              const int64_t ow_hi = std::min<int64_t>(out_sp[2] - 1, floor_div(in_sp[2] - 1 - shift, str[2]));
              if (ow_lo > ow_hi) continue;
              for (int64_t od = 0; od < out_sp[0]; ++od) {
                const int64_t id = od * str[0] - pad[0] + t * dil[0];
                if (id < 0 || id >= in_sp[0]) continue;
                for (int64_t oh = 0; oh < out_sp[1]; ++oh) {
                  const int64_t ih = oh * str[1] - pad[1] + r * dil[1];
                  if (ih < 0 || ih >= in_sp[1]) continue;
                  const float* xrow = xn + c * in_plane + (id * in_sp[1] + ih) * in_sp[2];
                  double* arow = acc.data() + (od * out_sp[1] + oh) * out_sp[2];
                  const int64_t st = str[2];
                  for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) arow[ow] += wv * xrow[ow * st + shift];
                }
              }
            }
      float* yo = y->data.data() + nk * out_plane;
      for (int64_t i = 0; i < out_plane; ++i) yo[i] = static_cast<float>(acc[i]);
    }
  });
  return Status::Ok();
}

Status run_matmul(const ResolvedOp& op, const Values& a, const Values& b, Values* y) {
  const size_t rank = y->dims.size();
  if (rank < 2 || a.dims.size() < 2 || b.dims.size() < 2 || a.dims.size() > rank || b.dims.size() > rank)
    return InvalidArgument(op_where(op) + "matmul needs rank >= 2 with a, b no larger than y; got a " +
                           dims_string(a.dims) + ", b " + dims_string(b.dims) + ", y " + dims_string(y->dims));
  const std::vector<int64_t> ad = left_pad(a.dims, rank), bd = left_pad(b.dims, rank);
  const int64_t M = ad[rank - 2], K = ad[rank - 1], N = bd[rank - 1];
  if (bd[rank - 2] != K || y->dims[rank - 2] != M || y->dims[rank - 1] != N)
    return InvalidArgument(op_where(op) + "shapes do not chain: a " + dims_string(a.dims) + " x b " +
                           dims_string(b.dims) + " -> y " + dims_string(y->dims));
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if ((ad[i] != 1 && ad[i] != y->dims[i]) || (bd[i] != 1 && bd[i] != y->dims[i]))
      return InvalidArgument(op_where(op) + "batch dims do not broadcast: a " + dims_string(a.dims) + ", b " +
                             dims_string(b.dims) + " -> y " + dims_string(y->dims));
    batch *= y->dims[i];
  }
  parallel_for(batch * M, static_cast<double>(K) * N, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(N);
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t bi = bm / M, m = bm % M;
      // Offsets of this batch in a and b (dims of size 1 broadcast).
      int64_t rem = bi, aoff = 0, boff = 0, astride = M * K, bstride = K * N;
      for (int d = static_cast<int>(rank) - 3; d >= 0; --d) {
        const int64_t c = rem % y->dims[d];
        rem /= y->dims[d];
        if (ad[d] != 1) aoff += c * astride;
        if (bd[d] != 1) boff += c * bstride;
        astride *= ad[d];
        bstride *= bd[d];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      const float* arow = a.data.data() + aoff + m * K;
      for (int64_t k = 0; k < K; ++k) {
        const double av = arow[k];
        const float* brow = b.data.data() + boff + k * N;
        for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
      }
      float* yrow = y->data.data() + bm * N;
      for (int64_t n = 0; n < N; ++n) yrow[n] = static_cast<float>(acc[n]);
    }
  });
  return Status::Ok();
}

// ---------------------------------------------------------------- sdpa

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
    return InvalidArgument(op_where(op) + "q, k and v must have rank 4; got q " + dims_string(q.dims) + ", k " +
                           dims_string(k.dims) + ", v " + dims_string(v.dims));
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
    if (role == "dq") return q.dims;
    if (role == "dk") return k.dims;
    if (role == "dv") return v.dims;
    return {};
  };
  auto check = [&](const char* kind, std::string_view role, const std::vector<int64_t>& dims) -> Status {
    const std::string what = op_where(op) + kind + " '" + std::string(role) + "' has dims " + dims_string(dims);
    if (role == "q" || role == "k" || role == "v") return Status::Ok();
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
      return InvalidArgument(op_where(op) + "input '" + role + "' holds " + std::to_string(x) + " for batch " +
                             std::to_string(b) + ": each length must be an integer in [0, " + std::to_string(full) +
                             "]");
    len[b] = static_cast<int64_t>(x);
  }
  return len;
}

// The scores of one sdpa op, s(b, h, i, j) = scale * q_i . k_j [+ bias] [+ alibi],
// and which of them its mask keeps: sdpa_keeps() with each sequence's lengths.
class SdpaScores {
 public:
  SdpaScores(const SdpaOptions& o, const SdpaShape& sh, double scale, const Values& q, const Values& k,
             const Values* bias, std::vector<int64_t> lq, std::vector<int64_t> lkv)
      : o_(o), sh_(sh), scale_(scale), q_(q), k_(k), bias_(bias), lq_(std::move(lq)), lkv_(std::move(lkv)) {
    if (o.alibi) slopes_ = alibi_slopes(sh.Hq);
    if (bias) {  // [B or 1, Hq or 1, Sq, Skv]: stride 0 along a broadcast dim
      bias_h_stride_ = bias->dims[1] == 1 ? 0 : sh.Sq * sh.Skv;
      bias_b_stride_ = bias->dims[0] == 1 ? 0 : bias->dims[1] * sh.Sq * sh.Skv;
    }
  }

  int64_t lq(int64_t b) const { return lq_[b]; }
  int64_t lkv(int64_t b) const { return lkv_[b]; }
  bool keeps(int64_t b, int64_t i, int64_t j) const { return sdpa_keeps(o_, i, j, lq_[b], lkv_[b]); }

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
      s[j] = keeps(b, i, j) ? score(b, h, i, j) : -INFINITY;
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
// gets o = 0 and stats = -inf (the logsumexp of nothing).
void sdpa_forward(const SdpaScores& sc, const SdpaShape& sh, const Values& v, const SdpaDropout& drop,
                  const Fp8Scales* fp8, Values* o, Values* stats, double* amax_s, double* amax_o) {
  const int64_t rows = sh.B * sh.Hq * sh.Sq;
  std::vector<double> row_amax_s(fp8 ? rows : 0), row_amax_o(fp8 ? rows : 0);
  parallel_for(rows, static_cast<double>(sh.Skv) * (sh.D + sh.Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> s(static_cast<size_t>(sh.Skv)), acc(static_cast<size_t>(sh.Dv));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % sh.Sq, bh = row / sh.Sq, h = bh % sh.Hq, b = bh / sh.Hq;
      if (i >= sc.lq(b)) continue;
      const double mx = sc.row(b, h, i, s);
      if (mx == -INFINITY) {
        if (stats) stats->data[row] = -INFINITY;
        continue;
      }
      double sum = 0;
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
  for (int64_t r = 0; r < rows; ++r) *amax_s = std::max(*amax_s, row_amax_s[r]), *amax_o = std::max(*amax_o, row_amax_o[r]);
}

// sdpa_bwd from the given o, do and stats, with P recomputed as exp(s - stats)
// and, with dropout, F = M / (1 - p) (else 1):
//   Di = do_i . o_i,  dP = F * (do @ v^T),  dS = P * (dP - Di),
//   dq = scale * dS @ k,  dk = scale * dS^T @ q,  dv = (P * F)^T @ do,
// dk and dv summed over the query heads that share a kv head. One pass per
// query row (Di, dq), then one per key row (dk, dv), so that each thread owns
// the rows it writes. Padded rows and keys (and keys no row keeps) stay 0.
void sdpa_backward(const SdpaScores& sc, const SdpaShape& sh, double scale, const SdpaDropout& drop,
                   const SdpaTensors& t, Values* dq, Values* dk, Values* dv) {
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
      for (int64_t d = 0; d < sh.Dv; ++d) di += static_cast<double>(dout.data[row * sh.Dv + d]) * o.data[row * sh.Dv + d];
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
}

// One value of a single-element input (an fp8 scale).
double single(const SdpaTensors& t, std::string_view role) { return t[role].data[0]; }

// With dropout, t.in holds "dropout_mask" (checked by the caller).
Status run_sdpa(const ResolvedOp& op, const SdpaOptions& o, const SdpaTensors& t) {
  FUSEBOX_ASSIGN_OR_RETURN(const SdpaShape sh, sdpa_shape(op, t));
  const bool dropout = o.dropout && *o.dropout > 0;
  const SdpaDropout drop = dropout ? SdpaDropout(&t["dropout_mask"], *o.dropout, sh) : SdpaDropout();
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<int64_t> lq, sdpa_lengths(op, o, t, "seq_len_q", sh.B, sh.Sq));
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<int64_t> lkv, sdpa_lengths(op, o, t, "seq_len_kv", sh.B, sh.Skv));
  const double attn_scale = o.attn_scale.value_or(1.0 / std::sqrt(static_cast<double>(sh.D)));
  const bool fp8 = std::holds_alternative<SdpaFp8FwdAttrs>(op.attrs);
  // fp8 q and k are descaled before the product: s = attn_scale * dq * dk * (q @ k^T).
  const double score_scale = fp8 ? attn_scale * single(t, "descale_q") * single(t, "descale_k") : attn_scale;
  const SdpaScores sc(o, sh, score_scale, t["q"], t["k"], o.bias ? &t["bias"] : nullptr, std::move(lq),
                      std::move(lkv));
  auto out = [&](std::string_view role) -> Values* {
    auto it = t.out.find(role);
    return it == t.out.end() ? nullptr : it->second;
  };
  if (std::holds_alternative<SdpaBwdAttrs>(op.attrs)) {
    sdpa_backward(sc, sh, attn_scale, drop, t, out("dq"), out("dk"), out("dv"));
    return Status::Ok();
  }
  Fp8Scales scales;
  if (fp8) {
    scales = {single(t, "descale_s"), single(t, "descale_v"), single(t, "scale_s"), single(t, "scale_o")};
  }
  double amax_s = 0, amax_o = 0;
  sdpa_forward(sc, sh, t["v"], drop, fp8 ? &scales : nullptr, out("o"), out("stats"), &amax_s, &amax_o);
  if (fp8) {
    out("amax_s")->data[0] = static_cast<float>(amax_s);
    out("amax_o")->data[0] = static_cast<float>(amax_o);
  }
  return Status::Ok();
}

// The op's output tensor index for `role`, checked.
Result<int> output_index(const ResolvedGraph& g, const ResolvedOp& op, const std::string& role) {
  auto it = op.outputs.find(role);
  if (it == op.outputs.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size()))
    return InvalidArgument(op_where(op) + "has no valid output '" + role + "'");
  return it->second;
}

Values zeros_like(const ResolvedTensor& t) {
  Values v;
  v.dims = t.dims;
  v.data.assign(static_cast<size_t>(std::max<int64_t>(product(t.dims), 0)), 0.0f);
  return v;
}

Result<ReferenceOutputs> reference_cpu_impl(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  std::vector<std::optional<Values>> values(g.tensors.size());

  // Fetches tensor `idx` for op `op`: computed earlier, a by-value scalar, or a caller input.
  auto get = [&](const ResolvedOp& op, const std::string& role, int idx) -> Result<const Values*> {
    if (idx < 0 || idx >= static_cast<int>(g.tensors.size()))
      return InvalidArgument(op_where(op) + "input '" + role + "' refers to tensor index " + std::to_string(idx) +
                             " outside the graph");
    if (values[idx]) return &*values[idx];
    const ResolvedTensor& t = g.tensors[idx];
    Values v;
    v.dims = t.dims;
    if (t.scalar_value) {
      v.data.assign(static_cast<size_t>(product(t.dims)), static_cast<float>(*t.scalar_value));
    } else {
      auto it = inputs.find(t.name);
      if (it == inputs.end())
        return InvalidArgument(op_where(op) + "input '" + role + "': no values for tensor '" + t.name +
                               "' (neither supplied as an input nor produced by an earlier op)");
      const HostTensor& h = it->second;
      if (h.dims != t.dims)
        return InvalidArgument(op_where(op) + "input tensor '" + t.name + "' has dims " + dims_string(h.dims) +
                               " but the graph says " + dims_string(t.dims));
      if (h.strides.size() != h.dims.size() ||
          h.data.size() < static_cast<size_t>(reference_detail::storage_span(h.dims, h.strides)) *
                              dtype_size_bytes(h.dtype))
        return InvalidArgument(op_where(op) + "input tensor '" + t.name + "': its data is smaller than its dims " +
                               "and strides span");
      v.data = h.to_float_logical();
    }
    values[idx] = std::move(v);
    return &*values[idx];
  };

  for (const ResolvedOp& op : g.ops) {
    if (const SdpaOptions* so = sdpa_options(op.attrs)) {
      SdpaTensors t;
      for (std::string_view r : op_input_roles(op.attrs)) {
        const std::string role(r);
        auto it = op.inputs.find(role);
        if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
        FUSEBOX_ASSIGN_OR_RETURN(t.in[role], get(op, role, it->second));
      }
      if (so->dropout && *so->dropout > 0) {
        // The mask cuDNN drew: its "dropout_mask" output's values, given as an input.
        FUSEBOX_ASSIGN_OR_RETURN(const std::string mask_name, reference_detail::sdpa_dropout_mask_name(g, op, inputs));
        FUSEBOX_ASSIGN_OR_RETURN(t.in["dropout_mask"], get(op, "dropout_mask", g.find_tensor(mask_name)));
      }
      std::map<std::string, std::pair<int, Values>> outs;  // role -> (tensor index, values)
      for (std::string_view r : op_output_roles(op.attrs)) {
        if (r == "dropout_mask") continue;  // cuDNN's RNG dump: an input to the reference, never computed
        FUSEBOX_ASSIGN_OR_RETURN(const int idx, output_index(g, op, std::string(r)));
        outs[std::string(r)] = {idx, zeros_like(g.tensors[idx])};
      }
      for (auto& [role, slot] : outs) t.out[role] = &slot.second;
      if (std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs))  // src/reference/sdpa_fp8_bwd_cpu.cpp
        FUSEBOX_RETURN_IF_ERROR(reference_detail::sdpa_fp8_bwd_cpu(g, op, t.in, t.out));
      else
        FUSEBOX_RETURN_IF_ERROR(run_sdpa(op, *so, t));
      for (auto& [role, slot] : outs) values[slot.first] = std::move(slot.second);
      continue;
    }
    FUSEBOX_ASSIGN_OR_RETURN(const int yidx, output_index(g, op, "y"));
    const ResolvedTensor& yt = g.tensors[yidx];
    Values y = zeros_like(yt);

    std::vector<std::string> roles;
    for (std::string_view r : op_input_roles(op.attrs)) roles.emplace_back(r);
    std::vector<const Values*> in;
    for (const std::string& role : roles) {
      auto it = op.inputs.find(role);
      if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
      FUSEBOX_ASSIGN_OR_RETURN(const Values* v, get(op, role, it->second));
      in.push_back(v);
    }

    Status st;
    if (const auto* conv = std::get_if<ConvFpropAttrs>(&op.attrs)) {
      st = run_conv(op, *conv, *in[0], *in[1], &y);
    } else if (std::holds_alternative<MatmulAttrs>(op.attrs)) {
      st = run_matmul(op, *in[0], *in[1], &y);
    } else if (const auto* pw = std::get_if<PointwiseAttrs>(&op.attrs)) {
      switch (pw->mode) {
        case PointwiseMode::kAdd: case PointwiseMode::kSub: case PointwiseMode::kMul:
        case PointwiseMode::kBiasAdd: case PointwiseMode::kScale:
        case PointwiseMode::kRelu: case PointwiseMode::kGeluTanh: case PointwiseMode::kGeluErf:
        case PointwiseMode::kSilu: case PointwiseMode::kSigmoid: case PointwiseMode::kTanh:
          if (in.size() != (pointwise_is_unary(pw->mode) ? 1u : 2u))
            return Internal(op_where(op) + "unexpected input count");
          st = run_pointwise(op, pw->mode, in, roles, &y);
          break;
        default:
          return NotSupported(op_where(op) + "the CPU reference does not implement pointwise mode " +
                              std::to_string(static_cast<int>(pw->mode)));
      }
    } else {
      return NotSupported(op_where(op) + "the CPU reference does not implement op '" +
                          std::string(op_type_name(op.attrs)) + "'");
    }
    FUSEBOX_RETURN_IF_ERROR(st);
    values[yidx] = std::move(y);
  }

  ReferenceOutputs out;
  for (const ResolvedOp& op : g.ops) {
    for (const auto& [role, idx] : op.outputs) {
      const ResolvedTensor& t = g.tensors[idx];
      if (role == "dropout_mask") continue;  // read from the inputs, not computed
      if (!t.is_virtual && values[idx]) out[t.name] = values[idx]->data;
    }
  }
  return out;
}

}  // namespace

Result<ReferenceOutputs> reference_cpu(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  try {
    return reference_cpu_impl(g, inputs);
  } catch (const std::bad_alloc&) {
    return Internal("[reference_cpu] out of host memory for graph '" + g.name + "'");
  } catch (const std::exception& e) {
    return Internal("[reference_cpu] unexpected exception: " + std::string(e.what()));
  }
}

namespace reference_detail {

void parallel_for(int64_t count, double work_per_item, const std::function<void(int64_t, int64_t)>& fn) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t threads = std::min<int64_t>({static_cast<int64_t>(hw), 16, count});
  if (count * work_per_item < 2e5) threads = 1;
  if (threads <= 1) return fn(0, count);
  std::vector<std::thread> pool;
  const int64_t chunk = (count + threads - 1) / threads;
  int64_t begin = chunk;  // this thread takes the first chunk
  try {
    for (; begin < count; begin += chunk) pool.emplace_back(fn, begin, std::min(count, begin + chunk));
  } catch (const std::exception&) {
    for (auto& t : pool) t.join();
    pool.clear();
    fn(0, count);  // could not start threads: do it all here
    return;
  }
  fn(0, std::min(count, chunk));
  for (auto& t : pool) t.join();
}

}  // namespace reference_detail

}  // namespace fusebox
