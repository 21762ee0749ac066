// fusebox check: validate a graph file and print its tensors with inferred shapes.
#include <cstdio>

#include "common.h"

namespace fusebox::cli {

Runner add_check(CLI::App& app) {
  auto* cmd = app.add_subcommand("check", "Validate a graph file; print tensors and inferred shapes (no GPU, no cuDNN)");
  auto path = std::make_shared<std::string>();
  auto json_out = std::make_shared<bool>(false);
  cmd->add_option("graph", *path, "Graph JSON file")->required();
  cmd->add_flag("--json", *json_out, "Write one JSON document to stdout");
  return [path, json_out]() {
    auto g = load_resolved(*path);
    if (!g.ok()) {
      if (*json_out) std::printf("%s\n", dump(nlohmann::json({{"ok", false}, {"error", g.status().message()}})).c_str());
      return fail("check", g.status());
    }
    if (*json_out) {
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& t : g->tensors) {
        tensors.push_back({{"name", t.name},
                           {"dims", t.dims},
                           {"strides", t.strides},
                           {"dtype", std::string(dtype_name(t.dtype))},
                           {"kind", t.scalar_value ? "scalar" : t.is_input ? "input" : t.is_output ? "output" : "virtual"}});
      }
      nlohmann::json ops = nlohmann::json::array();
      for (const auto& op : g->ops) ops.push_back({{"name", op.name}, {"op", std::string(op_type_name(op.attrs))}});
      std::printf("%s\n", dump(nlohmann::json({{"ok", true}, {"graph", g->name}, {"tensors", tensors}, {"ops", ops},
                                               {"flops", g->flops()}, {"bytes", g->bytes_moved()}}))
                              .c_str());
    } else {
      std::printf("%s: ok\n%s", safe(*path).c_str(), common::printable(describe(*g), /*keep_newlines=*/true).c_str());
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
