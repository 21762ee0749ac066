// Graphviz pictures of resolved graphs. Node ids are generated (t0, op0, ...):
// names from the graph file only ever appear inside escaped quoted labels.
#include "dot.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common.h"
#include "common/dims_string.h"

namespace fusebox::cli {
namespace {

// Attribute values longer than this are cut (ALiBi slopes, long lists).
constexpr size_t kMaxAttrChars = 48;

std::string tensor_kind(const ResolvedTensor& t) {
  if (t.scalar_value) return "scalar";
  if (t.is_input) return "input";
  if (t.is_output) return "output";
  return "virtual";
}

std::string tensor_label(const ResolvedTensor& t) {
  if (t.scalar_value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", *t.scalar_value);
    return dot_escape(t.name) + "\\n= " + buf + " (" + std::string(dtype_name(t.dtype)) + ")";
  }
  std::string s =
      dot_escape(t.name) + "\\n" + common::dims_string(t.dims) + " " + std::string(dtype_name(t.dtype));
  if (!t.is_virtual) s += "\\nstrides " + common::dims_string(t.strides);
  return s + "\\n" + tensor_kind(t);
}

std::string attr_value(const nlohmann::ordered_json& v) {
  std::string s = v.is_string() ? v.get<std::string>() : common::json_dump(v, -1);
  if (s.size() > kMaxAttrChars) s = s.substr(0, kMaxAttrChars) + "...";
  return s;
}

std::string op_label(const ResolvedGraph& g, const ResolvedOp& op) {
  // Name and type centred, then one left-justified line (\l) per attribute.
  std::string s = dot_escape(op.name) + "\\n" + dot_escape(op_type_name(op.attrs)) + "\\n";
  const auto attrs =
      nlohmann::ordered_json::parse(op_resolved_attrs_json(g, op), nullptr, /*allow_exceptions=*/false);
  if (attrs.is_object()) {
    for (const auto& [k, v] : attrs.items()) {
      if (v.is_null()) continue;  // unset options say nothing
      s += dot_escape(k) + ": " + dot_escape(attr_value(v)) + "\\l";
    }
  }
  return s + "compute " + std::string(dtype_name(op.compute_dtype)) + "\\l";
}

}  // namespace

std::string dot_escape(std::string_view s) {
  // Control bytes and invalid UTF-8 first, as the terminal output does; the
  // backslashes printable() adds are then escaped like any other.
  const std::string p = common::printable(s);
  std::string out;
  out.reserve(p.size() + 8);
  for (char c : p) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string graph_dot(const ResolvedGraph& g, const DotPlan* plan) {
  std::ostringstream o;
  char flops[96];
  std::snprintf(flops, sizeof flops, "%.3g GFLOP, %.3g MB moved", g.flops() / 1e9, g.bytes_moved() / 1e6);
  o << "digraph fusebox {\n"
    << "  graph [rankdir=TB, fontname=\"Helvetica\", labelloc=t, label=\"" << dot_escape(g.name) << " ("
    << flops << "; io " << dtype_name(g.io_dtype) << ", intermediate " << dtype_name(g.intermediate_dtype)
    << ")\\nboxes: tensors in memory; dashed: virtual tensors (never written to memory); rounded: ops\"];\n"
    << "  node [fontname=\"Helvetica\", fontsize=10];\n"
    << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  auto tensor_node = [&](size_t i, const char* indent) {
    const ResolvedTensor& t = g.tensors[i];
    o << indent << "t" << i << " [label=\"" << tensor_label(t) << "\"";
    if (t.scalar_value) {
      o << ", shape=plaintext";
    } else if (t.is_virtual) {
      o << ", shape=box, style=dashed, color=gray40";
    } else {
      o << ", shape=box, style=filled, fillcolor=" << (t.is_input ? "lightblue" : "palegreen");
    }
    o << "];\n";
  };
  auto op_node = [&](size_t i, const char* indent) {
    o << indent << "op" << i << " [label=\"" << op_label(g, g.ops[i])
      << "\", shape=box, style=\"rounded,filled\", fillcolor=lightyellow];\n";
  };
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!plan || !g.tensors[i].is_virtual) tensor_node(i, "  ");
  }
  if (plan && !plan->parts.empty()) {
    // A partitioned plan: one cluster per part; a virtual tensor inside one part stays in it,
    // one that crosses a cut is a temporary in the workspace, drawn between the clusters.
    auto part_of_op = [&](size_t op) {
      for (size_t k = 0; k < plan->parts.size(); ++k) {
        const auto& p = plan->parts[k];
        if (static_cast<int>(op) >= p.first_op && static_cast<int>(op) < p.first_op + p.op_count)
          return static_cast<int>(k);
      }
      return -1;
    };
    std::vector<int> home(g.tensors.size(), -1);  // part holding a virtual tensor, -2: crosses a cut
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const int k = part_of_op(i);
      auto mark = [&](int t) {
        if (!g.tensors[t].is_virtual) return;
        home[t] = home[t] == -1 || home[t] == k ? k : -2;
      };
      for (const auto& [role, idx] : g.ops[i].inputs) mark(idx);
      for (const auto& [role, idx] : g.ops[i].outputs) mark(idx);
    }
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      if (home[i] == -2) {
        o << "  t" << i << " [label=\"" << tensor_label(g.tensors[i])
          << "\\ntemporary between parts (in the workspace)\", shape=box, style=\"dashed,bold\", "
             "color=darkorange];\n";
      }
    }
    for (size_t k = 0; k < plan->parts.size(); ++k) {
      const auto& p = plan->parts[k];
      o << "  subgraph cluster_part" << k << " {\n    label=\"part " << (k + 1) << " of "
        << plan->parts.size() << ": " << dot_escape(p.engine) << "\\nworkspace "
        << dot_escape(format_bytes(p.workspace_bytes)) << "\";\n"
        << "    style=\"rounded,bold\"; color=darkorange;\n";
      for (size_t i = 0; i < g.tensors.size(); ++i) {
        if (home[i] == static_cast<int>(k)) tensor_node(i, "    ");
      }
      for (int i = p.first_op; i < p.first_op + p.op_count && i < static_cast<int>(g.ops.size()); ++i)
        op_node(i, "    ");
      o << "  }\n";
    }
    o << "  label_parts [shape=plaintext, label=\"no engine runs the whole graph: " << plan->parts.size()
      << " parts run in turn as one plan (" << dot_escape(plan->source) << ")\"];\n";
  } else if (plan) {
    // cuDNN runs the whole graph as one engine: one cluster holds every op and
    // the virtual tensors that stay inside it.
    o << "  subgraph cluster_plan {\n"
      << "    label=\"one cuDNN engine for the whole graph: " << dot_escape(plan->engine) << "\\nworkspace "
      << dot_escape(format_bytes(plan->workspace_bytes)) << " (" << plan->workspace_bytes << " bytes); "
      << dot_escape(plan->source);
    if (!plan->device.empty()) o << "; " << dot_escape(plan->device);
    o << "\";\n    style=\"rounded,bold\"; color=darkorange;\n";
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      if (g.tensors[i].is_virtual) tensor_node(i, "    ");
    }
    for (size_t i = 0; i < g.ops.size(); ++i) op_node(i, "    ");
    o << "  }\n";
  } else {
    for (size_t i = 0; i < g.ops.size(); ++i) op_node(i, "  ");
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (const auto& [role, idx] : g.ops[i].inputs)
      o << "  t" << idx << " -> op" << i << " [label=\"" << dot_escape(role) << "\"];\n";
    for (const auto& [role, idx] : g.ops[i].outputs)
      o << "  op" << i << " -> t" << idx << " [label=\"" << dot_escape(role) << "\"];\n";
  }
  o << "}\n";
  return o.str();
}

std::string pipeline_dot(const Pipeline& p) {
  std::ostringstream o;
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.3g GFLOP", p.flops() / 1e9);
  o << "digraph fusebox_pipeline {\n"
    << "  graph [rankdir=TB, fontname=\"Helvetica\", labelloc=t, label=\"pipeline " << dot_escape(p.name)
    << " (" << p.stages.size() << " stages, " << flops
    << ")\\nboxes: buffers (blue: inputs, grey: constants, white: intermediates, green: outputs); "
       "clusters: stages, one cuDNN graph each\"];\n"
    << "  node [fontname=\"Helvetica\", fontsize=10];\n"
    << "  edge [fontname=\"Helvetica\", fontsize=9];\n";
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const PipelineBuffer& buf = p.buffers[b];
    const char* fill = buf.kind == BufferKind::kInput      ? "lightblue"
                       : buf.kind == BufferKind::kConstant ? "lightgray"
                       : buf.kind == BufferKind::kOutput   ? "palegreen"
                                                           : "white";
    o << "  b" << b << " [label=\"" << dot_escape(buf.name) << "\\n"
      << common::dims_string(buf.dims) << " " << dtype_name(buf.dtype) << "\\n"
      << buffer_kind_name(buf.kind);
    if (!buf.file.empty()) o << " " << dot_escape(buf.file);
    o << "\", shape=box, style=filled, fillcolor=" << fill << "];\n";
  }
  // Op nodes are s<stage>_<op>; a stage's graph tensors bound to buffers are
  // drawn as edges to and from the buffer nodes, the rest stay inside.
  for (size_t k = 0; k < p.order.size(); ++k) {
    const int s = p.order[k];
    const PipelineStage& st = p.stages[s];
    o << "  subgraph cluster_s" << s << " {\n    label=\"" << (k + 1) << ". " << dot_escape(st.name)
      << ": graph " << dot_escape(st.graph.name) << " (" << dot_escape(st.graph_file) << ")\";\n"
      << "    style=\"rounded,bold\"; color=darkorange;\n";
    for (size_t i = 0; i < st.graph.ops.size(); ++i) {
      const ResolvedOp& op = st.graph.ops[i];
      o << "    s" << s << "_" << i << " [label=\"" << dot_escape(op.name) << "\\n"
        << dot_escape(op_type_name(op.attrs))
        << "\", shape=box, style=\"rounded,filled\", fillcolor=lightyellow];\n";
    }
    o << "  }\n";
    // Inside a stage: op -> op through virtual tensors, labelled with the tensor.
    std::map<int, size_t> writer;  // graph tensor index -> op writing it
    for (size_t i = 0; i < st.graph.ops.size(); ++i)
      for (const auto& [role, t] : st.graph.ops[i].outputs) writer[t] = i;
    for (size_t i = 0; i < st.graph.ops.size(); ++i) {
      for (const auto& [role, t] : st.graph.ops[i].inputs) {
        const ResolvedTensor& tensor = st.graph.tensors[t];
        auto bound = st.bind.find(tensor.name);
        if (bound != st.bind.end()) {
          o << "  b" << bound->second << " -> s" << s << "_" << i << " [label=\"" << dot_escape(tensor.name)
            << "\"];\n";
        } else if (auto w = writer.find(t); w != writer.end()) {
          o << "  s" << s << "_" << w->second << " -> s" << s << "_" << i << " [label=\""
            << dot_escape(tensor.name) << "\", style=dashed];\n";
        }
      }
      for (const auto& [role, t] : st.graph.ops[i].outputs) {
        const ResolvedTensor& tensor = st.graph.tensors[t];
        if (auto bound = st.bind.find(tensor.name); bound != st.bind.end())
          o << "  s" << s << "_" << i << " -> b" << bound->second << " [label=\"" << dot_escape(tensor.name)
            << "\"];\n";
      }
    }
  }
  o << "}\n";
  return o.str();
}

Status write_dot(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size())
      return IoError("--dot: cannot write to standard output");
    return Status::Ok();
  }
  return common::write_file_atomic(path, text, "--dot file");
}

}  // namespace fusebox::cli
