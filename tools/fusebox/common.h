// Shared pieces of the fusebox CLI commands.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/json_util.h"
#include "common/text.h"
#include "fusebox/cached_plan.h"
#include "fusebox/graph.h"
#include "fusebox/op_traits.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"
#include "fusebox/tensor.h"

namespace fusebox::cli {

// Exit codes: 0 ok, 1 the work failed (cuDNN, verification, no GPU), 2 bad input or usage.
constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitBadInput = 2;

int exit_code_for(const Status& st);
// Prints "fusebox <command>: <message>" to stderr (control bytes escaped) and
// returns the exit code.
int fail(const std::string& command, const Status& st);

// Text for a terminal: names, paths and foreign strings with control bytes
// escaped (common::printable), so a file name cannot move the cursor or
// retitle the terminal.
inline std::string safe(std::string_view s) { return common::printable(s); }
// A JSON document for stdout: never throws on invalid UTF-8 (replaced).
inline std::string dump(const nlohmann::json& j, int indent = 2) { return common::json_dump(j, indent); }

// Loads and resolves a graph file; a symbolic graph at `shape` ("B=8,S=128",
// empty: each symbol's default).
Result<ResolvedGraph> load_resolved(const std::string& path, const std::string& shape = "");
// --shape NAME=VALUE,...: concrete values for a symbolic graph's symbols.
void add_shape_flag(CLI::App* cmd, std::string& shape);
// --cuda-graph of `tune` and `pipeline tune`: time each engine inside a CUDA graph (TunePolicy::cuda_graph).
void add_tune_cuda_graph_flag(CLI::App* cmd, TunePolicy& policy);
// --inputs "x=a.npy,w=b.npy" -> {{x, a.npy}, {w, b.npy}} in the order given;
// an item that is not NAME=FILE is InvalidArgument naming it.
Result<std::vector<std::pair<std::string, std::string>>> parse_input_list(const std::string& spec);

// --inputs "x=a.npy,w=b.npy": each NAME must be a (non-scalar) input of `g`;
// the files are read as that tensor (shape checked). Empty spec: no inputs.
Result<std::map<std::string, HostTensor>> load_input_files(const ResolvedGraph& g, const std::string& spec);

// DIR/<name>.npy for output tensor `name` under option `flag` (--save-outputs): refused when the
// name is not one file name (names are free text in the graph file), the file is one of `inputs`
// or cannot be replaced. npy_output_paths: every output of g (every graph input with
// `graph_inputs`: --save-inputs), after checking DIR is no file.
Result<std::string> npy_output_path(const std::string& name, const std::string& dir,
                                    const std::vector<common::NamedPath>& inputs, const std::string& flag);
Result<std::map<std::string, std::string>> npy_output_paths(const ResolvedGraph& g, const std::string& dir,
                                                            const std::vector<common::NamedPath>& inputs,
                                                            const std::string& flag,
                                                            bool graph_inputs = false);

// JSON for reports (doubles only: see docs/architecture.md on the frontend's float serializer).
nlohmann::json to_json(const BuildReport& r);
nlohmann::json to_json(const Comparison& c);
std::string format_bytes(int64_t bytes);
// Prints the five steps with timings, the candidates and the chosen engine.
void print_build_report(const BuildReport& r);
// Where a plan came from: source, modes tried, cache, costs.
nlohmann::json to_json(const PlanReport& r);
nlohmann::json to_json(const PlanCheckReport& c);
// "outputs bit-identical to eager: yes (N bytes compared)", or for a graph not
// bit-reproducible by design, why and the within-tolerance comparisons (one per line).
std::string graph_equality(const CudaGraphRun& cg, const char* noun);
// `run --cuda-graph` / `pipeline run --cuda-graph`: recording, why not native,
// bit_identical_to_eager, bytes_compared, not_bit_reproducible,
// within_tolerance_of_eager, mismatches, create_ms; null when unused.
nlohmann::json to_json(const CudaGraphRun& cg);
// The heuristic modes tried before the one that served (or all, on failure).
void print_attempts(const PlanReport& r);
// "  plan check: passed (...)" and the rejected plans, when a check ran or was turned off.
void print_plan_check(const PlanReport& r);
// --no-plan-check (PlanRequest::check_plan).
void add_plan_check_flag(CLI::App* cmd, bool& off);
// --no-reference-fallback (PlanRequest::reference_fallback).
void add_reference_fallback_flag(CLI::App* cmd, bool& off);
// --heuristics: "auto" (empty: the session's modes in turn) or "a,b,fallback".
Result<std::vector<HeuristicMode>> parse_heuristics_flag(const std::string& flag);

// --cache PATH / --no-cache, shared by build, tune and run.
struct CacheFlags {
  std::string path;  // empty: $FUSEBOX_CACHE or ~/.cache/fusebox/plans.sqlite
  bool off = false;
  int64_t max_bytes = -1;  // -1: $FUSEBOX_CACHE_MAX_BYTES, else 1 GiB
};
void add_cache_flags(CLI::App* cmd, CacheFlags& flags);
// nullptr with --no-cache; otherwise the cache (possibly disabled, with its
// warning printed to stderr).
std::unique_ptr<PlanCache> open_cache(const CacheFlags& flags);
// The plan cache file the command would open (its side files included), as an
// input of check_outputs_spare_inputs(); an empty path with --no-cache.
common::NamedPath cache_input(const CacheFlags& flags);
// The FILEs of a NAME=FILE,... list (--inputs), as inputs; a malformed list gives
// none (the command reports it when it reads the list).
std::vector<common::NamedPath> input_list_files(const std::string& spec, const std::string& flag);
void print_warnings(const std::vector<std::string>& warnings);
// "hit", "miss" or "off".
std::string cache_state(const PlanCache* cache, bool hit);

// Token ids as text through `vocab` (each id's bytes; "[id]" without one), control bytes escaped.
std::string printable_tokens(const std::vector<int32_t>& ids, const std::vector<std::string>& vocab);

// Each command adds its subcommand and returns the function that runs it.
using Runner = std::function<int()>;
Runner add_info(CLI::App& app);
Runner add_devprop(CLI::App& app);
Runner add_check(CLI::App& app);
Runner add_build(CLI::App& app);
Runner add_run(CLI::App& app);
Runner add_engines(CLI::App& app);
Runner add_tune(CLI::App& app);
Runner add_cache(CLI::App& app);
Runner add_pipeline(CLI::App& app);
Runner add_shapes(CLI::App& app);
Runner add_model(CLI::App& app);
Runner add_ops(CLI::App& app);
Runner add_reference(CLI::App& app);
Runner add_backward(CLI::App& app);
Runner add_train(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_pipeline_backward(CLI::App& pipeline);  // `pipeline backward`, in cmd_backward.cpp
// An op's traits as JSON (fusebox ops, check --json).
nlohmann::ordered_json traits_json(const OpTraitsInfo& t);
// A Python runner of fusebox_tools: `module` (python3 -m), the file that shows where the tools
// are (`file`, relative to the python folder) and what the interpreter needs (for messages).
struct PythonRunner {
  const char* module;
  const char* file;
  const char* needs;
};
// Runs `python3 -m module --fusebox <this binary> ARGS...` ($FUSEBOX_PYTHON, $FUSEBOX_PYTHONPATH)
// and returns its exit code; errors in starting it are reported as `fusebox COMMAND: ...`.
int run_python_module(const std::string& command, const PythonRunner& r,
                      const std::vector<std::string>& args);
// `fusebox model embed ARGS...`: the Python runner with ARGS verbatim; its exit code.
int run_model_embed(const std::vector<std::string>& args);

}  // namespace fusebox::cli
