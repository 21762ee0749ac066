// fusebox engines: every candidate plan the heuristics offer, with its notes.
#include <cstdio>

#include "common.h"

namespace fusebox::cli {

Runner add_engines(CLI::App& app) {
  auto* cmd = app.add_subcommand("engines",
                                 "List every candidate engine for a graph: name, knobs, notes, "
                                 "workspace, support check (deviceless with --device)");
  struct Args {
    std::string shape;
    std::string graph, device, heuristics = "a,b,fallback";
    bool build = false, json = false, cudnn = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->graph, "Graph JSON file")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_option("--device", a->device, "Device-properties file (deviceless)");
  cmd->add_option("--heuristics", a->heuristics, "Heuristic modes: a, b, fallback")->capture_default_str();
  cmd->add_flag("--build", a->build, "Also build each supported plan (slower, definitive)");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  cmd->add_flag(
      "--cudnn", a->cudnn,
      "List cuDNN's candidates also for a graph fusebox's own kernel would run (a global average pool, "
      "a norm with fp32 params: docs/architecture.md, Native ops)");
  return [a]() {
    auto g = load_resolved(a->graph, a->shape);
    if (!g.ok()) return fail("engines", g.status());
    auto modes = parse_heuristic_modes(a->heuristics);
    if (!modes.ok()) return fail("engines", modes.status());
    auto target = a->device.empty() ? DeviceTarget::live_gpu(0) : DeviceTarget::from_file(a->device);
    if (!target.ok()) return fail("engines", target.status());
    BuildOptions options;
    options.heuristics = *modes;
    options.native_kernels = !a->cudnn;
    BuildReport report;
    auto engines = list_engines(*g, *target, options, a->build, &report);
    if (!engines.ok()) {
      if (!a->json) print_build_report(report);
      return fail("engines", engines.status());
    }
    if (a->json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& e : *engines) {
        list.push_back({{"index", e.index},
                        {"name", e.name},
                        {"engine_id", e.engine_id},
                        {"knobs", e.knobs},
                        {"behavior_notes", e.behavior_notes},
                        {"numerical_notes", e.numerical_notes},
                        {"supported", e.supported},
                        {"support_message", e.support_message},
                        {"workspace_bytes", e.workspace_bytes},
                        {"duplicate_of", e.duplicate_of}});
      }
      nlohmann::json j = to_json(report);
      j["graph"] = g->name;
      j["engines"] = list;
      std::printf("%s\n", dump(j).c_str());
      return kExitOk;
    }
    std::printf("%s: %zu candidates for %s (sm_%d)\n", safe(g->name).c_str(), engines->size(),
                safe(report.device_name).c_str(), report.sm_version);
    std::printf("%4s  %-44s %-9s %12s  %s\n", "idx", "engine", "supported", "workspace", "notes");
    for (const auto& e : *engines) {
      std::string notes;
      for (const auto& n : e.numerical_notes) notes += n + " ";
      for (const auto& n : e.behavior_notes) notes += n + " ";
      std::printf("%4lld  %-44s %-9s %12s  %s\n", static_cast<long long>(e.index), e.name.c_str(),
                  e.supported ? "yes" : "no",
                  e.workspace_bytes >= 0 ? format_bytes(e.workspace_bytes).c_str() : "(--build)",
                  notes.c_str());
      if (e.duplicate_of >= 0) {
        std::printf("      (duplicate of candidate %lld)\n", static_cast<long long>(e.duplicate_of));
      } else if (!e.supported) {
        std::printf("      why not: %s\n", safe(e.support_message.substr(0, 300)).c_str());
      }
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
