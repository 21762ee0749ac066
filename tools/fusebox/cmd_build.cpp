// fusebox build: the five steps, timed, deviceless with --device; through the
// plan cache unless --no-cache.
#include <cstdio>

#include "common.h"
#include "dot.h"
#include "fusebox/plan_file.h"

namespace fusebox::cli {
namespace {

struct BuildArgs {
  std::vector<std::string> graphs;
  std::string device, heuristics = "a", engine, plan_out, dot;
  bool want_dot = false;
  int64_t max_workspace = -1;
  bool json = false;
  CacheFlags cache;
};

// Builds one graph; appends its JSON report to `all` when given.
int build_one(const BuildArgs& a, const std::string& path, PlanCache* cache, nlohmann::json* all) {
  auto emit_error = [&](const Status& st, const BuildReport* r) {
    if (all) {
      nlohmann::json j = r ? to_json(*r) : nlohmann::json::object();
      j["graph_file"] = path;
      j["ok"] = false;
      j["error"] = st.message();
      all->push_back(j);
    } else if (r && !r->steps.empty()) {
      std::printf("%s\n", safe(path).c_str());
      print_build_report(*r);
    }
    return fail("build", st);
  };
  if (a.want_dot && !a.dot.empty() && a.dot != "-") {
    Status st = common::refuse_overwriting_input(a.dot, "--dot file",
                                                 {{"graph file", path}, {"--device file", a.device}});
    if (!st.ok()) return emit_error(st, nullptr);
  }
  if (!a.plan_out.empty()) {
    Status st = common::refuse_overwriting_input(
        a.plan_out, "--plan-out",
        {{"graph file", path}, {"--device file", a.device}, {"plan cache", cache ? cache->path() : ""}});
    if (!st.ok()) return emit_error(st, nullptr);
  }
  auto g = load_resolved(path);
  if (!g.ok()) return emit_error(g.status(), nullptr);
  auto modes = parse_heuristic_modes(a.heuristics);
  if (!modes.ok()) return emit_error(modes.status(), nullptr);
  auto target = a.device.empty() ? DeviceTarget::live_gpu(0) : DeviceTarget::from_file(a.device);
  if (!target.ok()) return emit_error(target.status(), nullptr);

  BuildOptions options;
  options.heuristics = *modes;
  options.engine = a.engine;
  options.max_workspace_bytes = a.max_workspace;
  std::unique_ptr<GpuContext> ctx;
  if (!target->deviceless()) {
    auto created = GpuContext::create(target->device_id);
    if (!created.ok()) return emit_error(created.status(), nullptr);
    ctx = std::move(created).value();
  }
  BuildReport failed;
  auto got = plan_through_cache(cache, *g, *target, options, ctx.get(), &failed);
  if (!got.ok()) return emit_error(got.status().WithContext("[graph '" + g->name + "']"), &failed);
  print_warnings(got->warnings);
  const Plan& plan = got->plan;
  if (!a.plan_out.empty()) {
    auto bytes = plan.serialize();
    if (!bytes.ok()) return emit_error(bytes.status(), &got->report);
    Status st = write_plan_file(a.plan_out, make_plan_info(*g, plan, *target), *bytes);
    if (!st.ok()) return emit_error(st, &got->report);
  }
  if (a.want_dot) {
    DotPlan dp;
    dp.engine = plan.engine_name();
    dp.workspace_bytes = plan.workspace_bytes();
    dp.source = got->hit ? "plan cache hit" : "built now";
    dp.device = target->device_name + (target->deviceless() ? " (deviceless)" : "");
    Status st = write_dot(a.dot, graph_dot(*g, &dp));
    if (!st.ok()) return emit_error(st, &got->report);
  }
  const std::string state = cache_state(cache, got->hit);
  if (all) {
    nlohmann::json j = to_json(got->report);
    j["graph"] = g->name;
    j["graph_file"] = path;
    j["plan_out"] = a.plan_out;
    j["cache"] = state;
    j["cache_key"] = got->key;
    j["cache_stored"] = got->stored;
    if (got->hit) {
      j["engine"] = plan.engine_name();
      j["workspace_bytes"] = plan.workspace_bytes();
      j["cache_lookup_ms"] = got->lookup_ms;
      j["deserialize_ms"] = got->deserialize_ms;
      j["cached_built_deviceless"] = got->entry.info.built_deviceless;
      j["cached_created_utc"] = got->entry.created_utc;
    }
    j["ok"] = true;
    all->push_back(j);
  } else if (a.want_dot && (a.dot.empty() || a.dot == "-")) {
    // stdout holds the picture alone, for `| dot -Tsvg`
  } else {
    std::printf("%s (%s)\n", safe(g->name).c_str(), safe(path).c_str());
    if (got->hit) {
      std::printf("  plan cache hit (%s): engine %s, workspace %s, built %s on %s; lookup %.2f ms, deserialize %.2f ms\n",
                  got->key.c_str(), safe(plan.engine_name()).c_str(), format_bytes(plan.workspace_bytes()).c_str(),
                  got->entry.info.built_deviceless ? "deviceless" : "on a GPU", safe(got->entry.created_utc).c_str(),
                  got->lookup_ms, got->deserialize_ms);
    } else {
      print_build_report(got->report);
      if (got->stored) std::printf("  stored in the plan cache (%s)\n", got->key.c_str());
    }
    if (!a.plan_out.empty()) std::printf("  plan written to %s\n", safe(a.plan_out).c_str());
  }
  return kExitOk;
}

}  // namespace

Runner add_build(CLI::App& app) {
  auto* cmd = app.add_subcommand("build", "Run the five steps (validate, build operation graph, create execution "
                                          "plans, check support, build plans) and report each");
  auto a = std::make_shared<BuildArgs>();
  cmd->add_option("graph", a->graphs, "Graph JSON file(s)")->required();
  cmd->add_option("--device", a->device, "Device-properties file: build deviceless for that GPU (no GPU needed)");
  cmd->add_option("--heuristics", a->heuristics, "Heuristic modes, comma-separated: a, b, fallback")
      ->capture_default_str();
  cmd->add_option("--engine", a->engine, "Pin an engine by name (see `fusebox engines`)");
  cmd->add_option("--max-workspace", a->max_workspace, "Reject plans needing more workspace (bytes)");
  cmd->add_option("--plan-out", a->plan_out, "Write the built plan to this file");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  auto* dot = cmd->add_option("--dot", a->dot,
                              "Write a Graphviz picture of the graph and the engine chosen (one engine for the "
                              "whole graph) to FILE (no FILE or '-': stdout; write --dot=FILE)")
                  ->expected(0, 1);
  add_cache_flags(cmd, a->cache);
  return [a, dot]() {
    a->want_dot = dot->count() > 0;
    if (a->want_dot && a->graphs.size() > 1) {
      return fail("build", InvalidArgument("--dot takes one graph; " + std::to_string(a->graphs.size()) +
                                           " were given"));
    }
    if (a->want_dot && a->json && (a->dot.empty() || a->dot == "-"))
      return fail("build", InvalidArgument("--json and --dot both write to stdout: give --dot a FILE"));
    if (a->graphs.size() > 1 && !a->plan_out.empty()) {
      return fail("build", InvalidArgument("--plan-out takes one graph; " + std::to_string(a->graphs.size()) +
                                           " were given (use --cache to keep plans for several)"));
    }
    auto cache = open_cache(a->cache);
    nlohmann::json all = nlohmann::json::array();
    int rc = kExitOk;
    for (const std::string& graph : a->graphs) {
      int one = build_one(*a, graph, cache.get(), a->json ? &all : nullptr);
      if (one != kExitOk && rc == kExitOk) rc = one;
    }
    if (a->json) std::printf("%s\n", dump(all.size() == 1 ? all[0] : nlohmann::json{{"graphs", all}}).c_str());
    return rc;
  };
}

}  // namespace fusebox::cli
