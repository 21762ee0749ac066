// fusebox: resolve(): validation, topological sort, shape/stride/dtype inference; describe().
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "fusebox/graph.h"

namespace fusebox {

namespace {

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxElements = int64_t{1} << 62;
constexpr size_t kMaxRank = 8;

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::string q(const std::string& s) { return "'" + s + "'"; }

std::string op_where(const OpSpec& op) {
  std::string s = "[";
  s.append(op_type_name(op.attrs));
  s.append(" '").append(op.name).append("']");
  return s;
}

std::string roles_str(const OpAttrs& a) {
  std::string s;
  for (auto r : op_input_roles(a)) {
    if (!s.empty()) s += ", ";
    s += r;
  }
  return s;
}

// Checks dims: rank 1..8, each dim in [1, 2^31-1], product <= 2^62.
Status check_dims(const std::string& where, const std::vector<int64_t>& dims) {
  if (dims.empty() || dims.size() > kMaxRank) {
    return InvalidArgument(where + " has rank " + std::to_string(dims.size()) + " " + dims_str(dims) +
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
      return InvalidArgument(where + ": dims " + dims_str(dims) + " hold more than 2^62 elements");
    }
  }
  return Status::Ok();
}

// Explicit strides: same rank, >= 0, 0 only on a dim of size 1, span fits in 2^62.
Status check_strides(const std::string& where, const std::vector<int64_t>& dims,
                     const std::vector<int64_t>& strides) {
  if (strides.size() != dims.size()) {
    return InvalidArgument(where + ": strides " + dims_str(strides) + " have rank " +
                           std::to_string(strides.size()) + " but dims " + dims_str(dims) + " have rank " +
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
      return InvalidArgument(where + ": strides " + dims_str(strides) + " span more than 2^62 elements");
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
      return InvalidArgument(where + ": strides " + dims_str(t.strides) + " disagree with layout " + q(t.layout) +
                             ", which gives " + dims_str(*from_layout) + ": give one or make them agree");
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
                           std::to_string(b.dims.size()) + " " + dims_str(b.dims) + " but input " + q(ra) + " (" +
                           q(a.name) + ") has rank " + std::to_string(a.dims.size()) + " " + dims_str(a.dims) +
                           ": pointwise inputs must have equal ranks (write 1 for broadcast dims)");
  }
  std::vector<int64_t> out(a.dims.size());
  for (size_t i = 0; i < a.dims.size(); ++i) {
    int64_t da = a.dims[i], db = b.dims[i];
    bool ok = into_a ? (db == da || db == 1) : (da == db || da == 1 || db == 1);
    if (!ok) {
      if (into_a) {
        return InvalidArgument(where + " input " + q(rb) + " (" + q(b.name) + ") " + dims_str(b.dims) +
                               " does not broadcast into input " + q(ra) + " (" + q(a.name) + ") " +
                               dims_str(a.dims) + ": dim " + std::to_string(i) + " must be " + std::to_string(da) +
                               " or 1");
      }
      return InvalidArgument(where + " inputs " + q(ra) + " (" + q(a.name) + ") " + dims_str(a.dims) + " and " +
                             q(rb) + " (" + q(b.name) + ") " + dims_str(b.dims) + " do not broadcast: dim " +
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
                           dims_str(x.dims) + ": conv_fprop takes [N,C,H,W] or [N,C,D,H,W]");
  }
  if (w.dims.size() != rank) {
    return InvalidArgument(where + " input 'w' (" + q(w.name) + ") has rank " + std::to_string(w.dims.size()) +
                           " " + dims_str(w.dims) + " but input 'x' (" + q(x.name) + ") has rank " +
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
      return InvalidArgument(where + " " + f.name + " " + dims_str(*f.v) + " has " + std::to_string(f.v->size()) +
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
                           dims_str(a.dims) + ": matmul takes [batch..., M, K] with rank >= 3 (write [1, M, K] for a plain GEMM)");
  }
  if (b.dims.size() != rank) {
    return InvalidArgument(where + " input 'b' (" + q(b.name) + ") has rank " + std::to_string(b.dims.size()) + " " +
                           dims_str(b.dims) + " but input 'a' (" + q(a.name) + ") has rank " + std::to_string(rank) +
                           ": both must have the same rank");
  }
  if (a.dims[rank - 1] != b.dims[rank - 2]) {
    return InvalidArgument(where + " input 'a' (" + q(a.name) + ") " + dims_str(a.dims) + " has K=" +
                           std::to_string(a.dims[rank - 1]) + " but input 'b' (" + q(b.name) + ") " +
                           dims_str(b.dims) + " has K=" + std::to_string(b.dims[rank - 2]) +
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
    if (op.outputs.size() != 1 || !op.outputs.count("y")) {
      std::string got;
      for (const auto& [role, name] : op.outputs) {
        if (!got.empty()) got += ", ";
        got += role;
      }
      return InvalidArgument(where + " outputs must be exactly one role 'y' (got: " + (got.empty() ? "none" : got) + ")");
    }
    const std::string& y = op.outputs.at("y");
    if (y.empty()) return InvalidArgument(where + " output 'y' names no tensor");
    auto [it, fresh] = producer.emplace(y, i);
    if (!fresh) {
      return InvalidArgument(where + " output 'y': tensor " + q(y) + " is also produced by " +
                             op_where(spec.ops[it->second]) + ": a tensor can be produced by one op only");
    }
    auto d = declared.find(y);
    if (d != declared.end() && spec.tensors[d->second].scalar_value) {
      return InvalidArgument(where + " output 'y': tensor " + q(y) +
                             " is a by-value scalar: scalars can only be inputs");
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
        available.insert(spec.ops[i].outputs.at("y"));
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
    const std::string& y = spec.ops[i].outputs.at("y");
    if (index.count(y)) continue;
    ResolvedTensor r;
    r.name = y;
    index[y] = static_cast<int>(g.tensors.size());
    g.tensors.push_back(r);
    tspec.push_back(nullptr);
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
    if (producer.count(t.name)) continue;
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
            return InvalidArgument(where + " is a by-value scalar with dims " + dims_str(t.dims) +
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
    const int yi = index.at(op.outputs.at("y"));
    rop.outputs["y"] = yi;

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
    FUSEBOX_RETURN_IF_ERROR(check_dims(where + " output 'y' (" + q(g.tensors[yi].name) + ")", ydims));

    // strides like the op's first non-scalar input
    std::vector<int64_t> like;
    for (auto role : roles) {
      const auto& t = in(role);
      if (!t.scalar_value) {
        like = t.strides;
        break;
      }
    }
    std::vector<int64_t> dense = dense_strides_like(ydims, like);
    ResolvedTensor& y = g.tensors[yi];
    const TensorSpec* ys = tspec[yi];
    const std::string ywhere = where + " output 'y' (" + q(y.name) + ")";
    y.dims = ydims;
    if (ys) {
      if (!ys->dims.empty() && ys->dims != ydims) {
        return InvalidArgument(ywhere + " is declared with dims " + dims_str(ys->dims) + " but the op produces " +
                               dims_str(ydims) + ": fix the dims or omit them to infer");
      }
      FUSEBOX_ASSIGN_OR_RETURN(y.strides, tensor_strides(ywhere, *ys, ydims, dense));
      y.is_virtual = ys->is_virtual;
      y.dtype = ys->dtype.value_or(ys->is_virtual ? spec.intermediate_dtype : spec.io_dtype);
    } else {
      y.strides = dense;
      y.is_virtual = true;
      y.dtype = spec.intermediate_dtype;
    }
    y.is_output = !y.is_virtual;
    known[yi] = true;
    g.ops.push_back(std::move(rop));
  }

  if (g.output_tensors().empty()) {
    return InvalidArgument("graph has no output: declare at least one op output in 'tensors'");
  }
  for (const auto& t : g.tensors) {
    if (t.is_virtual && !used.count(t.name)) {
      std::string by;
      for (const auto& op : spec.ops)
        if (op.outputs.at("y") == t.name) by = op_where(op);
      return InvalidArgument(by + " output 'y' (" + q(t.name) +
                             ") is virtual and no op uses it: declare it in 'tensors' (non-virtual) to make it a graph output");
    }
  }
  return g;
}

// ---------------------------------------------------------------- describe

std::string describe(const ResolvedGraph& g) {
  auto vec = [](const std::vector<int64_t>& v) { return dims_str(v); };
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
    os << ") -> " << g.tensors[op.outputs.at("y")].name << " " << vec(g.tensors[op.outputs.at("y")].dims)
       << ", compute " << dtype_name(op.compute_dtype);
    if (auto* c = std::get_if<ConvFpropAttrs>(&op.attrs)) {
      os << ", padding " << vec(c->padding) << ", stride " << vec(c->stride) << ", dilation " << vec(c->dilation);
    }
    os << "\n";
  }
  os << "flops " << g.flops() << ", bytes moved " << g.bytes_moved() << "\n";
  return os.str();
}

}  // namespace fusebox
