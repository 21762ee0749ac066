// fusebox: a Session is the library's entry point for one device and stream:
// it owns the cuDNN context (handle + stream), uses a plan cache, decides
// where each plan comes from (plan file, tuned cache entry, heuristic cache
// entry, build, tune) and reports it, and owns one workspace arena shared by
// every plan it binds. `fusebox build|run|tune` are thin callers of it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/cached_plan.h"
#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/plan_cache.h"
#include "fusebox/status.h"
#include "fusebox/tune.h"

namespace fusebox {

// kShapeOverride: no build, a plan built for another shape of the symbolic graph serves by
// execute-time shape override (PlanRequest::override_shapes).
enum class PlanSource { kNone, kPlanFile, kTunedCache, kHeuristicCache, kBuilt, kShapeOverride };
// "plan file", "tuned cache", "heuristic cache", "built", "shape override" (for JSON).
std::string_view plan_source_name(PlanSource s);

// How Session::get_plan finds a plan. The default: a tuned cache entry (the
// default tuning policy's), then the heuristic cache entry, then a build that
// tries heuristic modes A, B and fallback in turn until one yields an engine.
struct PlanRequest {
  std::string plan_file;  // non-empty: this plan file, nothing else
  // Empty: modes in turn (above). Non-empty: pinned, one build with exactly
  // these modes (the candidates of all of them).
  std::vector<HeuristicMode> heuristics;
  std::string engine;                // pin an engine by name (skips the tuned entry)
  int64_t max_workspace_bytes = -1;  // -1: the session's limit only
  bool use_tuned_cache = true;
  // The plan will be replayed in a CUDA graph: a tuned entry timed that way
  // (TunePolicy::cuda_graph, `tune --cuda-graph`) is looked up first, then the
  // eager-timed one.
  bool cuda_graph = false;
  bool measure_startup = false;  // on a hit, deserialize twice (one-time library load apart)
  // A symbolic graph (ResolvedGraph::symbolic_id set) builds with cuDNN's
  // dynamic shapes and the session's kernel cache for that graph, so a new
  // shape reuses the kernels earlier shapes compiled; where the engines
  // refuse dynamic shapes, a static build serves (PlanReport says why).
  // false: a static build, as for any graph (the cold baseline).
  bool dynamic_shape = true;
  // With dynamic shapes and no pinned engine: a later shape first replays the
  // engine and knobs the graph's first dynamic build chose (no heuristics,
  // like one engine per TensorRT profile, and the kernels that engine
  // compiled are the ones the kernel cache holds); where that engine does not
  // support the shape, the heuristics choose as usual.
  bool reuse_engine = true;
  // With dynamic shapes on a GPU whose cuDNN has execute-time shape override (9.23+,
  // override_shapes_available()) and no pinned engine: the graph's first build is override-enabled,
  // and every later shape is served by that plan with no build (plan_at_shape: the shapes go to
  // cuDNN at execute, the workspace from cuDNN's query for them), before the static policy below.
  // Where the engines refuse override shapes, or a shape differs in more than its dims, or the
  // plan check fails at a shape, the kernel cache and per-shape plans serve (PlanReport says why).
  bool override_shapes = true;
  // A symbolic graph builds statically when a static build is served by precompiled kernels (no
  // RUNTIME_COMPILATION note): such an engine builds any shape in milliseconds (3 ms for
  // conv_bias_relu_dyn on the H200) where even a warm kernel cache costs about 30 ms a shape
  // (cuDNN's finalize of the execution plan: 27-30 ms in its API log) and a cold one compiles first (884 ms
  // for that conv, whose dynamic-shape candidates are all runtime-compiled). Before the graph's first build,
  // the static heuristics are asked (step 3 and the support check, no build: milliseconds) which engine a
  // static build would take, unless the plan cache already holds the shape (a warm start asks nothing); after
  // the first dynamic build, its engine is checked too. Runtime-compiled engines (matmul epilogues, norms,
  // attention) keep the kernel cache. PlanReport::static_policy says so.
  bool static_when_precompiled = true;
  // The plan check (fusebox/plan_check.h): on a GPU, a plan built now, or
  // loaded without a sealed passing verdict, runs once on random inputs
  // against the reference before it is served; a plan that fails is never
  // served (the next candidate is built and checked). false: served
  // unchecked, and PlanReport::plan_check says so.
  bool check_plan = true;
  // When no engine runs the whole graph, split it into the largest parts
  // that have engines (fusebox/partition.h) and serve them as one plan.
  // Never when a whole-graph engine exists. false: the whole graph's error.
  bool partition = true;
  // On a GPU, a graph of one op (the whole graph, or a single op of a partition) that no cuDNN
  // engine builds runs on fusebox's reference kernels (engine "fusebox_reference": naive, fp32,
  // correct and slow; no CUDA graph capture), and PlanReport::reference_fallback says why.
  // Deviceless builds never take it (runtime-compiled engines might exist on the GPU).
  // false: the op's error.
  bool reference_fallback = true;
};

// One build tried by the policy.
struct ModeAttempt {
  std::vector<HeuristicMode> modes;
  Status status;
  BuildReport report;
};

// Where a plan came from and what it cost.
struct PlanReport {
  PlanSource source = PlanSource::kNone;
  std::string heuristic_mode;  // the modes that served a build ("a", "fallback", "a,b"); empty otherwise
  std::vector<ModeAttempt> attempts;  // builds tried, in order; the last one served when the plan was built
  BuildReport build;                  // the five steps of the serving (or last failed) build
  std::string engine;
  int64_t workspace_bytes = 0;
  std::string cache = "off";  // "hit", "miss" or "off"
  std::string cache_key;
  bool stored = false;     // a build was stored in the cache
  CacheEntry cache_entry;  // provenance on a cache hit (payload emptied)
  bool plan_file_built_deviceless = false;
  double lookup_ms = 0;       // cache lookups (tuned, then heuristic)
  double deserialize_ms = 0;  // plan file or cache entry
  double deserialize_again_ms = -1;
  double total_ms = 0;  // get_plan wall time
  std::vector<std::string> warnings;
  // A symbolic graph: its concrete values, and how a build used the
  // session's kernel cache for the graph: "off" (no dynamic-shape build),
  // "cold" (the graph's first dynamic build in this session: compiles and
  // fills the cache) or "warm" (earlier builds filled it).
  ShapeValues shape;
  bool dynamic_shape = false;  // the serving plan was built with dynamic shapes
  std::string kernel_cache = "off";
  int kernel_cache_builds_before = 0;  // dynamic builds of this graph in the session before this one
  // Why dynamic shapes were not used for this graph (a refused dynamic build:
  // cuDNN's first line), when a static build served instead.
  std::string dynamic_fallback;
  double dynamic_failed_ms = 0;  // time spent on the refused dynamic build
  // Why this shape was built statically by the session's choice although dynamic shapes work
  // (PlanRequest::static_when_precompiled): a static build takes an engine with precompiled
  // kernels (asked of the heuristics before the graph's first build), or the first dynamic build
  // chose one; such an engine builds any shape statically in milliseconds.
  std::string static_policy;
  double static_probe_ms = 0;    // asking the static heuristics before the graph's first build (0: not asked)
  bool engine_replayed = false;  // built with the first shape's engine, no heuristics
  std::string replay_failed;     // why that engine could not serve this shape (then heuristics served)
  // Execute-time shape override (PlanRequest::override_shapes): "built" (this build is
  // override-enabled: later shapes need no build), "served" (no build: the plan built for
  // `override_built_shape` serves this shape), else empty.
  std::string override_shape;
  ShapeValues override_built_shape;
  double override_ms = 0;            // serving a shape by override (the workspace query), plan check apart
  std::string override_refused;      // why override shapes did not serve (the graph, or this shape)
  bool tuned_in_cuda_graph = false;  // a tuned entry timed inside CUDA graphs (PlanRequest::cuda_graph)
  PlanCheckReport plan_check;        // what the plan check did (PlanRequest::check_plan)
  // A partitioned plan built now: GraphPartition::summary(), why each cut was
  // needed (one line per cut), and the bytes of temporaries in the workspace.
  std::string partition;
  // Ops run on fusebox's reference kernels because no cuDNN engine builds them
  // (PlanRequest::reference_fallback): "op 'name' (type): cuDNN's reason", one per op.
  std::vector<std::string> reference_fallback;
  std::vector<std::string> partition_cuts;
  std::vector<std::string> partition_narrowed;  // GraphPartition::narrowed: precision given up, and why
  int64_t partition_temporary_bytes = 0;
  struct PartitionPart {
    int first_op = 0;  // into the graph's ops (topological order)
    int op_count = 0;
    std::string engine;
    int64_t workspace_bytes = 0;
  };
  std::vector<PartitionPart> partition_parts;

  // What `fusebox run` prints: "built now", "plan cache (tuned)", "plan file (built deviceless)", ...
  // (a symbolic graph's shape and kernel-cache use appended in brackets).
  std::string source_text() const;
  // A symbolic graph: "shape B=8,S=128: dynamic shapes, kernel cache warm (3 earlier builds)",
  // or why a static build served; empty for a static graph.
  std::string shape_summary() const;

 private:
  std::string source_text_base() const;
};

// The order the default policy tries heuristic modes: {a}, {b}, {fallback}.
std::vector<std::vector<HeuristicMode>> default_mode_order();
// Whether another heuristic mode could succeed where `st` failed: cuDNN found
// no engine (steps 3-5, or the workspace limit), not a graph or CUDA error.
bool another_mode_may_help(const Status& st, const BuildReport& failed);
// The policy's build loop, apart from cuDNN so it is testable: calls `build`
// with each entry of `order` as the modes until one succeeds or a failure
// another mode cannot fix; every try is appended to `attempts`.
using BuildFn = std::function<Result<Plan>(const BuildOptions&, BuildReport*)>;
Result<Plan> build_modes_in_turn(const BuildOptions& base,
                                 const std::vector<std::vector<HeuristicMode>>& order, const BuildFn& build,
                                 std::vector<ModeAttempt>* attempts);
// The cache policy key of a request ("build;modes=a>b>fallback;..." for the default).
std::string request_policy_key(const PlanRequest& r, int64_t effective_max_workspace);

struct SessionOptions {
  int device_id = 0;
  // Non-empty: a deviceless session building for the GPU this
  // device-properties file describes (no GPU needed; cannot bind or run).
  std::string device_properties_file;
  PlanCache* cache = nullptr;  // not owned; null: no cache
  // Applied to every build: candidates needing more are dropped (and listed
  // in the report); a cached or file plan needing more is refused.
  int64_t workspace_limit_bytes = -1;
};

struct SessionTune {
  bool hit = false;  // a tuned plan was in the cache: not tuned again
  Plan plan;         // the cached plan, or the winner
  CacheEntry entry;  // on a hit
  std::string cache = "off";
  std::string cache_key;
  double lookup_ms = 0, deserialize_ms = 0;
  TuneResult result;    // when tuned now (winner_plan moved into `plan`)
  bool stored = false;  // the verified winner was stored
  std::vector<std::string> warnings;
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(const SessionOptions& options = {});
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const DeviceTarget& target() const;
  bool deviceless() const;
  GpuContext* context();  // null when deviceless
  PlanCache* cache();
  double context_create_ms() const;  // the GPU context and cuDNN handle, at create()

  // A plan for `g` by the request's policy. `report` (optional) is filled on
  // success and failure alike (a failed build's steps are in it).
  Result<Plan> get_plan(const ResolvedGraph& g, const PlanRequest& request = {},
                        PlanReport* report = nullptr);

  // A symbolic graph at concrete values: bind_shape(), resolve(), then
  // get_plan() above. `graph` is what the plan was built for (bind buffers
  // by its tensors). Every shape of one spec shares the session's kernel
  // cache for it; plans are cached per concrete shape (the cache key holds
  // the dims).
  struct ShapedPlan {
    ResolvedGraph graph;
    Plan plan;
  };
  Result<ShapedPlan> get_plan(const GraphSpec& spec, const ShapeValues& values,
                              const PlanRequest& request = {}, PlanReport* report = nullptr);
  // Symbolic graphs holding a kernel cache in this session.
  int kernel_cache_count() const;

  // The cached winner of `policy` if there is one, else tunes on the GPU and
  // stores the winner when it verifies.
  Result<SessionTune> tune(const ResolvedGraph& g, const TunePolicy& policy,
                           const TuneProgress& progress = nullptr);

  // Binds `plan` to device buffers (every non-virtual tensor by name) on this
  // session's stream and workspace arena, growing the arena if the plan needs
  // more. The plan and the session must outlive the BoundPlan.
  Result<BoundPlan> bind(const Plan& plan, const std::map<std::string, void*>& buffers);
  // Grows the arena to at least `bytes` now (a later bind then never waits
  // for the stream to free the old one; a grown arena makes each bound plan
  // rebuild its variant pack once, at its next execute).
  Status reserve_workspace(int64_t bytes);
  int64_t workspace_bytes() const;  // the arena's size: the largest bound plan's need so far

  struct Impl;

 private:
  explicit Session(std::unique_ptr<Impl> impl);
  // get_plan's partitioner: `whole` is why the whole graph found no engine.
  Result<Plan> build_partitioned(const ResolvedGraph& g, const BuildOptions& base, int64_t limit,
                                 const Status& whole, const PlanRequest& request, PlanReport& rep);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
