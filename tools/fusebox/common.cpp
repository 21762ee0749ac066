#include "common.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "fusebox/report_json.h"

namespace fusebox::cli {

int exit_code_for(const Status& st) {
  switch (st.code()) {
    case StatusCode::kOk:
      return kExitOk;
    case StatusCode::kInvalidArgument:
    case StatusCode::kParseError:
    case StatusCode::kIoError:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

int fail(const std::string& command, const Status& st) {
  std::cerr << "fusebox " << command << ": " << common::printable(st.ToString(), /*keep_newlines=*/true)
            << "\n";
  return exit_code_for(st);
}

Result<ResolvedGraph> load_resolved(const std::string& path, const std::string& shape) {
  FUSEBOX_ASSIGN_OR_RETURN(GraphSpec spec, load_graph_file(path));
  if (!shape.empty()) {
    auto values = parse_shape_values(shape);
    if (!values.ok()) return values.status().WithContext("--shape");
    auto bound = bind_shape(spec, *values);
    if (!bound.ok()) return bound.status().WithContext(path);
    spec = std::move(bound).value();
  }
  auto resolved = resolve(spec);
  if (!resolved.ok()) return resolved.status().WithContext(path);
  return resolved;
}

void add_shape_flag(CLI::App* cmd, std::string& shape) {
  cmd->add_option(
      "--shape", shape,
      "Concrete values for a symbolic graph's symbols, NAME=VALUE,... (e.g. B=8,S=128); symbols not "
      "given take their default");
}

void add_tune_cuda_graph_flag(CLI::App* cmd, TunePolicy& policy) {
  cmd->add_flag(
      "--cuda-graph", policy.cuda_graph,
      "Time each engine as GPU time per execute inside one CUDA graph of --iters executes, replayed (for "
      "plans you replay in CUDA graphs: no host launch gaps; small graphs may rank differently); "
      "cached apart from eager-timed tunes, and preferred by `run --cuda-graph` and `pipeline run "
      "--cuda-graph`");
}

Result<std::vector<std::pair<std::string, std::string>>> parse_input_list(const std::string& spec) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t start = 0;
  while (start < spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      return InvalidArgument("--inputs: '" + item + "' is not NAME=FILE.npy");
    }
    out.push_back({item.substr(0, eq), item.substr(eq + 1)});
  }
  return out;
}

Result<std::map<std::string, HostTensor>> load_input_files(const ResolvedGraph& g, const std::string& spec) {
  std::map<std::string, HostTensor> out;
  FUSEBOX_ASSIGN_OR_RETURN(auto items, parse_input_list(spec));
  for (const auto& [name, file] : items) {
    const int idx = g.find_tensor(name);
    if (idx < 0 || !g.tensors[idx].is_input || g.tensors[idx].scalar_value) {
      std::string names;
      for (int i : g.input_tensors()) {
        if (!g.tensors[i].scalar_value) names += " " + g.tensors[i].name;
      }
      return InvalidArgument("--inputs: '" + name + "' is not an input of graph '" + g.name +
                             "'; inputs are:" + names);
    }
    FUSEBOX_ASSIGN_OR_RETURN(HostTensor t, read_npy_for(file, g.tensors[idx]));
    out[name] = std::move(t);
  }
  return out;
}

nlohmann::json to_json(const BuildReport& r) { return nlohmann::json::parse(build_report_json(r)); }

nlohmann::json to_json(const Comparison& c) { return nlohmann::json::parse(comparison_json(c)); }

std::string format_bytes(int64_t bytes) {
  char buf[64];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else if (bytes < (1 << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return buf;
}

void print_build_report(const BuildReport& r) {
  std::fflush(stderr);
  std::printf("target: %s (sm_%d)%s\n", safe(r.device_name).c_str(), r.sm_version,
              r.deviceless ? ", deviceless (device-properties file)" : ", live GPU");
  int n = 1;
  for (const auto& s : r.steps) {
    // A failed step's message goes to stderr once, with the command's error.
    std::printf("  %d. %-24s %10.2f ms  %s\n", n++, safe(s.name).c_str(), s.ms,
                s.status.ok() ? "ok" : "FAILED (below)");
  }
  for (const auto& n : r.lowering_notes) std::printf("  lowering: %s\n", safe(n).c_str());
  for (const auto& n : r.excluded) std::printf("  excluded: %s\n", safe(n).c_str());
  if (r.candidate_plans) std::printf("  candidate plans: %lld\n", static_cast<long long>(r.candidate_plans));
  if (!r.engine.empty()) {
    std::printf("  engine: %s (candidate %lld), workspace %s\n", safe(r.engine).c_str(),
                static_cast<long long>(r.plan_index), format_bytes(r.workspace_bytes).c_str());
  }
  if (r.workspace_limit >= 0) {
    std::printf("  workspace limit %s: %zu candidate(s) dropped\n", format_bytes(r.workspace_limit).c_str(),
                r.dropped.size());
    // The first few; --json lists them all.
    const size_t shown = std::min<size_t>(r.dropped.size(), 8);
    for (size_t i = 0; i < shown; ++i) {
      const auto& d = r.dropped[i];
      std::printf("    - %s (candidate %lld): %s\n", safe(d.name).c_str(), static_cast<long long>(d.index),
                  safe(d.why).c_str());
    }
    if (shown < r.dropped.size())
      std::printf("    ... and %zu more (--json lists all)\n", r.dropped.size() - shown);
  }
  std::printf("  total: %.2f ms\n", r.total_ms());
  std::fflush(stdout);
}

nlohmann::json to_json(const PlanReport& r) { return nlohmann::json::parse(plan_report_json(r)); }

nlohmann::json to_json(const PlanCheckReport& c) { return nlohmann::json::parse(plan_check_report_json(c)); }

void print_plan_check(const PlanReport& r) {
  if (!r.partition.empty()) {
    std::printf("  partitioned (no engine runs the whole graph): %s; temporaries %s in the workspace\n",
                safe(r.partition).c_str(), format_bytes(r.partition_temporary_bytes).c_str());
    for (const auto& cut : r.partition_cuts) std::printf("    cut: %s\n", safe(cut).c_str());
    for (const auto& n : r.partition_narrowed) std::printf("    precision: %s\n", safe(n).c_str());
  }
  for (const auto& op : r.reference_fallback) {
    std::printf(
        "  no cuDNN engine for %s\n    -> run by fusebox's reference kernels (fusebox_reference: naive, "
        "fp32, slow; --no-reference-fallback refuses instead)\n",
        safe(op).c_str());
  }
  if (r.plan_check.state == "deviceless" || r.plan_check.state == "not run") return;
  std::printf("  plan check: %s\n", safe(r.plan_check.text()).c_str());
}

void add_reference_fallback_flag(CLI::App* cmd, bool& off) {
  cmd->add_flag("--no-reference-fallback", off,
                "Refuse an op no cuDNN engine builds instead of running it on fusebox's naive reference "
                "kernels (engine fusebox_reference; the fallback is on by default, on a GPU only)");
}

void add_plan_check_flag(CLI::App* cmd, bool& off) {
  cmd->add_flag("--no-plan-check", off,
                "Serve a plan built or loaded on the GPU without first running it once against the reference "
                "(the plan check; the report says it was off)");
}

void print_attempts(const PlanReport& r) {
  // One attempt: its error goes to stderr as the command's error, once.
  if (r.attempts.size() < 2) return;
  for (const auto& a : r.attempts) {
    if (a.status.ok()) continue;
    std::string modes;
    for (auto m : a.modes)
      modes += std::string(modes.empty() ? "" : ",") + std::string(heuristic_mode_name(m));
    const std::string& msg = a.status.message();
    std::printf("  heuristic mode %s: no engine (%.2f ms): %s\n", modes.c_str(), a.report.total_ms(),
                safe(msg.substr(0, std::min<size_t>(msg.find('\n'), 160))).c_str());
  }
  if (r.attempts.size() > 1 && r.attempts.back().status.ok()) {
    std::printf("  heuristic mode %s served\n", r.heuristic_mode.c_str());
  }
}

Result<std::vector<HeuristicMode>> parse_heuristics_flag(const std::string& flag) {
  if (flag == "auto" || flag.empty()) return std::vector<HeuristicMode>{};
  return parse_heuristic_modes(flag);
}

void add_cache_flags(CLI::App* cmd, CacheFlags& flags) {
  cmd->add_option("--cache", flags.path,
                  "Plan cache file (default $FUSEBOX_CACHE or ~/.cache/fusebox/plans.sqlite)");
  cmd->add_flag("--no-cache", flags.off, "Do not use the plan cache");
  cmd->add_option("--cache-max-bytes", flags.max_bytes,
                  "Plan cache size bound; least recently used entries are evicted beyond it "
                  "(default $FUSEBOX_CACHE_MAX_BYTES, else 1 GiB)")
      ->check(CLI::PositiveNumber);
}

std::unique_ptr<PlanCache> open_cache(const CacheFlags& flags) {
  if (flags.off) return nullptr;
  PlanCacheOptions options;
  if (flags.max_bytes > 0) {
    options.max_bytes = flags.max_bytes;
  } else if (const char* env = std::getenv("FUSEBOX_CACHE_MAX_BYTES"); env && *env) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end && *end == '\0' && v > 0) {
      options.max_bytes = v;
    } else {
      std::fprintf(
          stderr, "fusebox: warning: FUSEBOX_CACHE_MAX_BYTES='%s' is not a positive byte count; using %lld\n",
          safe(env).c_str(), static_cast<long long>(options.max_bytes));
    }
  }
  auto cache = std::make_unique<PlanCache>(
      PlanCache::open(flags.path.empty() ? default_cache_path() : flags.path, options));
  print_warnings(cache->warnings());
  return cache;
}

common::NamedPath cache_input(const CacheFlags& flags) {
  if (flags.off) return {"plan cache", ""};
  return {"plan cache", flags.path.empty() ? default_cache_path() : flags.path, /*database=*/true};
}

std::vector<common::NamedPath> input_list_files(const std::string& spec, const std::string& flag) {
  std::vector<common::NamedPath> out;
  auto items = parse_input_list(spec);
  if (!items.ok()) return out;  // reported when the command reads the list
  for (const auto& [name, file] : *items) out.push_back({flag + " file for '" + name + "'", file});
  return out;
}

void print_warnings(const std::vector<std::string>& warnings) {
  for (const auto& w : warnings) {
    std::fprintf(stderr, "fusebox: warning: %s\n", common::printable(w, /*keep_newlines=*/true).c_str());
  }
}

std::string cache_state(const PlanCache* cache, bool hit) {
  if (!cache || !cache->enabled()) return "off";
  return hit ? "hit" : "miss";
}

std::string graph_equality(const CudaGraphRun& cg, const char* noun) {
  std::string out = std::string(noun) + " bit-identical to eager: " + (cg.bit_identical ? "yes" : "no") +
                    " (" + std::to_string(cg.bytes_compared) + " bytes compared)";
  if (!cg.bit_identical && !cg.not_reproducible.empty()) {
    out += "; not bit-reproducible by design (" + cg.not_reproducible +
           "), so compared within tolerance: " + (cg.within_tolerance ? "yes" : "no");
    for (const auto& m : cg.mismatches) out += "\n    " + m;
  }
  return out;
}

nlohmann::json to_json(const CudaGraphRun& cg) { return nlohmann::json::parse(cuda_graph_run_json(cg)); }

std::string printable_tokens(const std::vector<int32_t>& ids, const std::vector<std::string>& vocab) {
  std::string s;
  for (int32_t id : ids) s += vocab.empty() ? "[" + std::to_string(id) + "]" : vocab[static_cast<size_t>(id)];
  std::string out;  // control bytes shown escaped; text (UTF-8 included) as is
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

Result<std::string> npy_output_path(const std::string& name, const std::string& dir,
                                    const std::vector<common::NamedPath>& inputs, const std::string& flag) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return InvalidArgument(
        flag + ": output tensor '" + name +
        "' cannot be saved as a file name (no '/', NUL, '.' or '..'); rename it in the graph");
  }
  const std::string path = (std::filesystem::path(dir) / (name + ".npy")).string();
  FUSEBOX_RETURN_IF_ERROR(common::refuse_overwriting_input(path, flag + " file", inputs));
  FUSEBOX_RETURN_IF_ERROR(common::check_replaceable(path, flag + " file"));
  return path;
}

Result<std::map<std::string, std::string>> npy_output_paths(const ResolvedGraph& g, const std::string& dir,
                                                            const std::vector<common::NamedPath>& inputs,
                                                            const std::string& flag, bool graph_inputs) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
    return InvalidArgument(flag + " '" + dir + "' exists and is not a directory");
  std::map<std::string, std::string> out;
  for (const auto& t : g.tensors) {
    if (!(graph_inputs ? t.is_input : t.is_output)) continue;
    FUSEBOX_ASSIGN_OR_RETURN(out[t.name], npy_output_path(t.name, dir, inputs, flag));
  }
  return out;
}

}  // namespace fusebox::cli
