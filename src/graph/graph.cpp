// fusebox: graph description helpers: layouts, op names, builder, resolved-graph queries.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>

#include "fusebox/graph.h"
#include "graph/dims_string.h"

namespace fusebox {

namespace {


// Strides for dims laid out with `order` listing dims from slowest to fastest.
Result<std::vector<int64_t>> strides_for_order(const std::vector<int64_t>& dims,
                                               const std::vector<size_t>& order) {
  std::vector<int64_t> strides(dims.size(), 1);
  int64_t running = 1;
  for (size_t k = order.size(); k-- > 0;) {
    size_t d = order[k];
    strides[d] = running;
    int64_t dim = std::max<int64_t>(dims[d], 1);
    if (__builtin_mul_overflow(running, dim, &running)) {
      return InvalidArgument("dims " + dims_string(dims) + " overflow 64-bit strides");
    }
  }
  return strides;
}

}  // namespace

Result<std::vector<int64_t>> layout_strides(const std::vector<int64_t>& dims, std::string_view layout_in) {
  std::string layout(layout_in);
  for (char& c : layout) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t rank = dims.size();
  std::vector<size_t> order(rank);
  std::iota(order.begin(), order.end(), size_t{0});
  auto need_rank = [&](size_t want) -> Status {
    if (rank != want) {
      return InvalidArgument("layout '" + layout + "' needs rank " + std::to_string(want) + " but dims " +
                             dims_string(dims) + " have rank " + std::to_string(rank) +
                             " (use 'channels_last' or 'packed' for other ranks)");
    }
    return Status::Ok();
  };
  if (layout.empty() || layout == "row_major" || layout == "packed") return strides_for_order(dims, order);
  if (layout == "bhsd") {
    FUSEBOX_RETURN_IF_ERROR(need_rank(4));
    return strides_for_order(dims, order);
  }
  if (layout == "bshd") {
    FUSEBOX_RETURN_IF_ERROR(need_rank(4));
    return strides_for_order(dims, {0, 2, 1, 3});  // slowest to fastest: B, S, H, D
  }
  if (layout == "nchw" || layout == "ncdhw") {
    FUSEBOX_RETURN_IF_ERROR(need_rank(layout == "nchw" ? 4 : 5));
    return strides_for_order(dims, order);
  }
  if (layout == "nhwc" || layout == "ndhwc" || layout == "channels_last") {
    if (layout == "nhwc") FUSEBOX_RETURN_IF_ERROR(need_rank(4));
    if (layout == "ndhwc") FUSEBOX_RETURN_IF_ERROR(need_rank(5));
    if (rank < 3) {
      return InvalidArgument("layout '" + layout + "' needs rank >= 3 but dims " + dims_string(dims) +
                             " have rank " + std::to_string(rank));
    }
    // slowest to fastest: N, spatial..., C
    std::vector<size_t> cl{0};
    for (size_t d = 2; d < rank; ++d) cl.push_back(d);
    cl.push_back(1);
    return strides_for_order(dims, cl);
  }
  if (layout == "col_major") {
    if (rank < 2) {
      return InvalidArgument("layout 'col_major' needs rank >= 2 but dims " + dims_string(dims) + " have rank " +
                             std::to_string(rank));
    }
    std::swap(order[rank - 1], order[rank - 2]);
    return strides_for_order(dims, order);
  }
  return InvalidArgument("unknown layout '" + std::string(layout_in) +
                         "': accepted layouts are nchw, ncdhw, nhwc, ndhwc, channels_last, row_major, "
                         "packed, col_major, bhsd, bshd");
}

std::vector<int64_t> dense_strides_like(const std::vector<int64_t>& dims, const std::vector<int64_t>& like) {
  const size_t rank = dims.size();
  std::vector<size_t> order(rank);
  std::iota(order.begin(), order.end(), size_t{0});
  if (like.size() == rank) {
    // slowest first; ties keep the declared order (later dim faster)
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return like[a] > like[b]; });
  }
  std::vector<int64_t> strides(rank, 1);
  int64_t running = 1;
  for (size_t k = rank; k-- > 0;) {
    strides[order[k]] = running;
    int64_t next;
    if (__builtin_mul_overflow(running, std::max<int64_t>(dims[order[k]], 1), &next)) next = running;
    running = next;
  }
  return strides;
}

// ---------------------------------------------------------------- ops

std::string_view pointwise_mode_name(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd: return "add";
    case PointwiseMode::kSub: return "sub";
    case PointwiseMode::kMul: return "mul";
    case PointwiseMode::kBiasAdd: return "bias_add";
    case PointwiseMode::kScale: return "scale";
    case PointwiseMode::kRelu: return "relu";
    case PointwiseMode::kGeluTanh: return "gelu_tanh";
    case PointwiseMode::kGeluErf: return "gelu_erf";
    case PointwiseMode::kSilu: return "silu";
    case PointwiseMode::kSigmoid: return "sigmoid";
    case PointwiseMode::kTanh: return "tanh";
  }
  return "unknown";
}

std::optional<PointwiseMode> parse_pointwise_mode(std::string_view s) {
  for (PointwiseMode m : {PointwiseMode::kAdd, PointwiseMode::kSub, PointwiseMode::kMul, PointwiseMode::kBiasAdd,
                          PointwiseMode::kScale, PointwiseMode::kRelu, PointwiseMode::kGeluTanh,
                          PointwiseMode::kGeluErf, PointwiseMode::kSilu, PointwiseMode::kSigmoid,
                          PointwiseMode::kTanh}) {
    if (pointwise_mode_name(m) == s) return m;
  }
  return std::nullopt;
}

bool pointwise_is_unary(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
    case PointwiseMode::kBiasAdd:
    case PointwiseMode::kScale: return false;
    default: return true;
  }
}

std::string_view op_type_name(const OpAttrs& attrs) {
  if (std::holds_alternative<ConvFpropAttrs>(attrs)) return "conv_fprop";
  if (std::holds_alternative<MatmulAttrs>(attrs)) return "matmul";
  if (std::holds_alternative<SdpaFwdAttrs>(attrs)) return "sdpa_fwd";
  if (std::holds_alternative<SdpaBwdAttrs>(attrs)) return "sdpa_bwd";
  if (std::holds_alternative<SdpaFp8FwdAttrs>(attrs)) return "sdpa_fp8_fwd";
  if (std::holds_alternative<SdpaFp8BwdAttrs>(attrs)) return "sdpa_fp8_bwd";
  return pointwise_mode_name(std::get<PointwiseAttrs>(attrs).mode);
}

const SdpaOptions* sdpa_options(const OpAttrs& attrs) {
  if (auto* s = std::get_if<SdpaFwdAttrs>(&attrs)) return s;
  if (auto* s = std::get_if<SdpaBwdAttrs>(&attrs)) return s;
  if (auto* s = std::get_if<SdpaFp8FwdAttrs>(&attrs)) return s;
  if (auto* s = std::get_if<SdpaFp8BwdAttrs>(&attrs)) return s;
  return nullptr;
}

SdpaOptions* sdpa_options(OpAttrs& attrs) {
  return const_cast<SdpaOptions*>(sdpa_options(static_cast<const OpAttrs&>(attrs)));
}

std::string_view sdpa_alignment_name(SdpaAlignment a) {
  return a == SdpaAlignment::kBottomRight ? "bottom_right" : "top_left";
}

std::vector<double> alibi_slopes(int64_t heads) {
  std::vector<double> exps;  // slope = 2^(-8 * e / n)
  int64_t n = 1;
  while (n * 2 <= heads) n *= 2;
  for (int64_t h = 0; h < n; ++h) exps.push_back(static_cast<double>(h + 1));
  for (int64_t m = 0; m < 2 * (heads - n); m += 2) exps.push_back(static_cast<double>(m + 1) * 0.5);
  std::vector<double> slopes;
  for (double e : exps) slopes.push_back(static_cast<double>(std::pow(2.0f, -8.0f * static_cast<float>(e) /
                                                                               static_cast<float>(n))));
  return slopes;
}

bool sdpa_keeps(const SdpaOptions& o, int64_t i, int64_t j, int64_t lq, int64_t lkv) {
  if (o.padding && (j >= lkv || i >= lq)) return false;
  const int64_t off = o.alignment == SdpaAlignment::kBottomRight ? lkv - lq : 0;
  const bool has_right = o.right_bound || o.causal;
  if (has_right && j > i + off + o.right_bound.value_or(0)) return false;
  if (o.left_bound && j <= i + off - *o.left_bound) return false;
  return true;
}

double sdpa_kept_pairs(const SdpaOptions& o, int64_t lq, int64_t lkv) {
  const bool has_right = o.right_bound || o.causal;
  const int64_t right = o.right_bound.value_or(0);
  const int64_t off = o.alignment == SdpaAlignment::kBottomRight ? lkv - lq : 0;
  double pairs = 0;
  for (int64_t i = 0; i < lq; ++i) {
    int64_t hi = lkv - 1;  // kept columns form the interval [lo, hi]
    if (has_right) hi = std::min(hi, i + off + right);
    int64_t lo = 0;
    if (o.left_bound) lo = std::max<int64_t>(lo, i + off - *o.left_bound + 1);
    if (hi >= lo) pairs += static_cast<double>(hi - lo + 1);
  }
  return pairs;
}

std::vector<std::string_view> op_output_roles(const OpAttrs& attrs) {
  std::vector<std::string_view> r;
  if (auto* s = std::get_if<SdpaFwdAttrs>(&attrs)) {
    r = {"o"};
    if (s->generate_stats) r.push_back("stats");
  } else if (std::holds_alternative<SdpaBwdAttrs>(attrs)) {
    r = {"dq", "dk", "dv"};
  } else if (auto* s = std::get_if<SdpaFp8FwdAttrs>(&attrs)) {
    r = {"o", "amax_s", "amax_o"};
    if (s->generate_stats) r.push_back("stats");
  } else if (std::holds_alternative<SdpaFp8BwdAttrs>(attrs)) {
    r = {"dq", "dk", "dv", "amax_dq", "amax_dk", "amax_dv", "amax_dp"};
  } else {
    return {"y"};
  }
  if (sdpa_options(attrs)->dump_dropout_mask) r.push_back("dropout_mask");
  return r;
}

std::string_view op_primary_output_role(const OpAttrs& attrs) { return op_output_roles(attrs).front(); }

std::vector<std::string_view> op_input_roles(const OpAttrs& attrs) {
  if (std::holds_alternative<ConvFpropAttrs>(attrs)) return {"x", "w"};
  if (std::holds_alternative<MatmulAttrs>(attrs)) return {"a", "b"};
  if (const SdpaOptions* o = sdpa_options(attrs)) {
    std::vector<std::string_view> r = {"q", "k", "v"};
    if (std::holds_alternative<SdpaBwdAttrs>(attrs) || std::holds_alternative<SdpaFp8BwdAttrs>(attrs)) {
      r.insert(r.end(), {"o", "do", "stats"});
    }
    if (std::holds_alternative<SdpaFp8BwdAttrs>(attrs)) {
      r.insert(r.end(), {"descale_q", "descale_k", "descale_v", "descale_o", "descale_do", "descale_s", "descale_dp",
                         "scale_s", "scale_dq", "scale_dk", "scale_dv", "scale_dp"});
    }
    if (std::holds_alternative<SdpaFp8FwdAttrs>(attrs)) {
      r.insert(r.end(), {"descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"});
    }
    if (o->padding) r.insert(r.end(), {"seq_len_q", "seq_len_kv"});
    if (o->bias) r.push_back("bias");
    if (o->dropout) r.insert(r.end(), {"seed", "offset"});
    return r;
  }
  switch (std::get<PointwiseAttrs>(attrs).mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul: return {"a", "b"};
    case PointwiseMode::kBiasAdd: return {"x", "bias"};
    case PointwiseMode::kScale: return {"x", "scale"};
    default: return {"x"};
  }
}

// ---------------------------------------------------------------- builder

namespace {

bool name_taken(const GraphSpec& g, const std::string& n) {
  for (const auto& t : g.tensors)
    if (t.name == n) return true;
  for (const auto& op : g.ops)
    for (const auto& [role, out] : op.outputs)
      if (out == n) return true;
  return false;
}

std::string add_op(GraphSpec& g, std::string op_name, OpAttrs attrs, std::vector<std::string> in) {
  OpSpec op;
  op.name = std::move(op_name);
  op.attrs = std::move(attrs);
  auto roles = op_input_roles(op.attrs);
  for (size_t i = 0; i < roles.size() && i < in.size(); ++i) op.inputs[std::string(roles[i])] = in[i];
  std::string primary;
  for (auto role : op_output_roles(op.attrs)) {
    const std::string base = op.name + "." + std::string(role);
    std::string out = base;
    for (int k = 2; name_taken(g, out); ++k) out = base + std::to_string(k);
    op.outputs[std::string(role)] = out;
    if (primary.empty()) primary = out;
  }
  g.ops.push_back(std::move(op));
  return primary;
}

}  // namespace

std::string GraphSpec::tensor(std::string tensor_name, std::vector<int64_t> dims, std::string layout,
                              std::optional<DType> dtype) {
  TensorSpec t;
  t.name = std::move(tensor_name);
  t.dims = std::move(dims);
  t.layout = std::move(layout);
  t.dtype = dtype;
  tensors.push_back(t);
  return t.name;
}

std::string GraphSpec::scalar(std::string tensor_name, double value, DType dtype) {
  TensorSpec t;
  t.name = std::move(tensor_name);
  t.scalar_value = value;
  t.dtype = dtype;
  tensors.push_back(t);
  return t.name;
}

std::string GraphSpec::conv_fprop(std::string op_name, const std::string& x, const std::string& w,
                                  ConvFpropAttrs attrs) {
  return add_op(*this, std::move(op_name), std::move(attrs), {x, w});
}

std::string GraphSpec::matmul(std::string op_name, const std::string& a, const std::string& b) {
  return add_op(*this, std::move(op_name), MatmulAttrs{}, {a, b});
}

std::string GraphSpec::pointwise(std::string op_name, PointwiseMode mode, const std::string& in0,
                                 const std::string& in1) {
  std::vector<std::string> in{in0};
  if (!pointwise_is_unary(mode)) in.push_back(in1);
  return add_op(*this, std::move(op_name), PointwiseAttrs{mode}, std::move(in));
}

namespace {

// Adds an sdpa op with inputs by role; outputs "<op_name>.<role>" declared as
// graph outputs.
void add_sdpa_op(GraphSpec& g, const std::string& op_name, OpAttrs attrs, std::map<std::string, std::string> inputs) {
  OpSpec op;
  op.name = op_name;
  op.attrs = std::move(attrs);
  op.inputs = std::move(inputs);
  // Optional inputs switch their feature on, as in the JSON format.
  SdpaOptions& o = *sdpa_options(op.attrs);
  if (op.inputs.count("seq_len_q") || op.inputs.count("seq_len_kv")) o.padding = true;
  if (op.inputs.count("bias")) o.bias = true;
  for (auto role : op_output_roles(op.attrs)) {
    const std::string y = op_name + "." + std::string(role);
    op.outputs[std::string(role)] = y;
    g.output(y);
  }
  g.ops.push_back(std::move(op));
}

}  // namespace

std::string GraphSpec::sdpa_fwd(std::string op_name, const std::string& q, const std::string& k,
                                const std::string& v, SdpaFwdAttrs attrs, std::map<std::string, std::string> extra) {
  extra["q"] = q;
  extra["k"] = k;
  extra["v"] = v;
  add_sdpa_op(*this, op_name, attrs, std::move(extra));
  return op_name + ".o";
}

std::string GraphSpec::sdpa_bwd(std::string op_name, const std::string& q, const std::string& k,
                                const std::string& v, const std::string& o, const std::string& d_o,
                                const std::string& stats, SdpaBwdAttrs attrs,
                                std::map<std::string, std::string> extra) {
  extra["q"] = q;
  extra["k"] = k;
  extra["v"] = v;
  extra["o"] = o;
  extra["do"] = d_o;
  extra["stats"] = stats;
  add_sdpa_op(*this, op_name, attrs, std::move(extra));
  return op_name;
}

std::string GraphSpec::sdpa_fp8_fwd(std::string op_name, const std::string& q, const std::string& k,
                                    const std::string& v, std::map<std::string, std::string> scales,
                                    SdpaFp8FwdAttrs attrs) {
  scales["q"] = q;
  scales["k"] = k;
  scales["v"] = v;
  add_sdpa_op(*this, op_name, attrs, std::move(scales));
  return op_name + ".o";
}

void GraphSpec::output(const std::string& tensor_name, std::string layout, std::optional<DType> dtype) {
  for (auto& t : tensors) {
    if (t.name == tensor_name) {
      t.is_virtual = false;
      if (!layout.empty()) t.layout = layout;
      if (dtype) t.dtype = dtype;
      return;
    }
  }
  TensorSpec t;
  t.name = tensor_name;
  t.layout = std::move(layout);
  t.dtype = dtype;
  tensors.push_back(std::move(t));
}

// ---------------------------------------------------------------- resolved form

int64_t ResolvedTensor::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

int64_t ResolvedTensor::storage_elements() const {
  int64_t span = 1;
  for (size_t i = 0; i < dims.size() && i < strides.size(); ++i) span += (dims[i] - 1) * strides[i];
  return span;
}

int64_t ResolvedTensor::storage_bytes() const {
  return storage_elements() * static_cast<int64_t>(dtype_size_bytes(dtype));
}

int ResolvedGraph::find_tensor(std::string_view tensor_name) const {
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].name == tensor_name) return static_cast<int>(i);
  return -1;
}

std::vector<int> ResolvedGraph::input_tensors() const {
  std::vector<int> r;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].is_input) r.push_back(static_cast<int>(i));
  return r;
}

std::vector<int> ResolvedGraph::output_tensors() const {
  std::vector<int> r;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].is_output) r.push_back(static_cast<int>(i));
  return r;
}

double ResolvedGraph::flops(const std::map<std::string, std::vector<double>>& inputs) const {
  double total = 0;
  for (const auto& op : ops) {
    auto in = [&](const char* role) -> const ResolvedTensor& { return tensors[op.inputs.at(role)]; };
    if (const SdpaOptions* s = sdpa_options(op.attrs)) {
      const auto& q = in("q");
      const auto& k = in("k");
      const auto& v = in("v");
      // Per-batch lengths when padding and the values are known, else full.
      auto lengths = [&](const char* role, int64_t full) {
        std::vector<int64_t> r(static_cast<size_t>(q.dims[0]), full);
        if (!s->padding) return r;
        auto it = inputs.find(in(role).name);
        const std::vector<double>& vals = it != inputs.end() ? it->second : in(role).values;
        for (size_t b = 0; b < r.size() && b < vals.size(); ++b) {
          r[b] = std::clamp<int64_t>(static_cast<int64_t>(vals[b]), 0, full);
        }
        return r;
      };
      const auto lq = lengths("seq_len_q", q.dims[2]);
      const auto lkv = lengths("seq_len_kv", k.dims[2]);
      double pairs = 0;
      for (size_t b = 0; b < lq.size(); ++b) pairs += sdpa_kept_pairs(*s, lq[b], lkv[b]);
      double f = 2.0 * static_cast<double>(q.dims[1]) * pairs * static_cast<double>(q.dims[3] + v.dims[3]);
      if (std::holds_alternative<SdpaBwdAttrs>(op.attrs) || std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs)) f *= 2.5;
      total += f;
      continue;
    }
    const ResolvedTensor& y = tensors[op.outputs.at("y")];
    if (std::holds_alternative<ConvFpropAttrs>(op.attrs)) {
      const auto& w = in("w");
      double macs = static_cast<double>(y.element_count());  // N*K*P*Q(*O)
      for (size_t d = 1; d < w.dims.size(); ++d) macs *= static_cast<double>(w.dims[d]);  // C*R*S
      total += 2 * macs;
    } else if (std::holds_alternative<MatmulAttrs>(op.attrs)) {
      const auto& a = in("a");
      total += 2.0 * static_cast<double>(y.element_count()) * static_cast<double>(a.dims.back());
    } else {
      total += static_cast<double>(y.element_count());
    }
  }
  return total;
}

double ResolvedGraph::bytes_moved() const {
  double total = 0;
  for (const auto& t : tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    total += static_cast<double>(t.element_count()) * static_cast<double>(dtype_size_bytes(t.dtype));
  }
  return total;
}

}  // namespace fusebox
