// fusebox: CPU reference. Every op accumulates in double; tensors between ops
// are kept as fp32 in logical row-major order (cuDNN keeps virtual tensors in
// the fp32 intermediate dtype). Outputs are not rounded to their dtype: the
// comparison tolerances absorb that rounding.
#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <optional>
#include <thread>

#include "fusebox/reference.h"
#include "reference/tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::product;

namespace {

// A tensor's values in logical row-major order, with its dims.
struct Values {
  std::vector<int64_t> dims;
  std::vector<float> data;
};

// Runs fn(begin, end) over [0, count) on a few threads when the work is large
// enough to pay for them; falls back to one thread if threads cannot start.
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

// Scaled-dot-product attention forward. q [B,Hq,Sq,D], k [B,Hk,Skv,D],
// v [B,Hk,Skv,Dv]; o [B,Hq,Sq,Dv]; stats [B,Hq,Sq,1] (natural-log logsumexp
// of the scaled, masked scores) when `stats` is not null.
Status run_sdpa(const ResolvedOp& op, const SdpaFwdAttrs& attrs, const Values& q, const Values& k, const Values& v,
                Values* o, Values* stats) {
  if (q.dims.size() != 4 || k.dims.size() != 4 || v.dims.size() != 4)
    return InvalidArgument(op_where(op) + "q, k and v must have rank 4; got q " + dims_string(q.dims) + ", k " +
                           dims_string(k.dims) + ", v " + dims_string(v.dims));
  const int64_t B = q.dims[0], Hq = q.dims[1], Sq = q.dims[2], D = q.dims[3];
  const int64_t Hk = k.dims[1], Skv = k.dims[2], Dv = v.dims[3];
  if (k.dims[0] != B || v.dims[0] != B || k.dims[3] != D || v.dims[1] != Hk || v.dims[2] != Skv || Hk < 1 ||
      Hq % Hk != 0 || o->dims != std::vector<int64_t>{B, Hq, Sq, Dv} ||
      (stats && stats->dims != std::vector<int64_t>{B, Hq, Sq, 1}))
    return InvalidArgument(op_where(op) + "inconsistent shapes: q " + dims_string(q.dims) + ", k " +
                           dims_string(k.dims) + ", v " + dims_string(v.dims) + ", o " + dims_string(o->dims));
  const double scale = attrs.attn_scale ? *attrs.attn_scale : 1.0 / std::sqrt(static_cast<double>(D));
  const int64_t group = Hq / Hk;
  parallel_for(B * Hq * Sq, static_cast<double>(Skv) * (D + Dv), [&](int64_t begin, int64_t end) {
    std::vector<double> s(static_cast<size_t>(Skv)), acc(static_cast<size_t>(Dv));
    for (int64_t row = begin; row < end; ++row) {
      const int64_t i = row % Sq, bh = row / Sq, h = bh % Hq, b = bh / Hq;
      const int64_t hk = h / group;
      const float* qr = q.data.data() + row * D;
      const float* kb = k.data.data() + (b * Hk + hk) * Skv * D;
      const float* vb = v.data.data() + (b * Hk + hk) * Skv * Dv;
      // top-left causal: row i sees keys j <= i
      const int64_t n = attrs.causal ? std::min(Skv, i + 1) : Skv;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        const float* kr = kb + j * D;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(qr[d]) * kr[d];
        s[j] = dot * scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; ++j) {
        const double p = std::exp(s[j] - mx);
        sum += p;
        const float* vr = vb + j * Dv;
        for (int64_t d = 0; d < Dv; ++d) acc[d] += p * vr[d];
      }
      float* orow = o->data.data() + row * Dv;
      for (int64_t d = 0; d < Dv; ++d) orow[d] = n > 0 ? static_cast<float>(acc[d] / sum) : 0.0f;
      if (stats) stats->data[row] = n > 0 ? static_cast<float>(mx + std::log(sum)) : -INFINITY;
    }
  });
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
    if (const auto* sdpa = std::get_if<SdpaFwdAttrs>(&op.attrs)) {
      std::vector<const Values*> qkv;
      for (const char* role : {"q", "k", "v"}) {
        auto it = op.inputs.find(role);
        if (it == op.inputs.end()) return InvalidArgument(op_where(op) + "missing input '" + role + "'");
        FUSEBOX_ASSIGN_OR_RETURN(const Values* v, get(op, role, it->second));
        qkv.push_back(v);
      }
      FUSEBOX_ASSIGN_OR_RETURN(const int oi, output_index(g, op, "o"));
      Values o = zeros_like(g.tensors[oi]);
      std::optional<Values> stats;
      int si = -1;
      if (sdpa->generate_stats) {
        FUSEBOX_ASSIGN_OR_RETURN(si, output_index(g, op, "stats"));
        stats = zeros_like(g.tensors[si]);
      }
      FUSEBOX_RETURN_IF_ERROR(run_sdpa(op, *sdpa, *qkv[0], *qkv[1], *qkv[2], &o, stats ? &*stats : nullptr));
      values[oi] = std::move(o);
      if (stats) values[si] = std::move(*stats);
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

}  // namespace fusebox
