// fusebox tune: time every admissible engine on the GPU, rank, verify the winner.
#include <unistd.h>

#include <cstdio>

#include "common.h"
#include "fusebox/plan_file.h"
#include "fusebox/tune.h"

namespace fusebox::cli {

Runner add_tune(CLI::App& app) {
  auto* cmd = app.add_subcommand("tune",
                                 "Autotune on the GPU: build every admissible engine, time each, verify "
                                 "the winner, print a ranked table");
  struct Args {
    std::string shape;
    std::string graph, heuristics = "a,b,fallback", plan_out;
    TunePolicy policy;
    bool json = false;
    CacheFlags cache;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->graph, "Graph JSON file")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_option("--heuristics", a->heuristics, "Heuristic modes: a, b, fallback")->capture_default_str();
  cmd->add_option("--warmup", a->policy.warmup, "Untimed runs per engine")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--iters", a->policy.iters, "Timed runs per engine (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--max-workspace", a->policy.max_workspace_bytes,
                  "Drop engines needing more workspace (bytes)");
  cmd->add_flag("--deterministic", a->policy.deterministic_only, "Drop nondeterministic engines");
  cmd->add_flag(
      "--no-runtime-compilation", [a](int64_t) { a->policy.allow_runtime_compilation = false; },
      "Drop runtime-compiled engines");
  cmd->add_option("--top", a->policy.top_k, "Time only the first K admissible engines")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--budget-ms", a->policy.budget_ms,
                  "Stop timing after this much wall time spent timing (building the candidates is not "
                  "counted; the first admissible candidate is always timed)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", a->policy.seed, "Seed for random inputs")->capture_default_str();
  add_tune_cuda_graph_flag(cmd, a->policy);
  cmd->add_option("--plan-out", a->plan_out, "Write the winner's plan to this file");
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  add_cache_flags(cmd, a->cache);
  return [a]() {
    auto g = load_resolved(a->graph, a->shape);
    if (!g.ok()) return fail("tune", g.status());
    auto modes = parse_heuristic_modes(a->heuristics);
    if (!modes.ok()) return fail("tune", modes.status());
    a->policy.heuristics = *modes;
    if (Status st = common::check_outputs_spare_inputs({{"--plan-out", a->plan_out}},
                                                       {{"graph file", a->graph}, cache_input(a->cache)});
        !st.ok())
      return fail("tune", st);
    auto cache = open_cache(a->cache);
    SessionOptions so;
    so.cache = cache.get();
    auto session = Session::create(so);
    if (!session.ok()) return fail("tune", session.status());
    GpuContext& ctx = *(*session)->context();
    const bool bar = !a->json && isatty(fileno(stderr));
    TuneProgress progress;
    if (bar) {
      progress = [](int done, int total, const std::string& engine) {
        const int width = 30, filled = total ? width * done / total : width;
        std::fprintf(stderr, "\r[%.*s%*s] %d/%d %-44s", filled, "##############################",
                     width - filled, "", done, total, engine.c_str());
        std::fflush(stderr);
      };
    }
    auto tuned = (*session)->tune(*g, a->policy, progress);
    if (bar) std::fprintf(stderr, "\r%*s\r", 90, "");
    if (tuned.ok()) print_warnings(tuned->warnings);
    if (tuned.ok() && tuned->hit) {
      auto cached = &*tuned;
      // A hit: no heuristics, no tuning. The plan is still checked against the reference.
      RunOptions ro;
      ro.seed = a->policy.seed;
      ro.verify = true;
      ro.iters = 0;
      auto run = run_plan(*g, cached->plan, ctx, ro);
      if (!run.ok()) return fail("tune", run.status());
      if (a->json) {
        nlohmann::json verify = nlohmann::json::array();
        for (const auto& c : run->comparisons) verify.push_back(to_json(c));
        std::printf("%s\n", dump(nlohmann::json{{"graph", g->name},
                                                {"cache", "hit"},
                                                {"cache_key", cached->cache_key},
                                                {"winner", cached->plan.engine_name()},
                                                {"winner_median_ms", cached->entry.tuned_median_ms},
                                                {"tuned_utc", cached->entry.created_utc},
                                                {"cache_lookup_ms", cached->lookup_ms},
                                                {"deserialize_ms", cached->deserialize_ms},
                                                {"verify", verify},
                                                {"ok", run->verified_ok}},
                                 2)
                                .c_str());
      } else {
        std::printf(
            "%s: plan cache hit (%s): tuned winner %s (%.4f ms when tuned on %s); lookup %.2f ms, "
            "deserialize %.2f ms; not tuned again (--no-cache to retune)\n",
            safe(g->name).c_str(), cached->cache_key.c_str(), safe(cached->plan.engine_name()).c_str(),
            cached->entry.tuned_median_ms, safe(cached->entry.created_utc).c_str(), cached->lookup_ms,
            cached->deserialize_ms);
        for (const auto& c : run->comparisons) std::printf("verify: %s\n", c.ToString().c_str());
      }
      Status vs = verify_status(*run);
      return vs.ok() ? kExitOk : fail("tune", vs);
    }
    if (!tuned.ok()) return fail("tune", tuned.status().WithContext("[graph '" + g->name + "']"));
    auto r = &tuned->result;
    const TuneEntry& w = r->entries[r->winner];
    if (!a->plan_out.empty()) {
      auto bytes = tuned->plan.serialize();
      if (!bytes.ok()) return fail("tune", bytes.status());
      Status st = write_plan_file(a->plan_out, make_plan_info(*g, tuned->plan, (*session)->target()), *bytes);
      if (!st.ok()) return fail("tune", st);
    }
    const std::string cache_result = tuned->cache;
    if (a->json) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& e : r->entries) {
        rows.push_back({{"index", e.candidate.index},
                        {"engine", e.candidate.name},
                        {"heuristic_choice", e.heuristic_choice},
                        {"timed", e.timed},
                        {"median_ms", e.latency.median_ms},
                        {"min_ms", e.latency.min_ms},
                        {"p90_ms", e.latency.p90_ms},
                        {"workspace_bytes", e.candidate.workspace_bytes},
                        {"numerical_notes", e.candidate.numerical_notes},
                        {"behavior_notes", e.candidate.behavior_notes},
                        {"skipped_why", e.skipped_why}});
      }
      nlohmann::json verify = nlohmann::json::array();
      for (const auto& c : r->winner_run.comparisons) verify.push_back(to_json(c));
      nlohmann::json j = {
          {"graph", g->name},
          {"cache", cache_result},
          {"winner", w.candidate.name},
          {"winner_median_ms", w.latency.median_ms},
          {"heuristic_choice", r->heuristic >= 0 ? r->entries[r->heuristic].candidate.name : ""},
          {"speedup_over_heuristic", r->speedup_over_heuristic},
          {"tuning_ms", r->tuning_ms},
          {"input_sets", r->input_sets},
          {"timing", a->policy.cuda_graph ? "cuda_graph" : "eager"},
          {"tflops", r->flops / (w.latency.median_ms * 1e-3) / 1e12},
          {"verify", verify},
          {"ok", r->winner_run.verified_ok},
          {"build", to_json(r->report)},
          {"entries", rows}};
      std::printf("%s\n", dump(j).c_str());
    } else {
      if (a->policy.cuda_graph) {
        std::printf(
            "%s: %zu candidates, tuned in %.0f ms (%d warm-up runs each, then GPU time per execute in a CUDA "
            "graph of %d executes, median of %d replays; %d input sets rotated)\n",
            safe(g->name).c_str(), r->entries.size(), r->tuning_ms, a->policy.warmup, a->policy.iters,
            kTuneGraphReplays, r->input_sets);
      } else {
        std::printf(
            "%s: %zu candidates, tuned in %.0f ms (%d warm-up + %d timed runs each, %d input sets rotated)\n",
            safe(g->name).c_str(), r->entries.size(), r->tuning_ms, a->policy.warmup, a->policy.iters,
            r->input_sets);
      }
      std::printf("%4s  %-46s %11s %11s %11s %9s %10s  %s\n", "rank", "engine", "median ms", "min ms",
                  "p90 ms", "TFLOP/s", "workspace", "");
      int rank = 1;
      for (const auto& e : r->entries) {
        const char* mark = e.heuristic_choice ? "<- heuristic choice" : "";
        if (e.timed) {
          std::printf("%4d  %-46s %11.4f %11.4f %11.4f %9.1f %10s  %s\n", rank++, e.candidate.name.c_str(),
                      e.latency.median_ms, e.latency.min_ms, e.latency.p90_ms,
                      r->flops / (e.latency.median_ms * 1e-3) / 1e12,
                      format_bytes(e.candidate.workspace_bytes).c_str(), mark);
        } else {
          std::printf("   -  %-46s %s %s\n", e.candidate.name.c_str(), e.skipped_why.substr(0, 120).c_str(),
                      mark);
        }
      }
      std::printf("winner: %s, %.4f ms", w.candidate.name.c_str(), w.latency.median_ms);
      if (r->heuristic >= 0 && r->entries[r->heuristic].timed) {
        std::printf(", %.2fx the heuristic choice %s (%.4f ms)", r->speedup_over_heuristic,
                    r->entries[r->heuristic].candidate.name.c_str(),
                    r->entries[r->heuristic].latency.median_ms);
      }
      std::printf("\n");
      for (const auto& c : r->winner_run.comparisons)
        std::printf("winner verify: %s\n", c.ToString().c_str());
      if (!a->plan_out.empty()) std::printf("winner plan written to %s\n", safe(a->plan_out).c_str());
    }
    Status vs = verify_status(r->winner_run);
    if (!vs.ok()) return fail("tune", vs.WithContext("[graph '" + g->name + "'] winner " + w.candidate.name));
    return kExitOk;
  };
}

}  // namespace fusebox::cli
