// fusebox build: the five steps, timed, deviceless with --device.
#include <cstdio>

#include "common.h"
#include "fusebox/plan_file.h"

namespace fusebox::cli {

Runner add_build(CLI::App& app) {
  auto* cmd = app.add_subcommand("build", "Run the five steps (validate, build operation graph, create execution "
                                          "plans, check support, build plans) and report each");
  struct Args {
    std::string graph, device, heuristics = "a", engine, plan_out;
    int64_t max_workspace = -1;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->graph, "Graph JSON file")->required();
  cmd->add_option("--device", a->device, "Device-properties file: build deviceless for that GPU (no GPU needed)");
  cmd->add_option("--heuristics", a->heuristics, "Heuristic modes, comma-separated: a, b, fallback")
      ->capture_default_str();
  cmd->add_option("--engine", a->engine, "Pin an engine by name (see `fusebox engines`)");
  cmd->add_option("--max-workspace", a->max_workspace, "Reject plans needing more workspace (bytes)");
  cmd->add_option("--plan-out", a->plan_out, "Write the built plan to this file");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  return [a]() {
    auto emit_error = [&](const Status& st, const BuildReport* r) {
      if (a->json) {
        nlohmann::json j = r ? to_json(*r) : nlohmann::json::object();
        j["graph_file"] = a->graph;
        j["ok"] = false;
        j["error"] = st.message();
        std::printf("%s\n", j.dump(2).c_str());
      } else if (r && !r->steps.empty()) {
        print_build_report(*r);
      }
      return fail("build", st);
    };
    auto g = load_resolved(a->graph);
    if (!g.ok()) return emit_error(g.status(), nullptr);
    auto modes = parse_heuristic_modes(a->heuristics);
    if (!modes.ok()) return emit_error(modes.status(), nullptr);
    auto target = a->device.empty() ? DeviceTarget::live_gpu(0) : DeviceTarget::from_file(a->device);
    if (!target.ok()) return emit_error(target.status(), nullptr);

    BuildOptions options;
    options.heuristics = *modes;
    options.engine = a->engine;
    options.max_workspace_bytes = a->max_workspace;
    BuildReport report;
    auto plan = build_plan(*g, *target, options, &report);
    if (!plan.ok()) return emit_error(plan.status().WithContext("[graph '" + g->name + "']"), &report);
    if (!a->plan_out.empty()) {
      auto bytes = plan->serialize();
      if (!bytes.ok()) return emit_error(bytes.status(), &report);
      Status st = write_plan_file(a->plan_out, make_plan_info(*g, *plan, *target), *bytes);
      if (!st.ok()) return emit_error(st, &report);
    }
    if (a->json) {
      nlohmann::json j = to_json(report);
      j["graph"] = g->name;
      j["graph_file"] = a->graph;
      j["plan_out"] = a->plan_out;
      j["ok"] = true;
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s (%s)\n", g->name.c_str(), a->graph.c_str());
      print_build_report(report);
      if (!a->plan_out.empty()) std::printf("  plan written to %s\n", a->plan_out.c_str());
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
