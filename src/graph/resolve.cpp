// fusebox: resolve(): validation, topological sort, shape/stride/dtype inference; describe().
#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <set>
#include <sstream>

#include "checks.h"
#include "common/dims_string.h"
#include "common/op_where.h"
#include "fusebox/graph.h"
#include "ops/ops.h"
#include "symbols.h"

namespace fusebox {

using common::dims_string;

namespace {

using graph_ops::kMaxDim;
constexpr int64_t kMaxElements = int64_t{1} << 62;
constexpr size_t kMaxRank = 8;

// One quoting helper for the graph layer (src/graph/ops/registry.cpp).
std::string q(const std::string& s) { return graph_ops::squote(s); }

std::string op_where(const OpSpec& op) { return common::op_where(op_type_name(op.attrs), op.name); }

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
      return InvalidArgument(where + ": strides " + dims_string(t.strides) + " disagree with layout " +
                             q(t.layout) + ", which gives " + dims_string(*from_layout) +
                             ": give one or make them agree");
    }
    return t.strides;
  }
  if (from_layout) return *from_layout;
  return fallback;
}

// Checks the op's roles and the names of its outputs against the declarations.
Status check_op_roles(const OpSpec& op, size_t i, const std::map<std::string, size_t>& declared,
                      const GraphSpec& spec, std::map<std::string, size_t>& producer) {
  const std::string where = op_where(op);
  const std::string type(op_type_name(op.attrs));
  auto roles = op_input_roles(op.attrs);
  for (auto r : roles) {
    auto it = op.inputs.find(std::string(r));
    if (it == op.inputs.end()) {
      return InvalidArgument(where + " missing input " + q(std::string(r)) + ": " + type + " takes inputs " +
                             roles_str(op.attrs));
    }
    if (it->second.empty())
      return InvalidArgument(where + " input " + q(std::string(r)) + " names no tensor");
  }
  for (const auto& [role, name] : op.inputs) {
    if (std::find(roles.begin(), roles.end(), role) == roles.end()) {
      return InvalidArgument(where + " unknown input role " + q(role) + ": " + type + " takes inputs " +
                             roles_str(op.attrs));
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
    want += std::visit([](const auto& a) { return graph_ops::output_roles_hint(a); }, op.attrs);
    return InvalidArgument(where + " outputs must be " + want + " (got: " + (got.empty() ? "none" : got) +
                           ")");
  }
  const bool in_memory =
      std::visit([](const auto& a) { return graph_ops::traits_info(a).outputs_in_memory; }, op.attrs);
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
    if (in_memory && (d == declared.end() || spec.tensors[d->second].is_virtual)) {
      return InvalidArgument(where + " output " + q(role) + ": tensor " + q(y) +
                             (d == declared.end() ? " is not declared" : " is virtual") + ": " + type +
                             " writes its outputs to memory, so declare it in 'tensors' as a graph "
                             "output (not virtual)");
    }
  }
  return Status::Ok();
}

// Topological order, O((ops + edges) log ops): always the earliest declared
// ready op, so errors come in file order.
Result<std::vector<size_t>> topological_order(const GraphSpec& spec,
                                              const std::map<std::string, size_t>& producer) {
  const size_t n = spec.ops.size();
  std::vector<size_t> pending(n, 0);
  std::vector<std::vector<size_t>> consumers(n);  // by producing op
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [role, name] : spec.ops[i].inputs) {
      auto p = producer.find(name);
      if (p == producer.end()) continue;
      ++pending[i];
      consumers[p->second].push_back(i);
    }
  }
  std::priority_queue<size_t, std::vector<size_t>, std::greater<size_t>> ready;
  for (size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.top();
    ready.pop();
    order.push_back(i);
    for (size_t c : consumers[i])
      if (--pending[c] == 0) ready.push(c);
  }
  if (order.size() < n) {
    std::string stuck;
    size_t listed = 0, total = 0;
    for (size_t i = 0; i < n; ++i) {
      if (pending[i] == 0) continue;
      ++total;
      if (listed < 8) {
        if (!stuck.empty()) stuck += ", ";
        stuck += op_where(spec.ops[i]);
        ++listed;
      }
    }
    if (total > listed) stuck += " and " + std::to_string(total - listed) + " more";
    return InvalidArgument("the ops form a cycle: " + stuck +
                           " each wait (directly or not) for their own output");
  }
  return order;
}

}  // namespace

Result<ResolvedGraph> resolve(const GraphSpec& spec) {
  ResolvedGraph g;
  g.name = spec.name;
  g.io_dtype = spec.io_dtype;
  g.intermediate_dtype = spec.intermediate_dtype;
  g.compute_dtype = spec.compute_dtype;
  FUSEBOX_RETURN_IF_ERROR(graph_symbols::check_symbols(spec));

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
      return InvalidArgument(op_where(op) + " op name " + q(op.name) +
                             " is used twice: op names must be unique");
    }
    FUSEBOX_RETURN_IF_ERROR(check_op_roles(op, i, declared, spec, producer));
  }
  for (const auto& op : spec.ops) {
    for (const auto& [role, name] : op.inputs) {
      if (!declared.count(name) && !producer.count(name)) {
        return InvalidArgument(op_where(op) + " input " + q(role) + ": tensor " + q(name) +
                               " is neither declared in 'tensors' nor produced by an op");
      }
    }
  }
  FUSEBOX_ASSIGN_OR_RETURN(const std::vector<size_t> order, topological_order(spec, producer));

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
        return InvalidArgument(where +
                               " has 'values' but is produced by an op: only graph inputs take fixed values");
      }
      continue;
    }
    if (!used.count(t.name)) {
      return InvalidArgument(where +
                             " is declared but no op uses it or produces it: remove it or connect it");
    }
    if (t.scalar_value) {
      if (t.is_virtual) return InvalidArgument(where + " is a by-value scalar and cannot be virtual");
      if (!std::isfinite(*t.scalar_value)) {
        return InvalidArgument(where + " is a by-value scalar that is not finite: give a finite number");
      }
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
        if (!std::isfinite(x))
          return InvalidArgument(where + " has a non-finite value: values must be finite");
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
    const bool scalars_ok =
        std::visit([](const auto& a) { return graph_ops::traits_info(a).accepts_scalar_inputs; }, op.attrs);
    // by-value scalars without dims take the rank of the op's other input
    for (auto role : roles) {
      int ti = rop.inputs.at(std::string(role));
      ResolvedTensor& t = g.tensors[ti];
      if (!t.scalar_value) continue;
      if (!scalars_ok) {
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

    // Sets an output's dims, strides (declared, else `dense`) and dtype (declared, else `dflt`).
    auto finish_output = [&](const std::string& role, const std::vector<int64_t>& dims,
                             const std::vector<int64_t>& dense, DType dflt) -> Status {
      const int yi = rop.outputs.at(role);
      ResolvedTensor& y = g.tensors[yi];
      const TensorSpec* ys = tspec[yi];
      const std::string ywhere = where + " output " + q(role) + " (" + q(y.name) + ")";
      FUSEBOX_RETURN_IF_ERROR(check_dims(ywhere, dims));
      y.dims = dims;
      if (ys) {
        if (!ys->dims.empty() && ys->dims != dims) {
          return InvalidArgument(ywhere + " is declared with dims " + dims_string(ys->dims) +
                                 " but the op produces " + dims_string(dims) +
                                 ": fix the dims or omit them to infer");
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
      known[yi] = true;
      return Status::Ok();
    };
    const graph_ops::InferContext ctx{where, rop, g.tensors, spec.io_dtype, finish_output};
    FUSEBOX_RETURN_IF_ERROR(std::visit([&](auto& a) { return graph_ops::infer(ctx, a); }, rop.attrs));
    for (const auto& [role, yi] : rop.outputs) {
      if (!known[yi]) return Internal(where + " inferred no shape for output " + q(role));
    }
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
      return InvalidArgument(
          by + " output " + q(by_role) + " (" + q(t.name) +
          ") is virtual and no op uses it: declare it in 'tensors' (non-virtual) to make it a graph output");
    }
  }
  FUSEBOX_RETURN_IF_ERROR(canonicalize(g));
  FUSEBOX_RETURN_IF_ERROR(graph_checks::check_cudnn_rules(g));
  g.shape = current_shape(spec);
  g.symbolic_id = symbolic_graph_id(spec);
  return g;
}

// ---------------------------------------------------------------- describe

std::string describe(const ResolvedGraph& g) {
  auto vec = [](const std::vector<int64_t>& v) { return dims_string(v); };
  std::ostringstream os;
  os << "graph '" << g.name << "': io " << dtype_name(g.io_dtype) << ", intermediate "
     << dtype_name(g.intermediate_dtype) << ", compute " << dtype_name(g.compute_dtype) << "\n";
  if (!g.shape.empty()) os << "symbolic, at shape " << shape_text(g.shape) << "\n";
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
    os << "  " << pad(t.name, wn) << "  " << pad(kind, 7) << "  " << pad(std::string(dtype_name(t.dtype)), 8)
       << "  " << pad(vec(t.dims), wd) << "  " << vec(t.strides);
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
      if (role != "y")
        os << " " << role << "=";
      else
        os << " ";
      os << g.tensors[it->second].name << " " << vec(g.tensors[it->second].dims);
    }
    os << ", compute " << dtype_name(op.compute_dtype);
    std::visit([&](const auto& a) { graph_ops::describe(a, os); }, op.attrs);
    os << "\n";
  }
  os << "flops " << g.flops() << ", bytes moved " << g.bytes_moved() << "\n";
  return os.str();
}

}  // namespace fusebox
