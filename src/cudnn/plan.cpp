// The five steps, engine listing, plan (de)serialization and execution.
#include <algorithm>
#include <functional>

#include "common/plan_parts.h"
#include "common/plan_payload_check.h"
#include "common/stopwatch.h"
#include "engine_rules.h"
#include "internal.h"
#include "stdio_capture.h"

namespace fusebox {
namespace cudnn {
namespace {

std::vector<fe::HeurMode_t> to_fe(const std::vector<HeuristicMode>& modes) {
  std::vector<fe::HeurMode_t> out;
  for (auto m : modes) {
    switch (m) {
      case HeuristicMode::kA:
        out.push_back(fe::HeurMode_t::A);
        break;
      case HeuristicMode::kB:
        out.push_back(fe::HeurMode_t::B);
        break;
      case HeuristicMode::kFallback:
        out.push_back(fe::HeurMode_t::FALLBACK);
        break;
    }
  }
  return out;
}

// Runs one named step, timing it and catching anything thrown.
Status run_step(BuildReport& r, const std::string& name, const std::function<fe::error_t()>& fn) {
  StepReport step;
  step.name = name;
  step.ran = true;
  common::Stopwatch watch;
  StdioCapture capture;
  try {
    step.status = from_fe(fn(), name);
  } catch (const std::exception& e) {
    const std::string what = e.what();
    // A support gap thrown rather than returned is still a support gap.
    const bool gap = what.find("NOT_SUPPORTED") != std::string::npos;
    step.status = Status(gap ? StatusCode::kNotSupported : StatusCode::kCudnnError,
                         name + ": exception from cuDNN frontend: " + what);
  } catch (...) {
    step.status = Status(StatusCode::kCudnnError, name + ": unknown exception from cuDNN frontend");
  }
  step.cudnn_log = capture.finish();
  step.ms = watch.ms();
  if (!step.status.ok()) {
    // The frontend appends cuDNN's whole diagnostic log (hundreds of lines on
    // a machine without a GPU): keep its first line and the distinct reasons.
    const std::string& full = step.status.message();
    const std::string first_line = full.substr(0, full.find('\n'));
    step.cudnn_log += full;
    std::string detail = distill_cudnn_log(step.cudnn_log);
    // cuDNN buffers most of these diagnostics inside its own runtime,
    // so the log can be empty here; the deviceless limitation is explained either way.
    if (r.deviceless &&
        (name == "create_execution_plans" || name == "check_support" || name == "build_plans")) {
      detail +=
          "\n  hint: cuDNN cannot build its runtime-compiled or cuBLASLt engines without a GPU driver (they "
          "need NVRTC plus a driver to load the kernel, or a cuBLAS handle; on a machine without a driver "
          "fusebox leaves the runtime-compiled ones out); only graphs with a precompiled engine (e.g. "
          "conv_fprop + bias + relu) build deviceless. Build this one on the GPU (without --device)";
      const CudnnEngineLibraries libs = cudnn_engine_libraries();
      if (!libs.precompiled) {
        detail += "\n  and the loaded cuDNN (" + libs.directory +
                  ") has no libcudnn_engines_precompiled.so.9 (a runtime-compiled-only set, like the "
                  "nvidia-cudnn-jit wheel), so nothing builds deviceless with it: put the full cuDNN first "
                  "on LD_LIBRARY_PATH";
      }
    }
    step.status = Status(step.status.code(), first_line + detail);
  }
  r.steps.push_back(step);
  return step.status;
}

void fill_target(BuildReport& r, const DeviceTarget& t) {
  r.deviceless = t.deviceless();
  r.device_name = t.device_name;
  r.sm_version = t.sm_version;
}

// Runs the support check of every candidate under the limit set on `graph`
// and lists those the limit drops (cuDNN reads each engine config's workspace
// without building it), so the report says which and why. Timed into the
// create_execution_plans step. No candidate left: an error naming the limit.
Status apply_workspace_limit(FeGraph& graph, int64_t limit, BuildReport& r) {
  r.workspace_limit = limit;
  common::Stopwatch watch;
  int64_t supported = 0, smallest = -1;
  {
    StdioCapture capture;
    const std::string marker = "workspace violation. Requires ";
    try {
      for (int64_t i = 0; i < r.candidate_plans; ++i) {
        auto st = graph.check_support_at(i);
        if (st.is_good()) {
          ++supported;
          continue;
        }
        const std::string& msg = st.get_message();
        const size_t at = msg.find(marker);
        if (at == std::string::npos) continue;  // unsupported for another reason: not the limit's doing
        DroppedCandidate d;
        d.index = i;
        (void)graph.get_plan_name_at_index(i, d.name);
        try {
          d.workspace_bytes = std::stoll(msg.substr(at + marker.size()));
        } catch (const std::exception&) {
          d.workspace_bytes = -1;
        }
        d.why = "needs " +
                (d.workspace_bytes >= 0 ? std::to_string(d.workspace_bytes) : std::string("more")) +
                " bytes of workspace, over the limit of " + std::to_string(limit);
        if (d.workspace_bytes >= 0 && (smallest < 0 || d.workspace_bytes < smallest))
          smallest = d.workspace_bytes;
        r.dropped.push_back(std::move(d));
      }
    } catch (const std::exception& e) {
      return Status(StatusCode::kCudnnError,
                    std::string("workspace limit: exception from cuDNN frontend: ") + e.what());
    }
    (void)capture.finish();
  }
  if (!r.steps.empty()) r.steps.back().ms += watch.ms();
  if (supported == 0 && !r.dropped.empty()) {
    return Status(StatusCode::kNotSupported,
                  "workspace limit of " + std::to_string(limit) + " bytes: no candidate meets it; " +
                      std::to_string(r.dropped.size()) + " of " + std::to_string(r.candidate_plans) +
                      " candidates need more (the smallest needs " + std::to_string(smallest) +
                      " bytes), the others are unsupported; raise the limit to at least " +
                      std::to_string(smallest));
  }
  return Status::Ok();
}

// fusebox's engine rules and the caller's exclusions (the plan check's
// rejects): recorded in `lowered.excluded`, which build_plan and
// CandidateSet skip, and listed in the report; none left is NotSupported naming them.
Status apply_engine_bars(const ResolvedGraph& g, const BuildOptions& options, LoweredGraph& lowered,
                         BuildReport& r) {
  FeGraph& graph = *lowered.graph;
  const std::vector<EngineBar> bars = engine_bars_for(g, options.dynamic_shape);
  if (bars.empty() && options.excluded_engines.empty()) return Status::Ok();
  int64_t left = 0;
  for (int64_t i = 0; i < r.candidate_plans; ++i) {
    std::string name, why;
    if (!graph.get_plan_name_at_index(i, name).is_good()) continue;
    if (engine_barred(name, bars, options.excluded_engines, &why)) {
      r.excluded.push_back(name + ": " + why);
      lowered.excluded[name] = why;
    } else {
      ++left;
    }
  }
  // Not the frontend's deselect_engines(): it bars every name that *contains* one
  // ("eng1" would bar eng10...). build_plan skips the barred indices itself.
  if (left == 0 && r.candidate_plans > 0) {
    std::string lines;
    for (const auto& e : r.excluded) lines += "\n  " + e;
    return NotSupported("every one of the " + std::to_string(r.candidate_plans) +
                        " candidates is excluded (wrong values for this graph):" + lines);
  }
  return Status::Ok();
}

// Steps 1-3 on a fresh frontend graph. `ctx` may be null for deviceless targets.
Result<LoweredGraph> first_three_steps(const ResolvedGraph& g, const DeviceTarget& target,
                                       const BuildOptions& options, GpuContext* ctx, BuildReport& r) {
  fill_target(r, target);
  r.dynamic_shape = options.dynamic_shape;
  r.kernel_cache = options.dynamic_shape && options.kernel_cache != nullptr;
  r.override_shapes = options.dynamic_shape && options.override_shapes;
  if (!target.deviceless() && !ctx) return Internal("a live-GPU build needs a GpuContext");
  cudnn::LoweredGraph lowered;
  // Lowering is timed as part of validate: it is where fusebox's description meets the frontend's.
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "validate", [&]() -> fe::error_t {
    auto lr = lower(g, target, options.dynamic_shape, r.override_shapes);
    if (!lr.ok()) {  // a refusal for the target stays "not supported", not "invalid"
      return {lr.status().code() == StatusCode::kNotSupported ? fe::error_code_t::GRAPH_NOT_SUPPORTED
                                                              : fe::error_code_t::INVALID_VALUE,
              lr.status().message()};
    }
    lowered = std::move(lr).value();
    r.lowering_notes = lowered.notes;
    // Before build_operation_graph: that is where the frontend ties the
    // kernel cache to the operation graph.
    if (options.dynamic_shape && options.kernel_cache) {
      lowered.graph->set_kernel_cache(options.kernel_cache->impl()->cache);
    }
    return lowered.graph->validate();
  }));

  auto& graph = *lowered.graph;
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "build_operation_graph", [&]() {
    return ctx ? graph.build_operation_graph(ctx->impl()->handle) : graph.build_operation_graph();
  }));
  r.replayed = !options.replay.empty();
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "create_execution_plans", [&]() -> fe::error_t {
    if (options.replay.empty()) return graph.create_execution_plans(to_fe(options.heuristics));
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    for (const auto& [type, value] : options.replay.knobs) knobs[static_cast<fe::KnobType_t>(type)] = value;
    return graph.create_execution_plan(options.replay.engine_id, knobs);
  }));
  r.candidate_plans = graph.get_execution_plan_count();
  // No GPU driver (only the toolkit's stub, driver_stub.cpp): a runtime-compiled
  // engine can never load its kernel. cuDNN 9.27 would still compile each with
  // NVRTC first (20 s per heuristic mode for a batchnorm graph, here), so they
  // are left out; cuDNN 9.19 failed them at once. The outcome is the same.
  if (target.deviceless() && cudnn::driver_load() != cudnn::DriverLoad::kDriver) {
    graph.deselect_behavior_notes({fe::BehaviorNote_t::RUNTIME_COMPILATION});
  }
  FUSEBOX_RETURN_IF_ERROR(apply_engine_bars(g, options, lowered, r));
  if (options.max_workspace_bytes >= 0) {
    graph.deselect_workspace_greater_than(options.max_workspace_bytes);
    FUSEBOX_RETURN_IF_ERROR(apply_workspace_limit(graph, options.max_workspace_bytes, r));
  }
  return lowered;
}

// "eng41_k2=4_k13=0" -> {k2: 4, k13: 0}: the knob numbering of the name
// (cuDNN's backend knob types), which is what users pin by.
std::map<std::string, int64_t> knobs_from_name(const std::string& name) {
  std::map<std::string, int64_t> out;
  size_t pos = name.find('_');
  while (pos != std::string::npos) {
    size_t end = name.find('_', pos + 1);
    std::string item = name.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
    size_t eq = item.find('=');
    if (eq != std::string::npos) {
      try {
        out[item.substr(0, eq)] = std::stoll(item.substr(eq + 1));
      } catch (const std::exception&) {
        // not a knob: leave it out
      }
    }
    pos = end;
  }
  return out;
}

Result<int64_t> find_engine(fe::graph::Graph& graph, const std::string& engine) {
  std::string names;
  const int64_t n = graph.get_execution_plan_count();
  for (int64_t i = 0; i < n; ++i) {
    std::string name;
    if (graph.get_plan_name_at_index(i, name).is_good()) {
      if (name == engine) return i;
      names += "\n  " + name;
    }
  }
  return InvalidArgument("engine '" + engine + "' is not among the " + std::to_string(n) +
                         " candidates for this graph; candidates are:" + names);
}

std::unique_ptr<GpuContext> maybe_context(const DeviceTarget& target, GpuContext* ctx, Status* st) {
  if (target.deviceless() || ctx) return nullptr;
  auto created = GpuContext::create(target.device_id);
  if (!created.ok()) {
    *st = created.status();
    return nullptr;
  }
  return std::move(created).value();
}

// A graph fusebox runs with its own kernel (kernels/native_kernel.h): no cuDNN
// call, so no heuristics, support check or build; one "validate" step (the
// kernel's own checks), said in the report. The same for live and deviceless
// targets: the kernel needs nothing from cuDNN.
// `faster`: a graph cuDNN runs too, taken by fusebox's kernel because cuDNN
// is much slower there (kernels::faster_native_kernel); null for an op only
// fusebox runs.
// `reference`: the graph runs on fusebox's reference kernel (kernels::make_reference_kernel), pinned
// as engine "fusebox_reference"; the session takes it where no cuDNN engine builds.
static_assert(std::string_view(kReferenceEngine) == std::string_view(kernels::kReferenceKernelName));

Result<Plan> build_native_plan(const ResolvedGraph& g, const DeviceTarget& target,
                               const BuildOptions& options, BuildReport& r,
                               const kernels::FasterKernel* faster = nullptr, bool reference = false) {
  fill_target(r, target);
  std::shared_ptr<const kernels::NativeKernel> kernel;
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "validate", [&]() -> fe::error_t {
    if (faster) {
      kernel = faster->kernel;
      return {fe::error_code_t::OK, ""};
    }
    auto k = reference ? kernels::make_reference_kernel(g) : kernels::make_native_kernel(g);
    if (!k.ok()) {  // a refusal stays "not supported" (the session's fallbacks read the code)
      return {k.status().code() == StatusCode::kNotSupported ? fe::error_code_t::GRAPH_NOT_SUPPORTED
                                                             : fe::error_code_t::INVALID_VALUE,
              k.status().message()};
    }
    kernel = std::move(k).value();
    return {fe::error_code_t::OK, ""};
  }));
  if (!options.engine.empty() && options.engine != kernel->name()) {
    return InvalidArgument("pinned engine '" + options.engine +
                           "' is not among the 1 candidates for this graph; " + "candidates are:\n  " +
                           kernel->name() + " (fusebox's own kernel)");
  }
  auto impl = std::make_unique<Plan::Impl>();
  impl->native = kernel;
  impl->native_ops = static_cast<int>(g.ops.size());
  impl->engine = kernel->name();
  impl->workspace_bytes = kernel->workspace_bytes();
  r.workspace_bytes = impl->workspace_bytes;
  for (const ResolvedTensor& t : g.tensors) {
    if (t.uid > 0) {
      impl->uids[t.name] = t.uid;
      impl->tensor_bytes[t.name] = t.storage_bytes();
    }
  }
  r.engine = impl->engine;
  r.candidate_plans = 1;
  r.plan_index = 0;
  r.notes_known = true;  // no behavior notes: not a cuDNN engine
  if (reference) {
    r.lowering_notes.push_back(
        "[graph '" + g.name + "']: run by '" + kernel->name() +
        "', fusebox's naive reference kernels (fp32, one thread per output value, the stream synchronized "
        "between ops, no CUDA graph capture): correct, and much slower than a cuDNN engine");
  } else if (faster) {
    r.lowering_notes.push_back("[graph '" + g.name + "']: run by fusebox's own CUDA kernel '" +
                               kernel->name() + "': " + faster->why +
                               "; pin a cuDNN engine (--engine) to run cuDNN instead");
  } else {
    r.lowering_notes.push_back(
        "[graph '" + g.name + "']: run by fusebox's own CUDA kernel '" + kernel->name() +
        "' (an op fusebox runs only with its own kernel): no cuDNN heuristics, support check or plan "
        "build");
  }
  return Plan(std::move(impl));
}

}  // namespace
}  // namespace cudnn

KernelCache::KernelCache() : impl_(std::make_unique<Impl>()) {
  impl_->cache = std::make_shared<cudnn::fe::KernelCache>();
}
KernelCache::~KernelCache() = default;
std::shared_ptr<KernelCache> KernelCache::create() { return std::shared_ptr<KernelCache>(new KernelCache()); }

double BuildReport::total_ms() const {
  double t = 0;
  for (const auto& s : steps) t += s.ms;
  return t;
}

Result<Plan> build_plan(const ResolvedGraph& g, const DeviceTarget& target, const BuildOptions& options,
                        BuildReport* report, GpuContext* ctx) {
  using namespace cudnn;
  BuildReport local;
  BuildReport& r = report ? *report : local;
  r = BuildReport{};
  Status ctx_status;
  auto owned_ctx = maybe_context(target, ctx, &ctx_status);
  FUSEBOX_RETURN_IF_ERROR(ctx_status);
  if (owned_ctx) ctx = owned_ctx.get();
  auto excluded = [&](const std::string& engine) {
    return std::find(options.excluded_engines.begin(), options.excluded_engines.end(), engine) !=
           options.excluded_engines.end();
  };
  if (options.engine == kernels::kReferenceKernelName) {
    if (excluded(options.engine))
      return NotSupported("[graph '" + g.name + "']: engine '" + options.engine + "' is excluded");
    return build_native_plan(g, target, options, r, nullptr, true);
  }
  if (kernels::has_native_op(g)) {
    auto plan = build_native_plan(g, target, options, r);
    if (plan.ok() && excluded(plan->engine_name())) {
      return NotSupported("[graph '" + g.name + "']: fusebox's own kernel '" + plan->engine_name() +
                          "' is excluded (it failed the plan check) and cuDNN 9.19 has no op for this graph");
    }
    return plan;
  }
  auto faster = kernels::faster_native_kernel(g, options.engine);
  if (faster.kernel && !excluded(faster.kernel->name()) &&
      (options.engine == faster.kernel->name() ||
       (options.engine.empty() && options.native_kernels && faster.by_default))) {
    return build_native_plan(g, target, options, r, &faster);
  }

  BuildOptions effective = options;
  if (!options.engine.empty()) {
    effective.heuristics = {HeuristicMode::kA, HeuristicMode::kB, HeuristicMode::kFallback};
  }
  // A kernel of fusebox's own that runs this graph only when pinned: the report (or the refusal, where
  // no cuDNN engine builds, as deviceless for runtime-compiled ones) says it exists.
  const bool pinnable = faster.kernel && !faster.by_default && options.engine.empty();
  auto lowered_or = first_three_steps(g, target, effective, ctx, r);
  if (!lowered_or.ok() && pinnable) {  // on the first line: callers keep the first line of each try
    std::string m = lowered_or.status().message();
    m.insert(std::min(m.find('\n'), m.size()), " (fusebox's own '" + faster.kernel->name() +
                                                   "' runs this graph when pinned: --engine " +
                                                   faster.kernel->name() + ")");
    return Status(lowered_or.status().code(), m);
  }
  FUSEBOX_ASSIGN_OR_RETURN(LoweredGraph lowered, std::move(lowered_or));
  if (pinnable) {
    r.lowering_notes.push_back("[graph '" + g.name +
                               "']: cuDNN's engine, the faster one here; fusebox's own '" +
                               faster.kernel->name() + "' runs this graph too when pinned (--engine " +
                               faster.kernel->name() + "): " + faster.why);
  }
  auto& graph = *lowered.graph;
  int64_t pinned = -1;
  if (!options.engine.empty()) {
    FUSEBOX_ASSIGN_OR_RETURN(pinned, find_engine(graph, options.engine));
    if (auto ex = lowered.excluded.find(options.engine); ex != lowered.excluded.end()) {
      return NotSupported("pinned engine " + ex->first + ": " + ex->second +
                          "; pin another engine (`fusebox engines` lists them)");
    }
    for (const auto& d : r.dropped) {
      if (d.index == pinned) {
        return InvalidArgument("pinned engine '" + options.engine + "' " + d.why +
                               ": raise the workspace limit or pin another engine");
      }
    }
  }
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "check_support", [&]() { return graph.check_support(); }));
  FUSEBOX_RETURN_IF_ERROR(run_step(r, "build_plans", [&]() -> fe::error_t {
    if (pinned >= 0) return graph.build_plan_at_index(pinned);
    if (lowered.excluded.empty()) return graph.build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    // As HEURISTICS_CHOICE does, the first candidate that builds, skipping the excluded ones.
    fe::error_t last{fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED, "no candidate left to build"};
    for (int64_t i = 0; i < r.candidate_plans; ++i) {
      std::string name;
      if (!graph.get_plan_name_at_index(i, name).is_good() || lowered.excluded.count(name)) continue;
      last = graph.build_plan_at_index(i);
      if (last.is_good()) {
        pinned = i;
        return last;
      }
    }
    return last;
  }));

  auto impl = std::make_unique<Plan::Impl>();
  try {
    FUSEBOX_RETURN_IF_ERROR(from_fe(graph.get_plan_name(impl->engine), "get_plan_name"));
    FUSEBOX_RETURN_IF_ERROR(from_fe(graph.get_workspace_size(impl->workspace_bytes), "get_workspace_size"));
  }
  FUSEBOX_CATCH_ALL("plan query")
  impl->graph = lowered.graph;
  impl->uids = std::move(lowered.uids);
  impl->tensor_bytes = std::move(lowered.tensor_bytes);
  impl->plan_index = pinned;
  impl->override_enabled = r.override_shapes && lowered.override_obstacle.empty();
  if (r.override_shapes && !impl->override_enabled) {
    r.lowering_notes.push_back(
        "[graph '" + g.name +
        "']: built override-enabled, but serves this shape only: " + lowered.override_obstacle);
  }
  r.engine = impl->engine;
  r.workspace_bytes = impl->workspace_bytes;
  if (pinned < 0) {
    for (int64_t i = 0; i < r.candidate_plans; ++i) {
      std::string name;
      if (graph.get_plan_name_at_index(i, name).is_good() && name == impl->engine) {
        r.plan_index = i;
        break;
      }
    }
  } else {
    r.plan_index = pinned;
  }
  if (r.plan_index >= 0) {
    std::unordered_map<fe::KnobType_t, int64_t> knobs;
    try {
      if (graph.get_engine_and_knobs_at_index(r.plan_index, r.choice.engine_id, knobs).is_good()) {
        for (const auto& [type, value] : knobs) r.choice.knobs[static_cast<int>(type)] = value;
        // NOT_SET: a knob the frontend cannot name, nor pass back: not replayable.
        if (knobs.count(fe::KnobType_t::NOT_SET)) r.choice = EngineChoice{};
      } else {
        r.choice = EngineChoice{};
      }
    } catch (const std::exception&) {
      r.choice = EngineChoice{};  // only a report detail: the plan stands
    }
    try {
      if (auto notes = graph.behavior_notes_at(r.plan_index)) {
        r.notes_known = true;
        r.behavior_notes = std::move(*notes);
      }
    } catch (const std::exception&) {
      r.notes_known = false;  // only a report detail
    }
  }
  return Plan(std::move(impl));
}

// ---------------------------------------------------------------- CandidateSet

struct CandidateSet::Impl {
  std::unique_ptr<GpuContext> owned_ctx;
  std::optional<Plan> native;  // a graph fusebox runs itself: its one candidate
  // fusebox's kernel for the graph where it runs only when pinned (FasterKernel::by_default false):
  // a candidate after cuDNN's, so that listing and tuning see it.
  std::optional<Plan> pinned_native;
  int64_t cudnn_count = 0;  // cuDNN's candidates, before pinned_native's
  cudnn::LoweredGraph lowered;
  std::vector<EngineCandidate> candidates;
  BuildReport* report = nullptr;
  BuildReport local_report;
};

CandidateSet::CandidateSet(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CandidateSet::CandidateSet(CandidateSet&&) noexcept = default;
CandidateSet& CandidateSet::operator=(CandidateSet&&) noexcept = default;
CandidateSet::~CandidateSet() = default;

Result<CandidateSet> CandidateSet::create(const ResolvedGraph& g, const DeviceTarget& target,
                                          const BuildOptions& options, BuildReport* report, GpuContext* ctx) {
  using namespace cudnn;
  auto impl = std::make_unique<Impl>();
  impl->report = report ? report : &impl->local_report;
  *impl->report = BuildReport{};
  Status ctx_status;
  impl->owned_ctx = maybe_context(target, ctx, &ctx_status);
  FUSEBOX_RETURN_IF_ERROR(ctx_status);
  if (impl->owned_ctx) ctx = impl->owned_ctx.get();
  auto faster = kernels::faster_native_kernel(g, options.engine);
  const bool faster_excluded =
      faster.kernel && std::find(options.excluded_engines.begin(), options.excluded_engines.end(),
                                 faster.kernel->name()) != options.excluded_engines.end();
  if (kernels::has_native_op(g) || (faster.kernel && !faster_excluded && options.engine.empty() &&
                                    options.native_kernels && faster.by_default)) {
    FUSEBOX_ASSIGN_OR_RETURN(
        Plan plan, build_native_plan(g, target, options, *impl->report, faster.kernel ? &faster : nullptr));
    EngineCandidate c;
    c.index = 0;
    c.name = plan.engine_name();
    c.supported = true;
    c.workspace_bytes = plan.workspace_bytes();
    impl->candidates.push_back(std::move(c));
    impl->native.emplace(std::move(plan));
    return CandidateSet(std::move(impl));
  }
  FUSEBOX_ASSIGN_OR_RETURN(impl->lowered, first_three_steps(g, target, options, ctx, *impl->report));
  auto& graph = *impl->lowered.graph;
  try {
    const int64_t n = graph.get_execution_plan_count();
    for (int64_t i = 0; i < n; ++i) {
      EngineCandidate c;
      c.index = i;
      (void)graph.get_plan_name_at_index(i, c.name);
      std::unordered_map<fe::KnobType_t, int64_t> knobs;
      (void)graph.get_engine_and_knobs_at_index(i, c.engine_id, knobs);
      c.knobs = knobs_from_name(c.name);
      if (auto notes = graph.behavior_notes_at(i)) c.behavior_notes = std::move(*notes);
      c.numerical_notes = graph.numerical_notes_at(i);
      for (const auto& earlier : impl->candidates) {
        if (earlier.name == c.name && earlier.duplicate_of < 0) c.duplicate_of = earlier.index;
      }
      impl->candidates.push_back(std::move(c));
    }
  }
  FUSEBOX_CATCH_ALL("listing candidates")
  impl->cudnn_count = static_cast<int64_t>(impl->candidates.size());
  if (faster.kernel && !faster_excluded && options.engine.empty() && options.native_kernels) {
    BuildReport own;  // not a step of the cuDNN build's report
    auto plan = build_native_plan(g, target, options, own, &faster);
    if (plan.ok()) {
      EngineCandidate c;
      c.index = impl->cudnn_count;
      c.name = plan->engine_name();
      c.supported = true;
      c.workspace_bytes = plan->workspace_bytes();
      impl->candidates.push_back(std::move(c));
      impl->pinned_native.emplace(std::move(*plan));
    }
  }
  return CandidateSet(std::move(impl));
}

const std::vector<EngineCandidate>& CandidateSet::candidates() const { return impl_->candidates; }

void CandidateSet::check_all(bool build) {
  using namespace cudnn;
  if (impl_->native) return;  // one candidate, built already
  auto& graph = *impl_->lowered.graph;
  BuildReport& r = *impl_->report;
  auto timed = [&](const std::string& name, const std::function<void()>& fn) {
    StepReport step{name, 0, true, Status::Ok(), ""};
    common::Stopwatch watch;
    StdioCapture capture;
    try {
      fn();
    } catch (const std::exception& e) {
      step.status = Status(StatusCode::kCudnnError, name + ": exception from cuDNN frontend: " + e.what());
    }
    step.cudnn_log = capture.finish();
    step.ms = watch.ms();
    r.steps.push_back(step);
  };
  const int64_t n_cudnn = impl_->cudnn_count;  // a pinned-only kernel of fusebox's after them: built
  timed("check_support", [&] {
    for (auto& c : impl_->candidates) {
      if (c.duplicate_of >= 0 || c.index >= n_cudnn) continue;
      if (auto ex = impl_->lowered.excluded.find(c.name); ex != impl_->lowered.excluded.end()) {
        c.supported = false;
        c.support_message = "excluded: " + ex->second;
        continue;
      }
      auto st = from_fe(graph.check_support_at(c.index), "check_support");
      c.supported = st.ok();
      if (!st.ok()) c.support_message = st.message().substr(0, st.message().find('\n'));
    }
  });
  auto copy_to_duplicates = [&] {
    for (auto& c : impl_->candidates) {
      if (c.duplicate_of < 0) continue;
      const auto& o = impl_->candidates[c.duplicate_of];
      c.supported = o.supported;
      c.support_message = o.support_message;
      c.workspace_bytes = o.workspace_bytes;
    }
  };
  copy_to_duplicates();
  if (!build) return;
  timed("build_plans", [&] {
    // Builds every candidate that passed, in parallel; failures are read per index below.
    (void)graph.build_plans(fe::BuildPlanPolicy_t::ALL, /*do_multithreaded_builds=*/true);
    for (auto& c : impl_->candidates) {
      if (!c.supported || c.duplicate_of >= 0 || c.index >= n_cudnn) continue;
      auto st = from_fe(graph.build_plan_at_index(c.index), "build_plan");
      c.supported = st.ok();
      if (!st.ok()) c.support_message = st.message().substr(0, st.message().find('\n'));
      int64_t ws = -1;
      if (c.supported && graph.get_workspace_size_plan_at_index(c.index, ws).is_good())
        c.workspace_bytes = ws;
    }
  });
  copy_to_duplicates();
}

Result<Plan> CandidateSet::plan_at(int64_t index) {
  using namespace cudnn;
  if (index < 0 || index >= static_cast<int64_t>(impl_->candidates.size())) {
    return InvalidArgument("candidate index " + std::to_string(index) + " is out of range (" +
                           std::to_string(impl_->candidates.size()) + " candidates)");
  }
  if (impl_->native) {  // a copy sharing the kernel
    auto impl = std::make_unique<Plan::Impl>(*impl_->native->impl());
    return Plan(std::move(impl));
  }
  if (index >= impl_->cudnn_count && impl_->pinned_native) {
    auto impl = std::make_unique<Plan::Impl>(*impl_->pinned_native->impl());
    return Plan(std::move(impl));
  }
  auto& graph = *impl_->lowered.graph;
  auto impl = std::make_unique<Plan::Impl>();
  try {
    StdioCapture capture;
    Status st = from_fe(graph.build_plan_at_index(index), "build plan " + impl_->candidates[index].name);
    if (!st.ok()) return Status(st.code(), st.message().substr(0, st.message().find('\n')));
    FUSEBOX_RETURN_IF_ERROR(
        from_fe(graph.get_workspace_size_plan_at_index(index, impl->workspace_bytes), "get_workspace_size"));
  }
  FUSEBOX_CATCH_ALL("plan_at")
  impl->graph = impl_->lowered.graph;
  impl->uids = impl_->lowered.uids;
  impl->tensor_bytes = impl_->lowered.tensor_bytes;
  impl->engine = impl_->candidates[index].name;
  impl->plan_index = index;
  return Plan(std::move(impl));
}

Result<std::vector<EngineCandidate>> list_engines(const ResolvedGraph& g, const DeviceTarget& target,
                                                  const BuildOptions& options, bool build_each,
                                                  BuildReport* report, GpuContext* ctx) {
  FUSEBOX_ASSIGN_OR_RETURN(CandidateSet set, CandidateSet::create(g, target, options, report, ctx));
  set.check_all(build_each);
  return set.candidates();
}

namespace {

// A plan that fails to load on a cuDNN without its precompiled engines (a runtime-compiled-only
// set: cuDNN then says CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH) gets the reason added.
Status without_precompiled_engines(Status failed) {
  const CudnnEngineLibraries libs = cudnn_engine_libraries();
  if (libs.precompiled) return failed;
  return Status(failed.code(),
                failed.message() + "; the loaded cuDNN (" + libs.directory +
                    ") has no libcudnn_engines_precompiled.so.9 (a runtime-compiled-only set, like the "
                    "nvidia-cudnn-jit wheel): a plan built deviceless or with a precompiled engine "
                    "loads only on the full cuDNN; put it first on LD_LIBRARY_PATH, or build the plan on "
                    "this machine");
}

}  // namespace

Result<Plan> deserialize_plan(const ResolvedGraph& g, const std::vector<uint8_t>& bytes,
                              const DeviceTarget& target, GpuContext* ctx, const std::string& engine_name) {
  using namespace cudnn;
  // Callers that read a file or cache entry have checked it already, naming
  // it; this covers every other caller (common/plan_payload_check.h).
  FUSEBOX_RETURN_IF_ERROR(common::check_plan_payload(bytes.data(), bytes.size(), "plan"));
  if (common::is_plan_parts(bytes.data(), bytes.size()))
    return cudnn::deserialize_parts(g, bytes, target, ctx);
  auto impl = std::make_unique<Plan::Impl>();
  try {
    auto graph = std::make_shared<FeGraph>();  // FeGraph: BoundPlan reads its execution plans
    if (ctx) {
      // No warm-up capture (the frontend's default): the first execution loads
      // the kernels instead, and fusebox reports it as such.
      Status loaded = from_fe(graph->deserialize(ctx->impl()->handle, bytes, /*enforce_precompiled=*/false,
                                                 /*run_warmup=*/false),
                              "deserialize plan");
      if (!loaded.ok()) return without_precompiled_engines(std::move(loaded));
    } else {
      if (!target.deviceless())
        return InvalidArgument("deserialize_plan: no GpuContext and no device properties");
      FUSEBOX_ASSIGN_OR_RETURN(auto props, device_properties_for(target));
      graph->set_device_properties(props);
      Status loaded = from_fe(graph->deserialize(bytes), "deserialize plan (handle-less)");
      if (!loaded.ok()) return without_precompiled_engines(std::move(loaded));
    }
    if (!graph->get_plan_name(impl->engine).is_good() || impl->engine.empty()) {
      impl->engine = engine_name.empty() ? "(deserialized)" : engine_name;
    }
    FUSEBOX_RETURN_IF_ERROR(from_fe(graph->get_workspace_size(impl->workspace_bytes), "get_workspace_size"));
    impl->graph = std::move(graph);
  }
  FUSEBOX_CATCH_ALL("deserialize plan")
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const auto& t = g.tensors[i];
    if (t.uid > 0) {
      impl->uids[t.name] = t.uid;  // canonical, as when it was built (lowering.cpp)
      impl->tensor_bytes[t.name] = t.storage_bytes();
    }
  }
  return Plan(std::move(impl));
}

// ---------------------------------------------------------------- Plan

Plan::Plan() = default;
Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;
Plan::~Plan() = default;

const std::string& Plan::engine_name() const {
  static const std::string empty;
  return impl_ ? impl_->engine : empty;
}
int64_t Plan::workspace_bytes() const { return impl_ ? impl_->workspace_bytes : 0; }
bool Plan::native() const { return impl_ && impl_->native; }
int Plan::part_count() const {
  return impl_ && impl_->parts ? static_cast<int>(impl_->parts->parts.size()) : 0;
}

const ResolvedGraph* Plan::part_graph(int i) const {
  if (i < 0 || i >= part_count()) return nullptr;
  return &impl_->parts->parts[static_cast<size_t>(i)].graph;
}
const Plan* Plan::part_plan(int i) const {
  if (i < 0 || i >= part_count()) return nullptr;
  return &impl_->parts->parts[static_cast<size_t>(i)].plan;
}

Result<std::vector<uint8_t>> Plan::serialize() const {
  if (!impl_) return Internal("serialize: empty plan");
  if (impl_->shape_override) {
    return NotSupported("engine '" + impl_->engine +
                        "' serves this shape by execute-time shape override of a plan built for another "
                        "shape: its bytes would be that shape's plan, so it is not serialized (a plan "
                        "built for this shape is)");
  }
  if (impl_->parts) return cudnn::serialize_parts(*impl_->parts);
  if (impl_->native) {
    // fusebox's own kernel: no cuDNN plan, so the bytes are one part covering the graph, by the
    // kernel's name (common/plan_parts.h), rebuilt from the graph when read: what a plan-cache
    // entry needs to carry the plan check's sealed verdict across starts.
    return common::encode_plan_parts({{0, impl_->native_ops, impl_->engine, {}}}, {});
  }
  std::vector<uint8_t> bytes;
  try {
    // serialize() writes the graph's current candidate: make it this plan's.
    if (impl_->plan_index >= 0) {
      FUSEBOX_RETURN_IF_ERROR(
          cudnn::from_fe(impl_->graph->build_plan_at_index(impl_->plan_index), "select plan"));
    }
    FUSEBOX_RETURN_IF_ERROR(cudnn::from_fe(impl_->graph->serialize(bytes), "serialize plan"));
  }
  FUSEBOX_CATCH_ALL("serialize plan")
  return bytes;
}

Status Plan::execute(GpuContext& ctx, const std::map<std::string, void*>& buffers, void* workspace) const {
  if (!impl_) return Internal("execute: empty plan");
  std::unordered_map<int64_t, void*> pack;
  pack.reserve(impl_->uids.size());
  for (const auto& [name, uid] : impl_->uids) {
    auto it = buffers.find(name);
    if (it == buffers.end() || it->second == nullptr) {
      return InvalidArgument("execute: no device buffer for tensor '" + name + "'");
    }
    pack.emplace(uid, it->second);
  }
  if (impl_->workspace_bytes > 0 && workspace == nullptr) {
    return InvalidArgument("execute: plan needs " + std::to_string(impl_->workspace_bytes) +
                           " bytes of workspace and none was given");
  }
  if (impl_->parts) return cudnn::execute_parts(*impl_->parts, ctx, buffers, workspace);
  if (impl_->native) {
    std::vector<void*> ptrs;
    for (const std::string& name : impl_->native->tensors()) ptrs.push_back(buffers.at(name));
    return impl_->native->launch_with_workspace(ptrs.data(), workspace, ctx.impl()->stream);
  }
  try {
    if (const auto& o = impl_->shape_override) {
      return cudnn::from_fe(
          impl_->graph->execute_plan_at_index(ctx.impl()->handle, pack, workspace, impl_->index_to_run(),
                                              o->uids, o->shapes, o->strides),
          "execute '" + impl_->engine + "' (shapes overridden)");
    }
    auto err = impl_->plan_index >= 0 ? impl_->graph->execute_plan_at_index(ctx.impl()->handle, pack,
                                                                            workspace, impl_->plan_index)
                                      : impl_->graph->execute(ctx.impl()->handle, pack, workspace);
    return cudnn::from_fe(err, "execute '" + impl_->engine + "'");
  }
  FUSEBOX_CATCH_ALL("execute")
}

// ---------------------------------------------------------------- GpuContext

GpuContext::GpuContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuContext::~GpuContext() {
  if (!impl_) return;
  if (impl_->handle) cudnnDestroy(impl_->handle);
  if (impl_->own_stream) cudaStreamDestroy(impl_->own_stream);
}
void* GpuContext::stream() const { return impl_->stream; }
int GpuContext::device_id() const { return impl_->device_id; }
Status GpuContext::set_stream(void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (s == impl_->stream) return Status::Ok();  // the common case: one call per execute
  FUSEBOX_RETURN_IF_ERROR(cudnn::cudnn_status(cudnnSetStream(impl_->handle, s), "cudnnSetStream"));
  impl_->stream = s;
  return Status::Ok();
}
Status GpuContext::use_own_stream() { return set_stream(impl_->own_stream); }

Result<std::unique_ptr<GpuContext>> GpuContext::create(int device_id) {
  using namespace cudnn;
  FUSEBOX_RETURN_IF_ERROR(check_cudnn_runtime());
  if (gpu_count() <= device_id) {
    return Status(StatusCode::kNoDevice, "no CUDA GPU with id " + std::to_string(device_id) + " (" +
                                             std::to_string(gpu_count()) + " visible)");
  }
  auto impl = std::make_unique<Impl>();
  impl->device_id = device_id;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaSetDevice(device_id), "cudaSetDevice"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaStreamCreateWithFlags(&impl->own_stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  impl->stream = impl->own_stream;
  auto ctx = std::unique_ptr<GpuContext>(new GpuContext(std::move(impl)));
  FUSEBOX_RETURN_IF_ERROR(cudnn_status(cudnnCreate(&ctx->impl_->handle), "cudnnCreate"));
  FUSEBOX_RETURN_IF_ERROR(
      cudnn_status(cudnnSetStream(ctx->impl_->handle, ctx->impl_->stream), "cudnnSetStream"));
  return ctx;
}

}  // namespace fusebox
