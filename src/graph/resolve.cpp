// fusebox: resolve(): validation, topological sort, shape/stride/dtype inference; describe().
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "fusebox/graph.h"
#include "graph/dims_string.h"

namespace fusebox {

namespace {

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxElements = int64_t{1} << 62;
constexpr size_t kMaxRank = 8;


std::string q(const std::string& s) { return "'" + s + "'"; }

std::string op_where(const OpSpec& op) {
  std::string s = "[";
  s.append(op_type_name(op.attrs));
  s.append(" '").append(op.name).append("']");
  return s;
}

std::string join_roles(const std::vector<std::string_view>& roles) {
  std::string s;
  for (auto r : roles) {
    if (!s.empty()) s += ", ";
    s += r;
  }
  return s;
}

std::string roles_str(const OpAttrs& a) { return join_roles(op_input_roles(a)); }

// Checks dims: rank 1..8, each dim in [1, 2^31-1], product <= 2^62.
Status check_dims(const std::string& where, const std::vector<int64_t>& dims) {
  if (dims.empty() || dims.size() > kMaxRank) {
    return InvalidArgument(where + " has rank " + std::to_string(dims.size()) + " " + dims_string(dims) +
                           ": rank must be 1 to 8");
  }
  int64_t n = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 1) {
      return InvalidArgument(where + ": dim " + std::to_string(i) + " is " + std::to_string(dims[i]) +
                             ": dims must be >= 1");
    }
    if (dims[i] > kMaxDim) {
      return InvalidArgument(where + ": dim " + std::to_string(i) + " is " + std::to_string(dims[i]) +
                             ": dims must be <= 2147483647");
    }
    if (__builtin_mul_overflow(n, dims[i], &n) || n > kMaxElements) {
      return InvalidArgument(where + ": dims " + dims_string(dims) + " hold more than 2^62 elements");
    }
  }
  return Status::Ok();
}

// Explicit strides: same rank, >= 0, 0 only on a dim of size 1, span fits in 2^62.
Status check_strides(const std::string& where, const std::vector<int64_t>& dims,
                     const std::vector<int64_t>& strides) {
  if (strides.size() != dims.size()) {
    return InvalidArgument(where + ": strides " + dims_string(strides) + " have rank " +
                           std::to_string(strides.size()) + " but dims " + dims_string(dims) + " have rank " +
                           std::to_string(dims.size()) + ": give one stride per dim");
  }
  int64_t span = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (strides[i] < 0 || (strides[i] == 0 && dims[i] != 1)) {
      return InvalidArgument(where + ": stride " + std::to_string(i) + " is " + std::to_string(strides[i]) +
                             ": strides must be >= 1 (0 is accepted only on a dim of size 1)");
    }
    int64_t term;
    if (__builtin_mul_overflow(dims[i] - 1, strides[i], &term) || __builtin_add_overflow(span, term, &span) ||
        span > kMaxElements) {
      return InvalidArgument(where + ": strides " + dims_string(strides) + " span more than 2^62 elements");
    }
  }
  return Status::Ok();
}

// Strides for a non-scalar tensor from explicit strides and/or layout; `fallback` when neither is given.
Result<std::vector<int64_t>> tensor_strides(const std::string& where, const TensorSpec& t,
                                            const std::vector<int64_t>& dims,
                                            const std::vector<int64_t>& fallback) {
  std::optional<std::vector<int64_t>> from_layout;
  if (!t.layout.empty()) {
    auto r = layout_strides(dims, t.layout);
    if (!r.ok()) return r.status().WithContext(where);
    from_layout = *r;
  }
  if (!t.strides.empty()) {
    FUSEBOX_RETURN_IF_ERROR(check_strides(where, dims, t.strides));
    if (from_layout && *from_layout != t.strides) {
      return InvalidArgument(where + ": strides " + dims_string(t.strides) + " disagree with layout " + q(t.layout) +
                             ", which gives " + dims_string(*from_layout) + ": give one or make them agree");
    }
    return t.strides;
  }
  if (from_layout) return *from_layout;
  return fallback;
}

struct Builder {
  const GraphSpec& spec;
  ResolvedGraph g;
  std::map<std::string, int> tensor_index;  // name -> index in g.tensors
  std::map<std::string, const TensorSpec*> declared;
  std::vector<bool> dims_known;

  std::string tensor_where(const std::string& name) const { return "tensor " + q(name); }
};

// Output dims of a binary broadcast; `into` requires the result to equal a's dims.
Result<std::vector<int64_t>> broadcast(const std::string& where, const std::string& ra, const ResolvedTensor& a,
                                       const std::string& rb, const ResolvedTensor& b, bool into_a) {
  if (a.dims.size() != b.dims.size()) {
    return InvalidArgument(where + " input " + q(rb) + " (" + q(b.name) + ") has rank " +
                           std::to_string(b.dims.size()) + " " + dims_string(b.dims) + " but input " + q(ra) + " (" +
                           q(a.name) + ") has rank " + std::to_string(a.dims.size()) + " " + dims_string(a.dims) +
                           ": pointwise inputs must have equal ranks (write 1 for broadcast dims)");
  }
  std::vector<int64_t> out(a.dims.size());
  for (size_t i = 0; i < a.dims.size(); ++i) {
    int64_t da = a.dims[i], db = b.dims[i];
    bool ok = into_a ? (db == da || db == 1) : (da == db || da == 1 || db == 1);
    if (!ok) {
      if (into_a) {
        return InvalidArgument(where + " input " + q(rb) + " (" + q(b.name) + ") " + dims_string(b.dims) +
                               " does not broadcast into input " + q(ra) + " (" + q(a.name) + ") " +
                               dims_string(a.dims) + ": dim " + std::to_string(i) + " must be " + std::to_string(da) +
                               " or 1");
      }
      return InvalidArgument(where + " inputs " + q(ra) + " (" + q(a.name) + ") " + dims_string(a.dims) + " and " +
                             q(rb) + " (" + q(b.name) + ") " + dims_string(b.dims) + " do not broadcast: dim " +
                             std::to_string(i) + " is " + std::to_string(da) + " vs " + std::to_string(db) +
                             " (dims must be equal or 1)");
    }
    out[i] = std::max(da, db);
  }
  return out;
}

Result<std::vector<int64_t>> infer_conv(const std::string& where, const ResolvedTensor& x, const ResolvedTensor& w,
                                        ConvFpropAttrs& attrs) {
  const size_t rank = x.dims.size();
  if (rank != 4 && rank != 5) {
    return InvalidArgument(where + " input 'x' (" + q(x.name) + ") has rank " + std::to_string(rank) + " " +
                           dims_string(x.dims) + ": conv_fprop takes [N,C,H,W] or [N,C,D,H,W]");
  }
  if (w.dims.size() != rank) {
    return InvalidArgument(where + " input 'w' (" + q(w.name) + ") has rank " + std::to_string(w.dims.size()) +
                           " " + dims_string(w.dims) + " but input 'x' (" + q(x.name) + ") has rank " +
                           std::to_string(rank) + ": the filter must be [K,C,R,S] (or [K,C,T,R,S]) matching x");
  }
  if (w.dims[1] != x.dims[1]) {
    return InvalidArgument(where + " input 'w' (" + q(w.name) + ") has C=" + std::to_string(w.dims[1]) +
                           " but input 'x' (" + q(x.name) + ") has C=" + std::to_string(x.dims[1]) +
                           ": the filter's dim 1 must equal x's channels (grouped convolution is not supported)");
  }
  const size_t sp = rank - 2;
  struct Field {
    const char* name;
    std::vector<int64_t>* v;
    int64_t def;
    int64_t min;
  };
  for (Field f : {Field{"padding", &attrs.padding, 0, 0}, Field{"stride", &attrs.stride, 1, 1},
                  Field{"dilation", &attrs.dilation, 1, 1}}) {
    if (f.v->empty()) f.v->assign(sp, f.def);
    if (f.v->size() != sp) {
      return InvalidArgument(where + " " + f.name + " " + dims_string(*f.v) + " has " + std::to_string(f.v->size()) +
                             " values but the convolution has " + std::to_string(sp) +
                             " spatial dims: give one per spatial dim (or none for the default " +
                             std::to_string(f.def) + ")");
    }
    for (size_t i = 0; i < sp; ++i) {
      int64_t v = (*f.v)[i];
      if (v < f.min || v > kMaxDim) {
        return InvalidArgument(where + " " + f.name + "[" + std::to_string(i) + "] is " + std::to_string(v) + ": " +
                               f.name + " must be in [" + std::to_string(f.min) + ", 2147483647]");
      }
    }
  }
  std::vector<int64_t> out{x.dims[0], w.dims[0]};
  for (size_t i = 0; i < sp; ++i) {
    int64_t in = x.dims[2 + i], f = w.dims[2 + i];
    int64_t p = attrs.padding[i], s = attrs.stride[i], d = attrs.dilation[i];
    int64_t num = in + 2 * p - d * (f - 1) - 1;  // all terms < 2^33: no overflow
    if (num < 0) {
      return InvalidArgument(where + " spatial dim " + std::to_string(i) + ": output size (in + 2*pad - dil*(f-1) - 1)/stride + 1 = (" +
                             std::to_string(in) + " + 2*" + std::to_string(p) + " - " + std::to_string(d) + "*(" +
                             std::to_string(f) + "-1) - 1)/" + std::to_string(s) +
                             " + 1 is < 1: the dilated filter of 'w' (" + q(w.name) + ") is larger than the padded input 'x' (" +
                             q(x.name) + ")");
    }
    out.push_back(num / s + 1);
  }
  return out;
}

Result<std::vector<int64_t>> infer_matmul(const std::string& where, const ResolvedTensor& a,
                                          const ResolvedTensor& b) {
  const size_t rank = a.dims.size();
  if (rank < 3) {
    return InvalidArgument(where + " input 'a' (" + q(a.name) + ") has rank " + std::to_string(rank) + " " +
                           dims_string(a.dims) + ": matmul takes [batch..., M, K] with rank >= 3 (write [1, M, K] for a plain GEMM)");
  }
  if (b.dims.size() != rank) {
    return InvalidArgument(where + " input 'b' (" + q(b.name) + ") has rank " + std::to_string(b.dims.size()) + " " +
                           dims_string(b.dims) + " but input 'a' (" + q(a.name) + ") has rank " + std::to_string(rank) +
                           ": both must have the same rank");
  }
  if (a.dims[rank - 1] != b.dims[rank - 2]) {
    return InvalidArgument(where + " input 'a' (" + q(a.name) + ") " + dims_string(a.dims) + " has K=" +
                           std::to_string(a.dims[rank - 1]) + " but input 'b' (" + q(b.name) + ") " +
                           dims_string(b.dims) + " has K=" + std::to_string(b.dims[rank - 2]) +
                           ": a's last dim must equal b's second-to-last");
  }
  std::vector<int64_t> out;
  for (size_t i = 0; i + 2 < rank; ++i) {
    int64_t da = a.dims[i], db = b.dims[i];
    if (da != db && da != 1 && db != 1) {
      return InvalidArgument(where + " batch dim " + std::to_string(i) + " is " + std::to_string(da) + " in 'a' (" +
                             q(a.name) + ") but " + std::to_string(db) + " in 'b' (" + q(b.name) +
                             "): batch dims must be equal or 1 (broadcast)");
    }
    out.push_back(std::max(da, db));
  }
  out.push_back(a.dims[rank - 2]);
  out.push_back(b.dims[rank - 1]);
  return out;
}

// Checks one sdpa input: rank 4, a graph input, the head dim contiguous.
Status check_sdpa_tensor(const std::string& where, const char* role, const ResolvedTensor& t, const char* shape,
                         const std::string& op_type) {
  const std::string in = where + " input '" + role + "' (" + q(t.name) + ")";
  if (t.dims.size() != 4) {
    return InvalidArgument(in + " has rank " + std::to_string(t.dims.size()) + " " + dims_string(t.dims) + ": " +
                           op_type + " takes rank-4 " + shape +
                           " (logical order; use layout \"bshd\" or strides for [B, S, H, D] memory)");
  }
  if (!t.is_input) {
    return InvalidArgument(in + " is produced by another op: " + op_type + " reads its inputs from memory, so '" +
                           role + "' must be a graph input");
  }
  if (t.strides.size() != 4 || t.strides[3] != 1) {
    return InvalidArgument(in + " has strides " + dims_string(t.strides) +
                           ": the last dim must be contiguous (stride 1), e.g. layout \"bhsd\" or \"bshd\"");
  }
  return Status::Ok();
}

Status check_dtype_in(const std::string& what, DType got, std::initializer_list<DType> allowed, const std::string& why) {
  for (DType d : allowed)
    if (d == got) return Status::Ok();
  return InvalidArgument(what + " has dtype " + std::string(dtype_name(got)) + ": " + why);
}

struct SdpaDims {
  int64_t B = 0, Hq = 0, Sq = 0, D = 0, Hk = 0, Skv = 0, Dv = 0;
};

// Validates q/k/v (shared by every sdpa op), the options and the optional
// inputs; fills attn_scale, right_bound (causal) and the random ranges of
// sequence-length and dropout inputs.
Result<SdpaDims> infer_sdpa(const std::string& where, ResolvedOp& op, std::vector<ResolvedTensor>& tensors) {
  const std::string type(op_type_name(op.attrs));
  const bool fp8_bwd = std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs);
  const bool fp8 = std::holds_alternative<SdpaFp8FwdAttrs>(op.attrs) || fp8_bwd;
  const bool bwd = std::holds_alternative<SdpaBwdAttrs>(op.attrs) || fp8_bwd;
  SdpaOptions& o = *sdpa_options(op.attrs);
  auto in = [&](const char* role) -> ResolvedTensor& { return tensors[op.inputs.at(role)]; };
  const ResolvedTensor& qt = in("q");
  const ResolvedTensor& k = in("k");
  const ResolvedTensor& v = in("v");
  struct Named {
    const char* role;
    const ResolvedTensor* t;
    const char* shape;
  };
  for (Named n : {Named{"q", &qt, "[B, Hq, Sq, D]"}, Named{"k", &k, "[B, Hk, Skv, D]"},
                  Named{"v", &v, "[B, Hk, Skv, Dv]"}}) {
    FUSEBOX_RETURN_IF_ERROR(check_sdpa_tensor(where, n.role, *n.t, n.shape, type));
    const std::string in_where = where + " input '" + n.role + "' (" + q(n.t->name) + ")";
    if (fp8) {
      FUSEBOX_RETURN_IF_ERROR(check_dtype_in(in_where, n.t->dtype, {DType::kFP8E4M3},
                                             type + " takes fp8_e4m3 q, k and v (cuDNN 9.19 on Hopper)"));
    } else {
      FUSEBOX_RETURN_IF_ERROR(check_dtype_in(in_where, n.t->dtype, {DType::kBF16, DType::kFP16},
                                             type + " takes bf16 or fp16 q, k and v (sdpa_fp8_fwd takes fp8)"));
    }
    if (n.t->dtype != qt.dtype) {
      return InvalidArgument(in_where + " has dtype " + std::string(dtype_name(n.t->dtype)) + " but 'q' (" +
                             q(qt.name) + ") has " + std::string(dtype_name(qt.dtype)) +
                             ": q, k and v must share one dtype");
    }
  }
  SdpaDims d;
  d.B = qt.dims[0], d.Hq = qt.dims[1], d.Sq = qt.dims[2], d.D = qt.dims[3];
  d.Hk = k.dims[1], d.Skv = k.dims[2], d.Dv = v.dims[3];
  auto kv_mismatch = [&](const char* role, const ResolvedTensor& t, size_t dim, const char* what, int64_t want,
                         const char* want_from) {
    return InvalidArgument(where + " input '" + role + "' (" + q(t.name) + ") " + dims_string(t.dims) + " has " + what +
                           "=" + std::to_string(t.dims[dim]) + " but " + want_from + " has " + std::to_string(want) +
                           ": " + what + " must match");
  };
  if (k.dims[0] != d.B) return kv_mismatch("k", k, 0, "B", d.B, "q");
  if (v.dims[0] != d.B) return kv_mismatch("v", v, 0, "B", d.B, "q");
  if (k.dims[3] != d.D) {
    return InvalidArgument(where + " input 'k' (" + q(k.name) + ") " + dims_string(k.dims) + " has head dim D=" +
                           std::to_string(k.dims[3]) + " but 'q' (" + q(qt.name) + ") " + dims_string(qt.dims) +
                           " has D=" + std::to_string(d.D) + ": q and k must have the same head dim");
  }
  if (v.dims[1] != d.Hk) return kv_mismatch("v", v, 1, "Hk", d.Hk, "k");
  if (v.dims[2] != d.Skv) return kv_mismatch("v", v, 2, "Skv", d.Skv, "k");
  if (d.Hq % d.Hk != 0) {
    return InvalidArgument(where + " 'q' (" + q(qt.name) + ") has Hq=" + std::to_string(d.Hq) + " heads but 'k' (" +
                           q(k.name) + ") has Hk=" + std::to_string(d.Hk) +
                           ": Hq must be a multiple of Hk (Hk == Hq: multi-head, Hk == 1: multi-query, "
                           "otherwise grouped-query attention)");
  }
  const int64_t multiple = fp8 ? 16 : 8;
  for (auto [name, val] : {std::pair<const char*, int64_t>{"D (q/k head dim)", d.D}, {"Dv (v head dim)", d.Dv}}) {
    if (val > 256 || val % multiple != 0) {
      return InvalidArgument(where + " " + name + " is " + std::to_string(val) + ": cuDNN 9.19 " +
                             (fp8 ? "FP8 SDPA needs head dims <= 256 and a multiple of 16"
                                  : "SDPA needs head dims <= 256 and a multiple of 8 (e.g. 64, 128)"));
    }
  }

  // --- options
  if (o.attn_scale) {
    if (!std::isfinite(*o.attn_scale)) {
      return InvalidArgument(where + " attn_scale is not finite: give a finite number (default 1/sqrt(D))");
    }
  } else {
    o.attn_scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  }
  if (o.right_bound && *o.right_bound < 0) {
    return InvalidArgument(where + " right_bound is " + std::to_string(*o.right_bound) +
                           ": give a bound >= 0 (0: causal; key j is kept while j <= i + right_bound)");
  }
  if (o.causal && o.right_bound && *o.right_bound != 0) {
    return InvalidArgument(where + " causal is set with right_bound " + std::to_string(*o.right_bound) +
                           ": causal means right_bound 0; give one or the other");
  }
  if (o.causal) o.right_bound = 0;
  if (o.left_bound && *o.left_bound < 1) {
    return InvalidArgument(where + " left_bound (sliding window) is " + std::to_string(*o.left_bound) +
                           ": give a window of at least 1 key");
  }
  if (o.dropout && !(*o.dropout >= 0.0 && *o.dropout < 1.0)) {
    return InvalidArgument(where + " dropout is " + std::to_string(*o.dropout) +
                           ": give a probability in [0, 1) (0: no dropout)");
  }
  if (o.dump_dropout_mask && !o.dropout) {
    return InvalidArgument(where + " has a 'dropout_mask' output but no dropout: set \"dropout\" (a probability) "
                           "or remove the output");
  }
  if (o.alibi && !(o.right_bound && *o.right_bound == 0)) {
    return InvalidArgument(where + " alibi needs a causal mask in cuDNN 9.19: set \"causal\": true with \"alibi\"");
  }

  // --- optional inputs
  auto check_small = [&](const char* role, DType want, const std::vector<int64_t>& dims,
                         const std::string& what) -> Status {
    ResolvedTensor& t = in(role);
    const std::string w = where + " input '" + role + "' (" + q(t.name) + ")";
    if (t.scalar_value || !t.is_input) {
      return InvalidArgument(w + " must be a graph input tensor in memory: " + what);
    }
    if (t.dims != dims) {
      return InvalidArgument(w + " has dims " + dims_string(t.dims) + ": " + what + " has dims " + dims_string(dims));
    }
    if (t.dtype != want) {
      return InvalidArgument(w + " has dtype " + std::string(dtype_name(t.dtype)) + ": " + what + " is " +
                             std::string(dtype_name(want)));
    }
    return Status::Ok();
  };
  if (o.padding) {
    FUSEBOX_RETURN_IF_ERROR(check_small("seq_len_q", DType::kInt32, {d.B, 1, 1, 1},
                                        "seq_len_q holds each sequence's query length"));
    FUSEBOX_RETURN_IF_ERROR(check_small("seq_len_kv", DType::kInt32, {d.B, 1, 1, 1},
                                        "seq_len_kv holds each sequence's key/value length"));
    for (auto [role, full] : {std::pair<const char*, int64_t>{"seq_len_q", d.Sq}, {"seq_len_kv", d.Skv}}) {
      ResolvedTensor& t = in(role);
      t.random_lo = 1;
      t.random_hi = static_cast<double>(full);
      for (double x : t.values) {
        if (x < 0 || x > static_cast<double>(full) || x != std::floor(x)) {
          std::ostringstream v;
          v << x;
          return InvalidArgument(where + " input '" + role + "' (" + q(t.name) + ") holds the value " + v.str() +
                                 ": each length must be an integer in [0, " +
                                 std::to_string(full) + "]");
        }
      }
    }
  }
  if (o.bias) {
    ResolvedTensor& t = in("bias");
    const std::string w = where + " input 'bias' (" + q(t.name) + ")";
    if (!t.is_input || t.dims.size() != 4 || (t.dims[0] != 1 && t.dims[0] != d.B) ||
        (t.dims[1] != 1 && t.dims[1] != d.Hq) || t.dims[2] != d.Sq || t.dims[3] != d.Skv) {
      return InvalidArgument(w + " has dims " + dims_string(t.dims) + ": the bias is a graph input [B or 1, Hq or 1, " +
                             "Sq, Skv] = [" + std::to_string(d.B) + " or 1, " + std::to_string(d.Hq) + " or 1, " +
                             std::to_string(d.Sq) + ", " + std::to_string(d.Skv) + "]");
    }
    if (fp8) return InvalidArgument(w + ": cuDNN 9.19 FP8 SDPA takes no bias");
    FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {DType::kBF16, DType::kFP16, DType::kFP32},
                                           "the bias is bf16, fp16 or fp32"));
    if (t.strides[3] != 1) return InvalidArgument(w + ": its last dim must be contiguous (stride 1)");
  }
  if (o.dropout) {
    for (const char* role : {"seed", "offset"}) {
      FUSEBOX_RETURN_IF_ERROR(check_small(role, DType::kInt64, {1, 1, 1, 1},
                                          std::string("the dropout ") + role + " (Philox RNG)"));
      in(role).random_lo = 0;
      in(role).random_hi = 2147483647.0;
    }
  }
  if (fp8) {
    const std::vector<const char*> scales =
        fp8_bwd ? std::vector<const char*>{"descale_q", "descale_k", "descale_v", "descale_o", "descale_do",
                                           "descale_s", "descale_dp", "scale_s", "scale_dq", "scale_dk", "scale_dv",
                                           "scale_dp"}
                : std::vector<const char*>{"descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"};
    for (const char* role : scales) {
      FUSEBOX_RETURN_IF_ERROR(check_small(role, DType::kFP32, {1, 1, 1, 1},
                                          std::string("the FP8 scale factor ") + role + " (one fp32 value)"));
      ResolvedTensor& t = in(role);
      // Random scales near 1 keep the fp8 values in range; fixed values win.
      t.random_lo = 0.5;
      t.random_hi = 2.0;
    }
  }
  if (bwd) {
    const std::vector<int64_t> o_dims = {d.B, d.Hq, d.Sq, d.Dv}, stats_dims = {d.B, d.Hq, d.Sq, 1};
    for (const char* role : {"o", "do"}) {
      const ResolvedTensor& t = in(role);
      FUSEBOX_RETURN_IF_ERROR(check_sdpa_tensor(where, role, t, "[B, Hq, Sq, Dv]", type));
      if (t.dims != o_dims) {
        return InvalidArgument(where + " input '" + role + "' (" + q(t.name) + ") has dims " + dims_string(t.dims) +
                               ": " + type + " needs [B, Hq, Sq, Dv] = " + dims_string(o_dims) + " from q and v");
      }
      const std::string w = where + " input '" + role + "' (" + q(t.name) + ")";
      if (fp8_bwd && std::string(role) == "do") {
        FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {DType::kFP8E4M3, DType::kFP8E5M2},
                                               "sdpa_fp8_bwd takes do in fp8_e4m3 or fp8_e5m2"));
      } else {
        FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, {qt.dtype}, "it must have q's dtype"));
      }
    }
    const ResolvedTensor& st = in("stats");
    if (!st.is_input || st.dims != stats_dims || st.dtype != DType::kFP32) {
      return InvalidArgument(where + " input 'stats' (" + q(st.name) + ") is " + dims_string(st.dims) + " " +
                             std::string(dtype_name(st.dtype)) + ": " + type + " needs the forward's softmax stats, " +
                             "an fp32 graph input " + dims_string(stats_dims));
    }
  }
  return d;
}

}  // namespace

Result<ResolvedGraph> resolve(const GraphSpec& spec) {
  ResolvedGraph g;
  g.name = spec.name;
  g.io_dtype = spec.io_dtype;
  g.intermediate_dtype = spec.intermediate_dtype;
  g.compute_dtype = spec.compute_dtype;

  // --- names
  std::map<std::string, size_t> declared;  // tensor name -> index in spec.tensors
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& t = spec.tensors[i];
    if (t.name.empty()) return InvalidArgument("tensors[" + std::to_string(i) + "]: tensor name is empty");
    if (!declared.emplace(t.name, i).second) {
      return InvalidArgument("tensor " + q(t.name) + " is declared twice: tensor names must be unique");
    }
  }
  std::set<std::string> op_names;
  std::map<std::string, size_t> producer;  // tensor name -> op index
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& op = spec.ops[i];
    if (op.name.empty()) {
      return InvalidArgument("ops[" + std::to_string(i) + "] (" + std::string(op_type_name(op.attrs)) +
                             "): op name is empty: every op needs a unique name");
    }
    if (!op_names.insert(op.name).second) {
      return InvalidArgument(op_where(op) + " op name " + q(op.name) + " is used twice: op names must be unique");
    }
    const std::string where = op_where(op);
    auto roles = op_input_roles(op.attrs);
    for (auto r : roles) {
      auto it = op.inputs.find(std::string(r));
      if (it == op.inputs.end()) {
        return InvalidArgument(where + " missing input " + q(std::string(r)) + ": " +
                               std::string(op_type_name(op.attrs)) + " takes inputs " + roles_str(op.attrs));
      }
      if (it->second.empty()) return InvalidArgument(where + " input " + q(std::string(r)) + " names no tensor");
    }
    for (const auto& [role, name] : op.inputs) {
      if (std::find(roles.begin(), roles.end(), role) == roles.end()) {
        return InvalidArgument(where + " unknown input role " + q(role) + ": " +
                               std::string(op_type_name(op.attrs)) + " takes inputs " + roles_str(op.attrs));
      }
    }
    const auto out_roles = op_output_roles(op.attrs);
    bool roles_ok = op.outputs.size() == out_roles.size();
    for (auto r : out_roles) roles_ok = roles_ok && op.outputs.count(std::string(r));
    if (!roles_ok) {
      std::string got;
      for (const auto& [role, name] : op.outputs) {
        if (!got.empty()) got += ", ";
        got += role;
      }
      std::string want = out_roles.size() == 1 ? "exactly one role '" + std::string(out_roles[0]) + "'"
                                               : "exactly the roles " + join_roles(out_roles);
      if (std::holds_alternative<SdpaFwdAttrs>(op.attrs) || std::holds_alternative<SdpaFp8FwdAttrs>(op.attrs)) {
        const bool stats = std::holds_alternative<SdpaFwdAttrs>(op.attrs)
                               ? std::get<SdpaFwdAttrs>(op.attrs).generate_stats
                               : std::get<SdpaFp8FwdAttrs>(op.attrs).generate_stats;
        want += stats ? " (generate_stats is on: give 'stats' too)"
                      : " (generate_stats is off; a 'stats' output turns it on)";
      }
      return InvalidArgument(where + " outputs must be " + want + " (got: " + (got.empty() ? "none" : got) + ")");
    }
    for (auto r : out_roles) {
      const std::string role(r);
      const std::string& y = op.outputs.at(role);
      if (y.empty()) return InvalidArgument(where + " output " + q(role) + " names no tensor");
      auto [it, fresh] = producer.emplace(y, i);
      if (!fresh) {
        return InvalidArgument(where + " output " + q(role) + ": tensor " + q(y) + " is also produced by " +
                               op_where(spec.ops[it->second]) + ": a tensor can be produced by one op only");
      }
      auto d = declared.find(y);
      if (d != declared.end() && spec.tensors[d->second].scalar_value) {
        return InvalidArgument(where + " output " + q(role) + ": tensor " + q(y) +
                               " is a by-value scalar: scalars can only be inputs");
      }
      if (sdpa_options(op.attrs) && (d == declared.end() || spec.tensors[d->second].is_virtual)) {
        return InvalidArgument(where + " output " + q(role) + ": tensor " + q(y) +
                               (d == declared.end() ? " is not declared" : " is virtual") + ": " +
                               std::string(op_type_name(op.attrs)) +
                               " writes its outputs to memory, so declare it in 'tensors' as a graph "
                               "output (not virtual)");
      }
    }
  }
  for (size_t i = 0; i < spec.ops.size(); ++i) {
    const auto& op = spec.ops[i];
    for (const auto& [role, name] : op.inputs) {
      if (!declared.count(name) && !producer.count(name)) {
        return InvalidArgument(op_where(op) + " input " + q(role) + ": tensor " + q(name) +
                               " is neither declared in 'tensors' nor produced by an op");
      }
    }
  }

  // --- topological order, stable: always take the earliest declared op that is ready
  std::vector<size_t> order;
  {
    std::vector<bool> done(spec.ops.size(), false);
    std::set<std::string> available;
    for (const auto& t : spec.tensors)
      if (!producer.count(t.name)) available.insert(t.name);
    while (order.size() < spec.ops.size()) {
      bool progressed = false;
      for (size_t i = 0; i < spec.ops.size(); ++i) {
        if (done[i]) continue;
        bool ready = true;
        for (const auto& [role, name] : spec.ops[i].inputs) ready = ready && available.count(name);
        if (!ready) continue;
        done[i] = true;
        order.push_back(i);
        for (const auto& [role, name] : spec.ops[i].outputs) available.insert(name);
        progressed = true;
        break;
      }
      if (!progressed) {
        std::string stuck;
        for (size_t i = 0; i < spec.ops.size(); ++i)
          if (!done[i]) {
            if (!stuck.empty()) stuck += ", ";
            stuck += op_where(spec.ops[i]);
          }
        return InvalidArgument("the ops form a cycle: " + stuck +
                               " each wait (directly or not) for their own output");
      }
    }
  }

  // --- tensors: declared ones first (declared order), then undeclared op outputs (topological order)
  std::map<std::string, int> index;
  std::vector<const TensorSpec*> tspec;  // nullptr: undeclared op output
  for (const auto& t : spec.tensors) {
    ResolvedTensor r;
    r.name = t.name;
    index[t.name] = static_cast<int>(g.tensors.size());
    g.tensors.push_back(r);
    tspec.push_back(&t);
  }
  for (size_t i : order) {
    for (auto role : op_output_roles(spec.ops[i].attrs)) {
      const std::string& y = spec.ops[i].outputs.at(std::string(role));
      if (index.count(y)) continue;
      ResolvedTensor r;
      r.name = y;
      index[y] = static_cast<int>(g.tensors.size());
      g.tensors.push_back(r);
      tspec.push_back(nullptr);
    }
  }
  std::vector<bool> known(g.tensors.size(), false);
  std::set<std::string> used;
  for (const auto& op : spec.ops)
    for (const auto& [role, name] : op.inputs) used.insert(name);

  // inputs and scalars
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    ResolvedTensor& r = g.tensors[i];
    const std::string where = "tensor " + q(t.name);
    if (producer.count(t.name)) {
      if (!t.values.empty()) {
        return InvalidArgument(where + " has 'values' but is produced by an op: only graph inputs take fixed values");
      }
      continue;
    }
    if (!used.count(t.name)) {
      return InvalidArgument(where + " is declared but no op uses it or produces it: remove it or connect it");
    }
    if (t.scalar_value) {
      if (t.is_virtual) return InvalidArgument(where + " is a by-value scalar and cannot be virtual");
      r.scalar_value = t.scalar_value;
      r.dtype = t.dtype.value_or(DType::kFP32);
      if (!t.dims.empty()) {
        FUSEBOX_RETURN_IF_ERROR(check_dims(where, t.dims));
        for (int64_t d : t.dims)
          if (d != 1) {
            return InvalidArgument(where + " is a by-value scalar with dims " + dims_string(t.dims) +
                                   ": a scalar's dims must all be 1 (or be omitted)");
          }
        r.dims = t.dims;
        r.strides.assign(r.dims.size(), 1);
        known[i] = true;
      }
      continue;
    }
    if (t.is_virtual) {
      return InvalidArgument(where + " is virtual but no op produces it: an input must be non-virtual");
    }
    if (t.dims.empty()) {
      return InvalidArgument(where + " is a graph input (no op produces it) but has no dims: give its dims");
    }
    FUSEBOX_RETURN_IF_ERROR(check_dims(where, t.dims));
    r.dims = t.dims;
    auto dense = layout_strides(t.dims, "packed");
    if (!dense.ok()) return dense.status().WithContext(where);
    FUSEBOX_ASSIGN_OR_RETURN(r.strides, tensor_strides(where, t, t.dims, *dense));
    r.dtype = t.dtype.value_or(spec.io_dtype);
    r.is_input = true;
    if (!t.values.empty()) {
      if (static_cast<int64_t>(t.values.size()) != r.element_count()) {
        return InvalidArgument(where + " has " + std::to_string(t.values.size()) + " values but dims " +
                               dims_string(t.dims) + " hold " + std::to_string(r.element_count()) +
                               ": give one value per element (logical row-major order)");
      }
      for (double x : t.values) {
        if (!std::isfinite(x)) return InvalidArgument(where + " has a non-finite value: values must be finite");
      }
      r.values = t.values;
    }
    known[i] = true;
  }

  // ops in topological order
  for (size_t oi : order) {
    const OpSpec& op = spec.ops[oi];
    const std::string where = op_where(op);
    ResolvedOp rop;
    rop.name = op.name;
    rop.attrs = op.attrs;
    rop.compute_dtype = op.compute_dtype.value_or(spec.compute_dtype);
    for (const auto& [role, name] : op.inputs) rop.inputs[role] = index.at(name);
    for (const auto& [role, name] : op.outputs) rop.outputs[role] = index.at(name);

    auto roles = op_input_roles(op.attrs);
    // by-value scalars without dims take the rank of the op's other input
    for (auto role : roles) {
      int ti = rop.inputs.at(std::string(role));
      ResolvedTensor& t = g.tensors[ti];
      if (!t.scalar_value) continue;
      if (!std::holds_alternative<PointwiseAttrs>(op.attrs)) {
        return InvalidArgument(where + " input " + q(std::string(role)) + ": " + q(t.name) +
                               " is a by-value scalar; " + std::string(op_type_name(op.attrs)) +
                               " needs a tensor (scalars feed pointwise ops)");
      }
      if (known[ti]) continue;
      size_t rank = 0;
      for (auto other : roles) {
        int oi2 = rop.inputs.at(std::string(other));
        if (oi2 != ti && known[oi2]) rank = g.tensors[oi2].dims.size();
      }
      if (rank == 0) rank = 1;
      t.dims.assign(rank, 1);
      t.strides.assign(rank, 1);
      known[ti] = true;
    }
    auto in = [&](std::string_view role) -> const ResolvedTensor& {
      return g.tensors[rop.inputs.at(std::string(role))];
    };

    // Sets an output's dims, strides (declared, else `dense`) and dtype (declared, else `dflt`).
    auto finish_output = [&](const std::string& role, const std::vector<int64_t>& dims,
                             const std::vector<int64_t>& dense, DType dflt) -> Status {
      const int oi = rop.outputs.at(role);
      ResolvedTensor& y = g.tensors[oi];
      const TensorSpec* ys = tspec[oi];
      const std::string ywhere = where + " output " + q(role) + " (" + q(y.name) + ")";
      FUSEBOX_RETURN_IF_ERROR(check_dims(ywhere, dims));
      y.dims = dims;
      if (ys) {
        if (!ys->dims.empty() && ys->dims != dims) {
          return InvalidArgument(ywhere + " is declared with dims " + dims_string(ys->dims) + " but the op produces " +
                                 dims_string(dims) + ": fix the dims or omit them to infer");
        }
        FUSEBOX_ASSIGN_OR_RETURN(y.strides, tensor_strides(ywhere, *ys, dims, dense));
        y.is_virtual = ys->is_virtual;
        y.dtype = ys->dtype.value_or(ys->is_virtual ? spec.intermediate_dtype : dflt);
      } else {
        y.strides = dense;
        y.is_virtual = true;
        y.dtype = spec.intermediate_dtype;
      }
      y.is_output = !y.is_virtual;
      known[oi] = true;
      return Status::Ok();
    };

    if (sdpa_options(rop.attrs)) {
      FUSEBOX_ASSIGN_OR_RETURN(SdpaDims d, infer_sdpa(where, rop, g.tensors));
      const std::vector<int64_t> o_dims = {d.B, d.Hq, d.Sq, d.Dv}, stats_dims = {d.B, d.Hq, d.Sq, 1};
      auto out = [&](const char* role) -> const ResolvedTensor& { return g.tensors[rop.outputs.at(role)]; };
      auto check_out = [&](const char* role, std::initializer_list<DType> allowed, const std::string& why) -> Status {
        const ResolvedTensor& t = out(role);
        const std::string w = where + " output '" + role + "' (" + q(t.name) + ")";
        FUSEBOX_RETURN_IF_ERROR(check_dtype_in(w, t.dtype, allowed, why));
        if (t.dims.size() == 4 && t.strides[3] != 1) {
          return InvalidArgument(w + " has strides " + dims_string(t.strides) +
                                 ": the last dim must be contiguous (stride 1)");
        }
        return Status::Ok();
      };
      auto amax_out = [&](std::initializer_list<const char*> roles) -> Status {
        for (const char* role : roles) {
          FUSEBOX_RETURN_IF_ERROR(finish_output(role, {1, 1, 1, 1}, {1, 1, 1, 1}, DType::kFP32));
          FUSEBOX_RETURN_IF_ERROR(check_out(role, {DType::kFP32}, "amax outputs are fp32 [1,1,1,1]"));
        }
        return Status::Ok();
      };
      // dq, dk, dv shaped like q, k, v, in their stride order, q's dtype by default.
      auto gradients_out = [&](std::initializer_list<DType> allowed, const std::string& why) -> Status {
        for (auto [grad, like_role] : {std::pair<const char*, const char*>{"dq", "q"}, {"dk", "k"}, {"dv", "v"}}) {
          const ResolvedTensor& like = in(like_role);
          FUSEBOX_RETURN_IF_ERROR(
              finish_output(grad, like.dims, dense_strides_like(like.dims, like.strides), in("q").dtype));
          FUSEBOX_RETURN_IF_ERROR(check_out(grad, allowed, why));
        }
        return Status::Ok();
      };
      auto stats_out = [&]() -> Status {
        FUSEBOX_RETURN_IF_ERROR(finish_output("stats", stats_dims, dense_strides_like(stats_dims, {}), DType::kFP32));
        return check_out("stats", {DType::kFP32}, "cuDNN writes stats in fp32 only");
      };
      if (sdpa_options(rop.attrs)->dump_dropout_mask) {
        const std::vector<int64_t> mask_dims = {d.B, d.Hq, d.Sq, d.Skv};
        FUSEBOX_RETURN_IF_ERROR(
            finish_output("dropout_mask", mask_dims, dense_strides_like(mask_dims, {}), DType::kFP32));
        FUSEBOX_RETURN_IF_ERROR(check_out("dropout_mask", {DType::kFP32}, "the dropout mask dump is fp32"));
      }
      if (auto* f = std::get_if<SdpaFwdAttrs>(&rop.attrs)) {
        // o like q's stride order (bshd q gives bshd o); stats dense [B, H, S, 1].
        FUSEBOX_RETURN_IF_ERROR(finish_output("o", o_dims, dense_strides_like(o_dims, in("q").strides), in("q").dtype));
        FUSEBOX_RETURN_IF_ERROR(check_out("o", {DType::kBF16, DType::kFP16}, "sdpa_fwd writes o in bf16 or fp16"));
        if (f->generate_stats) FUSEBOX_RETURN_IF_ERROR(stats_out());
      } else if (auto* f8 = std::get_if<SdpaFp8FwdAttrs>(&rop.attrs)) {
        FUSEBOX_RETURN_IF_ERROR(finish_output("o", o_dims, dense_strides_like(o_dims, in("q").strides), in("q").dtype));
        FUSEBOX_RETURN_IF_ERROR(check_out("o", {DType::kFP8E4M3},
                                          "sdpa_fp8_fwd writes o in fp8_e4m3 on Hopper (cuDNN 9.19)"));
        FUSEBOX_RETURN_IF_ERROR(amax_out({"amax_s", "amax_o"}));
        if (f8->generate_stats) FUSEBOX_RETURN_IF_ERROR(stats_out());
      } else if (std::holds_alternative<SdpaFp8BwdAttrs>(rop.attrs)) {
        FUSEBOX_RETURN_IF_ERROR(gradients_out({DType::kFP8E4M3, DType::kFP8E5M2},
                                              "sdpa_fp8_bwd writes fp8 gradients on Hopper (cuDNN 9.19)"));
        FUSEBOX_RETURN_IF_ERROR(amax_out({"amax_dq", "amax_dk", "amax_dv", "amax_dp"}));
      } else {
        FUSEBOX_RETURN_IF_ERROR(
            gradients_out({DType::kBF16, DType::kFP16}, "sdpa_bwd writes gradients in bf16 or fp16"));
      }
      g.ops.push_back(std::move(rop));
      continue;
    }

    std::vector<int64_t> ydims;
    if (auto* conv = std::get_if<ConvFpropAttrs>(&rop.attrs)) {
      FUSEBOX_ASSIGN_OR_RETURN(ydims, infer_conv(where, in("x"), in("w"), *conv));
    } else if (std::holds_alternative<MatmulAttrs>(rop.attrs)) {
      FUSEBOX_ASSIGN_OR_RETURN(ydims, infer_matmul(where, in("a"), in("b")));
    } else {
      PointwiseMode mode = std::get<PointwiseAttrs>(rop.attrs).mode;
      if (pointwise_is_unary(mode)) {
        ydims = in("x").dims;
      } else {
        const std::string r0(roles[0]), r1(roles[1]);
        bool into = mode == PointwiseMode::kBiasAdd || mode == PointwiseMode::kScale;
        FUSEBOX_ASSIGN_OR_RETURN(ydims, broadcast(where, r0, in(r0), r1, in(r1), into));
      }
    }
    // strides like the op's first non-scalar input
    std::vector<int64_t> like;
    for (auto role : roles) {
      const auto& t = in(role);
      if (!t.scalar_value) {
        like = t.strides;
        break;
      }
    }
    FUSEBOX_RETURN_IF_ERROR(finish_output("y", ydims, dense_strides_like(ydims, like), spec.io_dtype));
    g.ops.push_back(std::move(rop));
  }

  if (g.output_tensors().empty()) {
    return InvalidArgument("graph has no output: declare at least one op output in 'tensors'");
  }
  for (const auto& t : g.tensors) {
    if (t.is_virtual && !used.count(t.name)) {
      std::string by, by_role = "y";
      for (const auto& op : spec.ops)
        for (const auto& [role, name] : op.outputs)
          if (name == t.name) by = op_where(op), by_role = role;
      return InvalidArgument(by + " output " + q(by_role) + " (" + q(t.name) +
                             ") is virtual and no op uses it: declare it in 'tensors' (non-virtual) to make it a graph output");
    }
  }
  return g;
}

// ---------------------------------------------------------------- describe

std::string describe(const ResolvedGraph& g) {
  auto vec = [](const std::vector<int64_t>& v) { return dims_string(v); };
  std::ostringstream os;
  os << "graph '" << g.name << "': io " << dtype_name(g.io_dtype) << ", intermediate "
     << dtype_name(g.intermediate_dtype) << ", compute " << dtype_name(g.compute_dtype) << "\n";
  size_t wn = 4, wd = 4;
  for (const auto& t : g.tensors) {
    wn = std::max(wn, t.name.size());
    wd = std::max(wd, vec(t.dims).size());
  }
  auto pad = [](std::string s, size_t w) {
    if (s.size() < w) s.append(w - s.size(), ' ');
    return s;
  };
  os << "tensors:\n  " << pad("name", wn) << "  " << pad("kind", 7) << "  " << pad("dtype", 8) << "  "
     << pad("dims", wd) << "  strides\n";
  for (const auto& t : g.tensors) {
    std::string kind = t.scalar_value ? "scalar" : t.is_virtual ? "virtual" : t.is_input ? "input" : "output";
    os << "  " << pad(t.name, wn) << "  " << pad(kind, 7) << "  " << pad(std::string(dtype_name(t.dtype)), 8) << "  "
       << pad(vec(t.dims), wd) << "  " << vec(t.strides);
    if (t.scalar_value) {
      std::ostringstream v;
      v << *t.scalar_value;
      os << "  value " << v.str();
    }
    os << "\n";
  }
  os << "ops (topological order):\n";
  for (const auto& op : g.ops) {
    os << "  " << op.name << ": " << op_type_name(op.attrs) << "(";
    bool first = true;
    for (auto role : op_input_roles(op.attrs)) {
      auto it = op.inputs.find(std::string(role));
      if (it == op.inputs.end()) continue;
      os << (first ? "" : ", ") << role << "=" << g.tensors[it->second].name;
      first = false;
    }
    os << ") ->";
    for (auto role : op_output_roles(op.attrs)) {
      auto it = op.outputs.find(std::string(role));
      if (it == op.outputs.end()) continue;
      if (role != "y") os << " " << role << "=";
      else os << " ";
      os << g.tensors[it->second].name << " " << vec(g.tensors[it->second].dims);
    }
    os << ", compute " << dtype_name(op.compute_dtype);
    if (auto* c = std::get_if<ConvFpropAttrs>(&op.attrs)) {
      os << ", padding " << vec(c->padding) << ", stride " << vec(c->stride) << ", dilation " << vec(c->dilation);
    }
    if (const SdpaOptions* s = sdpa_options(op.attrs)) {
      os << ", attn_scale " << (s->attn_scale ? *s->attn_scale : 0.0) << (s->causal ? ", causal" : "");
      if (s->right_bound) os << ", right_bound " << *s->right_bound;
      if (s->left_bound) os << ", left_bound " << *s->left_bound;
      if (s->alignment == SdpaAlignment::kBottomRight) os << ", bottom_right";
      if (s->padding) os << ", padding";
      if (s->bias) os << ", bias";
      if (s->alibi) os << ", alibi";
      if (s->dropout) os << ", dropout " << *s->dropout;
      if (auto* b = std::get_if<SdpaBwdAttrs>(&op.attrs); b && b->deterministic) os << ", deterministic";
      const auto roles = op_output_roles(op.attrs);
      if (std::find(roles.begin(), roles.end(), "stats") != roles.end()) os << ", stats";
    }
    os << "\n";
  }
  os << "flops " << g.flops() << ", bytes moved " << g.bytes_moved() << "\n";
  return os.str();
}

}  // namespace fusebox
