// fusebox: graph description helpers: layouts, op names, builder, resolved-graph queries.
#include "fusebox/graph.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <set>

#include "common/dims_string.h"
#include "common/strided.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;

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
      return InvalidArgument("layout 'col_major' needs rank >= 2 but dims " + dims_string(dims) +
                             " have rank " + std::to_string(rank));
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

// Op names, roles and per-op properties: src/graph/ops/ (registry.cpp and one file per family).

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

std::string GraphSpec::conv_dgrad(std::string op_name, const std::string& dy, const std::string& w,
                                  ConvDgradAttrs attrs) {
  return add_op(*this, std::move(op_name), std::move(attrs), {dy, w});
}

std::string GraphSpec::conv_wgrad(std::string op_name, const std::string& dy, const std::string& x,
                                  ConvWgradAttrs attrs) {
  return add_op(*this, std::move(op_name), std::move(attrs), {dy, x});
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

std::string GraphSpec::reduction(std::string op_name, ReductionMode mode, const std::string& x,
                                 std::vector<int64_t> reduce_dims) {
  return add_op(*this, std::move(op_name), ReductionAttrs{mode, std::move(reduce_dims)}, {x});
}

namespace {

// Adds an sdpa op with inputs by role; outputs "<op_name>.<role>" declared as
// graph outputs.
void add_sdpa_op(GraphSpec& g, const std::string& op_name, OpAttrs attrs,
                 std::map<std::string, std::string> inputs) {
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
                                const std::string& v, SdpaFwdAttrs attrs,
                                std::map<std::string, std::string> extra) {
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

int64_t ResolvedTensor::element_count() const { return common::product(dims); }

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
    const graph_ops::FlopsContext ctx{*this, op, inputs};
    total += std::visit([&](const auto& a) { return graph_ops::flops(ctx, a); }, op.attrs);
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
