// fusebox run: execute on a GPU, verify against the reference, time it.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common.h"
#include "common/stopwatch.h"
#include "fusebox/plan_file.h"

namespace fusebox::cli {

Runner add_run(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run a graph on the GPU: verify against the reference and time it");
  struct Args {
    std::string shape;
    std::string graph, plan, inputs, save_outputs, engine, heuristics = "auto";
    bool verify = false, json = false, measure_startup = false, cuda_graph = false, no_plan_check = false,
         time_parts = false, no_reference_fallback = false;
    CacheFlags cache;
    uint64_t seed = 1;
    int warmup = 10, iters = 50, samples = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->graph, "Graph JSON file")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_option("--plan", a->plan,
                  "Use this plan file (from `fusebox build --plan-out`) instead of building");
  cmd->add_option("--inputs", a->inputs, "Inputs as NAME=FILE.npy,... (others random from --seed)");
  cmd->add_option("--save-outputs", a->save_outputs, "Write each output to DIR/<tensor>.npy");
  cmd->add_flag("--verify", a->verify, "Compare outputs with fusebox's reference (a mismatch is an error)");
  cmd->add_option("--seed", a->seed, "Seed for random inputs")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed runs before timing")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--iters", a->iters, "Timed runs (0: run once, no timing)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option(
         "--samples", a->samples,
         "Benchmark samples after the timed runs: this many GPU-time samples of --iters back-to-back "
         "runs between two events, and this many host latencies of one synchronized run (--json: "
         "gpu_time_ms, host_latency_ms)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--engine", a->engine, "Pin an engine by name");
  cmd->add_option(
         "--heuristics", a->heuristics,
         "Heuristic modes when building: auto (a, then b, then fallback), or a list of a, b, fallback to pin")
      ->capture_default_str();
  cmd->add_flag(
      "--cuda-graph", a->cuda_graph,
      "Also run the plan as a CUDA graph (cuDNN's native recording where the engine supports it, "
      "stream capture otherwise): its outputs must be bit-identical to the eager run's (within tolerance "
      "for graphs not bit-reproducible by design: reductions, sdpa backward without \"deterministic\"); "
      "--verify, timing and --samples then use the graph");
  cmd->add_flag("--time-parts", a->time_parts,
                "A partitioned plan: also time each part alone (same iterations) beside the whole");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  cmd->add_flag(
      "--measure-startup", a->measure_startup,
      "On a cache hit, deserialize the plan a second time to report cuDNN's one-time library load apart");
  add_cache_flags(cmd, a->cache);
  add_plan_check_flag(cmd, a->no_plan_check);
  add_reference_fallback_flag(cmd, a->no_reference_fallback);
  return [a]() {
    auto g = load_resolved(a->graph, a->shape);
    if (!g.ok()) return fail("run", g.status());
    auto input_files = parse_input_list(a->inputs);
    if (!input_files.ok()) return fail("run", input_files.status());
    // Before any GPU work: --save-outputs must not overwrite an input of this run.
    std::map<std::string, std::string> save_paths;
    std::vector<common::NamedPath> inputs = {
        {"graph file", a->graph}, {"--plan file", a->plan}, cache_input(a->cache)};
    if (!a->save_outputs.empty()) {
      for (const auto& [name, file] : *input_files)
        inputs.push_back({"--inputs file for '" + name + "'", file});
      auto paths = npy_output_paths(*g, a->save_outputs, inputs, "--save-outputs");
      if (!paths.ok()) return fail("run", paths.status());
      save_paths = std::move(paths).value();
    }
    auto input_tensors = load_input_files(*g, a->inputs);
    if (!input_tensors.ok()) return fail("run", input_tensors.status());
    RunOptions options;
    options.seed = a->seed;
    options.verify = a->verify;
    options.warmup = a->warmup;
    options.iters = a->iters;
    options.samples = a->samples;
    options.cuda_graph = a->cuda_graph;
    options.time_parts = a->time_parts;
    if (a->samples > 0 && a->iters == 0)
      return fail("run", InvalidArgument("--samples needs --iters >= 1 (the runs per GPU-time sample)"));
    options.inputs = std::move(input_tensors).value();

    // Start-up, timed in parts: the first cuDNN call loads its libraries.
    auto modes = parse_heuristics_flag(a->heuristics);
    if (!modes.ok()) return fail("run", modes.status());
    std::unique_ptr<PlanCache> cache;
    if (a->plan.empty()) cache = open_cache(a->cache);
    SessionOptions so;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) return fail("run", session.status());
    const double context_ms = (*session)->context_create_ms();

    PlanRequest request;
    request.plan_file = a->plan;
    request.heuristics = *modes;
    request.engine = a->engine;
    request.measure_startup = a->measure_startup;
    request.cuda_graph = a->cuda_graph;  // a plan tuned inside CUDA graphs is preferred then
    request.check_plan = !a->no_plan_check;
    request.reference_fallback = !a->no_reference_fallback;
    PlanReport rep;
    auto plan = (*session)->get_plan(*g, request, &rep);
    print_warnings(rep.warnings);
    const BuildReport& report = rep.build;
    const std::string plan_source = rep.source_text(), cache_result = rep.cache, cache_key = rep.cache_key;
    const double plan_ms = rep.total_ms, lookup_ms = rep.lookup_ms, deserialize_ms = rep.deserialize_ms,
                 deserialize_again_ms = rep.deserialize_again_ms;
    if (!plan.ok()) {
      if (!a->json && !report.steps.empty()) {
        print_attempts(rep);
        print_build_report(report);
      }
      if (!a->json) print_plan_check(rep);
      const Status st = plan.status();
      return fail("run", a->plan.empty() ? st.WithContext("[graph '" + g->name + "']") : st);
    }
    GpuContext& ctx = *(*session)->context();

    auto r = run_plan(*g, *plan, ctx, options);
    if (!r.ok()) return fail("run", r.status().WithContext("[graph '" + g->name + "']"));

    std::vector<std::string> saved;
    if (!a->save_outputs.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(a->save_outputs, ec);  // a failure shows in the write below
      for (const auto& [name, t] : r->outputs) {
        auto it = save_paths.find(name);
        auto checked = it != save_paths.end()
                           ? Result<std::string>(it->second)
                           : npy_output_path(name, a->save_outputs, inputs, "--save-outputs");
        if (!checked.ok()) return fail("run", checked.status());
        const std::string path = *checked;
        Status st = write_npy(path, t);
        if (!st.ok()) return fail("run", st);
        saved.push_back(path);
      }
    }

    if (a->json) {
      nlohmann::json verify = nlohmann::json::array();
      for (const auto& c : r->comparisons) verify.push_back(to_json(c));
      nlohmann::json j = {{"graph", g->name},
                          {"graph_file", a->graph},
                          {"plan_source", plan_source},
                          {"plan", to_json(rep)},
                          {"engine", r->engine},
                          {"workspace_bytes", r->workspace_bytes},
                          {"latency_ms",
                           {{"median", r->latency.median_ms},
                            {"min", r->latency.min_ms},
                            {"p90", r->latency.p90_ms},
                            {"mean", r->latency.mean_ms},
                            {"iters", r->latency.iters}}},
                          {"gpu_time_ms", {{"samples", r->gpu_time_ms}, {"calls_per_sample", a->iters}}},
                          {"host_latency_ms", {{"samples", r->host_latency_ms}}},
                          {"flops", r->flops},
                          {"bytes", g->bytes_moved()},
                          {"tflops", r->tflops},
                          {"gbps", r->gbps},
                          {"verify", verify},
                          {"reference", r->reference_kind},
                          {"cache", cache_result},
                          {"cache_key", cache_key},
                          {"startup_ms",
                           {{"context_create", context_ms},
                            {"plan_total", plan_ms},
                            {"cache_lookup", lookup_ms},
                            {"deserialize", deserialize_ms},
                            {"deserialize_again", deserialize_again_ms},
                            {"first_execute", r->first_execute_ms},
                            {"build_steps", report.total_ms()}}},
                          {"input_sets", r->input_sets},
                          {"outputs_saved", saved},
                          {"ok", r->verified_ok}};
      if (!report.steps.empty()) j["build"] = to_json(report);
      j["cuda_graph"] = to_json(r->cuda_graph);
      if (!r->parts.empty()) {
        nlohmann::json parts = nlohmann::json::array();
        double sum = 0;
        for (const auto& p : r->parts) {
          parts.push_back({{"engine", p.engine}, {"median_ms", p.median_ms}});
          sum += p.median_ms;
        }
        j["parts_alone"] = {{"parts", parts}, {"sum_ms", sum}};
      }
      std::printf("%s\n", dump(j).c_str());
    } else {
      std::printf("%s (%s)\n", safe(g->name).c_str(), safe(a->graph).c_str());
      if (!report.steps.empty()) {
        print_attempts(rep);
        print_build_report(report);
      }
      std::printf("  plan: %s, engine %s, workspace %s\n", plan_source.c_str(), safe(r->engine).c_str(),
                  format_bytes(r->workspace_bytes).c_str());
      print_plan_check(rep);
      std::printf("  start-up: GPU context and cuDNN load %.1f ms, plan %.2f ms (cache %s", context_ms,
                  plan_ms, cache_result.c_str());
      if (cache_result == "hit")
        std::printf(": lookup %.2f ms, deserialize %.2f ms", lookup_ms, deserialize_ms);
      if (deserialize_again_ms >= 0) std::printf(", again %.2f ms", deserialize_again_ms);
      std::printf("), first execution %.2f ms\n", r->first_execute_ms);
      if (r->cuda_graph.used) {
        const CudaGraphRun& cg = r->cuda_graph;
        std::printf("  CUDA graph: %s recording", cg.recording.c_str());
        if (!cg.why_not_native.empty()) std::printf(" (not native: %s)", safe(cg.why_not_native).c_str());
        std::printf(", made in %.2f ms; %s\n", cg.create_ms,
                    common::printable(graph_equality(cg, "outputs"), true).c_str());
      }
      for (const auto& c : r->comparisons) {
        std::printf("  verify (%s reference): %s\n", r->reference_kind.c_str(), safe(c.ToString()).c_str());
      }
      if (r->latency.iters > 0) {
        std::printf(
            "  latency over %d %s: median %.4f ms, min %.4f ms, p90 %.4f ms; %.1f TFLOP/s, %.1f GB/s\n",
            r->latency.iters, r->cuda_graph.used ? "CUDA graph launches" : "runs", r->latency.median_ms,
            r->latency.min_ms, r->latency.p90_ms, r->tflops, r->gbps);
      }
      if (!r->parts.empty()) {
        double sum = 0;
        std::string terms;
        for (const auto& p : r->parts) {
          char b[96];
          std::snprintf(b, sizeof b, "%s%.4f ms", terms.empty() ? "" : " + ", p.median_ms);
          terms += b;
          sum += p.median_ms;
        }
        std::printf("  parts alone (median): %s = %.4f ms; the whole plan %.4f ms (%+.1f%%)\n", terms.c_str(),
                    sum, r->latency.median_ms, sum > 0 ? 100.0 * (r->latency.median_ms / sum - 1) : 0.0);
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
      };
      if (!r->gpu_time_ms.empty()) {
        std::printf(
            "  benchmark: GPU time %.4f ms per run (median of %zu samples of %d back-to-back runs), "
            "host latency %.4f ms (median of %zu synchronized runs)\n",
            median(r->gpu_time_ms), r->gpu_time_ms.size(), a->iters, median(r->host_latency_ms),
            r->host_latency_ms.size());
      }
      for (const auto& p : saved) std::printf("  saved %s\n", safe(p).c_str());
    }
    Status vs = verify_status(*r);
    if (!vs.ok()) return fail("run", vs.WithContext("[graph '" + g->name + "']"));
    return kExitOk;
  };
}

}  // namespace fusebox::cli
