// fusebox check: validate a graph file and print its tensors with inferred shapes.
// `--json` prints the resolved graph: what the Python tools (python/fusebox_tools)
// read instead of re-deriving shapes, roles, FLOPs, tolerances and masks.
#include <cstdio>

#include "common.h"
#include "dot.h"
#include "fusebox/reference.h"

namespace fusebox::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

// Bump when a key changes meaning or goes away (adding keys keeps the version).
constexpr int kCheckJsonVersion = 1;

std::string tensor_kind(const ResolvedTensor& t) {
  if (t.scalar_value) return "scalar";
  if (t.is_input) return "input";
  if (t.is_output) return "output";
  return "virtual";
}

ordered_json tensor_json(const ResolvedTensor& t) {
  ordered_json j;
  j["name"] = t.name;
  j["kind"] = tensor_kind(t);
  j["dtype"] = std::string(dtype_name(t.dtype));
  j["dims"] = t.dims;
  j["strides"] = t.strides;
  j["storage_bytes"] = t.storage_bytes();
  j["scalar"] = t.scalar_value ? ordered_json(*t.scalar_value) : ordered_json(nullptr);
  j["values"] = t.values.empty() ? ordered_json(nullptr) : ordered_json(t.values);
  j["random_lo"] = t.random_lo;
  j["random_hi"] = t.random_hi;
  return j;
}

ordered_json op_json(const ResolvedGraph& g, const ResolvedOp& op) {
  ordered_json j;
  j["name"] = op.name;
  j["op"] = std::string(op_type_name(op.attrs));
  ordered_json in = ordered_json::object(), out = ordered_json::object(), tol = ordered_json::object();
  for (const auto& [role, idx] : op.inputs) in[role] = g.tensors[idx].name;
  for (const auto& [role, idx] : op.outputs) {
    const ResolvedTensor& t = g.tensors[idx];
    out[role] = t.name;
    if (!t.is_output) continue;  // virtual: never compared
    const Tolerance tl = tolerance_for(g, t.name);
    tol[role] = {{"rel_l2", tl.rel_l2}, {"max_abs_rel", tl.max_abs_rel}, {"saturate_at", tl.saturate_at}};
  }
  j["inputs"] = std::move(in);
  j["outputs"] = std::move(out);
  j["primary_output"] = std::string(op_primary_output_role(op.attrs));
  j["compute_dtype"] = std::string(dtype_name(op.compute_dtype));
  j["attrs"] = ordered_json::parse(op_resolved_attrs_json(g, op));  // the family's own (src/graph/ops/)
  j["traits"] = traits_json(op_traits(op.attrs));  // the op's facts (fusebox ops --json lists every op's)
  j["tolerances"] = std::move(tol);
  return j;
}

ordered_json graph_json(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  ordered_json tensors = ordered_json::array(), ops = ordered_json::array();
  for (const auto& t : g.tensors) tensors.push_back(tensor_json(t));
  for (const auto& op : g.ops) ops.push_back(op_json(g, op));
  ordered_json j;
  j["ok"] = true;
  j["version"] = kCheckJsonVersion;
  j["graph"] = g.name;
  j["io_dtype"] = std::string(dtype_name(g.io_dtype));
  j["intermediate_dtype"] = std::string(dtype_name(g.intermediate_dtype));
  j["compute_dtype"] = std::string(dtype_name(g.compute_dtype));
  j["fingerprint"] = graph_fingerprint(g);
  // A symbolic graph: the concrete shape it was resolved at ({} for a static graph).
  j["shape"] = g.shape.empty() ? ordered_json::object() : ordered_json(g.shape);
  j["flops"] = g.flops(input_values_for_flops(g, inputs));
  j["bytes"] = g.bytes_moved();
  j["tensors"] = std::move(tensors);
  j["ops"] = std::move(ops);
  j["canonical_form_version"] = kCanonicalFormVersion;
  // Copies of the inputs a timed run rotates through (fusebox/runtime.h): the benchmarks' torch side reads
  // it.
  j["rotation_sets"] = input_rotation_sets(g);
  return j;
}

}  // namespace

Runner add_check(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "check", "Validate a graph file; print tensors and inferred shapes (no GPU, no cuDNN)");
  struct Args {
    std::string shape;
    std::string path, inputs, dot;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->path, "Graph JSON file")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_flag("--json", a->json, "Write the resolved graph as one JSON document to stdout");
  auto* dot =
      cmd->add_option("--dot", a->dot,
                      "Write a Graphviz picture of the resolved graph to FILE (no FILE or '-': stdout; "
                      "write --dot=FILE, or put --dot after the graph)")
          ->expected(0, 1);
  cmd->add_option("--inputs", a->inputs,
                  "Inputs as NAME=FILE.npy,...: sequence lengths for the FLOP count (others: full length)");
  return [a, dot]() {
    const bool want_dot = dot->count() > 0;
    if (want_dot && a->json && (a->dot.empty() || a->dot == "-"))
      return fail("check", InvalidArgument("--json and --dot both write to stdout: give --dot a FILE"));
    if (want_dot && !a->dot.empty() && a->dot != "-") {
      std::vector<common::NamedPath> inputs = input_list_files(a->inputs, "--inputs");
      inputs.push_back({"graph file", a->path});
      Status st = common::check_outputs_spare_inputs({{"--dot file", a->dot}}, inputs);
      if (!st.ok()) return fail("check", st);
    }
    auto fail_json = [&](const Status& st) {
      if (a->json)
        std::printf(
            "%s\n",
            common::json_dump(
                ordered_json({{"ok", false}, {"code", status_code_name(st.code())}, {"error", st.message()}}),
                2)
                .c_str());
      return fail("check", st);
    };
    auto g = load_resolved(a->path, a->shape);
    if (!g.ok()) return fail_json(g.status());
    auto inputs = load_input_files(*g, a->inputs);
    if (!inputs.ok()) return fail_json(inputs.status());
    if (want_dot) {
      Status st = write_dot(a->dot, graph_dot(*g));
      if (!st.ok()) return fail("check", st);
    }
    if (a->json) {
      std::printf("%s\n", common::json_dump(graph_json(*g, *inputs), 2).c_str());
    } else if (want_dot && (a->dot.empty() || a->dot == "-")) {
      // stdout holds the picture alone, for `| dot -Tsvg`
    } else {
      std::printf("%s: ok\n%s", safe(a->path).c_str(),
                  common::printable(describe(*g), /*keep_newlines=*/true).c_str());
      if (!inputs->empty())
        std::printf("flops with the given inputs %g\n", g->flops(input_values_for_flops(*g, *inputs)));
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
