// fusebox graph layer: the canonical form of a resolved graph, its
// fingerprint and the frontend uids that follow from it.
//
// The canonical form is what plan caches and plan files key on. It holds
// exactly what a cuDNN plan depends on: the graph's dtypes, every tensor's
// kind, dtype, dims and strides, by-value scalars (baked into plans), and
// every op's type, compute dtype, attributes (exact: shortest round-trip
// doubles) and connections. It leaves out what does not change the
// computation: the graph's name, op names, tensor names, the order of
// tensors and ops in the file, and fixed input values (data, not plan).
//
// Numbering: ops are emitted in topological order, choosing among ready ops
// by a structural key (type, attributes, the canonical ids of the tensors it
// reads, or the description of graph inputs not yet numbered); names break
// only exact structural ties. A tensor's canonical id is the order in which
// it is first met (an op's inputs in role order, then its outputs).
#include <charconv>
#include <queue>
#include <sstream>

#include "ops/ops.h"
#include "xxhash.h"

namespace fusebox {

// ---------------------------------------------------------------- writer

std::string CanonicalWriter::exact(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void CanonicalWriter::key(std::string_view k) {
  if (!fresh_) text_ += ' ';
  fresh_ = false;
  text_.append(k);
  text_ += '=';
}

void CanonicalWriter::field(std::string_view k, std::string_view value) {
  key(k);
  text_.append(value);
}
void CanonicalWriter::field(std::string_view k, int64_t value) {
  key(k);
  text_ += std::to_string(value);
}
void CanonicalWriter::field(std::string_view k, bool value) {
  key(k);
  text_ += value ? "1" : "0";
}
void CanonicalWriter::field(std::string_view k, double value) {
  key(k);
  text_ += exact(value);
}
void CanonicalWriter::field(std::string_view k, const std::vector<int64_t>& values) {
  key(k);
  text_ += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) text_ += ',';
    text_ += std::to_string(values[i]);
  }
  text_ += ']';
}
void CanonicalWriter::field(std::string_view k, const std::vector<double>& values) {
  key(k);
  text_ += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) text_ += ',';
    text_ += exact(values[i]);
  }
  text_ += ']';
}
void CanonicalWriter::line() {
  text_ += '\n';
  fresh_ = true;
}

// ---------------------------------------------------------------- canonical form

namespace {

std::string_view tensor_kind(const ResolvedTensor& t) {
  return t.scalar_value ? "scalar" : t.is_virtual ? "virtual" : t.is_input ? "input" : "output";
}

// A tensor's own description, without its name.
void describe_tensor(const ResolvedTensor& t, CanonicalWriter& w) {
  w.field("kind", tensor_kind(t));
  w.field("dtype", dtype_name(t.dtype));
  w.field("dims", t.dims);
  w.field("strides", t.strides);
  if (t.scalar_value) w.field("value", *t.scalar_value);
}

// An op's structural key; `ids` holds the canonical ids given so far (-1: none).
std::string op_key(const ResolvedGraph& g, const ResolvedOp& op, const std::vector<int>& ids) {
  CanonicalWriter w;
  w.field("op", op_type_name(op.attrs));
  w.field("compute", dtype_name(op.compute_dtype));
  std::visit([&](const auto& a) { graph_ops::canonical(a, w); }, op.attrs);
  for (std::string_view role : op_input_roles(op.attrs)) {
    auto it = op.inputs.find(std::string(role));
    if (it == op.inputs.end()) continue;
    const int ti = it->second;
    if (ids[ti] >= 0) {
      w.field(role, "t" + std::to_string(ids[ti]));
    } else {
      w.field(role, "(");
      describe_tensor(g.tensors[ti], w);
      w.field(")", "");
    }
  }
  return w.text();
}

}  // namespace

Status canonicalize(ResolvedGraph& g) {
  const size_t n_ops = g.ops.size();
  std::vector<int> producer(g.tensors.size(), -1);
  for (size_t i = 0; i < n_ops; ++i)
    for (const auto& [role, ti] : g.ops[i].outputs) producer[ti] = static_cast<int>(i);
  // pending[i]: inputs of op i not yet produced; consumers[t]: ops reading t.
  std::vector<int> pending(n_ops, 0);
  std::vector<std::vector<int>> consumers(g.tensors.size());
  for (size_t i = 0; i < n_ops; ++i) {
    for (const auto& [role, ti] : g.ops[i].inputs) {
      if (producer[ti] >= 0) {
        ++pending[i];
        consumers[ti].push_back(static_cast<int>(i));
      }
    }
  }
  std::vector<int> ids(g.tensors.size(), -1);
  int next_id = 0;
  using Entry = std::pair<std::string, int>;  // (key, op index)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  auto tiebreak = [&](const ResolvedOp& op) {
    // Names only break exact structural ties: output names (non-virtual ones
    // are the caller's), then the op name.
    std::string s;
    for (const auto& [role, ti] : op.outputs) s += "\x01" + g.tensors[ti].name;
    return s + "\x02" + op.name;
  };
  auto push = [&](int i) { ready.emplace(op_key(g, g.ops[i], ids) + "\x03" + tiebreak(g.ops[i]), i); };
  for (size_t i = 0; i < n_ops; ++i)
    if (pending[i] == 0) push(static_cast<int>(i));

  std::vector<int> order;
  order.reserve(n_ops);
  while (!ready.empty()) {
    const int i = ready.top().second;
    ready.pop();
    order.push_back(i);
    const ResolvedOp& op = g.ops[i];
    for (std::string_view role : op_input_roles(op.attrs)) {
      auto it = op.inputs.find(std::string(role));
      if (it != op.inputs.end() && ids[it->second] < 0) ids[it->second] = next_id++;
    }
    for (std::string_view role : op_output_roles(op.attrs)) {
      auto it = op.outputs.find(std::string(role));
      if (it == op.outputs.end()) continue;
      if (ids[it->second] < 0) ids[it->second] = next_id++;
      for (int c : consumers[it->second])
        if (--pending[c] == 0) push(c);
    }
  }
  if (order.size() != n_ops)
    return Internal("canonical form: the ops form a cycle (resolve() should have refused it)");
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0) return Internal("canonical form: tensor '" + g.tensors[t].name + "' is used by no op");
  }

  // The form: a header, tensors by canonical id, ops in canonical order.
  CanonicalWriter w;
  w.field("fusebox-canonical-form", static_cast<int64_t>(kCanonicalFormVersion));
  w.line();
  w.field("io", dtype_name(g.io_dtype));
  w.field("intermediate", dtype_name(g.intermediate_dtype));
  w.field("compute", dtype_name(g.compute_dtype));
  w.line();
  std::vector<int> by_id(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) by_id[ids[t]] = static_cast<int>(t);
  for (size_t id = 0; id < by_id.size(); ++id) {
    w.field("t", static_cast<int64_t>(id));
    describe_tensor(g.tensors[by_id[id]], w);
    w.line();
  }
  std::vector<ResolvedOp> ops;
  ops.reserve(n_ops);
  for (int i : order) {
    const ResolvedOp& op = g.ops[i];
    w.field("op", op_type_name(op.attrs));
    w.field("compute", dtype_name(op.compute_dtype));
    std::visit([&](const auto& a) { graph_ops::canonical(a, w); }, op.attrs);
    for (const auto& [role, ti] : op.inputs) w.field("in." + role, "t" + std::to_string(ids[ti]));
    for (const auto& [role, ti] : op.outputs) w.field("out." + role, "t" + std::to_string(ids[ti]));
    w.line();
    ops.push_back(std::move(g.ops[i]));
  }
  g.ops = std::move(ops);
  g.canonical = w.text();
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    ResolvedTensor& r = g.tensors[t];
    r.uid = (r.is_virtual || r.scalar_value) ? 0 : static_cast<int64_t>(ids[t]) + 1;
  }
  return Status::Ok();
}

std::string canonical_form(const ResolvedGraph& g) {
  if (!g.canonical.empty()) return g.canonical;
  ResolvedGraph copy = g;
  if (!canonicalize(copy).ok()) return std::string();
  return copy.canonical;
}

std::string graph_fingerprint(const ResolvedGraph& g) {
  const std::string c = canonical_form(g);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(c.data(), c.size())));
  return hex;
}

}  // namespace fusebox
