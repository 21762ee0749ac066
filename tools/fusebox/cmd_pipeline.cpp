// fusebox pipeline check|build|tune|run: pipeline files (docs/pipeline-format.md).
// check: the wiring of the stages, the stage order and buffers (no GPU).
// build, tune, run: every stage through one Session, as `fusebox build|tune|run`
// do for one graph. Thin over fusebox/pipeline.h and fusebox/pipeline_run.h.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "common.h"
#include "common/dims_string.h"
#include "common/stopwatch.h"
#include "dot.h"
#include "fusebox/cuda_graph.h"
#include "fusebox/pipeline.h"
#include "fusebox/pipeline_parallel.h"
#include "fusebox/pipeline_run.h"

namespace fusebox::cli {
namespace {

// --devices "0,1": CUDA device ids (a device may repeat: two sessions on one GPU).
Result<std::vector<int>> parse_device_list(const std::string& text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || !end || *end != '\0' || v < 0 || v > 1023)
      return InvalidArgument("--devices '" + text + "': '" + item +
                             "' is not a device id (accepted: a comma-separated list such as 0,1)");
    out.push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

// --shape for pipelines: values for the symbols of the stages' symbolic graphs.
void add_pipeline_shape_flag(CLI::App* cmd, std::string& shape) {
  cmd->add_option(
      "--shape", shape,
      "Values for the symbols of the stages' symbolic graphs, NAME=VALUE,... (e.g. N=4): a symbol "
      "means the same in every stage that declares it; others take their defaults");
}

Result<Pipeline> load_pipeline(const std::string& path, const std::string& shape) {
  ShapeValues values;
  if (!shape.empty()) {
    auto v = parse_shape_values(shape);
    if (!v.ok()) return v.status().WithContext("--shape");
    values = std::move(v).value();
  }
  return load_pipeline_file(path, values);
}

using ordered_json = nlohmann::ordered_json;

// Bump when a key changes meaning or goes away (adding keys keeps the version).
constexpr int kPipelineCheckJsonVersion = 1;

std::string use_text(const Pipeline& p, const BufferUse& u) {
  return p.stages[u.stage].name + "." + u.tensor;
}

ordered_json use_json(const Pipeline& p, const BufferUse& u) {
  return ordered_json({{"stage", p.stages[u.stage].name}, {"tensor", u.tensor}});
}

ordered_json pipeline_json(const Pipeline& p) {
  ordered_json j;
  j["ok"] = true;
  j["version"] = kPipelineCheckJsonVersion;
  j["pipeline"] = p.name;
  j["shape"] = p.shape;  // the symbols' values ({} for a static pipeline)
  ordered_json stages = ordered_json::array();
  for (int s : p.order) {
    const PipelineStage& st = p.stages[s];
    ordered_json bind = ordered_json::object();
    for (const auto& [tensor, bi] : st.bind) bind[tensor] = p.buffers[bi].name;
    stages.push_back({{"name", st.name},
                      {"graph", st.graph.name},
                      {"graph_file", st.graph_file},
                      {"fingerprint", graph_fingerprint(st.graph)},
                      {"flops", st.graph.flops()},
                      {"bind", std::move(bind)}});
  }
  j["stages"] = std::move(stages);
  ordered_json buffers = ordered_json::array();
  for (const auto& b : p.buffers) {
    ordered_json rd = ordered_json::array();
    for (const auto& r : b.readers) rd.push_back(use_json(p, r));
    ordered_json e;
    e["name"] = b.name;
    e["kind"] = std::string(buffer_kind_name(b.kind));
    e["dtype"] = std::string(dtype_name(b.dtype));
    e["dims"] = b.dims;
    e["strides"] = b.strides;
    e["reshape"] = b.reshape;
    e["view"] = b.is_view() ? ordered_json{{"of", p.buffers[static_cast<size_t>(b.view_of)].name},
                                           {"part", b.view_part},
                                           {"parts", b.view_parts},
                                           {"offset_elements", b.view_offset_elements(p)}}
                            : ordered_json(nullptr);
    e["file"] = b.file.empty() ? ordered_json(nullptr) : ordered_json(b.file);
    e["key"] = b.key.empty() ? ordered_json(nullptr) : ordered_json(b.key);
    e["writer"] = b.writer ? use_json(p, *b.writer) : ordered_json(nullptr);
    e["readers"] = std::move(rd);
    buffers.push_back(std::move(e));
  }
  j["buffers"] = std::move(buffers);
  j["flops"] = p.flops();
  const BufferArenaPlan arena = plan_buffer_arena(p);
  j["intermediate_bytes"] = {{"separate", arena.separate_bytes}, {"shared", arena.arena_bytes}};
  return j;
}

void print_pipeline(const Pipeline& p) {
  std::printf("%s: ok\npipeline %s: %zu stages, %zu buffers\n", safe(p.path).c_str(), safe(p.name).c_str(),
              p.stages.size(), p.buffers.size());
  if (!p.shape.empty()) std::printf("symbolic, at shape %s\n", safe(shape_text(p.shape)).c_str());
  std::printf("stage order:\n");
  for (size_t i = 0; i < p.order.size(); ++i) {
    const PipelineStage& st = p.stages[p.order[i]];
    std::printf("  %zu. %s  graph %s (%s)  %g flops\n", i + 1, safe(st.name).c_str(),
                safe(st.graph.name).c_str(), safe(st.graph_file).c_str(), st.graph.flops());
  }
  std::printf("buffers:\n");
  for (const auto& b : p.buffers) {
    std::string who = b.is_view()
                          ? "part " + std::to_string(b.view_part) + " of " + std::to_string(b.view_parts) +
                                " of " + p.buffers[static_cast<size_t>(b.view_of)].name + " (+" +
                                std::to_string(b.view_offset_elements(p)) + " elements)"
                          : "written by " + (b.writer ? use_text(p, *b.writer) : std::string("-"));
    std::string rd;
    for (const auto& r : b.readers) rd += (rd.empty() ? "" : ", ") + use_text(p, r);
    who += ", read by " + (rd.empty() ? std::string("-") : rd);
    if (!b.file.empty()) who += ", file " + b.file + (b.key.empty() ? "" : " tensor " + b.key);
    std::printf("  %-12s %-12s %s %s  %s\n", safe(b.name).c_str(),
                std::string(buffer_kind_name(b.kind)).c_str(), std::string(dtype_name(b.dtype)).c_str(),
                common::dims_string(b.dims).c_str(), safe(who).c_str());
  }
  std::printf("total flops %g\n", p.flops());
  const BufferArenaPlan arena = plan_buffer_arena(p);
  std::printf(
      "intermediate buffers: %s one allocation each, %s in one arena by their lives "
      "(pipeline run --share-intermediates)\n",
      format_bytes(arena.separate_bytes).c_str(), format_bytes(arena.arena_bytes).c_str());
}

// ---------------------------------------------------------------- build, tune, run

// Bump when a key of build/tune/run --json changes meaning or goes away.
constexpr int kPipelineRunJsonVersion = 1;

void print_json_error(const Status& st, ordered_json extra = ordered_json::object()) {
  ordered_json j = {{"ok", false}, {"code", status_code_name(st.code())}, {"error", st.message()}};
  for (auto it = extra.begin(); it != extra.end(); ++it) j[it.key()] = it.value();
  std::printf("%s\n", common::json_dump(j, 2).c_str());
}

ordered_json header_json(const Pipeline& p, const Session* session) {
  ordered_json j;
  j["ok"] = true;
  j["version"] = kPipelineRunJsonVersion;
  j["pipeline"] = p.name;
  j["pipeline_file"] = p.path;
  if (session) {
    const DeviceTarget& t = session->target();
    j["target"] = {
        {"device_name", t.device_name}, {"sm_version", t.sm_version}, {"deviceless", t.deviceless()}};
  }
  return j;
}

ordered_json stage_json(const Pipeline& p, int s) {
  const PipelineStage& st = p.stages[static_cast<size_t>(s)];
  return {{"stage", st.name}, {"graph", st.graph.name}, {"graph_file", st.graph_file}};
}

ordered_json build_stages_json(const Pipeline& p, const PipelineBuild& b) {
  ordered_json stages = ordered_json::array();
  for (const StageBuild& sb : b.stages) {
    ordered_json j = stage_json(p, sb.stage);
    j["ok"] = sb.ok;
    j["ms"] = sb.ms;
    j["plan_source"] = sb.report.source_text();
    j["engine"] = sb.ok ? sb.plan.engine_name() : sb.report.engine;
    j["workspace_bytes"] = sb.ok ? sb.plan.workspace_bytes() : sb.report.workspace_bytes;
    j["plan"] = ordered_json::parse(to_json(sb.report).dump());
    if (!sb.report.build.steps.empty()) j["build"] = ordered_json::parse(to_json(sb.report.build).dump());
    if (!sb.ok && !sb.error.ok()) {
      j["code"] = status_code_name(sb.error.code());
      j["error"] = sb.error.message();
    }
    stages.push_back(std::move(j));
  }
  return stages;
}

int64_t largest_workspace(const PipelineBuild& b) {
  int64_t ws = 0;
  for (const auto& s : b.stages)
    if (s.ok) ws = std::max(ws, s.plan.workspace_bytes());
  return ws;
}

// The part of a stage's build error after "...: stage 'NAME' (graph 'G'): ".
std::string stage_reason(const Status& st) {
  const std::string& m = st.message();
  const size_t at = m.find("): ");
  const std::string code = status_code_name(st.code());
  return code + ": " + (at == std::string::npos ? m : m.substr(at + 3));
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

ordered_json comparisons_json(const std::vector<Comparison>& cs) {
  ordered_json out = ordered_json::array();
  for (const auto& cmp : cs) out.push_back(ordered_json::parse(to_json(cmp).dump()));
  return out;
}

ordered_json latency_json(const LatencyStats& l) {
  return {
      {"median", l.median_ms}, {"min", l.min_ms}, {"p90", l.p90_ms}, {"mean", l.mean_ms}, {"iters", l.iters}};
}

// `pipeline run --devices`: per device its rows, plans, verification and
// latency (timed on each device while the others ran theirs), then the whole.
void print_data_parallel(const Pipeline& p, const DataParallelResult& r, bool json,
                         const std::vector<std::string>& saved) {
  bool ok = r.verified_ok;
  if (json) {
    ordered_json j = header_json(p, nullptr);
    j["data_parallel"] = {{"batch_symbol", r.batch_symbol}, {"batch", r.batch}, {"wall_ms", r.wall_ms}};
    ordered_json shares = ordered_json::array();
    for (size_t i = 0; i < r.shares.size(); ++i) {
      const DeviceShare& s = r.shares[i];
      ordered_json stages = ordered_json::array();
      for (const StageRun& sr : s.result.stages) {
        stages.push_back({{"stage", r.share_pipelines[i].stages[static_cast<size_t>(sr.stage)].name},
                          {"engine", sr.engine},
                          {"verify", comparisons_json(sr.comparisons)},
                          {"verified_ok", sr.verified_ok}});
      }
      shares.push_back({{"device", s.device},
                        {"device_name", s.device_name},
                        {"rows", {s.offset, s.offset + s.batch}},
                        {"build_ms", s.build_ms},
                        {"stages", std::move(stages)},
                        {"chain_verify", comparisons_json(s.result.chain)},
                        {"latency_ms", latency_json(s.result.latency)},
                        {"cuda_graph", ordered_json::parse(to_json(s.result.cuda_graph).dump())},
                        {"verified_ok", s.result.verified_ok}});
    }
    j["shares"] = std::move(shares);
    ordered_json outs = ordered_json::object();
    for (const auto& [name, t] : r.outputs) outs[name] = {{"dims", t.dims}, {"dtype", dtype_name(t.dtype)}};
    j["outputs"] = std::move(outs);
    j["outputs_saved"] = saved;
    j["ok"] = ok;
    std::printf("%s\n", common::json_dump(j, 2).c_str());
    return;
  }
  std::printf("%s (%s): data parallel over %zu devices, %s=%lld split as", safe(p.name).c_str(),
              safe(p.path).c_str(), r.shares.size(), safe(r.batch_symbol).c_str(),
              static_cast<long long>(r.batch));
  for (const DeviceShare& s : r.shares) std::printf(" %lld", static_cast<long long>(s.batch));
  std::printf("\n");
  for (size_t i = 0; i < r.shares.size(); ++i) {
    const DeviceShare& s = r.shares[i];
    std::printf("  device %d (%s), rows %lld..%lld: plans %.2f ms\n", s.device, safe(s.device_name).c_str(),
                static_cast<long long>(s.offset), static_cast<long long>(s.offset + s.batch - 1), s.build_ms);
    for (const StageRun& sr : s.result.stages) {
      std::printf("    %-12s engine %s\n",
                  safe(r.share_pipelines[i].stages[static_cast<size_t>(sr.stage)].name).c_str(),
                  safe(sr.engine).c_str());
      for (const auto& cmp : sr.comparisons)
        std::printf("      verify (%s reference, this stage's inputs): %s\n", sr.reference_kind.c_str(),
                    safe(cmp.ToString()).c_str());
    }
    for (const auto& cmp : s.result.chain)
      std::printf("    whole pipeline (%s references chained): %s\n", s.result.chain_reference_kind.c_str(),
                  safe(cmp.ToString()).c_str());
    if (s.result.cuda_graph.used)
      std::printf("    CUDA graph: %s recording; %s\n", s.result.cuda_graph.recording.c_str(),
                  common::printable(graph_equality(s.result.cuda_graph, "buffers"), true).c_str());
    if (s.result.latency.iters > 0)
      std::printf(
          "    latency over %d runs (timed while the other devices ran theirs): median %.4f ms, min %.4f "
          "ms\n",
          s.result.latency.iters, s.result.latency.median_ms, s.result.latency.min_ms);
  }
  for (const auto& [name, t] : r.outputs)
    std::printf("  output %s: %s stacked from the devices\n", safe(name).c_str(),
                common::dims_string(t.dims).c_str());
  std::printf("  wall time, threads start to last end (sessions, plans, runs): %.1f ms%s\n", r.wall_ms,
              ok ? "" : "; verification FAILED");
  for (const auto& path : saved) std::printf("  saved %s\n", safe(path).c_str());
}

void print_build_stages(const Pipeline& p, const PipelineBuild& b, bool keep_going = false) {
  int n = 0;
  for (const StageBuild& sb : b.stages) {
    const PipelineStage& st = p.stages[static_cast<size_t>(sb.stage)];
    std::printf("  %d. %-12s graph %s: ", ++n, safe(st.name).c_str(), safe(st.graph.name).c_str());
    if (sb.ok)
      std::printf("%s, engine %s, workspace %s, %.2f ms (cache %s)\n", safe(sb.report.source_text()).c_str(),
                  safe(sb.plan.engine_name()).c_str(), format_bytes(sb.plan.workspace_bytes()).c_str(), sb.ms,
                  sb.report.cache.c_str());
    else if (keep_going)  // one line per failed stage: its reason, without the pipeline prefix
      std::printf("failed after %.2f ms: %s\n", sb.ms, safe(first_line(stage_reason(sb.error))).c_str());
    else
      std::printf("failed after %.2f ms\n", sb.ms);
  }
}

std::string target_text(const Session& s) {
  const DeviceTarget& t = s.target();
  return safe(t.device_name) + " (sm_" + std::to_string(t.sm_version) + ")" +
         (t.deviceless() ? ", deviceless (device-properties file)" : "");
}

struct PlanFlags {
  std::string heuristics = "auto", engine;
  int64_t max_workspace = -1;
  bool static_shapes = false;
  bool no_override_shapes = false;
  bool no_plan_check = false;
  bool no_reference_fallback = false;
};

void add_plan_flags(CLI::App* c, PlanFlags& f) {
  c->add_option("--heuristics", f.heuristics,
                "Heuristic modes: auto (a, then b, then fallback, until one yields an engine), or a "
                "comma-separated list of a, b, fallback to pin")
      ->capture_default_str();
  c->add_option("--engine", f.engine, "Pin an engine by name for every stage (see `fusebox engines`)");
  c->add_option("--max-workspace", f.max_workspace, "Reject plans needing more workspace (bytes)");
  c->add_flag("--static-shapes", f.static_shapes,
              "Symbolic graphs: build each concrete shape statically (kernels fitted to the shape; no kernel "
              "cache, no dynamic-shape build), cached per shape like the dynamic ones");
  c->add_flag("--no-override-shapes", f.no_override_shapes,
              "Symbolic graphs: build every new shape (through the kernel cache) instead of serving it by "
              "execute-time shape override of the plan built for the first (cuDNN 9.23+ on a GPU)");
  add_plan_check_flag(c, f.no_plan_check);
  add_reference_fallback_flag(c, f.no_reference_fallback);
}

Result<PlanRequest> plan_request(const PlanFlags& f) {
  PlanRequest r;
  FUSEBOX_ASSIGN_OR_RETURN(r.heuristics, parse_heuristics_flag(f.heuristics));
  r.engine = f.engine;
  r.max_workspace_bytes = f.max_workspace;
  r.dynamic_shape = !f.static_shapes;
  r.override_shapes = !f.no_override_shapes;
  r.check_plan = !f.no_plan_check;
  r.reference_fallback = !f.no_reference_fallback;
  return r;
}

Runner add_pipeline_build(CLI::App& cmd) {
  struct Args {
    std::string path, device, shape;
    PlanFlags plan;
    bool json = false, keep_going = false;
    CacheFlags cache;
  };
  auto a = std::make_shared<Args>();
  auto* c = cmd.add_subcommand(
      "build", "Build every stage's plan (the five steps, or the plan cache), deviceless with --device");
  c->add_option("pipeline", a->path, "Pipeline JSON file")->required();
  add_pipeline_shape_flag(c, a->shape);
  c->add_option("--device", a->device,
                "Device-properties file: build deviceless for that GPU (no GPU needed)");
  add_plan_flags(c, a->plan);
  c->add_flag("--keep-going", a->keep_going,
              "Try every stage even after one fails (e.g. deviceless, where cuDNN refuses some graphs); "
              "exit 1 if any failed");
  c->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_cache_flags(c, a->cache);
  return [a]() {
    auto p = load_pipeline(a->path, a->shape);
    auto request = plan_request(a->plan);
    Status st = !p.ok() ? p.status() : request.status();
    if (!st.ok()) {
      if (a->json) print_json_error(st);
      return fail("pipeline build", st);
    }
    request->use_tuned_cache = false;  // build reports what the heuristics choose, as `fusebox build`
    auto cache = open_cache(a->cache);
    SessionOptions so;
    so.device_properties_file = a->device;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) {
      if (a->json) print_json_error(session.status());
      return fail("pipeline build", session.status());
    }
    PipelineBuild b;
    st = build_pipeline(**session, *p, *request, &b, a->keep_going);
    for (const auto& sb : b.stages) print_warnings(sb.report.warnings);
    if (a->json) {
      ordered_json j = header_json(*p, session->get());
      j["ok"] = st.ok();
      if (!st.ok()) {
        j["code"] = status_code_name(st.code());
        j["error"] = st.message();
      }
      j["stages"] = build_stages_json(*p, b);
      j["total_ms"] = b.total_ms;
      j["workspace_bytes"] = largest_workspace(b);
      std::printf("%s\n", common::json_dump(j, 2).c_str());
    } else {
      std::printf("%s (%s): %zu stages, target %s\n", safe(p->name).c_str(), safe(p->path).c_str(),
                  p->stages.size(), target_text(**session).c_str());
      print_build_stages(*p, b, a->keep_going);
      if (a->keep_going) {
        size_t built = 0;
        for (const auto& sb : b.stages) built += sb.ok ? 1 : 0;
        std::printf("  %zu of %zu stages built, %zu failed; total %.2f ms\n", built, b.stages.size(),
                    b.stages.size() - built, b.total_ms);
      } else if (!st.ok() && !b.stages.empty() && !b.stages.back().report.build.steps.empty()) {
        print_attempts(b.stages.back().report);
        print_build_report(b.stages.back().report.build);
      }
      if (st.ok())
        std::printf("  total %.2f ms; workspace arena needed: %s (the largest stage's)\n", b.total_ms,
                    format_bytes(largest_workspace(b)).c_str());
    }
    return st.ok() ? kExitOk : fail("pipeline build", st);
  };
}

Runner add_pipeline_tune(CLI::App& cmd) {
  struct Args {
    std::string path, heuristics = "a,b,fallback", shape;
    TunePolicy policy;
    bool json = false;
    CacheFlags cache;
  };
  auto a = std::make_shared<Args>();
  auto* c = cmd.add_subcommand("tune",
                               "Autotune every stage on the GPU (as `fusebox tune`), through the plan cache");
  c->add_option("pipeline", a->path, "Pipeline JSON file")->required();
  add_pipeline_shape_flag(c, a->shape);
  c->add_option("--heuristics", a->heuristics, "Heuristic modes: a, b, fallback")->capture_default_str();
  c->add_option("--warmup", a->policy.warmup, "Untimed runs per engine")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--iters", a->policy.iters, "Timed runs per engine (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  c->add_option("--max-workspace", a->policy.max_workspace_bytes,
                "Drop engines needing more workspace (bytes)");
  c->add_flag("--deterministic", a->policy.deterministic_only, "Drop nondeterministic engines");
  c->add_option("--top", a->policy.top_k, "Time only the first K admissible engines per stage")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--budget-ms", a->policy.budget_ms,
                "Per stage: stop timing after this much wall time spent timing (the first admissible "
                "candidate is always timed)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--seed", a->policy.seed, "Seed for random inputs")->capture_default_str();
  add_tune_cuda_graph_flag(c, a->policy);
  c->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_cache_flags(c, a->cache);
  return [a]() {
    auto p = load_pipeline(a->path, a->shape);
    auto modes = parse_heuristic_modes(a->heuristics);
    Status st = !p.ok() ? p.status() : modes.status();
    if (!st.ok()) {
      if (a->json) print_json_error(st);
      return fail("pipeline tune", st);
    }
    a->policy.heuristics = *modes;
    auto cache = open_cache(a->cache);
    SessionOptions so;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) {
      if (a->json) print_json_error(session.status());
      return fail("pipeline tune", session.status());
    }
    PipelineTune t;
    st = tune_pipeline(**session, *p, a->policy, &t);
    for (const auto& s : t.stages) print_warnings(s.tune.warnings);
    if (a->json) {
      ordered_json j = header_json(*p, session->get());
      j["ok"] = st.ok();
      if (!st.ok()) {
        j["code"] = status_code_name(st.code());
        j["error"] = st.message();
      }
      j["timing"] = a->policy.cuda_graph ? "cuda_graph" : "eager";
      ordered_json stages = ordered_json::array();
      for (const StageTune& s : t.stages) {
        ordered_json e = stage_json(*p, s.stage);
        const TuneResult& r = s.tune.result;
        const bool tuned = !s.tune.hit && r.winner >= 0;
        e["ok"] = s.ok;
        e["ms"] = s.ms;
        e["cache"] = s.tune.hit ? "hit" : s.tune.cache;
        e["cache_key"] = s.tune.cache_key;
        e["stored"] = s.tune.stored;
        e["winner"] = s.ok || tuned ? s.tune.plan.engine_name() : "";
        e["winner_median_ms"] =
            s.tune.hit ? s.tune.entry.tuned_median_ms : (tuned ? r.entries[r.winner].latency.median_ms : 0.0);
        e["heuristic_choice"] = tuned && r.heuristic >= 0 ? r.entries[r.heuristic].candidate.name : "";
        e["speedup_over_heuristic"] = tuned ? r.speedup_over_heuristic : 0.0;
        e["candidates"] = tuned ? r.entries.size() : 0;
        e["verify"] = comparisons_json(r.winner_run.comparisons);
        stages.push_back(std::move(e));
      }
      j["stages"] = std::move(stages);
      j["total_ms"] = t.total_ms;
      std::printf("%s\n", common::json_dump(j, 2).c_str());
    } else {
      std::printf("%s (%s): %zu stages, tuned on %s%s\n", safe(p->name).c_str(), safe(p->path).c_str(),
                  p->stages.size(), target_text(**session).c_str(),
                  a->policy.cuda_graph ? " (each engine timed per execute inside a CUDA graph)" : "");
      int n = 0;
      for (const StageTune& s : t.stages) {
        const PipelineStage& ps = p->stages[static_cast<size_t>(s.stage)];
        const TuneResult& r = s.tune.result;
        std::printf("  %d. %-12s graph %s: ", ++n, safe(ps.name).c_str(), safe(ps.graph.name).c_str());
        if (s.tune.hit)
          std::printf("plan cache hit, tuned winner %s (%.4f ms when tuned)\n",
                      safe(s.tune.plan.engine_name()).c_str(), s.tune.entry.tuned_median_ms);
        else if (r.winner >= 0)
          std::printf("winner %s, %.4f ms, %.2fx the heuristic choice; %zu candidates in %.0f ms%s\n",
                      safe(r.entries[r.winner].candidate.name).c_str(), r.entries[r.winner].latency.median_ms,
                      r.speedup_over_heuristic, r.entries.size(), s.ms,
                      s.tune.stored ? ", stored in the cache" : "");
        else
          std::printf("failed after %.0f ms\n", s.ms);
        for (const auto& cmp : r.winner_run.comparisons)
          std::printf("     verify: %s\n", safe(cmp.ToString()).c_str());
      }
      if (st.ok()) std::printf("  total %.0f ms\n", t.total_ms);
    }
    return st.ok() ? kExitOk : fail("pipeline tune", st);
  };
}

// A buffer name as one file name in DIR (names are free text in the pipeline file).
Result<std::string> save_path(const std::string& name, const std::string& dir,
                              const std::vector<common::NamedPath>& inputs) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    return InvalidArgument(
        "--save-outputs: buffer '" + name +
        "' cannot be saved as a file name (no '/', NUL, '.' or '..'); rename it in the pipeline");
  const std::string path = (std::filesystem::path(dir) / (name + ".npy")).string();
  FUSEBOX_RETURN_IF_ERROR(common::refuse_overwriting_input(path, "--save-outputs file", inputs));
  FUSEBOX_RETURN_IF_ERROR(common::check_replaceable(path, "--save-outputs file"));
  return path;
}

Runner add_pipeline_run(CLI::App& cmd) {
  struct Args {
    std::string path, save_outputs, shape, devices, batch_symbol;
    std::vector<std::string> inputs;
    PlanFlags plan;
    bool verify = false, json = false, cuda_graph = false, profile = false, share = false;
    uint64_t seed = 1;
    int warmup = 10, iters = 50;
    CacheFlags cache;
  };
  auto a = std::make_shared<Args>();
  auto* c = cmd.add_subcommand(
      "run", "Run a pipeline on the GPU: every stage bound once, executed in order; verify and time");
  c->add_flag("--share-intermediates", a->share,
              "Put the intermediate buffers in one arena by their lives in the stage order (fusebox pipeline "
              "check reports the sizes): less memory, nothing left to --verify or --save-outputs");
  c->add_flag(
      "--profile", a->profile,
      "After the timing, time each stage alone (--iters executes of its plan): which stage costs the time");
  c->add_option("--devices", a->devices,
                "Data parallel: split the batch symbol over these GPUs, e.g. 0,1 (one session and thread "
                "each, one plan cache; outputs stacked in this order)");
  c->add_option("--batch-symbol", a->batch_symbol,
                "With --devices: the symbol to split (default: the pipeline's only symbol)");
  c->add_option("pipeline", a->path, "Pipeline JSON file")->required();
  add_pipeline_shape_flag(c, a->shape);
  c->add_option("--input", a->inputs,
                "An input buffer's values, NAME=FILE.npy (repeatable; others random from --seed)");
  c->add_option("--seed", a->seed, "Seed for random inputs")->capture_default_str();
  c->add_flag("--verify", a->verify,
              "Check each stage against the reference on its own inputs, and the final outputs against the "
              "references chained (a mismatch is an error naming the stage and buffer)");
  c->add_option(
      "--save-outputs", a->save_outputs,
      "Write every buffer a stage writes to DIR/<buffer>.npy and every input to DIR/inputs/<buffer>.npy");
  c->add_option("--warmup", a->warmup, "Untimed runs before timing")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--iters", a->iters, "Timed runs of the whole pipeline (0: run once, no timing)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_flag(
      "--cuda-graph", a->cuda_graph,
      "Also record every stage into one CUDA graph: its buffers must equal the eager run's byte for byte; "
      "time graph launches beside eager runs");
  add_plan_flags(c, a->plan);
  c->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_cache_flags(c, a->cache);
  return [a]() {
    auto bad = [&](const Status& st) {
      if (a->json) print_json_error(st);
      return fail("pipeline run", st);
    };
    if (a->share && (a->verify || !a->save_outputs.empty()))
      return bad(InvalidArgument(std::string("--share-intermediates leaves no intermediate buffer to ") +
                                 (a->verify ? "check: drop --verify" : "save: drop --save-outputs") +
                                 " or --share-intermediates"));
    std::vector<int> devices;
    if (!a->devices.empty()) {
      auto d = parse_device_list(a->devices);
      if (!d.ok()) return bad(d.status());
      devices = *d;
    } else if (!a->batch_symbol.empty()) {
      return bad(
          InvalidArgument("--batch-symbol goes with --devices (the symbol a data-parallel run splits)"));
    }
    auto p = load_pipeline(a->path, a->shape);
    if (!p.ok()) return bad(p.status());
    auto request = plan_request(a->plan);
    if (!request.ok()) return bad(request.status());
    request->cuda_graph = a->cuda_graph;  // a stage tuned inside CUDA graphs is preferred then
    std::map<std::string, std::string> input_files;
    for (const std::string& item : a->inputs) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
        return bad(InvalidArgument("--input: '" + item + "' is not NAME=FILE.npy"));
      if (!input_files.emplace(item.substr(0, eq), item.substr(eq + 1)).second)
        return bad(InvalidArgument("--input: buffer '" + item.substr(0, eq) + "' is given twice"));
    }
    // Before any GPU work: where outputs go (never over an input of this run), then every input and constant.
    std::map<int, std::string> save;
    if (!a->save_outputs.empty()) {
      struct stat sb {};
      if (::stat(a->save_outputs.c_str(), &sb) == 0 && !S_ISDIR(sb.st_mode))
        return bad(InvalidArgument("--save-outputs '" + a->save_outputs + "' exists and is not a directory"));
      std::vector<common::NamedPath> ins = {{"pipeline file", a->path}};
      for (const auto& st : p->stages)
        ins.push_back({"graph file of stage '" + st.name + "'", st.graph_path});
      for (const auto& b : p->buffers)
        if (!b.file_path.empty()) ins.push_back({"weights file of '" + b.name + "'", b.file_path});
      for (const auto& [name, file] : input_files) ins.push_back({"--input file for '" + name + "'", file});
      ins.push_back(cache_input(a->cache));
      for (size_t bi = 0; bi < p->buffers.size(); ++bi) {
        const PipelineBuffer& b = p->buffers[bi];
        if (b.kind == BufferKind::kConstant || b.is_view()) continue;  // a view's bytes are its parent's
        const std::string dir = b.kind == BufferKind::kInput
                                    ? (std::filesystem::path(a->save_outputs) / "inputs").string()
                                    : a->save_outputs;
        auto path = save_path(b.name, dir, ins);
        if (!path.ok()) return bad(path.status());
        save[static_cast<int>(bi)] = *path;
      }
    }
    auto data = load_pipeline_data(*p, a->seed, input_files);
    if (!data.ok()) return bad(data.status());

    auto cache = open_cache(a->cache);
    if (!devices.empty()) {
      DataParallelOptions dp;
      dp.devices = devices;
      dp.batch_symbol = a->batch_symbol;
      dp.request = *request;
      dp.cache_path = cache && cache->enabled() ? cache->path() : "";
      cache.reset();  // each device's thread opens the file itself
      dp.run.verify = a->verify;
      dp.run.warmup = a->warmup;
      dp.run.iters = a->iters;
      dp.run.cuda_graph = a->cuda_graph;
      dp.run.profile = a->profile;
      dp.run.share_intermediates = a->share;
      auto r = run_pipeline_data_parallel(*p, *data, dp);
      if (!r.ok()) return bad(r.status());
      // --save-outputs: the inputs as given and the outputs stacked from the devices (each
      // device's intermediates stay on it).
      std::vector<std::string> saved;
      if (!save.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(a->save_outputs) / "inputs", ec);
        for (const auto& [bi, path] : save) {
          const PipelineBuffer& buf = p->buffers[static_cast<size_t>(bi)];
          const HostTensor* t = nullptr;
          if (buf.kind == BufferKind::kInput && data->count(bi)) t = &data->at(bi);
          if (buf.kind == BufferKind::kOutput && r->outputs.count(buf.name)) t = &r->outputs.at(buf.name);
          if (!t) continue;
          Status st = write_npy(path, *t);
          if (!st.ok()) return bad(st);
          saved.push_back(path);
        }
      }
      print_data_parallel(*p, *r, a->json, saved);
      for (size_t i = 0; i < r->shares.size(); ++i) {
        Status vs = pipeline_verify_status(r->share_pipelines[i], r->shares[i].result);
        if (!vs.ok())
          return fail("pipeline run", vs.WithContext("device " + std::to_string(r->shares[i].device)));
      }
      return kExitOk;
    }
    SessionOptions so;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) return bad(session.status());
    PipelineBuild b;
    Status st = build_pipeline(**session, *p, *request, &b);
    for (const auto& sb : b.stages) print_warnings(sb.report.warnings);
    if (!st.ok()) {
      if (a->json) {
        ordered_json j = header_json(*p, session->get());
        j["ok"] = false;
        j["code"] = status_code_name(st.code());
        j["error"] = st.message();
        j["stages"] = build_stages_json(*p, b);
        std::printf("%s\n", common::json_dump(j, 2).c_str());
      } else {
        print_build_stages(*p, b);
      }
      return fail("pipeline run", st);
    }
    PipelineRunOptions ro;
    ro.verify = a->verify;
    ro.warmup = a->warmup;
    ro.iters = a->iters;
    ro.keep_intermediates = !a->save_outputs.empty();
    ro.cuda_graph = a->cuda_graph;
    ro.profile = a->profile;
    ro.share_intermediates = a->share;
    auto r = run_pipeline(**session, *p, b.plans_by_stage(*p), *data, ro);
    if (!r.ok()) return bad(r.status());

    std::vector<std::string> saved;
    if (!a->save_outputs.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(a->save_outputs) / "inputs", ec);
      for (const auto& [bi, path] : save) {
        const PipelineBuffer& buf = p->buffers[static_cast<size_t>(bi)];
        auto& from = buf.kind == BufferKind::kInput ? r->inputs : r->outputs;
        auto it = from.find(buf.name);
        if (it == from.end()) continue;
        st = write_npy(path, it->second);
        if (!st.ok()) return bad(st);
        saved.push_back(path);
      }
    }

    if (a->json) {
      ordered_json j = header_json(*p, session->get());
      ordered_json stages = ordered_json::array();
      for (size_t i = 0; i < r->stages.size(); ++i) {
        const StageRun& sr = r->stages[i];
        const StageBuild& sb = b.stages[i];
        ordered_json e = stage_json(*p, sr.stage);
        e["engine"] = sr.engine;
        e["workspace_bytes"] = sr.workspace_bytes;
        e["plan_source"] = sb.report.source_text();
        e["plan"] = ordered_json::parse(to_json(sb.report).dump());
        e["plan_ms"] = sb.ms;
        e["reference"] = sr.reference_kind;
        e["verify"] = comparisons_json(sr.comparisons);
        e["verified_ok"] = sr.verified_ok;
        e["flops"] = sr.flops;
        e["latency_ms"] = sr.latency.iters > 0 ? latency_json(sr.latency) : ordered_json(nullptr);
        stages.push_back(std::move(e));
      }
      j["stages"] = std::move(stages);
      j["chain_verify"] = comparisons_json(r->chain);
      j["chain_reference"] = r->chain_reference_kind;
      j["verified"] = a->verify;
      j["memory_bytes"] = {
          {"buffers", r->buffer_bytes}, {"workspace", r->workspace_bytes}, {"peak", r->peak_device_bytes}};
      j["build_ms"] = b.total_ms;
      j["context_create_ms"] = (*session)->context_create_ms();
      j["first_execute_ms"] = r->first_execute_ms;
      j["latency_ms"] = latency_json(r->latency);
      j["cuda_graph"] = ordered_json::parse(to_json(r->cuda_graph).dump());
      if (r->cuda_graph.used) {
        j["eager_latency_ms"] = latency_json(r->eager_latency);
      }
      j["flops"] = r->flops;
      j["tflops"] = r->tflops;
      j["outputs_saved"] = saved;
      j["ok"] = r->verified_ok;
      std::printf("%s\n", common::json_dump(j, 2).c_str());
    } else {
      std::printf("%s (%s): %zu stages on %s\n", safe(p->name).c_str(), safe(p->path).c_str(),
                  p->stages.size(), target_text(**session).c_str());
      for (size_t i = 0; i < r->stages.size(); ++i) {
        const StageRun& sr = r->stages[i];
        const PipelineStage& ps = p->stages[static_cast<size_t>(sr.stage)];
        std::printf("  %zu. %-12s graph %s: plan %s (%.2f ms), engine %s, workspace %s\n", i + 1,
                    safe(ps.name).c_str(), safe(ps.graph.name).c_str(),
                    safe(b.stages[i].report.source_text()).c_str(), b.stages[i].ms, safe(sr.engine).c_str(),
                    format_bytes(sr.workspace_bytes).c_str());
        for (const auto& cmp : sr.comparisons)
          std::printf("     verify (%s reference, this stage's inputs): %s\n", sr.reference_kind.c_str(),
                      safe(cmp.ToString()).c_str());
      }
      for (const auto& cmp : r->chain)
        std::printf("  whole pipeline (%s references chained): %s\n", r->chain_reference_kind.c_str(),
                    safe(cmp.ToString()).c_str());
      std::printf("  device memory: buffers %s + workspace arena %s = peak %s\n",
                  format_bytes(r->buffer_bytes).c_str(), format_bytes(r->workspace_bytes).c_str(),
                  format_bytes(r->peak_device_bytes).c_str());
      std::printf("  start-up: GPU context and cuDNN load %.1f ms, plans %.2f ms, first run %.2f ms\n",
                  (*session)->context_create_ms(), b.total_ms, r->first_execute_ms);
      if (r->cuda_graph.used) {
        const CudaGraphRun& cg = r->cuda_graph;
        std::printf("  CUDA graph of %zu steps: %s recording", r->stages.size(), cg.recording.c_str());
        if (!cg.why_not_native.empty()) std::printf(" (not native: %s)", safe(cg.why_not_native).c_str());
        std::printf(", made in %.2f ms; %s\n", cg.create_ms,
                    common::printable(graph_equality(cg, "buffers"), true).c_str());
      }
      if (r->eager_latency.iters > 0)
        std::printf(
            "  latency over %d runs (eager, %zu launches each): median %.4f ms, min %.4f ms, p90 %.4f ms\n",
            r->eager_latency.iters, r->stages.size(), r->eager_latency.median_ms, r->eager_latency.min_ms,
            r->eager_latency.p90_ms);
      if (r->latency.iters > 0) {
        if (r->cuda_graph.used)
          std::printf(
              "  latency over %d CUDA graph launches: median %.4f ms, min %.4f ms, p90 %.4f ms; %.1f "
              "TFLOP/s\n",
              r->latency.iters, r->latency.median_ms, r->latency.min_ms, r->latency.p90_ms, r->tflops);
        else
          std::printf(
              "  latency over %d runs (eager, %zu launches each): median %.4f ms, min %.4f ms, p90 %.4f ms; "
              "%.1f TFLOP/s\n",
              r->latency.iters, r->stages.size(), r->latency.median_ms, r->latency.min_ms, r->latency.p90_ms,
              r->tflops);
      }
      if (a->profile && r->latency.iters > 0) {
        double sum = 0;
        for (const StageRun& sr : r->stages) sum += sr.latency.median_ms;
        std::printf("  per stage, each alone (%d executes, median): sum %.4f ms against %.4f ms per run\n",
                    r->latency.iters, sum, r->latency.median_ms);
        for (const StageRun& sr : r->stages) {
          const double ms = sr.latency.median_ms;
          std::printf("    %-12s %9.4f ms %5.1f%%  %7.1f TFLOP/s  engine %s\n",
                      safe(p->stages[static_cast<size_t>(sr.stage)].name).c_str(), ms,
                      sum > 0 ? 100 * ms / sum : 0.0, ms > 0 ? sr.flops / (ms * 1e-3) / 1e12 : 0.0,
                      safe(sr.engine).c_str());
        }
      }
      for (const auto& path : saved) std::printf("  saved %s\n", safe(path).c_str());
    }
    Status vs = pipeline_verify_status(*p, *r);
    return vs.ok() ? kExitOk : fail("pipeline run", vs);
  };
}

}  // namespace

// `pipeline startup FILE...`: what a serving process pays before its first
// results, for several pipelines in one process on one session: the GPU
// context and cuDNN handle, then per pipeline its plans (cache hits or
// builds), binding with the uploads, the CUDA graph (--cuda-graph) and the
// first run, synchronized. Run it twice with one --cache: cold, then warm.
Runner add_pipeline_startup(CLI::App& cmd) {
  struct Args {
    std::vector<std::string> paths;
    PlanFlags plan;
    bool json = false, cuda_graph = false;
    uint64_t seed = 1;
    CacheFlags cache;
  };
  auto a = std::make_shared<Args>();
  auto* c =
      cmd.add_subcommand("startup",
                         "Start several pipelines in one process and time each step to their first results "
                         "(context, plans from the cache or built, binding, CUDA graph, first run)");
  c->add_option("pipelines", a->paths, "Pipeline JSON files (at their symbols' defaults)")->required();
  c->add_flag("--cuda-graph", a->cuda_graph, "Record each pipeline as one CUDA graph before its first run");
  c->add_option("--seed", a->seed, "Seed for random inputs")->capture_default_str();
  add_plan_flags(c, a->plan);
  c->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_cache_flags(c, a->cache);
  return [a]() {
    const common::Stopwatch total;
    auto bad = [&](const Status& st) {
      if (a->json) print_json_error(st);
      return fail("pipeline startup", st);
    };
    auto request = plan_request(a->plan);
    if (!request.ok()) return bad(request.status());
    request->cuda_graph = a->cuda_graph;  // a stage tuned inside CUDA graphs is preferred then
    // Host work first: every file and its inputs and weights.
    const common::Stopwatch load;
    std::vector<Pipeline> ps;
    std::vector<PipelineHostData> data;
    for (const std::string& path : a->paths) {
      auto p = load_pipeline(path, "");
      if (!p.ok()) return bad(p.status());
      auto d = load_pipeline_data(*p, a->seed);
      if (!d.ok()) return bad(d.status());
      ps.push_back(std::move(*p));
      data.push_back(std::move(*d));
    }
    const double load_ms = load.ms();
    auto cache = open_cache(a->cache);
    SessionOptions so;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) return bad(session.status());
    struct Step {
      PipelineBuild build;
      std::unique_ptr<PipelineExecutor> ex;
      std::optional<CudaGraph> graph;
      int hits = 0;
      double plans_ms = 0, bind_ms = 0, graph_ms = 0, first_ms = 0;
    };
    std::vector<Step> steps(ps.size());
    for (size_t i = 0; i < ps.size(); ++i) {
      Step& st = steps[i];
      const common::Stopwatch plans;
      Status s = build_pipeline(**session, ps[i], *request, &st.build);
      st.plans_ms = plans.ms();
      if (!s.ok()) return bad(s);
      for (const StageBuild& sb : st.build.stages) st.hits += sb.report.cache == "hit" ? 1 : 0;
      const common::Stopwatch bind;
      auto ex = PipelineExecutor::create(**session, ps[i], st.build.plans_by_stage(ps[i]), data[i]);
      if (!ex.ok()) return bad(ex.status());
      st.ex = std::move(*ex);
      st.bind_ms = bind.ms();
      if (a->cuda_graph) {
        const common::Stopwatch made;
        std::vector<BoundPlan*> plans_in_order;
        for (BoundPlan& b : st.ex->steps()) plans_in_order.push_back(&b);
        auto g = CudaGraph::create(plans_in_order);
        if (!g.ok()) return bad(g.status().WithContext(ps[i].path + ": CUDA graph"));
        st.graph.emplace(std::move(*g));
        st.graph_ms = made.ms();
      }
      const common::Stopwatch first;
      s = st.graph ? st.graph->launch() : st.ex->execute();
      if (s.ok()) s = st.ex->synchronize();
      if (!s.ok()) return bad(s.WithContext(ps[i].path + ": first run"));
      st.first_ms = first.ms();
    }
    const double total_ms = total.ms();
    const double context_ms = (*session)->context_create_ms();
    if (a->json) {
      ordered_json j = header_json(ps[0], session->get());
      j.erase("pipeline");
      j.erase("pipeline_file");
      j["load_ms"] = load_ms;
      j["context_create_ms"] = context_ms;
      ordered_json list = ordered_json::array();
      for (size_t i = 0; i < ps.size(); ++i) {
        const Step& st = steps[i];
        list.push_back({{"pipeline", ps[i].name},
                        {"pipeline_file", ps[i].path},
                        {"stages", ps[i].stages.size()},
                        {"cache_hits", st.hits},
                        {"plans_ms", st.plans_ms},
                        {"bind_ms", st.bind_ms},
                        {"cuda_graph_ms", st.graph ? ordered_json(st.graph_ms) : ordered_json(nullptr)},
                        {"first_run_ms", st.first_ms}});
      }
      j["pipelines"] = std::move(list);
      j["total_ms"] = total_ms;
      std::printf("%s\n", common::json_dump(j, 2).c_str());
      return kExitOk;
    }
    std::printf("start-up of %zu pipelines in one process on %s (cache %s)\n", ps.size(),
                target_text(**session).c_str(),
                cache && cache->enabled() ? safe(cache->path()).c_str() : "off");
    std::printf("  files, weights and inputs %.1f ms; GPU context and cuDNN handle %.1f ms\n", load_ms,
                context_ms);
    for (size_t i = 0; i < ps.size(); ++i) {
      const Step& st = steps[i];
      std::printf("  %-16s %3zu stages: plans %.1f ms (%d of %zu from the cache), bind and upload %.1f ms",
                  safe(ps[i].name).c_str(), ps[i].stages.size(), st.plans_ms, st.hits, ps[i].stages.size(),
                  st.bind_ms);
      if (st.graph) std::printf(", CUDA graph %.1f ms", st.graph_ms);
      std::printf(", first run %.2f ms\n", st.first_ms);
    }
    std::printf("  total %.1f ms from the command's start to the last pipeline's first results\n", total_ms);
    return kExitOk;
  };
}

Runner add_pipeline(CLI::App& app) {
  auto* cmd = app.add_subcommand("pipeline", "Pipelines of graphs (docs/pipeline-format.md)");
  struct Args {
    std::string path;
    bool json = false;
    std::string dot, shape;
  };
  auto a = std::make_shared<Args>();
  auto* check = cmd->add_subcommand(
      "check",
      "Load a pipeline file, check how its stages connect; print the stage order and buffers (no GPU)");
  check->add_option("pipeline", a->path, "Pipeline JSON file")->required();
  add_pipeline_shape_flag(check, a->shape);
  check->add_flag("--json", a->json, "Write the checked pipeline as one JSON document to stdout");
  auto* dot =
      check
          ->add_option("--dot", a->dot,
                       "Write a Graphviz picture of the pipeline (buffers, stages, their ops) to FILE (no "
                       "FILE or '-': stdout; write --dot=FILE, or put --dot after the pipeline)")
          ->expected(0, 1);
  Runner build = add_pipeline_build(*cmd), tune = add_pipeline_tune(*cmd), run = add_pipeline_run(*cmd),
         startup = add_pipeline_startup(*cmd), backward = add_pipeline_backward(*cmd);
  return [a, cmd, check, dot, build, tune, run, startup, backward]() {
    if (cmd->got_subcommand("backward")) return backward();
    if (cmd->got_subcommand("build")) return build();
    if (cmd->got_subcommand("tune")) return tune();
    if (cmd->got_subcommand("run")) return run();
    if (cmd->got_subcommand("startup")) return startup();
    if (!check->parsed())
      return fail(
          "pipeline",
          InvalidArgument(
              "a subcommand is needed: accepted subcommands are check, build, tune, run, startup, backward "
              "(see fusebox pipeline --help)"));
    const bool want_dot = dot->count() > 0;
    const bool dot_stdout = want_dot && (a->dot.empty() || a->dot == "-");
    if (dot_stdout && a->json)
      return fail("pipeline check",
                  InvalidArgument("--json and --dot both write to stdout: give --dot a FILE"));
    auto p = load_pipeline(a->path, a->shape);
    if (!p.ok()) {
      if (a->json) print_json_error(p.status());
      return fail("pipeline check", p.status());
    }
    if (want_dot && !dot_stdout) {
      // Never onto a file the pipeline reads: itself, a stage's graph, a weights file.
      std::vector<common::NamedPath> inputs = {{"pipeline file", a->path}};
      for (const auto& st : p->stages)
        inputs.push_back({"graph file of stage '" + st.name + "'", st.graph_path});
      for (const auto& b : p->buffers)
        if (!b.file_path.empty()) inputs.push_back({"weights file of buffer '" + b.name + "'", b.file_path});
      if (Status st = common::refuse_overwriting_input(a->dot, "--dot file", inputs); !st.ok())
        return fail("pipeline check", st);
    }
    if (want_dot) {
      if (Status st = write_dot(a->dot, pipeline_dot(*p)); !st.ok()) return fail("pipeline check", st);
      if (dot_stdout) return kExitOk;  // stdout holds the picture alone, for `| dot -Tsvg`
    }
    if (a->json)
      std::printf("%s\n", common::json_dump(pipeline_json(*p), 2).c_str());
    else
      print_pipeline(*p);
    return kExitOk;
  };
}

}  // namespace fusebox::cli
