// fusebox build: the five steps, timed, deviceless with --device; through the
// plan cache unless --no-cache.
#include <cstdio>

#include "common.h"
#include "common/plan_info_json.h"
#include "dot.h"
#include "fusebox/plan_file.h"

namespace fusebox::cli {
namespace {

struct BuildArgs {
  std::vector<std::string> graphs;
  std::string device, heuristics = "auto", engine, plan_out, dot, shape;
  bool want_dot = false;
  int64_t max_workspace = -1;
  bool json = false;
  bool no_plan_check = false;
  bool no_reference_fallback = false;
  CacheFlags cache;
};

// Builds one graph through the session; appends its JSON report to `all` when given.
int build_one(const BuildArgs& a, const std::string& path, Result<std::unique_ptr<Session>>& session,
              nlohmann::json* all) {
  auto emit_error = [&](const Status& st, const PlanReport* r) {
    if (all) {
      nlohmann::json j = r ? to_json(r->build) : nlohmann::json::object();
      if (r) j["plan"] = to_json(*r);
      j["graph_file"] = path;
      j["ok"] = false;
      j["error"] = st.message();
      all->push_back(j);
    } else if (r && !r->build.steps.empty()) {
      std::printf("%s\n", safe(path).c_str());
      print_attempts(*r);
      print_build_report(r->build);
      print_plan_check(*r);
    }
    return fail("build", st);
  };
  auto g = load_resolved(path, a.shape);
  if (!g.ok()) return emit_error(g.status(), nullptr);
  auto modes = parse_heuristics_flag(a.heuristics);
  if (!modes.ok()) return emit_error(modes.status(), nullptr);
  if (!session.ok()) return emit_error(session.status(), nullptr);

  PlanRequest request;
  request.heuristics = *modes;
  request.engine = a.engine;
  request.max_workspace_bytes = a.max_workspace;
  request.use_tuned_cache = false;  // build reports what the heuristics choose
  request.check_plan = !a.no_plan_check;
  request.reference_fallback = !a.no_reference_fallback;
  PlanReport rep;
  auto got = (*session)->get_plan(*g, request, &rep);
  print_warnings(rep.warnings);
  if (!got.ok()) return emit_error(got.status().WithContext("[graph '" + g->name + "']"), &rep);
  const Plan& plan = *got;
  const bool hit = rep.cache == "hit";
  if (!a.plan_out.empty()) {
    auto bytes = plan.serialize();
    if (!bytes.ok()) return emit_error(bytes.status(), &rep);
    PlanFileInfo info = make_plan_info(*g, plan, (*session)->target());
    if (rep.plan_check.state == "passed" || rep.plan_check.state == "trusted") {
      // Checked on this GPU now or earlier: the file carries the sealed verdict, so loading it skips the
      // check.
      PlanCheckRun verdict;
      verdict.passed = true;
      verdict.detail = rep.plan_check.detail.empty() ? "passed the plan check" : rep.plan_check.detail;
      record_plan_check(info, verdict, plan_info_json::payload_xxh3(bytes->data(), bytes->size()));
    }
    Status st = write_plan_file(a.plan_out, info, *bytes);
    if (!st.ok()) return emit_error(st, &rep);
  }
  if (a.want_dot) {
    DotPlan dp;
    dp.engine = plan.engine_name();
    dp.workspace_bytes = plan.workspace_bytes();
    dp.source = hit ? "plan cache hit" : "built now";
    const DeviceTarget& target = (*session)->target();
    dp.device = target.device_name + (target.deviceless() ? " (deviceless)" : "");
    for (const auto& part : rep.partition_parts) {
      dp.parts.push_back({part.first_op, part.op_count, part.engine, part.workspace_bytes});
    }
    Status st = write_dot(a.dot, graph_dot(*g, &dp));
    if (!st.ok()) return emit_error(st, &rep);
  }
  if (all) {
    nlohmann::json j = to_json(rep.build);
    j["graph"] = g->name;
    j["graph_file"] = path;
    j["plan_out"] = a.plan_out;
    j["cache"] = rep.cache;
    j["cache_key"] = rep.cache_key;
    j["cache_stored"] = rep.stored;
    j["plan"] = to_json(rep);
    if (hit) {
      j["engine"] = plan.engine_name();
      j["workspace_bytes"] = plan.workspace_bytes();
      j["cache_lookup_ms"] = rep.lookup_ms;
      j["deserialize_ms"] = rep.deserialize_ms;
      j["cached_built_deviceless"] = rep.cache_entry.info.built_deviceless;
      j["cached_created_utc"] = rep.cache_entry.created_utc;
    }
    j["ok"] = true;
    all->push_back(j);
  } else if (a.want_dot && (a.dot.empty() || a.dot == "-")) {
    // stdout holds the picture alone, for `| dot -Tsvg`
  } else {
    std::printf("%s (%s)\n", safe(g->name).c_str(), safe(path).c_str());
    if (hit) {
      std::printf(
          "  plan cache hit (%s): engine %s, workspace %s, built %s on %s; lookup %.2f ms, deserialize %.2f "
          "ms\n",
          rep.cache_key.c_str(), safe(plan.engine_name()).c_str(),
          format_bytes(plan.workspace_bytes()).c_str(),
          rep.cache_entry.info.built_deviceless ? "deviceless" : "on a GPU",
          safe(rep.cache_entry.created_utc).c_str(), rep.lookup_ms, rep.deserialize_ms);
    } else {
      print_attempts(rep);
      print_build_report(rep.build);
      if (!rep.shape.empty()) std::printf("  %s\n", safe(rep.shape_summary()).c_str());
      if (rep.stored) std::printf("  stored in the plan cache (%s)\n", rep.cache_key.c_str());
    }
    print_plan_check(rep);
    if (!a.plan_out.empty()) std::printf("  plan written to %s\n", safe(a.plan_out).c_str());
  }
  return kExitOk;
}

}  // namespace

Runner add_build(CLI::App& app) {
  auto* cmd = app.add_subcommand("build",
                                 "Run the five steps (validate, build operation graph, create execution "
                                 "plans, check support, build plans) and report each");
  auto a = std::make_shared<BuildArgs>();
  cmd->add_option("graph", a->graphs, "Graph JSON file(s)")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_option("--device", a->device,
                  "Device-properties file: build deviceless for that GPU (no GPU needed)");
  cmd->add_option("--heuristics", a->heuristics,
                  "Heuristic modes: auto (a, then b, then fallback, until one yields an engine), or a "
                  "comma-separated list of a, b, fallback to pin")
      ->capture_default_str();
  cmd->add_option("--engine", a->engine, "Pin an engine by name (see `fusebox engines`)");
  cmd->add_option("--max-workspace", a->max_workspace, "Reject plans needing more workspace (bytes)");
  cmd->add_option("--plan-out", a->plan_out, "Write the built plan to this file");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_plan_check_flag(cmd, a->no_plan_check);
  add_reference_fallback_flag(cmd, a->no_reference_fallback);
  auto* dot =
      cmd->add_option("--dot", a->dot,
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
    // Before anything is opened or written (opening the cache creates it): no output is an input.
    std::vector<common::NamedPath> inputs = {{"--device file", a->device}, cache_input(a->cache)};
    for (const std::string& g : a->graphs) inputs.push_back({"graph file", g});
    std::vector<common::NamedPath> outputs = {{"--plan-out", a->plan_out}};
    if (a->want_dot && a->dot != "-") outputs.push_back({"--dot file", a->dot});
    if (Status st = common::check_outputs_spare_inputs(outputs, inputs); !st.ok()) return fail("build", st);
    auto cache = open_cache(a->cache);
    SessionOptions so;
    so.device_properties_file = a->device;
    so.cache = cache.get();
    auto session = Session::create(so);
    nlohmann::json all = nlohmann::json::array();
    int rc = kExitOk;
    for (const std::string& graph : a->graphs) {
      int one = build_one(*a, graph, session, a->json ? &all : nullptr);
      if (one != kExitOk && rc == kExitOk) rc = one;
    }
    if (a->json)
      std::printf("%s\n", dump(all.size() == 1 ? all[0] : nlohmann::json{{"graphs", all}}).c_str());
    return rc;
  };
}

}  // namespace fusebox::cli
