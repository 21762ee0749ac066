// fusebox: running a plan on a GPU with managed buffers and workspace,
// verifying it against the references and timing it.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

// One graph input as fusebox makes it: the tensor's fixed values when it has
// them, else seeded random values in [random_lo, random_hi] (never constant).
HostTensor make_input(const ResolvedTensor& t, uint64_t seed);
// Every non-scalar graph input: `given` first, then make_input(). Backward
// attention inputs o and stats are then recomputed from q, k and v by the
// forward reference (CPU up to `cpu_reference_max_flops`, else the GPU), so
// a backward graph runs on a consistent forward. Fails when `given` names a
// tensor that is not a graph input.
Result<std::map<std::string, HostTensor>> make_inputs(const ResolvedGraph& g, uint64_t seed,
                                                      const std::map<std::string, HostTensor>& given = {},
                                                      double cpu_reference_max_flops = 2e9);
// The sequence-length inputs' values, for ResolvedGraph::flops().
std::map<std::string, std::vector<double>> input_values_for_flops(
    const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs);

struct RunOptions {
  uint64_t seed = 1;
  // Graph inputs given by the caller (others are random from `seed`).
  std::map<std::string, HostTensor> inputs;
  bool verify = false;
  // Above this many FLOPs the GPU reference is used instead of the CPU one.
  double cpu_reference_max_flops = 2e9;
  int warmup = 10;
  int iters = 50;  // 0: run once, no timing
  // Timed runs rotate through copies of the inputs totalling > 2x the L2
  // cache, so small problems are not timed out of a warm cache.
  bool rotate_inputs = true;
  // Benchmark samples (fusebox_tools.bench.bench_run), 0: none. After the per-call
  // timing: `samples` GPU-time samples, each `iters` calls back to back
  // between two events, divided by `iters`; and `samples` host latencies,
  // each one call from before execute() until its stream is synchronized.
  int samples = 0;
  // Also run through a CUDA graph (fusebox/cuda_graph.h): after the eager
  // execution, the graph is launched on re-poisoned outputs and its outputs
  // are compared byte for byte with the eager ones (a difference is an
  // error; for a graph that is not bit-reproducible by design, see
  // not_bit_reproducible(), within the outputs' tolerance instead); verification and timing then use the
  // graph (one graph per input set, launched in rotation; samples launch one graph of `iters` executes).
  bool cuda_graph = false;
  // A partitioned plan: after the timed run, time each part alone too (RunResult::parts).
  bool time_parts = false;
};

// What RunOptions::cuda_graph did.
struct CudaGraphRun {
  bool used = false;
  std::string recording;       // "native", "native (frontend)" or "capture"
  std::string why_not_native;  // for "capture"
  bool bit_identical = false;  // every output byte equal to the eager run's
  int64_t bytes_compared = 0;
  std::vector<std::string> mismatches;  // "y: 12 of 4096 bytes differ, first at byte 8"
  double create_ms = 0;                 // recording and instantiating the graphs
  // Set when the outputs may differ bitwise by design (not_bit_reproducible()):
  // why; they were then compared within tolerance, and `within_tolerance` says
  // whether every one passed (its comparison lines are in `mismatches`).
  std::string not_reproducible;
  bool within_tolerance = false;
};

// Why two executions of one plan for g may give different bits by design, or
// "" when they repeat bit for bit: an sdpa backward without its deterministic
// algorithm accumulates dq with atomics; reductions (reduce_* ops: a bias
// gradient, a GEMM's row sums, amax) add partial sums in no fixed order (on
// the H200 two runs of one plan differed in the last bits, though cuDNN sets
// no NONDETERMINISTIC note); an sdpa forward with one query per sequence (a
// decode step: eng8 on the H200 split the keys, and the paged decode's CUDA
// graph differed from eager in one byte of 524288). Engines cuDNN flags
// NONDETERMINISTIC are not covered here: the plan's engine decides those.
std::string not_bit_reproducible(const ResolvedGraph& g);

struct LatencyStats {
  int iters = 0;
  double median_ms = 0, min_ms = 0, p90_ms = 0, mean_ms = 0;
};

struct RunResult {
  std::string engine;
  int64_t workspace_bytes = 0;
  std::map<std::string, HostTensor> outputs;  // device results, as the graph lays them out
  std::map<std::string, HostTensor> inputs;   // what was fed in
  std::vector<Comparison> comparisons;        // when verified
  std::string reference_kind;                 // "cpu" or "gpu"
  bool verified_ok = true;
  LatencyStats latency;
  std::vector<double> gpu_time_ms;      // RunOptions::samples: per call, back to back
  std::vector<double> host_latency_ms;  // RunOptions::samples: one synchronized call each
  int input_sets = 1;                   // input copies rotated through while timing
  double first_execute_ms = 0;          // the first execution, synchronized (loads the kernels)
  double flops = 0;                     // the graph's useful work with these inputs (sequence lengths)
  double tflops = 0;                    // flops / median
  double gbps = 0;                      // non-virtual bytes / median
  CudaGraphRun cuda_graph;
  // RunOptions::time_parts on a partitioned plan: each part run alone (its own buffers, random
  // inputs, the same warm-up and iterations), to compare with the whole (issue 29: at most the
  // sum of the parts + 10%).
  struct PartTime {
    std::string engine;
    double median_ms = 0;
  };
  std::vector<PartTime> parts;
};

// How many copies of g's inputs a timed run rotates through, so that every
// execute reads its inputs from beyond the L2 (60 MiB on the H200): 2 x L2 /
// input bytes + 1, at most 16 and at most 8 GiB of copies. `fusebox check
// --json` gives it as "rotation_sets", which the benchmarks' torch side reads.
int input_rotation_sets(const ResolvedGraph& g);

// The names of g's dropout keep-mask outputs (cuDNN draws them; the references read them as inputs).
std::set<std::string> dropout_mask_outputs(const ResolvedGraph& g);

// `outputs` (as run_plan downloads them) against `reference` (reference_cpu or reference_gpu of
// `inputs`, the keep-masks among them): values cuDNN leaves undefined (padded attention rows) set to
// zero on both sides, the keep-masks checked, every other output compared with tolerance_for().
// What run_plan's --verify does, and `fusebox reference --compare` with saved outputs. An output
// with no reference value is Internal.
Result<std::vector<Comparison>> compare_with_reference(const ResolvedGraph& g,
                                                       const std::map<std::string, HostTensor>& inputs,
                                                       const std::map<std::string, HostTensor>& outputs,
                                                       ReferenceOutputs reference);

// Runs `plan` for `g` on ctx's GPU: uploads inputs, poisons outputs with NaN,
// allocates the workspace, executes, downloads, verifies, times.
// A verification mismatch is reported in RunResult (verified_ok = false) and
// as a kVerificationFailed status by verify_status().
Result<RunResult> run_plan(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx,
                           const RunOptions& options);

Status verify_status(const RunResult& r);

}  // namespace fusebox
