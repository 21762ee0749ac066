// fusebox: building, selecting, serializing and executing cuDNN execution
// plans for a ResolvedGraph. No cuDNN type appears here; the only code that
// includes cudnn_frontend.h lives in src/cudnn/.
//
// Thread safety: a Plan may be executed concurrently from several threads
// with distinct GpuContexts; building is independent per call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/partition.h"
#include "fusebox/status.h"

namespace fusebox {

enum class HeuristicMode { kA, kB, kFallback };
std::string_view heuristic_mode_name(HeuristicMode m);  // "a", "b", "fallback"
// "a,b,fallback" -> modes; errors list the accepted names.
Result<std::vector<HeuristicMode>> parse_heuristic_modes(std::string_view csv);

// The GPU plans are built for: the live GPU, or a device-properties file
// (deviceless ahead-of-time builds on machines without a GPU).
struct DeviceTarget {
  std::string properties_json;  // cuDNN's serialized device description; empty = live GPU
  int device_id = 0;            // live GPU ordinal
  // Read from the properties (or the live GPU): for reports and cache keys.
  std::string device_name;
  int sm_version = 0;  // e.g. 90
  int sm_count = 0;

  bool deviceless() const { return !properties_json.empty(); }
  static Result<DeviceTarget> from_file(const std::string& path);
  static Result<DeviceTarget> from_properties_json(std::string json, const std::string& origin);
  static Result<DeviceTarget> live_gpu(int device_id = 0);
};

// Captures cuDNN's device description of a live GPU (`fusebox devprop`).
Result<std::string> capture_device_properties(int device_id = 0);

// cuDNN's kernel cache: a dynamic-shape build (BuildOptions::dynamic_shape)
// given one reuses the kernels an earlier build of the same graph at another
// shape compiled, instead of compiling them again. One per symbolic graph
// (the first build ties it to that graph's topology); shared by its builds,
// thread-safe. Opaque: no cuDNN type here.
class KernelCache {
 public:
  static std::shared_ptr<KernelCache> create();
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  KernelCache();
  std::unique_ptr<Impl> impl_;
};

// An engine and its knob choices, as cuDNN numbers them: what a build chose,
// replayed by a later build of the same graph at another shape without the
// heuristics (BuildOptions::replay).
struct EngineChoice {
  int64_t engine_id = -1;        // -1: none
  std::map<int, int64_t> knobs;  // cuDNN frontend knob type -> value
  bool empty() const { return engine_id < 0; }
};

// The engine name of fusebox's reference kernels (BuildOptions::engine below).
inline constexpr const char* kReferenceEngine = "fusebox_reference";

struct BuildOptions {
  std::vector<HeuristicMode> heuristics{HeuristicMode::kA};
  // Pin an engine by the name `fusebox engines` shows ("eng41_k2=4_k13=0...").
  // It is looked up among the candidates of all heuristic modes.
  // Empty: the first candidate that passes the support check.
  // "fusebox_reference": the whole graph on fusebox's naive GPU reference kernels (fp32, slow;
  // the last resort Session::get_plan takes for a single op no cuDNN engine builds).
  std::string engine;
  int64_t max_workspace_bytes = -1;  // -1: no limit
  // Build with cuDNN's dynamic shapes (engines that support them compile
  // shape-generic kernels), reusing and filling `kernel_cache` when given.
  bool dynamic_shape = false;
  std::shared_ptr<KernelCache> kernel_cache;  // only with dynamic_shape
  // Non-empty: step 3 creates this one engine config instead of asking the
  // heuristics (the `heuristics` and `engine` fields are not used); a shape
  // it does not support fails in check_support.
  EngineChoice replay;
  // Engines (full names, as `fusebox engines` shows them) never to build:
  // candidates that failed the plan check (fusebox/plan_check.h). The build
  // takes the next candidate in the heuristics' order instead. fusebox's own
  // rules (src/cudnn/engine_rules.cpp) are applied besides.
  std::vector<std::string> excluded_engines;
  // A graph fusebox's own kernel runs much faster than cuDNN (a global average
  // pool alone; a layernorm or rmsnorm forward alone with 16-bit x and fp32
  // params: docs/architecture.md, "Native ops") is built as that kernel unless
  // this is false or a cuDNN engine is pinned.
  bool native_kernels = true;
  // With dynamic_shape, on a cuDNN with execute-time shape override (override_shapes_available()):
  // the graph is built override-enabled, so the plan serves other shapes of the same symbolic graph
  // without a build (plan_at_shape). An engine that refuses override shapes fails the build.
  bool override_shapes = false;
};

// One of the five steps (validate, build_operation_graph,
// create_execution_plans, check_support, build_plans).
struct StepReport {
  std::string name;
  double ms = 0;
  bool ran = false;
  Status status;
  std::string cudnn_log;  // what cuDNN printed during the step (captured)
};

// A candidate left out by the workspace limit (BuildOptions::max_workspace_bytes).
struct DroppedCandidate {
  int64_t index = 0;
  std::string name;
  int64_t workspace_bytes = -1;  // what it needs
  std::string why;
};

struct BuildReport {
  std::vector<StepReport> steps;
  int64_t workspace_limit = -1;           // the limit applied, -1: none
  std::vector<DroppedCandidate> dropped;  // candidates over the limit
  int64_t candidate_plans = 0;            // offered by the heuristics
  std::string engine;                     // chosen engine-and-knobs name
  int64_t plan_index = -1;
  int64_t workspace_bytes = 0;
  bool deviceless = false;
  std::string device_name;
  int sm_version = 0;
  bool dynamic_shape = false;    // built with cuDNN's dynamic shapes
  bool kernel_cache = false;     // ... and a kernel cache
  bool replayed = false;         // step 3 replayed BuildOptions::replay (no heuristics)
  bool override_shapes = false;  // built override-enabled (BuildOptions::override_shapes)
  EngineChoice choice;           // the engine and knobs built (empty if unknown)
  // cuDNN's behavior notes of the plan built (RUNTIME_COMPILATION, ...); empty if unknown.
  std::vector<std::string> behavior_notes;
  bool notes_known = false;  // behavior_notes were read (an empty list then means none)
  // What the lowering chose that the graph does not say, one line per choice,
  // e.g. "[sdpa_fwd 'attn']: causal mask left out: ..." (docs/graph-format.md).
  std::vector<std::string> lowering_notes;
  // Candidates left out by fusebox's engine rules or BuildOptions::excluded_engines, one line each.
  std::vector<std::string> excluded;
  double total_ms() const;
};

// Everything known about one candidate plan (`fusebox engines`).
struct EngineCandidate {
  int64_t index = 0;
  std::string name;  // engine and knobs, e.g. "eng41_k2=4_k13=0_k18=0"
  int64_t engine_id = -1;
  std::map<std::string, int64_t> knobs;
  std::vector<std::string> behavior_notes;   // RUNTIME_COMPILATION, CUBLASLT_DEPENDENCY, ...
  std::vector<std::string> numerical_notes;  // TENSOR_CORE, NONDETERMINISTIC, ...
  bool supported = false;
  std::string support_message;  // why not, when unsupported
  int64_t workspace_bytes = -1;
  // The heuristic modes overlap: a later copy of an earlier candidate points
  // at it (and is neither checked nor timed again).
  int64_t duplicate_of = -1;
};

// Whether a list of cuDNN notes (behavior_notes, numerical_notes) holds `note`,
// e.g. has_note(report.behavior_notes, "RUNTIME_COMPILATION").
inline bool has_note(const std::vector<std::string>& notes, const std::string& note) {
  for (const auto& n : notes) {
    if (n == note) return true;
  }
  return false;
}

class GpuContext;

class Plan {
 public:
  Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  ~Plan();

  const std::string& engine_name() const;
  int64_t workspace_bytes() const;
  // Run by fusebox's own CUDA kernel (an op cuDNN has none for, e.g.
  // embedding), not a cuDNN plan: nothing to serialize, cache or tune.
  bool native() const;
  // A partitioned plan (compose_partitioned_plan): its parts' count, else 0.
  int part_count() const;
  // Part i of a partitioned plan (0 <= i < part_count()): its graph and its plan, e.g. to time
  // it alone; null out of range.
  const ResolvedGraph* part_graph(int i) const;
  const Plan* part_plan(int i) const;
  // A plan serving a shape it was not built for (plan_at_shape): the dims and strides that
  // differ go to cuDNN at every execute. Its serialize() refuses: its bytes are the built shape's.
  bool shape_overridden() const;
  // Built override-enabled (BuildOptions::override_shapes): plan_at_shape accepts it.
  bool serves_other_shapes() const;
  // The frontend's serialized form (graph structure and compiled plan); for a
  // partitioned plan, a container of its parts' forms (common/plan_parts.h).
  Result<std::vector<uint8_t>> serialize() const;
  // Runs the plan. `buffers` maps every non-virtual graph tensor name to a
  // device pointer (by-value scalars are taken from the graph); `workspace`
  // has at least workspace_bytes(). Asynchronous on ctx's stream.
  Status execute(GpuContext& ctx, const std::map<std::string, void*>& buffers, void* workspace) const;

  struct Impl;
  explicit Plan(std::unique_ptr<Impl> impl);
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Runs the five steps and builds one plan.
// `ctx` is needed for a live-GPU target (one is created when null).
Result<Plan> build_plan(const ResolvedGraph& g, const DeviceTarget& target, const BuildOptions& options,
                        BuildReport* report, GpuContext* ctx = nullptr);

// Steps 1-3, then the support check and workspace of every candidate.
// With `build_each`, also builds each supported candidate (slow, but says
// whether it really builds).
Result<std::vector<EngineCandidate>> list_engines(const ResolvedGraph& g, const DeviceTarget& target,
                                                  const BuildOptions& options, bool build_each,
                                                  BuildReport* report, GpuContext* ctx = nullptr);

// Steps 1-3 run once, then each candidate can be checked, built and turned
// into a Plan: the basis of `fusebox engines` and `fusebox tune`. Plans taken
// from one set share its frontend graph. Not thread-safe.
class CandidateSet {
 public:
  static Result<CandidateSet> create(const ResolvedGraph& g, const DeviceTarget& target,
                                     const BuildOptions& options, BuildReport* report,
                                     GpuContext* ctx = nullptr);
  CandidateSet(CandidateSet&&) noexcept;
  CandidateSet& operator=(CandidateSet&&) noexcept;
  ~CandidateSet();

  // Names, knobs and notes of every candidate, in the heuristics' order.
  const std::vector<EngineCandidate>& candidates() const;
  // Runs the support check of every candidate and, with `build`, builds each
  // supported one (on several threads where the frontend allows it), filling
  // supported, support_message and workspace_bytes. Timed into the report.
  void check_all(bool build);
  // A plan for candidate `index` (built now if needed).
  Result<Plan> plan_at(int64_t index);

  struct Impl;

 private:
  explicit CandidateSet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The workspace a BoundPlan executes with, owned by whoever binds (a
// Session's arena). `generation` changes whenever `ptr` does, so bound plans
// notice a grown arena without being told.
struct WorkspaceBinding {
  void* ptr = nullptr;
  int64_t bytes = 0;
  uint64_t generation = 0;
};

// A plan bound once to its tensors: device pointers held in cuDNN's uid
// order, so execute() allocates nothing and looks nothing up by name. Where
// the plan allows (no frontend-side workspace work, the usual case), the
// cuDNN variant pack is built at bind time and execute() is one
// cudnnBackendExecute; otherwise it is the frontend's execute from the
// pointer array. The plan, GpuContext and workspace must outlive it.
// Not thread-safe (one stream, one thread at a time).
class BoundPlan {
 public:
  BoundPlan();
  BoundPlan(BoundPlan&&) noexcept;
  BoundPlan& operator=(BoundPlan&&) noexcept;
  ~BoundPlan();

  // Every non-virtual tensor of the plan needs a pointer in `buffers` (by
  // name); unknown names are refused.
  static Result<BoundPlan> bind(const Plan& plan, GpuContext& ctx,
                                const std::map<std::string, void*>& buffers,
                                std::shared_ptr<const WorkspaceBinding> workspace);

  // Tensor names in slot order (ascending cuDNN uid).
  const std::vector<std::string>& tensor_names() const;
  // The slot of a tensor, for rebind(int, ...); -1 when the plan has none by that name.
  int slot_of(std::string_view name) const;
  // Points one tensor elsewhere. With the slot: no lookup; the variant pack
  // is rebuilt here (microseconds), never in execute().
  Status rebind(int slot, void* ptr);
  Status rebind(std::string_view name, void* ptr);
  // The same, refusing a buffer of `buffer_bytes` smaller than the tensor
  // (the error names the tensor and both sizes); nothing changes then.
  Status rebind(int slot, void* ptr, int64_t buffer_bytes);
  Status rebind(std::string_view name, void* ptr, int64_t buffer_bytes);
  // The bytes a buffer for the tensor in `slot` must hold (its storage:
  // strides included), -1 for an unknown slot.
  int64_t tensor_bytes(int slot) const;
  // Whether a buffer of `buffer_bytes` can hold the tensor in `slot`.
  Status check_buffer(int slot, int64_t buffer_bytes) const;
  // Asynchronous on the context's stream.
  Status execute();

  const std::string& engine_name() const;
  int64_t workspace_bytes() const;
  // True when execute() is a bare cudnnBackendExecute on a prebuilt variant pack.
  bool direct() const;
  // For benchmarks that call cuDNN themselves: cudnnHandle_t, and the
  // cudnnBackendDescriptor_t of the execution plan and of the current variant
  // pack (null unless direct()).
  void* cudnn_handle() const;
  void* backend_plan() const;
  void* backend_variant_pack() const;

  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit BoundPlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One plan for `whole` made of `partition`'s parts, part_plans[i] built for
// partition.parts[i].graph: executed as one (the parts in turn on one stream,
// the temporaries between them at the start of the workspace, so
// workspace_bytes() = temporaries + the largest part's workspace), capturable
// in a CUDA graph, serialized as one payload with its parts.
Result<Plan> compose_partitioned_plan(const ResolvedGraph& whole, const GraphPartition& partition,
                                      std::vector<Plan> part_plans);

// Whether the loaded cuDNN serves execute-time shape override with its per-variant-pack workspace
// query (fusebox/cudnn_features.h: "override_shapes" and "override_shape_workspace", 9.23 and up).
bool override_shapes_available();

// `built` (a plan built override-enabled for `built_graph`, a symbolic graph at one shape) serving
// `g`, the same symbolic graph at another shape: no build. The non-virtual tensors whose dims or
// strides differ go to cuDNN at every execute, and the workspace is cuDNN's answer for them. The
// plan shares `built`'s cuDNN graph (either keeps it alive; executes may run concurrently). Refused
// (InvalidArgument, naming what differs) where `g` is another graph, or the same graph with
// other op attributes or by-value scalars (a value derived from a dim), or where the lowering
// gives a tensor other dims than the graph; `ctx` must be the GPU context `built` was built on.
Result<Plan> plan_at_shape(const Plan& built, const ResolvedGraph& built_graph, const ResolvedGraph& g,
                           GpuContext& ctx);

// Rebuilds a plan from serialize()'s bytes. Without a GpuContext the target
// must be deviceless (handle-less deserialization). `engine_name` names the
// plan where the frontend cannot tell after deserializing (a plan file has it).
Result<Plan> deserialize_plan(const ResolvedGraph& g, const std::vector<uint8_t>& bytes,
                              const DeviceTarget& target, GpuContext* ctx,
                              const std::string& engine_name = "");

// A cuDNN handle bound to one GPU and one CUDA stream.
class GpuContext {
 public:
  static Result<std::unique_ptr<GpuContext>> create(int device_id = 0);
  ~GpuContext();
  void* stream() const;  // cudaStream_t: the context's own, or the last set_stream()'s
  int device_id() const;
  // Sends later work (executes, and the session's own work) to `stream`, a
  // cudaStream_t the caller owns and keeps alive while it is set (nullptr:
  // CUDA's default stream). use_own_stream() goes back to the context's own.
  Status set_stream(void* stream);
  Status use_own_stream();
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  explicit GpuContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- system

struct GpuInfo {
  int id = 0;
  std::string name;
  int sm_version = 0;
  int sm_count = 0;
  int64_t memory_bytes = 0;
};

// The engine libraries of the loaded cuDNN 9, which it opens by name at first use: those beside
// the loaded libcudnn. A runtime-compiled-only set (the nvidia-cudnn-jit wheel) has no
// precompiled engines, so a plan built deviceless, or with a precompiled engine, cannot be loaded
// on it (cuDNN says CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH).
struct CudnnEngineLibraries {
  bool precompiled = false;       // libcudnn_engines_precompiled.so.9
  bool runtime_compiled = false;  // libcudnn_engines_runtime_compiled.so.9
  std::string directory;          // where the loaded libcudnn is
};

struct SystemInfo {
  std::string fusebox_version;
  std::string frontend_version;        // headers compiled against
  int64_t cudnn_header_version = 0;    // CUDNN_VERSION, e.g. 91900
  int64_t cudnn_runtime_version = 0;   // cudnnGetVersion()
  std::string cudnn_library_path;      // the libcudnn actually loaded
  CudnnEngineLibraries cudnn_engines;  // which engine libraries the loaded cuDNN has
  int cuda_runtime_version = 0;        // cudaRuntimeGetVersion
  int cuda_driver_version = 0;         // 0 when no driver
  std::string cuda_driver_library;     // what libcuda.so.1 is here: the driver, the toolkit's stub, none
  std::vector<GpuInfo> gpus;
  std::string gpu_error;  // why no GPU is seen, if none
};
// With `enumerate_gpus` false, only the versions (cheap: no CUDA device
// queries), which is all plan-file and cache-key checks need on start-up.
SystemInfo system_info(bool enumerate_gpus = true);

// Fails with kVersionMismatch, naming both versions and the loaded library's
// path, when the cuDNN runtime is older than kMinCudnnVersion (9.19; see
// fusebox/cudnn_features.h) or not cuDNN 9. A runtime older than the headers
// fusebox was built with is accepted: features it lacks stay off.
Status check_cudnn_runtime();

// Number of CUDA GPUs visible (0 on a machine without a GPU or driver).
int gpu_count();

// The loaded cuDNN's engine libraries (CudnnEngineLibraries).
CudnnEngineLibraries cudnn_engine_libraries();

}  // namespace fusebox
