// fusebox shapes: the cost of new shapes of a symbolic graph, built through
// the session's kernel cache (dynamic shapes) and cold (static builds), side
// by side (issue 11: 32 new shapes at least 10x cheaper with the cache).
#include <cstdio>
#include <optional>
#include <set>

#include "common.h"
#include "common/stopwatch.h"

namespace fusebox::cli {
namespace {

struct ShapesArgs {
  std::string graph, device, heuristics = "auto", mode = "both";
  std::vector<std::string> sweeps;
  double target_speedup = 10;
  bool json = false;
  bool no_engine_reuse = false, always_dynamic = false, no_warmup = false, no_override_shapes = false;
};

struct Row {
  ShapeValues shape;
  bool ok = false;
  double ms = 0;  // bind + resolve + get_plan, wall clock
  PlanReport rep;
  std::string error;
};

// Where a build's time went: {step name: ms} for the steps that ran.
nlohmann::json step_times(const BuildReport& b) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& st : b.steps) {
    if (st.ran) out[st.name] = st.ms;
  }
  return out;
}

nlohmann::json row_json(const std::string& mode, const Row& r) {
  return {{"mode", mode},
          {"shape", r.shape},
          {"shape_text", shape_text(r.shape)},
          {"ok", r.ok},
          {"ms", r.ms},
          {"build_ms", r.rep.build.total_ms()},
          {"steps", step_times(r.rep.build)},
          {"behavior_notes",
           r.rep.build.notes_known ? nlohmann::json(r.rep.build.behavior_notes) : nlohmann::json(nullptr)},
          {"engine", r.rep.engine},
          {"dynamic_shape", r.rep.dynamic_shape},
          {"kernel_cache", r.rep.kernel_cache},
          {"dynamic_fallback", r.rep.dynamic_fallback},
          {"static_policy", r.rep.static_policy},
          {"static_probe_ms", r.rep.static_probe_ms},
          {"engine_replayed", r.rep.engine_replayed},
          {"replay_failed", r.rep.replay_failed},
          {"override_shape", r.rep.override_shape},
          {"override_ms", r.rep.override_ms},
          {"override_refused", r.rep.override_refused},
          {"plan_check_ms", r.rep.plan_check.ms},
          {"error", r.error}};
}

// How the session served a shape, for the per-shape lines.
std::string pass_state(const PlanReport& r) {
  if (r.source == PlanSource::kShapeOverride) return "shape override (no build)";
  if (r.override_shape == "built") return "override-enabled build, kernel cache " + r.kernel_cache;
  if (r.kernel_cache != "off") return "kernel cache " + r.kernel_cache;
  return r.static_policy.empty() ? "static" : "static (precompiled engine)";
}

// The same in the table's column: "override", "cold+ovr" (built override-enabled), "warm+reuse" (the first
// shape's engine replayed, no heuristics), "cold", "static".
std::string short_state(const PlanReport& r) {
  if (r.source == PlanSource::kShapeOverride) return "override";
  if (r.kernel_cache == "off") return "static";
  return r.kernel_cache + (r.override_shape == "built" ? "+ovr" : r.engine_replayed ? "+reuse" : "");
}

double total(const std::vector<Row>& rows) {
  double t = 0;
  for (const auto& r : rows) t += r.ms;
  return t;
}

}  // namespace

Runner add_shapes(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "shapes",
      "Build many concrete shapes of a symbolic graph, through the kernel cache (dynamic shapes) and "
      "cold (static builds), and report each shape's cost");
  auto a = std::make_shared<ShapesArgs>();
  cmd->add_option("graph", a->graph, "Symbolic graph JSON file")->required();
  cmd->add_option("--shapes", a->sweeps,
                  "Values of one symbol: NAME=LO..HI, NAME=LO..HI:STEP or NAME=V1,V2,...; repeat for several "
                  "symbols (every combination is built)")
      ->required();
  cmd->add_option("--mode", a->mode, "both (kernel cache, then cold), kernel-cache or cold")
      ->check(CLI::IsMember({"both", "kernel-cache", "cold"}))
      ->capture_default_str();
  cmd->add_option("--device", a->device, "Device-properties file: build deviceless for that GPU");
  cmd->add_option("--heuristics", a->heuristics,
                  "Heuristic modes: auto, or a comma-separated list of a, b, fallback")
      ->capture_default_str();
  cmd->add_option("--target-speedup", a->target_speedup,
                  "Cold total over kernel-cache total that counts as met in the summary")
      ->capture_default_str();
  cmd->add_flag(
      "--no-engine-reuse", a->no_engine_reuse,
      "Kernel-cache pass: let the heuristics choose an engine for every shape instead of reusing the "
      "first shape's");
  cmd->add_flag(
      "--always-dynamic", a->always_dynamic,
      "Kernel-cache pass: build every shape with dynamic shapes, also where the first build's engine has "
      "precompiled kernels (by default those shapes build statically: the session's policy)");
  cmd->add_flag(
      "--no-warmup", a->no_warmup,
      "Charge the process's one-time cuDNN costs (engine libraries) to the first pass's first build "
      "instead of one untimed static build of a shape outside the sweep, reported apart");
  cmd->add_flag("--no-override-shapes", a->no_override_shapes,
                "Kernel-cache pass: build every shape instead of serving later shapes by execute-time shape "
                "override of the plan built for the first (used where cuDNN 9.23+ runs on a GPU)");
  cmd->add_flag("--json", a->json,
                "Write one JSON document to stdout (a row per shape and mode, and a summary)");
  return [a]() -> int {
    auto spec = load_graph_file(a->graph);
    if (!spec.ok()) return fail("shapes", spec.status());
    if (spec->symbols.empty()) {
      return fail("shapes",
                  InvalidArgument(a->graph + ": graph '" + spec->name +
                                  "' declares no symbols: nothing to sweep (see docs/graph-format.md, "
                                  "\"Symbolic dims\")"));
    }
    std::vector<ShapeSweep> sweeps;
    for (const auto& text : a->sweeps) {
      auto s = parse_shape_sweep(text);
      if (!s.ok()) return fail("shapes", s.status().WithContext("--shapes"));
      sweeps.push_back(std::move(s).value());
    }
    const std::vector<ShapeValues> shapes = sweep_shapes(sweeps);
    // Every shape is checked before anything is built: a value out of range is bad input.
    for (const auto& shape : shapes) {
      auto bound = bind_shape(*spec, shape);
      if (!bound.ok()) return fail("shapes", bound.status().WithContext(a->graph));
      auto g = resolve(*bound);
      if (!g.ok()) {
        return fail("shapes", g.status().WithContext(a->graph + " at shape " + shape_text(shape)));
      }
    }
    auto modes = parse_heuristics_flag(a->heuristics);
    if (!modes.ok()) return fail("shapes", modes.status());
    SessionOptions so;
    so.device_properties_file = a->device;  // no plan cache: every shape is built
    auto session = Session::create(so);
    if (!session.ok()) return fail("shapes", session.status());

    // The process's one-time costs (cuDNN's engine libraries, NVRTC's start) fall on whichever build
    // comes first. One static build of a shape the sweep does not hold pays them outside both totals
    // (reported apart); with --no-warmup, or when the sweep holds every value of a symbol, the
    // kernel-cache pass runs first and pays them, so the comparison does not flatter it.
    double warmup_ms = -1;
    std::optional<ShapeValues> warmup_shape;
    if (!a->no_warmup) {
      ShapeValues w;
      bool found = true;
      for (const auto& [sym, range] : spec->symbols) {
        std::set<int64_t> used;
        for (const auto& shape : shapes)
          if (auto it = shape.find(sym); it != shape.end()) used.insert(it->second);
        std::optional<int64_t> pick;
        for (int64_t v : {range.min, range.max, range.default_value})
          if (!used.count(v)) pick = v;
        for (int64_t v = range.min; !pick && v <= range.max && v < range.min + 4096; ++v)
          if (!used.count(v)) pick = v;
        if (!pick) {
          found = false;
          break;
        }
        w[sym] = *pick;
      }
      if (found) {
        PlanRequest request;
        request.use_tuned_cache = false;
        request.dynamic_shape = false;
        PlanReport rep;
        const common::Stopwatch watch;
        auto got = (*session)->get_plan(*spec, w, request, &rep);
        warmup_ms = watch.ms();
        warmup_shape = w;
        if (!a->json) {
          const std::string& m = got.status().message();
          const std::string what = got.ok() ? std::string("static, outside both totals")
                                            : "FAILED (ignored): " + safe(m.substr(0, m.find('\n')));
          std::fprintf(stderr, "  %-12s %-20s %10.2f ms  %s\n", "warm-up", safe(shape_text(w)).c_str(),
                       warmup_ms, what.c_str());
        }
      }
    }
    std::vector<std::string> passes;
    if (a->mode != "cold") passes.push_back("kernel_cache");
    if (a->mode != "kernel-cache") passes.push_back("cold");
    std::map<std::string, std::vector<Row>> rows;
    for (const auto& pass : passes) {
      PlanRequest request;
      request.heuristics = *modes;
      request.use_tuned_cache = false;
      request.dynamic_shape = pass == "kernel_cache";
      request.reuse_engine = !a->no_engine_reuse;
      request.static_when_precompiled = !a->always_dynamic;
      request.override_shapes = !a->no_override_shapes;
      for (const auto& shape : shapes) {
        Row row;
        row.shape = shape;
        const common::Stopwatch watch;
        auto got = (*session)->get_plan(*spec, shape, request, &row.rep);
        row.ms = watch.ms();
        row.ok = got.ok();
        if (!got.ok()) row.error = got.status().message().substr(0, got.status().message().find('\n'));
        if (!a->json) {
          std::fprintf(stderr, "  %-12s %-20s %10.2f ms  %s\n", pass.c_str(), safe(shape_text(shape)).c_str(),
                       row.ms,
                       row.ok ? safe(pass_state(row.rep)).c_str() : ("FAILED: " + safe(row.error)).c_str());
        }
        rows[pass].push_back(std::move(row));
      }
    }

    int failed = 0;
    for (const auto& [pass, list] : rows)
      for (const auto& r : list) failed += r.ok ? 0 : 1;
    const bool both = rows.count("kernel_cache") && rows.count("cold");
    const double kc_ms = rows.count("kernel_cache") ? total(rows["kernel_cache"]) : 0;
    const double cold_ms = rows.count("cold") ? total(rows["cold"]) : 0;
    const double speedup = both && kc_ms > 0 ? cold_ms / kc_ms : 0;
    std::string fallback;
    if (rows.count("kernel_cache")) {
      for (const auto& r : rows["kernel_cache"])
        if (!r.rep.dynamic_fallback.empty()) fallback = r.rep.dynamic_fallback;
    }
    std::string override_refused;
    if (rows.count("kernel_cache")) {
      for (const auto& r : rows["kernel_cache"])
        if (!r.rep.override_refused.empty()) override_refused = r.rep.override_refused;
    }

    const DeviceTarget& target = (*session)->target();
    if (a->json) {
      nlohmann::json list = nlohmann::json::array();
      for (const auto& pass : passes)
        for (const auto& r : rows[pass]) {
          nlohmann::json j = row_json(pass, r);
          j["graph"] = spec->name;
          j["graph_file"] = a->graph;
          list.push_back(std::move(j));
        }
      nlohmann::json summary = {
          {"shapes", shapes.size()},
          {"failed", failed},
          {"kernel_cache_total_ms", kc_ms},
          {"cold_total_ms", cold_ms},
          {"speedup", speedup},
          {"target_speedup", a->target_speedup},
          {"meets_target", both && failed == 0 && speedup >= a->target_speedup},
          {"dynamic_fallback", fallback},
          {"override_refused", override_refused},
          {"warmup_ms", warmup_ms >= 0 ? nlohmann::json(warmup_ms) : nlohmann::json(nullptr)},
          {"warmup_shape", warmup_shape ? nlohmann::json(*warmup_shape) : nlohmann::json(nullptr)}};
      nlohmann::json doc = {{"graph", spec->name},
                            {"graph_file", a->graph},
                            {"device", target.device_name},
                            {"deviceless", target.deviceless()},
                            {"rows", list},
                            {"summary", summary}};
      std::printf("%s\n", dump(doc).c_str());
    } else {
      std::printf("%s (%s): %zu shapes, %s (sm_%d)%s\n", safe(spec->name).c_str(), safe(a->graph).c_str(),
                  shapes.size(), safe(target.device_name).c_str(), target.sm_version,
                  target.deviceless() ? ", deviceless" : ", live GPU");
      std::printf("  %-20s %22s %14s  %s\n", "shape", "kernel cache (ms)", "cold (ms)", "engine");
      for (size_t i = 0; i < shapes.size(); ++i) {
        std::string kc = "-", cold = "-", engine;
        char buf[64];
        if (rows.count("kernel_cache")) {
          const Row& r = rows["kernel_cache"][i];
          // "warm+reuse": the first shape's engine replayed (no heuristics).
          const std::string state = !r.ok ? "FAILED" : short_state(r.rep);
          std::snprintf(buf, sizeof buf, "%.2f %s", r.ms, state.c_str());
          kc = buf;
          engine = r.rep.engine;
        }
        if (rows.count("cold")) {
          const Row& r = rows["cold"][i];
          std::snprintf(buf, sizeof buf, "%.2f%s", r.ms, r.ok ? "" : " FAILED");
          cold = buf;
          if (engine.empty()) engine = r.rep.engine;
        }
        std::printf("  %-20s %22s %14s  %s\n", safe(shape_text(shapes[i])).c_str(), kc.c_str(), cold.c_str(),
                    safe(engine).c_str());
      }
      if (warmup_shape)
        std::printf(
            "  warm-up: one static build at %s, %.2f ms, outside both totals (the process's one-time "
            "cuDNN loads)\n",
            safe(shape_text(*warmup_shape)).c_str(), warmup_ms);
      if (!fallback.empty())
        std::printf("  dynamic shapes refused, static builds served: %s\n", safe(fallback).c_str());
      if (!override_refused.empty())
        std::printf("  shape override not used: %s\n", safe(override_refused).c_str());
      if (both) {
        std::printf("  total: kernel cache %.2f ms, cold %.2f ms: %.1fx less time (target %.0fx: %s)\n",
                    kc_ms, cold_ms, speedup, a->target_speedup,
                    failed == 0 && speedup >= a->target_speedup ? "met" : "NOT met");
      } else {
        std::printf("  total: %.2f ms\n", kc_ms + cold_ms);
      }
      for (const auto& [pass, list] : rows)
        for (const auto& r : list)
          if (!r.ok)
            std::printf("  %s %s failed: %s\n", pass.c_str(), safe(shape_text(r.shape)).c_str(),
                        safe(r.error).c_str());
    }
    return failed ? kExitFailure : kExitOk;
  };
}

}  // namespace fusebox::cli
