// Device memory for a graph's tensors: inputs uploaded (optionally in several
// rotated copies so timing does not run out of a warm L2), outputs poisoned.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox::runtime {

using common::cuda_status;  // "<where>: cudaErrorX: text"

// Device memory that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  ~DeviceBuffer();
  Status allocate(size_t bytes, const std::string& what);
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class GraphBuffers {
 public:
  // Uploads `inputs` (every non-scalar graph input) `input_sets` times and
  // poisons the outputs with NaN bytes (0xFF), on `stream`.
  Status prepare(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs, int input_sets,
                 cudaStream_t stream);
  // Pointers for every non-virtual tensor, inputs from set `set % sets()`.
  const std::map<std::string, void*>& pointers(int set) const { return pointers_[set % pointers_.size()]; }
  int sets() const { return static_cast<int>(pointers_.size()); }
  void* device(const std::string& tensor) const;  // set 0

 private:
  std::vector<std::map<std::string, DeviceBuffer>> inputs_;
  std::map<std::string, DeviceBuffer> outputs_;
  std::vector<std::map<std::string, void*>> pointers_;
};

// How many input copies make the rotation exceed twice a 60 MiB L2, within
// 16 copies and 8 GiB.
int rotation_sets_for(const ResolvedGraph& g);

}  // namespace fusebox::runtime

namespace fusebox {
class Plan;
class GpuContext;
struct LatencyStats;
struct CudaGraphRun;
}  // namespace fusebox

namespace fusebox::runtime {

// `warmup` untimed calls run(0), ..., run(warmup - 1), then `iters` calls
// run(warmup + i), each between two CUDA events on `stream` (`what` names the
// synchronize in errors); median, min, p90, mean of the per-call GPU ms. The
// one timing loop of run, tune and pipeline run.
Result<LatencyStats> time_calls(cudaStream_t stream, int warmup, int iters,
                                const std::function<Status(int)>& run, const std::string& what);
// The CUDA graph's outputs against the eager run's, by name, byte for byte
// (out.bit_identical, bytes_compared, mismatches), and where
// they differ but `not_reproducible` says why they may (not_bit_reproducible),
// each output within tolerance(name) instead (out.not_reproducible,
// out.within_tolerance, comparison lines in out.mismatches). VerificationFailed
// naming `what` and the outputs when they do not match.
Status check_graph_outputs(const std::map<std::string, HostTensor>& eager,
                           const std::map<std::string, HostTensor>& graph,
                           const std::string& not_reproducible,
                           const std::function<Tolerance(const std::string&)>& tolerance,
                           const std::string& what, CudaGraphRun& out);
// Warm-up runs, then `iters` runs each timed with CUDA events, rotating the
// input sets; median, min, p90, mean.
Result<LatencyStats> time_plan(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers,
                               void* workspace, int warmup, int iters);
// The plan as a CUDA graph replays it: `warmup` eager runs, then one CUDA
// graph of `iters` executes (input sets in rotation) replayed once untimed and
// `replays` times between two events; each sample is that launch's GPU time
// divided by `iters` (the host's launch cost is not in it). An error naming
// the engine when the plan cannot be recorded.
Result<LatencyStats> time_plan_in_graph(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers,
                                        void* workspace, int warmup, int iters, int replays);
// Benchmark samples (RunOptions::samples): GPU time per call of `calls`
// back-to-back executions between two events, and host latency of one
// synchronized execution, `samples` of each; inputs rotated as above.
Status sample_plan(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers, void* workspace, int calls,
                   int samples, std::vector<double>& gpu_ms, std::vector<double>& host_ms);

}  // namespace fusebox::runtime
