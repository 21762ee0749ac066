// fusebox: building, tuning and running pipelines (docs/pipeline-format.md)
// through a Session. No cuDNN type appears here.
//
// Running is split so that everything that can be wrong with the caller's
// files is found before any GPU work: load_pipeline_data() reads the inputs
// and constants (dtype and shape checked against each buffer), then
// build_pipeline() gets a plan per stage, then PipelineExecutor allocates a
// device buffer per pipeline buffer and binds every stage (one workspace
// arena, the session's); run_pipeline() executes, verifies and times.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusebox/pipeline.h"
#include "fusebox/plan.h"
#include "fusebox/reference.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

// ---------------------------------------------------------------- build, tune

struct StageBuild {
  int stage = -1;  // index into Pipeline::stages
  bool ok = false;
  Plan plan;  // when ok
  PlanReport report;
  double ms = 0;  // get_plan wall time
  Status error;   // when not ok: why, naming the pipeline and stage
};

struct PipelineBuild {
  std::vector<StageBuild> stages;  // in Pipeline::order (up to the failed one, or all with keep_going)
  double total_ms = 0;
  // Plans by stage index (Pipeline::stages), for PipelineExecutor; null for a
  // stage not built.
  std::vector<const Plan*> plans_by_stage(const Pipeline& p) const;
};

// Every stage's plan through session.get_plan(request), in Pipeline::order.
// Stops at the first failure: its error names the pipeline and stage, and
// `out` holds the stages so far, the failed one last (with its report).
// With keep_going, every stage is tried (e.g. a deviceless build where cuDNN
// refuses some graphs): `out` holds them all, each failed one with its
// error, and the status is the first failure's, saying how many failed.
Status build_pipeline(Session& session, const Pipeline& p, const PlanRequest& request, PipelineBuild* out,
                      bool keep_going = false);

struct StageTune {
  int stage = -1;
  bool ok = false;
  SessionTune tune;  // tune.plan is the stage's plan
  double ms = 0;
};

struct PipelineTune {
  std::vector<StageTune> stages;  // in Pipeline::order (up to the failed one)
  double total_ms = 0;
  std::vector<const Plan*> plans_by_stage(const Pipeline& p) const;
};

// session.tune() per stage, in Pipeline::order (a GPU is needed). A stage
// whose winner does not verify fails the pipeline (named).
Status tune_pipeline(Session& session, const Pipeline& p, const TunePolicy& policy, PipelineTune* out);

// ---------------------------------------------------------------- host data

// What the caller feeds a pipeline: every input and constant buffer, by
// buffer index, laid out as the buffer (dtype, dims, strides).
using PipelineHostData = std::map<int, HostTensor>;

// Reads constants from their files and inputs from `input_files` (buffer
// name -> .npy) or, when not given, seeded random values as make_input()
// makes them (the first reading tensor's range, named after the buffer).
// A .npy must match its buffer: shape equal to its dims, a float array for a
// float buffer and an integer one for an integer buffer. Errors name the
// pipeline, the buffer, the file and what the buffer expects; a name in
// `input_files` that is not an input buffer is an error. No GPU.
Result<PipelineHostData> load_pipeline_data(const Pipeline& p, uint64_t seed,
                                            const std::map<std::string, std::string>& input_files = {});

// A tensor description of buffer `b` (named after the buffer), for
// HostTensor::like and read_npy_for.
ResolvedTensor buffer_tensor(const Pipeline& p, int b);

// ---------------------------------------------------------------- execution

// One device buffer per pipeline buffer and one bound plan per stage, on one
// session (its stream and workspace arena). Executing is an ordered list of
// BoundPlan executes (steps()), so another executor (a CUDA graph capturing
// the same list) can take the steps as they are.
// Where intermediate buffers may share memory: each of `buffers` (indices of buffers with memory
// of their own, not views) lives from the first to the last step (position in Pipeline::order) of
// a stage that binds it or a view of it; two whose lives overlap never overlap in memory.
// `offsets[b]` is buffer b's byte offset in one arena of `arena_bytes` (256-byte aligned); -1 for
// buffers not in the set. Placement: largest first, each at the lowest offset clear of every placed
// buffer it lives beside.
struct BufferArenaPlan {
  std::vector<int64_t> offsets;  // by buffer index
  int64_t arena_bytes = 0;       // the arena
  int64_t separate_bytes = 0;    // the same buffers, one allocation each (256-byte aligned)
};
BufferArenaPlan plan_buffer_arena(const Pipeline& p, const std::vector<int>& buffers);
// The same for every floating-point intermediate buffer with memory of its own (what `fusebox
// pipeline check` reports, and PipelineExecutorOptions::share_intermediates shares when the caller
// owns none of them; integer intermediates, indices, keep their own).
BufferArenaPlan plan_buffer_arena(const Pipeline& p);

struct PipelineExecutorOptions {
  // Floating-point intermediate buffers (not external, not given data) share one arena by their lives in the
  // pipeline's order (plan_buffer_arena), instead of one allocation each: for a caller that reads
  // no intermediate after execute() (device() and download() of one give whatever a later stage
  // left there). A backward pass's gradient parts, mostly.
  bool share_intermediates = false;
};

class PipelineExecutor {
 public:
  // Allocates every buffer, uploads `data` (every input and constant),
  // poisons the rest with NaN bytes (0xFF) and binds each stage's plan
  // (`plans` by stage index) with session.bind(). The session, pipeline and
  // plans must outlive the executor. `external`: buffers (by index) whose device memory the
  // caller owns (at least the buffer's storage bytes): used as they are, neither allocated nor
  // poisoned, uploaded only when `data` holds them; an input or constant among them needs no
  // data (the caller fills it). Another executor's buffers, for a backward that reads the
  // forward's saved activations, or a trainer's weights.
  static Result<std::unique_ptr<PipelineExecutor>> create(Session& session, const Pipeline& p,
                                                          const std::vector<const Plan*>& plans,
                                                          const PipelineHostData& data,
                                                          const std::map<int, void*>& external = {},
                                                          const PipelineExecutorOptions& options = {});
  ~PipelineExecutor();

  // Bound plans in Pipeline::order; step i runs stage step_stages()[i].
  std::vector<BoundPlan>& steps();
  const std::vector<int>& step_stages() const;
  // Every step in order, asynchronous on the session's stream.
  Status execute();
  // Waits for the session's stream.
  Status synchronize();

  void* device(int buffer) const;
  // Copies buffer `b` to the host (synchronizes the stream first).
  Result<HostTensor> download(int buffer) const;
  int64_t buffer_bytes() const;  // all pipeline buffers
  // Buffers plus the session's workspace arena: what running the pipeline holds.
  int64_t peak_device_bytes() const;

  struct Impl;

 private:
  explicit PipelineExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PipelineRunOptions {
  bool verify = false;
  // Per stage (and per stage of the reference chain): above this many FLOPs
  // the GPU reference is used instead of the CPU one.
  double cpu_reference_max_flops = 2e9;
  int warmup = 10;
  int iters = 50;  // 0: run once, no timing
  // Download every buffer a stage writes (intermediates too), not only outputs.
  bool keep_intermediates = false;
  // After the eager run: record every step into one CUDA graph (CudaGraph),
  // poison the buffers the stages write, launch it once and compare every
  // written buffer byte for byte with the eager run; then time graph
  // launches (PipelineRunResult::latency) beside eager runs (eager_latency).
  bool cuda_graph = false;
  // After the timing: each stage alone, `iters` executes of its bound plan
  // timed with CUDA events after `warmup` (StageRun::latency): which stage
  // costs the time. Stages run on what the last run left in their inputs.
  bool profile = false;
  // The intermediates in one arena by their lives (PipelineExecutorOptions::share_intermediates):
  // less device memory, but no intermediate is left to verify or keep, so not with `verify` or
  // `keep_intermediates` (InvalidArgument).
  bool share_intermediates = false;
};

struct StageRun {
  int stage = -1;
  std::string engine;
  int64_t workspace_bytes = 0;
  std::string reference_kind;  // "cpu" or "gpu" when verified
  std::vector<Comparison> comparisons;
  bool verified_ok = true;
  LatencyStats latency;  // with PipelineRunOptions::profile: this stage alone
  double flops = 0;      // the stage graph's
};

struct PipelineRunResult {
  std::vector<StageRun> stages;               // in Pipeline::order
  std::map<std::string, HostTensor> outputs;  // output buffers (and intermediates when kept), by name
  std::map<std::string, HostTensor> inputs;   // input buffers, by name
  // Final outputs against the references chained on their own outputs
  // (rounded to each buffer's dtype between stages).
  std::vector<Comparison> chain;
  std::string chain_reference_kind;  // "cpu", "gpu" or "cpu+gpu"
  bool verified_ok = true;
  int64_t buffer_bytes = 0, workspace_bytes = 0, peak_device_bytes = 0;
  double first_execute_ms = 0;  // the first run of every stage, synchronized
  LatencyStats latency;         // the whole pipeline per run (per graph launch with cuda_graph)
  LatencyStats eager_latency;   // with cuda_graph: the same runs launched stage by stage
  // With cuda_graph: how the steps were recorded ("native" for all, or a
  // count per kind), bit_identical over every buffer a stage writes.
  CudaGraphRun cuda_graph;
  double flops = 0, tflops = 0;
};

// Creates the executor, runs once (verifying when asked), then times
// `iters` runs of the whole pipeline (and, with cuda_graph, checks and times
// it as one CUDA graph).
Result<PipelineRunResult> run_pipeline(Session& session, const Pipeline& p,
                                       const std::vector<const Plan*>& plans, const PipelineHostData& data,
                                       const PipelineRunOptions& options);

// The chain's tolerance for a final output: the producing op's tolerance
// times the number of stages on the longest path from the pipeline's inputs
// to it (rounding differences compound from stage to stage).
Tolerance chain_tolerance(const Pipeline& p, int buffer);
// Per-stage outputs with the references chained on their own outputs from
// `data`; keyed by buffer name (fp32, logical row-major). `kind` gets
// "cpu", "gpu" or "cpu+gpu". For tests and the verification above.
Result<std::map<std::string, std::vector<float>>> reference_chain(const Pipeline& p,
                                                                  const PipelineHostData& data,
                                                                  double cpu_reference_max_flops,
                                                                  std::string* kind = nullptr);

// The verification of run_pipeline from the values every buffer held after a
// run (`buffers`, by buffer index; inputs and constants may come from
// `data`): each stage's outputs against its reference on the inputs it read,
// then the final outputs against reference_chain(). Fills r->stages (one per
// stage in Pipeline::order when empty), r->chain and r->verified_ok. No GPU
// unless a stage is over `cpu_reference_max_flops`.
Status verify_pipeline(const Pipeline& p, const PipelineHostData& data, std::map<int, HostTensor> buffers,
                       double cpu_reference_max_flops, PipelineRunResult* r);

// Ok, or kVerificationFailed naming the first stage (in order) whose outputs
// diverge and each failing buffer, then any failing final output.
Status pipeline_verify_status(const Pipeline& p, const PipelineRunResult& r);

}  // namespace fusebox
