// fusebox: bound plans recorded into one executable CUDA graph.
//
// A CudaGraph holds an ordered list of BoundPlans that run on one stream
// (one GpuContext, e.g. a Session's) as one cudaGraphExec_t: each plan is a
// child graph node, depending on the one before. Each plan is recorded by
// cuDNN's native API where its engine supports it, else by stream capture
// of BoundPlan::execute(); steps() says which, and why not native.
//
// New pointers (rebind) are applied to the executable graph in place: the
// step's child graph is updated (cudnnBackendUpdateCudaGraph, or the
// frontend's update_cuda_graph) and set on the executable graph's node
// (cudaGraphExecChildGraphNodeSetParams); nothing is instantiated again. A
// captured step has no update API: its launches are recorded again into a
// template graph that is set on the same node (the executable graph still is
// not re-instantiated); steps() says which steps do this.
//
// Host cost of launch(): one cudaGraphLaunch (a few microseconds, whatever
// the number of plans) plus one integer compare per plan (has the workspace
// arena moved?). Nothing is allocated or looked up. No cuDNN type appears here.
//
// Not thread-safe. The BoundPlans and their GpuContext (Session) must outlive
// the CudaGraph; each BoundPlan's execution plan is kept alive by it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/plan.h"
#include "fusebox/status.h"

namespace fusebox {

// How one plan was recorded.
enum class GraphRecording {
  kNative,          // cudnnBackendPopulateCudaGraph on the bound variant pack
  kNativeFrontend,  // the frontend's populate_cuda_graph (plans with frontend-side workspace nodes)
  kCapture,         // stream capture of BoundPlan::execute()
};
// "native", "native (frontend)", "capture" (for reports and JSON).
std::string_view graph_recording_name(GraphRecording r);

struct CudaGraphStep {
  std::string engine;
  GraphRecording recording = GraphRecording::kCapture;
  std::string why_not_native;  // for kCapture: why the native API was not used
  int64_t updates = 0;         // times this step's node was updated (rebind, moved workspace)
};

struct CudaGraphOptions {
  // false: record every plan by stream capture (to compare the two paths).
  bool allow_native = true;
  // Execute each plan that will be captured once, eagerly, before capturing
  // (loads its kernels outside the capture; writes its outputs).
  bool warm_up_captured = true;
};

class CudaGraph {
 public:
  CudaGraph();
  CudaGraph(CudaGraph&&) noexcept;
  CudaGraph& operator=(CudaGraph&&) noexcept;
  ~CudaGraph();

  // Records `plans` in order (the same plan may appear several times) and
  // instantiates the graph. All must be bound on one GpuContext. Nothing runs
  // on the GPU except captured plans' warm-up (options).
  static Result<CudaGraph> create(const std::vector<BoundPlan*>& plans, const CudaGraphOptions& options = {});

  // Launches the whole graph, asynchronously on the plans' stream.
  Status launch();

  // Points tensor `slot` (or `tensor`) of step `step` at `ptr`, a buffer of
  // `buffer_bytes` bytes, and updates the executable graph. A buffer smaller
  // than the tensor is refused (the error names the step, tensor and sizes)
  // and nothing changes. Every step that lists the same BoundPlan sees it.
  Status rebind(size_t step, int slot, void* ptr, int64_t buffer_bytes);
  Status rebind(size_t step, std::string_view tensor, void* ptr, int64_t buffer_bytes);
  // Applies the current pointers of every step's BoundPlan (after calling
  // BoundPlan::rebind directly).
  Status update();

  size_t size() const;  // number of steps
  const std::vector<CudaGraphStep>& steps() const;
  BoundPlan* plan(size_t step) const;
  void* stream() const;  // cudaStream_t

  struct Impl;

 private:
  explicit CudaGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusebox
