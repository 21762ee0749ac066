#include "fusebox/session.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <set>

#include "common/cuda_status.h"
#include "common/plan_info_json.h"
#include "common/stopwatch.h"
#include "fusebox/plan_file.h"

namespace fusebox {
namespace {

std::string modes_csv(const std::vector<HeuristicMode>& modes) {
  std::string s;
  for (auto m : modes) s += std::string(s.empty() ? "" : ",") + std::string(heuristic_mode_name(m));
  return s;
}

// The tighter of two limits (-1: none).
int64_t tighter(int64_t a, int64_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return std::min(a, b);
}

void append(std::vector<std::string>& to, const std::vector<std::string>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

std::string_view plan_source_name(PlanSource s) {
  switch (s) {
    case PlanSource::kNone:
      return "none";
    case PlanSource::kPlanFile:
      return "plan file";
    case PlanSource::kTunedCache:
      return "tuned cache";
    case PlanSource::kHeuristicCache:
      return "heuristic cache";
    case PlanSource::kBuilt:
      return "built";
    case PlanSource::kShapeOverride:
      return "shape override";
  }
  return "none";
}

std::string PlanReport::shape_summary() const {
  if (shape.empty()) return "";
  std::string s = "shape " + shape_text(shape) + ": ";
  if (source == PlanSource::kShapeOverride) {
    return s + "no build: the plan built for " + shape_text(override_built_shape) +
           " serves it by execute-time shape override";
  }
  if (source != PlanSource::kBuilt)
    return s + "plan for this shape from the " + std::string(plan_source_name(source));
  if (override_shape == "built") s += "override-enabled (later shapes need no build), ";
  if (dynamic_shape) {
    s += "dynamic shapes, kernel cache " + kernel_cache;
    if (engine_replayed) s += ", engine of the first shape reused";
    if (kernel_cache_builds_before > 0) {
      s += " (" + std::to_string(kernel_cache_builds_before) + " earlier build" +
           (kernel_cache_builds_before == 1 ? "" : "s") + " of this graph)";
    }
    return s;
  }
  if (!dynamic_fallback.empty()) return s + "static build (dynamic shapes refused: " + dynamic_fallback + ")";
  if (!static_policy.empty()) return s + "static build (" + static_policy + ")";
  return s + "static build";
}

std::string PlanReport::source_text() const {
  std::string text = source_text_base();
  return shape.empty() ? text : text + " [" + shape_summary() + "]";
}

std::string PlanReport::source_text_base() const {
  switch (source) {
    case PlanSource::kPlanFile:
      return std::string("plan file (built ") + (plan_file_built_deviceless ? "deviceless" : "on a GPU") +
             ")";
    case PlanSource::kTunedCache:
      return tuned_in_cuda_graph ? "plan cache (tuned in a CUDA graph)" : "plan cache (tuned)";
    case PlanSource::kHeuristicCache:
      return "plan cache (heuristic choice)";
    case PlanSource::kBuilt: {
      std::string s = "built now";
      if (attempts.size() > 1) {
        s += " (heuristic mode " + heuristic_mode + "; ";
        for (size_t i = 0; i + 1 < attempts.size(); ++i) {
          s += (i ? ", " : "") + modes_csv(attempts[i].modes);
        }
        s += " found no engine)";
      }
      return s;
    }
    case PlanSource::kShapeOverride:
      return "no build (shape override of the plan built for " + shape_text(override_built_shape) + ")";
    case PlanSource::kNone:
      break;
  }
  return "none";
}

std::vector<std::vector<HeuristicMode>> default_mode_order() {
  return {{HeuristicMode::kA}, {HeuristicMode::kB}, {HeuristicMode::kFallback}};
}

bool another_mode_may_help(const Status& st, const BuildReport& failed) {
  if (st.code() != StatusCode::kNotSupported && st.code() != StatusCode::kCudnnError) return false;
  // validate and build_operation_graph do not depend on the mode: a failure
  // there (fewer than three steps ran) fails every mode alike.
  return failed.steps.size() >= 3;
}

Result<Plan> build_modes_in_turn(const BuildOptions& base,
                                 const std::vector<std::vector<HeuristicMode>>& order, const BuildFn& build,
                                 std::vector<ModeAttempt>* attempts) {
  if (order.empty()) return InvalidArgument("no heuristic mode to try");
  std::vector<Status> failures;
  for (const auto& modes : order) {
    BuildOptions o = base;
    o.heuristics = modes;
    ModeAttempt attempt;
    attempt.modes = modes;
    auto plan = build(o, &attempt.report);
    attempt.status = plan.ok() ? Status::Ok() : plan.status();
    const bool may_help = !plan.ok() && another_mode_may_help(attempt.status, attempt.report);
    if (attempts) attempts->push_back(std::move(attempt));
    if (plan.ok()) return plan;
    if (!may_help) return plan.status();
    failures.push_back(plan.status());
  }
  if (order.size() == 1) return failures[0];
  // One line per mode, then the first mode's details (cuDNN's reasons, hints).
  std::string tried, lines;
  for (size_t i = 0; i < order.size(); ++i) {
    tried += (i ? ", " : "") + modes_csv(order[i]);
    const std::string& m = failures[i].message();
    lines += "\n  mode " + modes_csv(order[i]) + ": " + m.substr(0, m.find('\n'));
  }
  const std::string& first = failures[0].message();
  const size_t nl = first.find('\n');
  return Status(failures[0].code(), "no heuristic mode yielded a buildable engine (tried in turn: " + tried +
                                        ")" + lines + (nl == std::string::npos ? "" : first.substr(nl)));
}

std::string request_policy_key(const PlanRequest& r, int64_t effective_max_workspace) {
  BuildOptions o;
  o.heuristics = r.heuristics;
  o.engine = r.engine;
  o.max_workspace_bytes = effective_max_workspace;
  return build_policy_key(o);  // empty modes: the in-turn order's own key
}

// ---------------------------------------------------------------- Session

// How many plans one get_plan checks before it gives up (each failure
// rebuilds without the engine that failed).
constexpr size_t kMaxPlanCheckCandidates = 8;

struct Session::Impl {
  SessionOptions options;
  DeviceTarget target;
  std::unique_ptr<GpuContext> ctx;
  double context_ms = 0;
  // The arena: one workspace for every plan bound on this stream.
  void* arena = nullptr;
  std::shared_ptr<WorkspaceBinding> workspace = std::make_shared<WorkspaceBinding>();
  // One kernel cache per symbolic graph (ResolvedGraph::symbolic_id).
  struct KernelCacheSlot {
    std::shared_ptr<KernelCache> cache;
    int builds = 0;       // dynamic builds that used it
    std::string refused;  // a dynamic build was refused: later shapes build static
    std::string
        precompiled;      // a static or the first dynamic build's engine is precompiled: shapes build static
    bool probed = false;  // the static heuristics were asked (before the first build)
    // The engine the first dynamic build chose, per request policy (PlanRequest::reuse_engine).
    std::map<std::string, EngineChoice> engines;
    // Execute-time shape override (PlanRequest::override_shapes): the plan built override-enabled
    // and the graph it was built for serve every later shape with no build; or why they do not
    // (then the kernel cache and per-shape plans serve, as on a cuDNN without it).
    std::shared_ptr<const Plan> override_plan;
    ResolvedGraph override_graph;
    std::string override_refused;
    std::set<std::string> override_checked;  // shapes (shape_text) that passed the plan check by override
    // Per engine, the shapes whose plan, the first shape's engine replayed with the warm kernel
    // cache, passed the plan check (see kShapesCheckedPerPath).
    std::map<std::string, std::set<std::string>> replay_checked;
  };
  std::map<std::string, KernelCacheSlot> kernel_caches;
  // fusebox's own kernels (Plan::native()) that passed the plan check in this session, by the
  // graph's canonical form and the kernel: the same kernel on an equal graph is the same code on
  // the same shapes, so it is checked once per session, not once per stage (a transformer's
  // layers repeat every norm and RoPE). With a plan cache an equal graph is a trusted hit anyway;
  // this serves sessions without one.
  std::set<std::string> native_passed;

  ~Impl() {
    if (arena) {
      if (ctx) cudaStreamSynchronize(static_cast<cudaStream_t>(ctx->stream()));
      cudaFree(arena);
    }
  }

  // A plan from somewhere other than a build must meet the limit too.
  Status check_limit(const Plan& plan, int64_t limit, const std::string& what) const {
    if (limit < 0 || plan.workspace_bytes() <= limit) return Status::Ok();
    return InvalidArgument(what + ": plan '" + plan.engine_name() + "' needs " +
                           std::to_string(plan.workspace_bytes()) +
                           " bytes of workspace, over the limit of " + std::to_string(limit));
  }
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Session::~Session() = default;

Result<std::unique_ptr<Session>> Session::create(const SessionOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (!options.device_properties_file.empty()) {
    FUSEBOX_ASSIGN_OR_RETURN(impl->target, DeviceTarget::from_file(options.device_properties_file));
  } else {
    const common::Stopwatch watch;
    FUSEBOX_ASSIGN_OR_RETURN(impl->ctx, GpuContext::create(options.device_id));
    impl->context_ms = watch.ms();
    FUSEBOX_ASSIGN_OR_RETURN(impl->target, DeviceTarget::live_gpu(options.device_id));
  }
  return std::unique_ptr<Session>(new Session(std::move(impl)));
}

const DeviceTarget& Session::target() const { return impl_->target; }
bool Session::deviceless() const { return impl_->target.deviceless(); }
GpuContext* Session::context() { return impl_->ctx.get(); }
PlanCache* Session::cache() { return impl_->options.cache; }
double Session::context_create_ms() const { return impl_->context_ms; }
int64_t Session::workspace_bytes() const { return impl_->workspace->bytes; }

namespace {

// Which engine a static build of `g` would take (the first heuristic mode's first candidate
// that passes the support check; nothing is built): non-empty, saying so, when its kernels are
// precompiled (no RUNTIME_COMPILATION note). Empty when it is runtime-compiled or unknown.
std::string static_engine_precompiled(const ResolvedGraph& g, const DeviceTarget& target,
                                      const PlanRequest& request, int64_t limit, GpuContext* ctx) {
  BuildOptions o;
  o.heuristics = request.heuristics.empty() ? default_mode_order()[0] : request.heuristics;
  o.max_workspace_bytes = limit;
  auto set = CandidateSet::create(g, target, o, nullptr, ctx);
  if (!set.ok()) return "";
  set->check_all(/*build=*/false);
  for (const auto& c : set->candidates()) {
    if (!c.supported || c.duplicate_of >= 0) continue;
    if (has_note(c.behavior_notes, "RUNTIME_COMPILATION")) return "";
    return "a static build takes engine " + c.name +
           ", which has precompiled kernels (no RUNTIME_COMPILATION): it builds a new shape in milliseconds "
           "and a kernel cache has nothing to reuse";
  }
  return "";
}

// The last resort for a graph of one op that no cuDNN engine builds (`why`): fusebox's reference
// kernels (PlanRequest::reference_fallback). Only on a GPU: deviceless, a runtime-compiled engine
// the build could not see may exist. `why` unchanged where the fallback does not apply.
// `whole_graph`: any number of ops (the plan check's last candidate, after a partition failed it).
Result<Plan> reference_fallback_plan(const ResolvedGraph& g, const DeviceTarget& target,
                                     const BuildOptions& base, const PlanRequest& request, const Status& why,
                                     GpuContext* ctx, PlanReport& rep, BuildReport* report,
                                     bool whole_graph = false) {
  if (!request.reference_fallback || !request.engine.empty() || target.deviceless() ||
      (g.ops.size() != 1 && !whole_graph) || why.code() != StatusCode::kNotSupported) {
    return why;
  }
  BuildOptions o = base;
  o.engine = kReferenceEngine;
  o.dynamic_shape = false;
  o.kernel_cache = nullptr;
  auto plan = build_plan(g, target, o, report, ctx);
  if (!plan.ok()) {
    return Status(why.code(), why.message() + "\n  and fusebox's reference kernels cannot run it either: " +
                                  plan.status().message());
  }
  const ResolvedOp& op = g.ops[0];
  const std::string& m = why.message();
  const std::string what = g.ops.size() == 1
                               ? "op '" + op.name + "' (" + std::string(op_type_name(op.attrs)) + ")"
                               : "the whole graph (" + std::to_string(g.ops.size()) + " ops)";
  rep.reference_fallback.push_back(what + ": " + m.substr(0, std::min<size_t>(m.find('\n'), 300)));
  return plan;
}

}  // namespace

Result<Plan> Session::get_plan(const ResolvedGraph& g, const PlanRequest& request, PlanReport* report_out) {
  PlanReport local;
  PlanReport& rep = report_out ? *report_out : local;
  rep = PlanReport{};
  rep.shape = g.shape;
  const common::Stopwatch total;
  auto finish = [&](Result<Plan> plan) -> Result<Plan> {
    rep.total_ms = total.ms();
    if (plan.ok()) {
      rep.engine = plan->engine_name();
      rep.workspace_bytes = plan->workspace_bytes();
    }
    return plan;
  };
  Impl& s = *impl_;
  PlanCache* cache = s.options.cache;
  const int64_t limit = tighter(request.max_workspace_bytes, s.options.workspace_limit_bytes);
  GpuContext* ctx = s.ctx.get();

  // The plan check: a plan is served only after it matched the reference on
  // this GPU once (or carries a sealed verdict that it did).
  const bool checking = request.check_plan && ctx != nullptr && !s.target.deviceless();
  rep.plan_check.state = !request.check_plan ? "off" : s.target.deviceless() ? "deviceless" : "not run";
  std::vector<std::string> rejected_engines;
  // True when `plan` may be served: it passed, or no check could run (said
  // in the report). False: it failed, and its engine is rejected.
  // fusebox's own kernels are checked like cuDNN's plans: one that fails gives way to cuDNN's
  // engines where cuDNN runs the graph too (build_plan honours excluded_engines for them).
  auto check_now = [&](const Plan& plan, PlanCheckRun* verdict) -> bool {
    const std::string native_key = plan.native() ? plan.engine_name() + "\n" + g.canonical : std::string();
    if (!native_key.empty() && s.native_passed.count(native_key)) {
      rep.plan_check.state = "session";
      return true;
    }
    auto run = check_plan_once(g, plan, *ctx);
    if (!run.ok()) {
      rep.plan_check.state = "unavailable";
      rep.plan_check.detail = run.status().message().substr(0, run.status().message().find('\n'));
      rep.warnings.push_back("plan check could not run, plan served unchecked: " + rep.plan_check.detail);
      return true;
    }
    ++rep.plan_check.plans_checked;
    rep.plan_check.ms += run->ms;
    if (run->passed) {
      rep.plan_check.state = "passed";
      rep.plan_check.detail = run->detail;
      if (verdict) *verdict = *run;
      if (!native_key.empty()) s.native_passed.insert(native_key);
      return true;
    }
    rep.plan_check.rejected.push_back({plan.engine_name(), run->detail});
    rejected_engines.push_back(plan.engine_name());
    return false;
  };

  if (!request.plan_file.empty()) {
    FUSEBOX_ASSIGN_OR_RETURN(PlanFile pf, read_plan_file(request.plan_file));
    Status compat = check_plan_compatible(pf.info, g, s.target);
    if (!compat.ok()) return finish(compat.WithContext(request.plan_file));
    rep.source = PlanSource::kPlanFile;
    rep.plan_file_built_deviceless = pf.info.built_deviceless;
    const common::Stopwatch watch;
    auto plan = deserialize_plan(g, pf.payload, s.target, ctx, pf.info.engine);
    rep.deserialize_ms = watch.ms();
    if (plan.ok()) FUSEBOX_RETURN_IF_ERROR(s.check_limit(*plan, limit, request.plan_file));
    if (plan.ok() && checking) {
      if (plan_info_json::check_passed(pf.info,
                                       plan_info_json::payload_xxh3(pf.payload.data(), pf.payload.size()))) {
        rep.plan_check.state = "trusted";
      } else if (!check_now(*plan, nullptr)) {
        rep.plan_check.state = "failed";
        return finish(
            Status(StatusCode::kVerificationFailed,
                   request.plan_file + ": the plan (engine '" + plan->engine_name() +
                       "') failed the plan check on this GPU: " + rep.plan_check.rejected.back().why +
                       "; build the graph here instead of loading this plan, or run with --no-plan-check"));
      }
    }
    return finish(std::move(plan));
  }

  // A cache hit, unless its plan breaks the workspace limit.
  auto take_hit = [&](CachedPlan& got, PlanSource source, const std::string& policy_key) -> bool {
    append(rep.warnings, got.warnings);
    rep.lookup_ms += got.lookup_ms;
    if (!got.hit) return false;
    if (!s.check_limit(got.plan, limit, "plan cache entry " + got.key).ok()) {
      rep.warnings.push_back("plan cache entry " + got.key + " ignored: its plan needs " +
                             std::to_string(got.plan.workspace_bytes()) +
                             " bytes of workspace, over the limit of " + std::to_string(limit));
      return false;
    }
    if (checking && got.check_trusted) {
      rep.plan_check.state = "trusted";
    } else if (checking) {
      // No verdict, or one whose seal does not match (edited, or from an older fusebox): check now.
      PlanCheckRun verdict;
      if (!check_now(got.plan, &verdict)) {
        int64_t removed = 0;
        const bool evicted =
            cache && !cache->read_only() && cache->remove(got.key, &removed).ok() && removed > 0;
        rep.warnings.push_back("plan cache entry " + got.key + " (engine '" + got.plan.engine_name() +
                               "') failed the plan check" + (evicted ? " and was deleted" : "") + ": " +
                               rep.plan_check.rejected.back().why);
        return false;
      }
      if (verdict.passed) {
        (void)store_plan(cache, g, s.target, policy_key, got.plan, got.entry.tuned_median_ms, &rep.warnings,
                         &verdict);
      }
    }
    rep.source = source;
    rep.cache = "hit";
    rep.cache_key = got.key;
    rep.cache_entry = got.entry;
    rep.deserialize_ms = got.deserialize_ms;
    rep.deserialize_again_ms = got.deserialize_again_ms;
    return true;
  };
  if (request.engine.empty() && request.use_tuned_cache) {
    TunePolicy graph_timed;
    graph_timed.cuda_graph = true;
    for (const TunePolicy& p : request.cuda_graph ? std::vector<TunePolicy>{graph_timed, TunePolicy{}}
                                                  : std::vector<TunePolicy>{TunePolicy{}}) {
      auto got = lookup_cached_plan(cache, g, s.target, tune_policy_key(p), ctx, request.measure_startup);
      if (got.ok() && take_hit(*got, PlanSource::kTunedCache, tune_policy_key(p))) {
        if (p.cuda_graph) rep.tuned_in_cuda_graph = true;
        return finish(std::move(got->plan));
      }
    }
  }
  // A dynamic-shape plan is its own entry: the engines may differ from a static build's.
  const bool symbolic = !g.symbolic_id.empty();
  Impl::KernelCacheSlot* slot = symbolic && request.dynamic_shape ? &s.kernel_caches[g.symbolic_id] : nullptr;
  const std::string base_key = request_policy_key(request, limit);
  bool looked_up = false;  // both heuristic-cache keys already missed
  // Execute-time shape override: a plan built override-enabled for another shape serves this one
  // with no build, once it passes the plan check at this shape. It goes before the static policy
  // (no build beats a fast one), whose probe then waits until override shapes are refused.
  const bool override_wanted = slot && slot->refused.empty() && slot->override_refused.empty() &&
                               request.override_shapes && request.engine.empty() && ctx &&
                               override_shapes_available();
  // The static policy's question, once per graph in the session: would a static build take an
  // engine with precompiled kernels (PlanRequest::static_when_precompiled)?
  auto probe_static = [&] {
    slot->probed = true;
    const common::Stopwatch watch;
    slot->precompiled = static_engine_precompiled(g, s.target, request, limit, ctx);
    rep.static_probe_ms += watch.ms();
  };
  // The probe runs before the graph's first build, or once override shapes are refused (then
  // the static policy serves as it does where cuDNN has none).
  if (slot && !slot->probed && (slot->builds == 0 || !slot->override_refused.empty()) &&
      request.static_when_precompiled && request.engine.empty()) {
    // A warm cache answers before the probe (no heuristic query at start-up): an entry of
    // either kind, dynamic-shape or static, is a plan for this very shape.
    for (const std::string& key : {base_key + ";dyn=1", base_key}) {
      auto hit = lookup_cached_plan(cache, g, s.target, key, ctx, request.measure_startup);
      if (hit.ok() && take_hit(*hit, PlanSource::kHeuristicCache, key)) return finish(std::move(hit->plan));
    }
    looked_up = true;
    if (!override_wanted) probe_static();
  }
  const bool by_policy = slot && slot->refused.empty() && !slot->precompiled.empty() &&
                         request.static_when_precompiled && !override_wanted;
  const bool dynamic = slot && slot->refused.empty() && !by_policy;
  if (slot && !slot->refused.empty()) rep.dynamic_fallback = slot->refused;
  if (by_policy) rep.static_policy = slot->precompiled;
  const std::string policy = base_key + (dynamic ? ";dyn=1" : "");
  if (!looked_up) {
    auto got = lookup_cached_plan(cache, g, s.target, policy, ctx, request.measure_startup);
    if (got.ok() && take_hit(*got, PlanSource::kHeuristicCache, policy)) return finish(std::move(got->plan));
  }
  rep.cache = cache && cache->enabled() ? "miss" : "off";
  rep.cache_key = cache_key_for(g, s.target, policy);

  if (slot && !slot->override_refused.empty()) rep.override_refused = slot->override_refused;
  // The plan check of shapes served by override: the plan itself passed at its built shape; the
  // override path is checked at the first kShapesCheckedPerPath other shapes, then served
  // unchecked with the state "other shapes" (on the H200 the check cost 70-140 ms a shape of
  // matmul_bias_gelu_dyn, the override 0.03 ms). The same holds for the kernel cache's replay of
  // the first shape's engine (the same shape-generic kernels at another shape): checked at its
  // first kShapesCheckedPerPath replayed shapes (on an H100 with cuDNN 9.27 the check cost 15-50 ms
  // a shape of conv_bias_relu_dyn, growing with N, the replayed build about 2 ms).
  constexpr size_t kShapesCheckedPerPath = 2;
  if (override_wanted && slot->override_plan) {
    const common::Stopwatch watch;
    auto served = plan_at_shape(*slot->override_plan, slot->override_graph, g, *ctx);
    const double served_ms = watch.ms();
    if (!served.ok()) {
      // This shape only (an attribute derived from a dim): it builds, later shapes still try.
      const std::string& m = served.status().message();
      rep.override_refused = m.substr(0, m.find('\n'));
    } else if (s.check_limit(*served, limit, "shape override").ok() &&
               (!checking || slot->override_checked.size() >= kShapesCheckedPerPath ||
                slot->override_checked.count(shape_text(g.shape)) || check_now(*served, nullptr))) {
      if (checking && rep.plan_check.state == "passed") slot->override_checked.insert(shape_text(g.shape));
      if (checking && rep.plan_check.state == "not run") {
        rep.plan_check.state = "other shapes";
        rep.plan_check.detail = "the override plan passed the check at its built shape and at " +
                                std::to_string(slot->override_checked.size()) + " other shapes";
      }
      rep.source = PlanSource::kShapeOverride;
      rep.override_shape = "served";
      rep.override_built_shape = slot->override_graph.shape;
      rep.override_ms = served_ms;
      rep.engine = served->engine_name();
      return finish(std::move(served));
    } else {
      // Over the workspace limit at this shape, or wrong here: the override plan serves no more
      // shapes (the next builds choose again; the plan check rejected the engine).
      slot->override_refused =
          !rep.plan_check.rejected.empty()
              ? "the override plan failed the plan check at shape " + shape_text(g.shape) + ": " +
                    rep.plan_check.rejected.back().why
              : "the override plan needs more workspace at shape " + shape_text(g.shape) + " than the limit";
      rep.override_refused = slot->override_refused;
      slot->override_plan.reset();
    }
  }

  BuildOptions base;
  base.engine = request.engine;
  base.max_workspace_bytes = limit;
  base.excluded_engines = rejected_engines;  // a cached plan that failed the check
  if (dynamic) {
    if (!slot->cache) slot->cache = KernelCache::create();
    base.dynamic_shape = true;
    base.kernel_cache = slot->cache;
    base.override_shapes = override_wanted && !slot->override_plan && slot->override_refused.empty();
  }
  // A static build of `o`'s graph: no dynamic shapes, kernel cache or override.
  auto static_build = [&](BuildOptions o, BuildReport* r) {
    o.dynamic_shape = false;
    o.kernel_cache = nullptr;
    o.override_shapes = false;
    return build_plan(g, s.target, o, r, ctx);
  };
  // A build whose result stands: built, or a failure no other way of building would avoid.
  auto settled = [](const Result<Plan>& p) {
    return p.ok() || p.status().code() == StatusCode::kCudaError ||
           p.status().code() == StatusCode::kNoDevice;
  };
  const BuildFn build = [&](const BuildOptions& o, BuildReport* r) -> Result<Plan> {
    if (!o.dynamic_shape || !slot->refused.empty()) return static_build(o, r);
    if (o.override_shapes && slot->override_refused.empty()) {
      auto plan = build_plan(g, s.target, o, r, ctx);
      if (settled(plan)) return plan;
      // No engine builds this graph override-enabled: the static policy below, else dynamic
      // shapes and the kernel cache serve.
      const std::string& m = plan.status().message();
      slot->override_refused = "no engine builds it override-enabled: " + m.substr(0, m.find('\n'));
      rep.override_refused = slot->override_refused;
      // Then the static policy, as where cuDNN has no override shapes: an engine with precompiled
      // kernels builds this shape statically. (Without this, cuDNN 9.27's full set served
      // conv_bias_relu_dyn through its runtime-compiled dynamic-shape engine eng52 at 2.0x the time
      // per call of 9.19's static eng41: H100, 2026-12-07.)
      if (request.static_when_precompiled && !slot->probed) probe_static();
    }
    if (o.override_shapes && !slot->override_refused.empty() && request.static_when_precompiled &&
        !slot->precompiled.empty()) {
      auto static_plan = static_build(o, r);
      if (settled(static_plan)) {
        rep.static_policy = slot->precompiled;
        return static_plan;
      }
      // This shape has no static plan in this mode: the dynamic build below serves it.
    }
    BuildOptions plain = o;
    plain.override_shapes = false;
    auto plan = build_plan(g, s.target, plain, r, ctx);
    if (settled(plan)) return plan;
    // Engines that refuse dynamic shapes (cuDNN's unified SDPA, some
    // precompiled ones) may still build statically: the graph builds static
    // from now on in this session.
    const std::string& m = plan.status().message();
    const std::string refused = m.substr(0, m.find('\n'));
    const double failed_ms = r->total_ms();
    auto static_plan = static_build(o, r);
    // Only a static success shows that dynamic shapes were the obstacle.
    if (static_plan.ok()) {
      slot->refused = refused;
      rep.dynamic_fallback = refused;
      rep.dynamic_failed_ms += failed_ms;
    }
    return static_plan;
  };
  // A later shape replays the first shape's engine when it can.
  const std::string& engine_key = base_key;
  Result<Plan> plan = Status(StatusCode::kInternal, "no build ran");
  if (dynamic && request.engine.empty() && request.reuse_engine) {
    auto it = slot->engines.find(engine_key);
    if (it != slot->engines.end()) {
      BuildOptions o = base;
      o.replay = it->second;
      BuildReport replay_report;
      plan = build_plan(g, s.target, o, &replay_report, ctx);
      if (plan.ok()) {
        rep.engine_replayed = true;
        rep.build = std::move(replay_report);
      } else {
        const std::string& m = plan.status().message();
        rep.replay_failed = m.substr(0, m.find('\n'));
      }
    }
  }
  // A pinned engine is searched among every mode's candidates by build_plan itself.
  const bool in_turn = request.heuristics.empty() && request.engine.empty();
  const std::vector<std::vector<HeuristicMode>> order =
      in_turn ? default_mode_order()
              : std::vector<std::vector<HeuristicMode>>{request.heuristics.empty() ? default_mode_order()[0]
                                                                                   : request.heuristics};
  if (!rep.engine_replayed) {
    plan = build_modes_in_turn(base, order, build, &rep.attempts);
    if (!rep.attempts.empty()) rep.build = rep.attempts.back().report;
  }
  // No engine for the whole graph: the largest parts that have engines, run as one plan.
  if (!plan.ok() && request.partition && request.engine.empty() && g.ops.size() > 1 &&
      plan.status().code() == StatusCode::kNotSupported) {
    const Status whole = plan.status();
    auto parted = build_partitioned(g, base, limit, whole, request, rep);
    if (parted.ok()) {
      plan = std::move(parted);
    } else {
      plan = Status(whole.code(), whole.message() + "\n  and no partition of the graph runs either: " +
                                      parted.status().message());
    }
  }
  // A single op no cuDNN engine runs: the reference kernels.
  if (!plan.ok()) {
    BuildReport fallback_report;
    plan = reference_fallback_plan(g, s.target, base, request, plan.status(), ctx, rep, &fallback_report);
    if (plan.ok()) rep.build = std::move(fallback_report);
  }
  // The plan check of a plan built now: one that fails is rejected and the
  // build runs again without it, taking the next candidate.
  PlanCheckRun verdict;
  bool partitioned_after_check = false, whole_on_reference_kernels = false;
  const std::string shape_now = shape_text(g.shape);
  bool replay_trusted = false;
  if (plan.ok() && checking && rep.engine_replayed) {
    const auto done = slot->replay_checked.find(plan->engine_name());
    if (done != slot->replay_checked.end() && done->second.size() >= kShapesCheckedPerPath &&
        !done->second.count(shape_now)) {
      replay_trusted = true;
      rep.plan_check.state = "other shapes";
      rep.plan_check.detail =
          "engine " + plan->engine_name() +
          ", the first shape's engine replayed with the kernel cache, passed the check at " +
          std::to_string(done->second.size()) + " other replayed shapes of this graph";
    }
  }
  while (plan.ok() && checking && !replay_trusted && !check_now(*plan, &verdict)) {
    // Refused: what went wrong, then every rejected plan and why.
    auto refuse = [&](const std::string& head) {
      rep.plan_check.state = "failed";
      std::string lines;
      for (const auto& r : rep.plan_check.rejected) lines += "\n  rejected " + r.engine + ": " + r.why;
      return finish(Status(StatusCode::kVerificationFailed,
                           head + lines + "\n  (--no-plan-check serves a plan unchecked)"));
    };
    if (!request.engine.empty()) return refuse("pinned engine failed the plan check");
    BuildOptions again = base;
    again.excluded_engines = rejected_engines;
    rep.engine_replayed = false;
    if (rejected_engines.size() >= kMaxPlanCheckCandidates) {
      plan = NotSupported("no plan passed the plan check (" + std::to_string(rejected_engines.size()) +
                          " tried)");
    } else {
      plan = build_modes_in_turn(again, order, build, &rep.attempts);
      if (!rep.attempts.empty()) rep.build = rep.attempts.back().report;
    }
    // Every candidate of a graph of several ops failed the check (each the same wrong values: the
    // graph's pattern, not one engine): its parts, each built alone, as one plan, checked in turn.
    // The parts may take the engines the whole graph's check rejected. (Its first case, a training
    // step's independent da and dw in one graph, is now refused by the lowering before any engine:
    // independent_op_groups, fusebox/partition.h.)
    if (!plan.ok() && !partitioned_after_check && request.partition && g.ops.size() > 1 &&
        plan.status().code() == StatusCode::kNotSupported) {
      partitioned_after_check = true;
      BuildOptions parts_base = base;
      parts_base.excluded_engines.clear();
      auto parted = build_partitioned(g, parts_base, limit, plan.status(), request, rep);
      if (parted.ok()) plan = std::move(parted);
    }
    // Every cuDNN candidate of a single op failed the check: the reference kernels are the next one.
    if (!plan.ok() && std::find(rejected_engines.begin(), rejected_engines.end(), kReferenceEngine) ==
                          rejected_engines.end()) {
      BuildReport fallback_report;
      auto fallback =
          reference_fallback_plan(g, s.target, again, request, plan.status(), ctx, rep, &fallback_report);
      if (fallback.ok()) {
        plan = std::move(fallback);
        rep.build = std::move(fallback_report);
      }
    }
    // The last candidate before a refusal, once a partition built after the check failed it too:
    // the whole graph as one plan of fusebox's reference kernels (no parts to compose): slow, but
    // a valid graph runs. (H100, 2026-12-05, the sweep's seed 4347: a partition whose parts each
    // passed the check alone failed it together, twice, and the graph was refused.)
    if (!plan.ok() && partitioned_after_check && !whole_on_reference_kernels && g.ops.size() > 1) {
      whole_on_reference_kernels = true;
      BuildReport whole_report;
      auto whole = reference_fallback_plan(g, s.target, base, request, plan.status(), ctx, rep, &whole_report,
                                           /*whole_graph=*/true);
      if (whole.ok()) {
        plan = std::move(whole);
        rep.build = std::move(whole_report);
      }
    }
    if (!plan.ok()) return refuse("no plan passed the plan check: " + plan.status().message().substr(0, 400));
  }
  if (!plan.ok()) return finish(plan.status());
  if (checking && rep.engine_replayed && verdict.passed && rep.plan_check.rejected.empty())
    slot->replay_checked[plan->engine_name()].insert(shape_now);
  rep.source = PlanSource::kBuilt;
  if (by_policy && rep.build.notes_known && has_note(rep.build.behavior_notes, "RUNTIME_COMPILATION")) {
    // The policy expected precompiled kernels but the build took a runtime-compiled engine (the
    // probe's candidate failed to build): later shapes go back to dynamic shapes and the cache.
    slot->precompiled.clear();
  }
  if (rep.build.dynamic_shape && !rep.build.choice.empty() && !slot->engines.count(engine_key)) {
    slot->engines[engine_key] = rep.build.choice;
  }
  if (rep.build.dynamic_shape) {
    rep.dynamic_shape = true;
    rep.kernel_cache = slot->builds == 0 ? "cold" : "warm";
    rep.kernel_cache_builds_before = slot->builds;
    ++slot->builds;
    if (rep.build.notes_known && slot->precompiled.empty() &&
        !has_note(rep.build.behavior_notes, "RUNTIME_COMPILATION")) {
      slot->precompiled = "engine " + plan->engine_name() +
                          " has precompiled kernels (no RUNTIME_COMPILATION): a static build of a new shape "
                          "takes milliseconds and a kernel cache has nothing to reuse";
    }
  }
  rep.heuristic_mode = rep.engine_replayed      ? "replay"
                       : request.engine.empty() ? modes_csv(rep.attempts.back().modes)
                                                : "a,b,fallback";
  // A static build that stood in for a refused dynamic one is stored as what it is.
  const std::string stored_policy = dynamic && !rep.build.dynamic_shape ? base_key : policy;
  if (stored_policy != policy) rep.cache_key = cache_key_for(g, s.target, stored_policy);
  rep.stored = store_plan(cache, g, s.target, stored_policy, *plan, -1, &rep.warnings,
                          verdict.passed ? &verdict : nullptr);
  // Built override-enabled: the session keeps it to serve the graph's later shapes.
  if (override_wanted && !plan->serves_other_shapes()) {
    const std::string why =
        plan->part_count() > 0 ? "a partitioned plan serves the graph"
        : plan->native()       ? "fusebox's own kernel serves the graph"
        : rep.build.override_shapes
            ? "its lowering gives a tensor other dims or strides than the graph's (the build's notes)"
            : "";
    if (!why.empty()) {
      slot->override_refused = why;
      rep.override_refused = why;
      slot->probed = false;  // the static policy may ask its question at the next shape
    }
  }
  if (override_wanted && plan->serves_other_shapes()) {
    auto kept = std::make_shared<Plan>(std::move(plan).value());
    auto view = plan_at_shape(*kept, g, g, *ctx);
    if (!view.ok()) return finish(view.status());
    rep.override_shape = "built";
    slot->override_plan = std::move(kept);
    slot->override_graph = g;
    return finish(std::move(view));
  }
  return finish(std::move(plan));
}

Result<Plan> Session::build_partitioned(const ResolvedGraph& g, const BuildOptions& base, int64_t limit,
                                        const Status& whole, const PlanRequest& request, PlanReport& rep) {
  Impl& s = *impl_;
  GpuContext* ctx = s.ctx.get();
  // The oracle builds each part it is asked about (heuristic modes in turn)
  // and keeps the plans, so the parts chosen are built once.
  std::vector<std::pair<std::string, Plan>> built;
  // On a GPU, each part's plan is checked alone before it joins the partition (a part that fails
  // gives way to its next candidate, then to a smaller part), so a partition that fails the whole
  // plan check does not come back with the same failing part: on the H100 (2026-12-05) two
  // partitions with one wrong part were refused whole, every retry rebuilding the same parts.
  const bool check_parts = request.check_plan && ctx != nullptr && !s.target.deviceless();
  const SupportOracle oracle = [&](const ResolvedGraph& part) -> Status {
    if (part.canonical == g.canonical) return whole;
    for (const auto& b : built)
      if (b.first == part.canonical) return Status::Ok();  // built in an earlier pass
    BuildOptions o = base;
    o.dynamic_shape = false;
    o.kernel_cache = nullptr;
    const BuildFn build = [&](const BuildOptions& bo, BuildReport* r) {
      return build_plan(part, s.target, bo, r, ctx);
    };
    size_t part_rejected = 0;
    for (;;) {
      auto p = build_modes_in_turn(o, default_mode_order(), build, nullptr);
      if (!p.ok()) return p.status();
      if (check_parts) {
        auto run = check_plan_once(part, *p, *ctx);
        if (run.ok()) {
          ++rep.plan_check.plans_checked;
          rep.plan_check.ms += run->ms;
        }
        if (run.ok() && !run->passed) {
          rep.plan_check.rejected.push_back({"part '" + part.name + "' " + p->engine_name(), run->detail});
          o.excluded_engines.push_back(p->engine_name());
          if (++part_rejected >= kMaxPlanCheckCandidates)
            return NotSupported("no plan of part '" + part.name + "' passed the plan check (" +
                                std::to_string(part_rejected) + " tried)");
          continue;
        }
      }
      built.emplace_back(part.canonical, std::move(p).value());
      return Status::Ok();
    }
  };
  // The reference kernels, only for an op no cuDNN engine builds alone in any form the
  // partitioner tries (partition_graph's last resort).
  const SupportOracle last_resort = [&](const ResolvedGraph& part) -> Status {
    auto p = reference_fallback_plan(part, s.target, base, request,
                                     NotSupported("no cuDNN engine for this op alone"), ctx, rep, nullptr);
    if (!p.ok()) return p.status();
    built.emplace_back(part.canonical, std::move(p).value());
    return Status::Ok();
  };
  const bool use_last_resort = request.reference_fallback && !s.target.deviceless();
  auto parted = use_last_resort ? partition_graph(g, oracle, last_resort) : partition_graph(g, oracle);
  FUSEBOX_ASSIGN_OR_RETURN(GraphPartition partition, std::move(parted));
  std::vector<Plan> plans;
  int64_t largest = 0;
  for (const GraphPart& part : partition.parts) {
    auto find_built = [&] {
      return std::find_if(built.begin(), built.end(),
                          [&](const auto& b) { return b.first == part.graph.canonical; });
    };
    auto it = find_built();
    if (it == built.end()) {
      // A part identical to an earlier one (the same canonical form: two equal layers) took the
      // plan built for both: build it again (the H200 sweep of 2026-12-05 found three equal
      // scale ops, seed 2032).
      Status again = oracle(part.graph);
      if (!again.ok() && use_last_resort) again = last_resort(part.graph);
      FUSEBOX_RETURN_IF_ERROR(again);
      it = find_built();
      if (it == built.end())
        return Internal("partition: part '" + part.graph.name + "' was accepted but not built");
    }
    largest = std::max(largest, it->second.workspace_bytes());
    plans.push_back(std::move(it->second));
    built.erase(it);
  }
  const int64_t need = partition.temporary_bytes + largest;
  if (limit >= 0 && need > limit) {
    return Status(StatusCode::kNotSupported,
                  partition.summary() + " needs " + std::to_string(need) + " bytes of workspace (" +
                      std::to_string(partition.temporary_bytes) + " for the temporaries between parts, " +
                      std::to_string(largest) + " for the largest part), over the limit of " +
                      std::to_string(limit));
  }
  rep.partition = partition.summary();
  rep.partition_temporary_bytes = partition.temporary_bytes;
  rep.partition_narrowed = partition.narrowed;
  for (size_t i = 0; i < partition.parts.size(); ++i) {
    const GraphPart& part = partition.parts[i];
    if (!part.why_cut.empty()) rep.partition_cuts.push_back(part.why_cut);
    rep.partition_parts.push_back(
        {part.first_op, part.op_count, plans[i].engine_name(), plans[i].workspace_bytes()});
  }
  return compose_partitioned_plan(g, partition, std::move(plans));
}

Result<Session::ShapedPlan> Session::get_plan(const GraphSpec& spec, const ShapeValues& values,
                                              const PlanRequest& request, PlanReport* report) {
  FUSEBOX_ASSIGN_OR_RETURN(GraphSpec bound, bind_shape(spec, values));
  FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph g, resolve(bound));
  FUSEBOX_ASSIGN_OR_RETURN(Plan plan, get_plan(g, request, report));
  return ShapedPlan{std::move(g), std::move(plan)};
}

int Session::kernel_cache_count() const { return static_cast<int>(impl_->kernel_caches.size()); }

Result<SessionTune> Session::tune(const ResolvedGraph& g, const TunePolicy& policy_in,
                                  const TuneProgress& progress) {
  Impl& s = *impl_;
  if (!s.ctx)
    return Status(StatusCode::kNoDevice, "tune: a deviceless session cannot time plans; tune on the GPU");
  TunePolicy policy = policy_in;
  policy.max_workspace_bytes = tighter(policy.max_workspace_bytes, s.options.workspace_limit_bytes);
  SessionTune out;
  const std::string key = tune_policy_key(policy);
  PlanCache* cache = s.options.cache;
  out.cache = cache && cache->enabled() ? "miss" : "off";
  auto cached = lookup_cached_plan(cache, g, s.target, key, s.ctx.get());
  if (cached.ok()) {
    append(out.warnings, cached->warnings);
    out.cache_key = cached->key;
    out.lookup_ms = cached->lookup_ms;
    if (cached->hit) {
      out.hit = true;
      out.cache = "hit";
      out.plan = std::move(cached->plan);
      out.entry = cached->entry;
      out.deserialize_ms = cached->deserialize_ms;
      return out;
    }
  }
  FUSEBOX_ASSIGN_OR_RETURN(out.result, fusebox::tune(g, *s.ctx, policy, progress));
  out.plan = std::move(out.result.winner_plan);
  if (out.result.winner_run.verified_ok) {
    const TuneEntry& w = out.result.entries[out.result.winner];
    // The winner's verification is its plan check: sealed into the entry.
    PlanCheckRun verdict;
    verdict.passed = true;
    verdict.detail = plan_check_detail(out.result.winner_run);
    out.stored = store_plan(cache, g, s.target, key, out.plan, w.latency.median_ms, &out.warnings,
                            policy.verify_winner ? &verdict : nullptr);
  }
  return out;
}

Status Session::reserve_workspace(int64_t bytes) {
  Impl& s = *impl_;
  if (bytes <= s.workspace->bytes) return Status::Ok();
  if (!s.ctx) return Status(StatusCode::kNoDevice, "workspace: a deviceless session has no device memory");
  // Round up so a run of slightly larger plans does not regrow each time.
  const int64_t size = (std::max(bytes, s.workspace->bytes * 2) + 255) / 256 * 256;
  // Plans in flight may still use the old arena.
  FUSEBOX_RETURN_IF_ERROR(common::cuda_status(
      cudaStreamSynchronize(static_cast<cudaStream_t>(s.ctx->stream())), "workspace arena"));
  if (s.arena) {
    FUSEBOX_RETURN_IF_ERROR(common::cuda_status(cudaFree(s.arena), "workspace arena: cudaFree"));
    s.arena = nullptr;
  }
  FUSEBOX_RETURN_IF_ERROR(
      common::cuda_status(cudaMalloc(&s.arena, static_cast<size_t>(size)),
                          "workspace arena: cudaMalloc of " + std::to_string(size) + " bytes"));
  s.workspace->ptr = s.arena;
  s.workspace->bytes = size;
  ++s.workspace->generation;
  return Status::Ok();
}

Result<BoundPlan> Session::bind(const Plan& plan, const std::map<std::string, void*>& buffers) {
  Impl& s = *impl_;
  if (!s.ctx) return Status(StatusCode::kNoDevice, "bind: a deviceless session cannot run plans");
  FUSEBOX_RETURN_IF_ERROR(s.check_limit(plan, s.options.workspace_limit_bytes, "bind"));
  FUSEBOX_RETURN_IF_ERROR(reserve_workspace(plan.workspace_bytes()));
  return BoundPlan::bind(plan, *s.ctx, buffers, s.workspace);
}

}  // namespace fusebox
