#include "fusebox/partition.h"

#include <set>

#include "common/dims_string.h"
#include "fusebox/op_traits.h"

namespace fusebox {
namespace {

std::string op_where(const ResolvedOp& op) {
  return "[" + std::string(op_type_name(op.attrs)) + " '" + op.name + "']";
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// A temporary between parts (a virtual tensor of the whole graph) is laid out
// like its producer's first input of the same rank (channels-last after a
// channels-last convolution), which is what cuDNN's engines take for their
// outputs; dense row-major when there is none. Deterministic in the whole
// graph, so every part sees the same strides.
std::vector<int64_t> temporary_strides(const ResolvedGraph& g, int t) {
  const ResolvedTensor& tmp = g.tensors[t];
  for (const ResolvedOp& op : g.ops) {
    bool makes = false;
    for (const auto& [role, o] : op.outputs) makes = makes || o == t;
    if (!makes) continue;
    for (const auto& [role, in] : op.inputs) {
      const ResolvedTensor& x = g.tensors[in];
      if (!x.scalar_value && x.dims.size() == tmp.dims.size() && x.strides.size() == tmp.dims.size()) {
        return dense_strides_like(tmp.dims, x.strides);
      }
    }
  }
  return tmp.strides;
}

}  // namespace

Result<ResolvedGraph> graph_part(const ResolvedGraph& g, int first, int count,
                                 const std::map<int, DType>& temporary_dtypes) {
  const int n = static_cast<int>(g.ops.size());
  if (first < 0 || count < 1 || first + count > n) {
    return InvalidArgument("graph part: ops [" + std::to_string(first) + ", " +
                           std::to_string(first + count) + ") outside the graph's " + std::to_string(n) +
                           " ops");
  }
  const int end = first + count;
  // Who reads each tensor outside the part.
  std::vector<bool> read_outside(g.tensors.size(), false);
  for (int i = 0; i < n; ++i) {
    if (i >= first && i < end) continue;
    for (const auto& [role, t] : g.ops[i].inputs) read_outside[t] = true;
  }
  std::set<int> used;
  std::set<int> produced;
  for (int i = first; i < end; ++i) {
    for (const auto& [role, t] : g.ops[i].inputs) used.insert(t);
    for (const auto& [role, t] : g.ops[i].outputs) {
      used.insert(t);
      produced.insert(t);
    }
  }
  GraphSpec spec;
  spec.name = count == n ? g.name : g.name + "#ops" + std::to_string(first) + "-" + std::to_string(end - 1);
  spec.io_dtype = g.io_dtype;
  spec.intermediate_dtype = g.intermediate_dtype;
  spec.compute_dtype = g.compute_dtype;
  for (int i : used) {
    const ResolvedTensor& t = g.tensors[i];
    TensorSpec ts;
    ts.name = t.name;
    ts.dims = t.dims;
    ts.strides = t.strides;
    ts.dtype = t.dtype;
    ts.scalar_value = t.scalar_value;
    ts.values = t.values;
    // A virtual tensor stays virtual only when the part both makes it and is its only reader.
    ts.is_virtual = t.is_virtual && produced.count(i) && !read_outside[i];
    if (t.is_virtual && !ts.is_virtual) {
      ts.strides = temporary_strides(g, i);
      auto d = temporary_dtypes.find(i);
      if (d != temporary_dtypes.end()) ts.dtype = d->second;
    }
    spec.tensors.push_back(std::move(ts));
  }
  for (int i = first; i < end; ++i) {
    const ResolvedOp& op = g.ops[i];
    OpSpec os;
    os.name = op.name;
    os.attrs = op.attrs;
    os.compute_dtype = op.compute_dtype;
    for (const auto& [role, t] : op.inputs) os.inputs[role] = g.tensors[t].name;
    for (const auto& [role, t] : op.outputs) os.outputs[role] = g.tensors[t].name;
    spec.ops.push_back(std::move(os));
  }
  auto part = resolve(spec);
  if (!part.ok())
    return part.status().WithContext("graph part of ops " + std::to_string(first) + "-" +
                                     std::to_string(end - 1));
  return part;
}

std::vector<int> independent_op_groups(const ResolvedGraph& g) {
  const int n = static_cast<int>(g.ops.size());
  std::vector<int> parent(n);
  for (int i = 0; i < n; ++i) parent[i] = i;
  auto root = [&](int i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::map<int, int> writer;  // tensor index -> the op writing it
  for (int i = 0; i < n; ++i)
    for (const auto& [role, t] : g.ops[i].outputs) writer[t] = i;
  for (int i = 0; i < n; ++i) {
    for (const auto& [role, t] : g.ops[i].inputs) {
      auto w = writer.find(t);
      if (w != writer.end()) parent[root(i)] = root(w->second);
    }
  }
  std::map<int, int> number;  // root -> group, in the order of each group's first op
  std::vector<int> groups(n);
  for (int i = 0; i < n; ++i) {
    auto [it, fresh] = number.emplace(root(i), static_cast<int>(number.size()));
    groups[i] = it->second;
  }
  return groups;
}

std::string GraphPartition::summary() const {
  std::string s = std::to_string(parts.size()) + (parts.size() == 1 ? " part: " : " parts: ");
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) s += " | ";
    s += "[";
    const ResolvedGraph& pg = parts[i].graph;
    for (size_t k = 0; k < pg.ops.size(); ++k) {
      s += (k ? ", " : "") + std::string(op_type_name(pg.ops[k].attrs)) + " '" + pg.ops[k].name + "'";
    }
    s += "]";
  }
  return s;
}

namespace {

// The op after `from` that sums temporary t (a reduce_sum, a reduce_mean: op_traits' sums_inputs),
// directly or through pointwise ops (relu(t) summed sums t's rounding too), or null. Storing t in
// fewer bits than the graph's intermediate dtype rounds every value it sums: on the H100
// (2026-12-06, sweep seed 7131) a bf16 convolution's fp32 temporary stored as bf16 and summed 144
// values a channel with cancellation (sum|t| / |sum| up to 900) came back 0.56% off (rel_l2)
// where the graph asked for fp32 intermediates.
const ResolvedOp* summed_by(const ResolvedGraph& g, int t, int from) {
  std::set<int> reach = {t};  // t and the pointwise results of it
  for (size_t j = static_cast<size_t>(from); j < g.ops.size(); ++j) {
    const ResolvedOp& op = g.ops[j];
    bool reads = false;
    for (const auto& [role, in] : op.inputs) reads = reads || reach.count(in) > 0;
    if (!reads) continue;
    const OpTraitsInfo traits = op_traits(op.attrs);
    if (traits.sums_inputs) return &op;
    if (traits.family == "pointwise")
      for (const auto& [role, out] : op.outputs) reach.insert(out);
  }
  return nullptr;
}

// partition_graph, with or without narrowing a temporary that a later op sums (see summed_by):
// without, such a part is refused as if it had no engine, so the caller's last resort (the
// reference kernels, in the intermediate dtype) gets it first; `narrowed` lists what was narrowed.
Result<GraphPartition> partition_graph_impl(const ResolvedGraph& g, const SupportOracle& oracle,
                                            bool narrow_summed) {
  const int n = static_cast<int>(g.ops.size());
  if (n == 0) return InvalidArgument("partition: the graph has no ops");
  GraphPartition out;
  Status whole = oracle(g);
  if (whole.ok()) {
    out.parts.push_back({0, n, g, ""});
    return out;
  }
  std::map<int, DType> decided;  // temporaries' dtypes fixed by the parts accepted so far
  // The temporaries a part [first, end) makes for later parts.
  auto outgoing = [&](int first, int end) {
    std::vector<int> out_t;
    for (int i = first; i < end; ++i) {
      for (const auto& [role, t] : g.ops[i].outputs) {
        if (!g.tensors[t].is_virtual) continue;
        for (int j = end; j < n; ++j) {
          bool reads = false;
          for (const auto& [r2, t2] : g.ops[j].inputs) reads = reads || t2 == t;
          if (reads) {
            out_t.push_back(t);
            break;
          }
        }
      }
    }
    return out_t;
  };
  // Greedy over the topological order, trying each part's outgoing temporaries in the dtypes
  // `prefs` lists, in turn. A part that fits its own temporaries but not the next part's
  // inputs (a convolution reading an fp32 temporary) fails later: the caller then runs it again
  // with other preferences.
  auto greedy = [&](const std::vector<DType>& prefs) -> Status {
    out.parts.clear();
    out.narrowed.clear();
    decided.clear();
    int start = 0;
    std::string longer_why = first_line(whole.message());  // why the part could not go on
    while (start < n) {
      bool found = false;
      Status single = Status::Ok();
      for (int end = n; end > start && !found; --end) {
        if (start == 0 && end == n) continue;  // the whole graph: refused above
        const std::vector<int> made = outgoing(start, end);
        std::vector<DType> tries = made.empty() ? std::vector<DType>{prefs.front()} : prefs;
        for (DType d : tries) {
          std::map<int, DType> dtypes = decided;
          for (int t : made) dtypes[t] = d;
          std::string
              lossy;  // the first temporary narrowed below the intermediate dtype that a later op sums
          if (dtype_size_bytes(d) < dtype_size_bytes(g.intermediate_dtype)) {
            for (int t : made) {
              const ResolvedOp* sum = lossy.empty() ? summed_by(g, t, end) : nullptr;
              if (sum != nullptr)
                lossy = "temporary '" + g.tensors[t].name + "' stored as " + std::string(dtype_name(d)) +
                        ", not the graph's intermediate " + std::string(dtype_name(g.intermediate_dtype)) +
                        ", though " + op_where(*sum) + " sums it";
            }
          }
          if (!lossy.empty() && !narrow_summed) {
            const Status st =
                Status(StatusCode::kNotSupported,
                       op_where(g.ops[start]) + ": not with " + lossy + " (its sums would lose precision)");
            longer_why = first_line(st.message());
            if (end - start == 1) single = st;
            continue;
          }
          auto part = graph_part(g, start, end - start, dtypes);
          Status st = part.ok() ? oracle(*part) : part.status();
          if (!st.ok()) {
            longer_why = first_line(st.message());
            if (end - start == 1) single = st;
            continue;
          }
          decided = dtypes;
          if (!lossy.empty())
            out.narrowed.push_back(lossy + ": no engine writes it in " +
                                   std::string(dtype_name(g.intermediate_dtype)));
          out.parts.push_back({start, end - start, std::move(part).value(), ""});
          // The try one op longer (the previous iteration) was refused: that is why the part ends here.
          if (end < n) {
            out.parts.back().why_cut = op_where(g.ops[end - 1]) + " and " + op_where(g.ops[end]) +
                                       " have no engine together: " + longer_why;
          }
          start = end;
          found = true;
          break;
        }
      }
      if (!found) {
        const ResolvedOp& op = g.ops[start];
        std::string tensors;
        for (const auto& [role, t] : op.inputs) {
          const ResolvedTensor& x = g.tensors[t];
          tensors += " " + role + "='" + x.name + "' " + std::string(dtype_name(x.dtype)) + " " +
                     common::dims_string(x.dims) + " strides " + common::dims_string(x.strides) + ";";
        }
        return Status(StatusCode::kNotSupported,
                      op_where(op) + " has no engine even on its own, so no split of the graph runs:" +
                          tensors + " cuDNN: " + first_line(single.message()));
      }
    }
    return Status::Ok();
  };
  Status st = greedy({g.intermediate_dtype, g.io_dtype});
  if (!st.ok() && g.io_dtype != g.intermediate_dtype) {
    const Status first_try = st;
    st = greedy({g.io_dtype});  // every temporary as fused engines write to memory
    if (!st.ok()) st = first_try;
  }
  FUSEBOX_RETURN_IF_ERROR(st);
  std::vector<std::pair<int, int>> ranges;
  for (const GraphPart& p : out.parts) ranges.push_back({p.first_op, p.op_count});
  auto again = partition_at(g, ranges, decided);  // the temporaries (parts already built above are kept)
  if (!again.ok()) return again.status();
  out.temporaries = again->temporaries;
  out.temporary_dtypes = again->temporary_dtypes;
  out.temporary_bytes = again->temporary_bytes;
  return out;
}

}  // namespace

Result<GraphPartition> partition_graph(const ResolvedGraph& g, const SupportOracle& oracle) {
  auto p = partition_graph_impl(g, oracle, /*narrow_summed=*/false);
  if (!p.ok() && p.status().code() == StatusCode::kNotSupported)
    p = partition_graph_impl(g, oracle, /*narrow_summed=*/true);
  return p;
}

Result<GraphPartition> partition_at(const ResolvedGraph& g, const std::vector<std::pair<int, int>>& ranges,
                                    const std::map<int, DType>& temporary_dtypes) {
  const int n = static_cast<int>(g.ops.size());
  GraphPartition out;
  int next = 0;
  for (const auto& [first, count] : ranges) {
    if (first != next || count < 1 || first + count > n) {
      return InvalidArgument("partition: parts must cover the graph's " + std::to_string(n) +
                             " ops in order; a part starts at op " + std::to_string(first) + ", expected " +
                             std::to_string(next));
    }
    if (count == n) {
      out.parts.push_back({0, n, g, ""});
    } else {
      FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph part, graph_part(g, first, count, temporary_dtypes));
      out.parts.push_back({first, count, std::move(part), ""});
    }
    next = first + count;
  }
  if (next != n)
    return InvalidArgument("partition: the parts cover " + std::to_string(next) + " of " + std::to_string(n) +
                           " ops");
  // Temporaries: whole-graph virtual tensors that more than one part touches.
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!g.tensors[i].is_virtual) continue;
    int parts_touching = 0;
    for (const GraphPart& p : out.parts) {
      if (p.graph.find_tensor(g.tensors[i].name) >= 0) ++parts_touching;
    }
    if (parts_touching > 1) {
      out.temporaries.push_back(static_cast<int>(i));
      auto d = temporary_dtypes.find(static_cast<int>(i));
      ResolvedTensor as_stored = g.tensors[i];
      if (d != temporary_dtypes.end()) as_stored.dtype = d->second;
      out.temporary_dtypes[static_cast<int>(i)] = as_stored.dtype;
      out.temporary_bytes += (as_stored.storage_bytes() + 255) / 256 * 256;
    }
  }
  return out;
}

Result<GraphPartition> partition_graph(const ResolvedGraph& g, const SupportOracle& oracle,
                                       const SupportOracle& last_resort) {
  std::set<std::string> ok_alone, refused_alone, allowed;
  const SupportOracle asked = [&](const ResolvedGraph& part) -> Status {
    Status st = oracle(part);
    if (part.ops.size() != 1) return st;
    const std::string& name = part.ops[0].name;
    (st.ok() ? ok_alone : refused_alone).insert(name);
    if (st.ok() || !allowed.count(name)) return st;
    Status last = last_resort(part);
    if (last.ok()) return last;
    return Status(st.code(), st.message() + " (and the last resort: " + first_line(last.message()) + ")");
  };
  // First without narrowing a summed temporary (the last resort computes it in the intermediate
  // dtype), then with it.
  Result<GraphPartition> p = InvalidArgument("partition: not tried");
  for (bool narrow_summed : {false, true}) {
    p = partition_graph_impl(g, asked, narrow_summed);
    while (!p.ok() && p.status().code() == StatusCode::kNotSupported) {
      const size_t before = allowed.size();
      for (const std::string& op : refused_alone)
        if (!ok_alone.count(op)) allowed.insert(op);
      if (allowed.size() == before) break;  // no new op the last resort could take
      p = partition_graph_impl(g, asked, narrow_summed);
    }
    if (p.ok() || p.status().code() != StatusCode::kNotSupported) break;
  }
  return p;
}

}  // namespace fusebox
