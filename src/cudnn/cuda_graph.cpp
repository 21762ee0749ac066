// CudaGraph: bound plans recorded into one executable CUDA graph, each a
// child graph node, updated in place when pointers change.
#include "fusebox/cuda_graph.h"

#include <algorithm>
#include <unordered_map>

#include "bound_plan_impl.h"

namespace fusebox {

std::string_view graph_recording_name(GraphRecording r) {
  switch (r) {
    case GraphRecording::kNative:
      return "native";
    case GraphRecording::kNativeFrontend:
      return "native (frontend)";
    case GraphRecording::kCapture:
      return "capture";
  }
  return "?";
}

namespace {

using cudnn::cuda_status;

struct Step {
  BoundPlan* plan = nullptr;
  std::shared_ptr<cudnn::fe::graph::Graph> keep;  // the execution plan the graph launches
  GraphRecording recording = GraphRecording::kCapture;
  cudaGraph_t own = nullptr;       // the child graph: cuDNN updates it, then it is set on `node`
  cudaGraphNode_t node = nullptr;  // in the parent graph
  uint64_t workspace_generation = 0;
};

uint64_t generation_of(const BoundPlan::Impl& b) { return b.workspace ? b.workspace->generation : 0; }

bool has_native_note(const BoundPlan::Impl& b) {
  const cudnn::fe::ExecutionPlan* ep = b.fe ? b.fe->execution_plan_at(b.plan_index) : nullptr;
  if (!ep) return false;
  const auto& notes = ep->getAllBehaviorNotes();
  return std::find(notes.begin(), notes.end(), CUDNN_BEHAVIOR_NOTE_SUPPORTS_CUDA_GRAPH_NATIVE_API) !=
         notes.end();
}

std::unordered_map<int64_t, void*> uid_map(const BoundPlan::Impl& b) {
  std::unordered_map<int64_t, void*> m;
  for (size_t i = 0; i < b.user_uids.size(); ++i) m[b.user_uids[i]] = b.user_ptrs[i];
  return m;
}

// The direct path's variant pack follows a moved workspace before it is recorded.
Status refresh_pack(BoundPlan::Impl& b) {
  if (b.direct && generation_of(b) != b.workspace_generation) return b.build_pack();
  return b.check_workspace();
}

// cuDNN's native API into a new graph; on failure `why` says why and no graph is returned.
cudaGraph_t record_native(BoundPlan::Impl& b, GraphRecording* rec, std::string* why) {
  if (b.native) {
    *why = "fusebox's own kernel (no cuDNN plan to populate a graph): recorded by stream capture";
    return nullptr;
  }
  if (b.composite) {
    *why = "a partitioned plan (its parts run in turn): recorded by stream capture";
    return nullptr;
  }
  if (b.shape_override) {
    *why =
        "a plan serving this shape by execute-time shape override (cuDNN's graph API records the "
        "built shape only): recorded by stream capture";
    return nullptr;
  }
  if (!refresh_pack(b).ok()) {
    *why = "the workspace does not fit the plan";
    return nullptr;
  }
  cudaGraph_t g = nullptr;
  if (cudaGraphCreate(&g, 0) != cudaSuccess) {
    *why = "cudaGraphCreate failed";
    return nullptr;
  }
  const std::string note =
      has_native_note(b) ? "" : " (the engine has no SUPPORTS_CUDA_GRAPH_NATIVE_API note)";
  if (b.direct) {
    const cudnnStatus_t st = cudnnBackendPopulateCudaGraph(b.handle, b.backend_plan, b.pack, g);
    if (st == CUDNN_STATUS_SUCCESS) {
      *rec = GraphRecording::kNative;
      return g;
    }
    *why = std::string("cudnnBackendPopulateCudaGraph: ") + cudnnGetErrorString(st) + note;
  } else if (b.plan_index < -1) {
    *why = "the engine is run by the cuDNN frontend, not a cuDNN execution plan";
  } else if (b.plan_index != b.fe->current_candidate()) {
    // The frontend's populate/update record the graph's current candidate only.
    *why = "the plan is not its frontend graph's current candidate (the frontend records only that one)";
  } else {
    try {
      auto m = uid_map(b);
      auto* fe = const_cast<cudnn::FeGraph*>(b.fe);
      auto err = fe->populate_cuda_graph(b.handle, m, b.ws_ptr(), g);
      if (err.is_good()) {
        *rec = GraphRecording::kNativeFrontend;
        return g;
      }
      *why = "frontend populate_cuda_graph: " + err.get_message() + note;
    } catch (const std::exception& e) {
      *why = std::string("frontend populate_cuda_graph: ") + e.what();
    }
  }
  cudaGraphDestroy(g);
  return nullptr;
}

// Stream capture of one execute() on the plan's stream.
Result<cudaGraph_t> record_capture(BoundPlan& plan) {
  BoundPlan::Impl& b = *plan.impl();
  FUSEBOX_RETURN_IF_ERROR(refresh_pack(b));
  const std::string where = "CUDA graph: capture of '" + b.engine + "'";
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal), where + ": begin"));
  const Status executed = plan.execute();
  cudaGraph_t g = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(b.stream, &g);
  if (!executed.ok()) {
    if (g) cudaGraphDestroy(g);
    return executed.WithContext(where);
  }
  FUSEBOX_RETURN_IF_ERROR(cuda_status(ended, where + ": end"));
  if (!g) return Internal(where + ": no graph captured");
  return g;
}

}  // namespace

struct CudaGraph::Impl {
  std::vector<Step> steps;
  std::vector<CudaGraphStep> info;
  cudaStream_t stream = nullptr;
  cudaGraph_t parent = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool stale = false;  // a failed update left the executable graph behind the plans

  ~Impl() {
    // A launch in flight still runs the plans' kernels: let it finish before they may go.
    if (exec && stream) cudaStreamSynchronize(stream);
    if (exec) cudaGraphExecDestroy(exec);
    if (parent) cudaGraphDestroy(parent);
    for (auto& s : steps) {
      if (s.own) cudaGraphDestroy(s.own);
    }
  }

  // Brings step i's node in the executable graph up to its plan's pointers.
  Status update_step(size_t i) {
    Step& s = steps[i];
    BoundPlan::Impl& b = *s.plan->impl();
    const std::string where = "CUDA graph step " + std::to_string(i) + " ('" + b.engine + "')";
    FUSEBOX_RETURN_IF_ERROR(refresh_pack(b).WithContext(where));
    cudaGraph_t fresh = nullptr;
    switch (s.recording) {
      case GraphRecording::kNative: {
        const cudnnStatus_t st = cudnnBackendUpdateCudaGraph(b.handle, b.backend_plan, b.pack, s.own);
        if (st != CUDNN_STATUS_SUCCESS)
          return cudnn::cudnn_status(st, where + ": cudnnBackendUpdateCudaGraph");
        break;
      }
      case GraphRecording::kNativeFrontend: {
        try {
          auto m = uid_map(b);
          auto* fe = const_cast<cudnn::FeGraph*>(b.fe);
          FUSEBOX_RETURN_IF_ERROR(cudnn::from_fe(fe->update_cuda_graph(b.handle, m, b.ws_ptr(), s.own),
                                                 where + ": update_cuda_graph"));
        }
        FUSEBOX_CATCH_ALL(where)
        break;
      }
      case GraphRecording::kCapture: {
        // No update API for captured work: record it again into a template.
        FUSEBOX_ASSIGN_OR_RETURN(fresh, record_capture(*s.plan));
        break;
      }
    }
    cudaGraph_t source = fresh ? fresh : s.own;
    const cudaError_t set = cudaGraphExecChildGraphNodeSetParams(exec, s.node, source);
    if (set != cudaSuccess) {
      if (fresh) cudaGraphDestroy(fresh);
      return cuda_status(set, where +
                                  ": cudaGraphExecChildGraphNodeSetParams (the new recording does not match "
                                  "the instantiated one)");
    }
    if (fresh) {
      cudaGraphDestroy(s.own);
      s.own = fresh;
    }
    s.workspace_generation = generation_of(b);
    ++info[i].updates;
    return Status::Ok();
  }

  // Updates every step that lists `plan` (all when null).
  Status update_plan(const BoundPlan* plan) {
    stale = true;
    for (size_t i = 0; i < steps.size(); ++i) {
      if (plan == nullptr || steps[i].plan == plan) FUSEBOX_RETURN_IF_ERROR(update_step(i));
    }
    stale = false;
    return Status::Ok();
  }
};

CudaGraph::CudaGraph() = default;
CudaGraph::CudaGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaGraph::CudaGraph(CudaGraph&&) noexcept = default;
CudaGraph& CudaGraph::operator=(CudaGraph&&) noexcept = default;
CudaGraph::~CudaGraph() = default;

Result<CudaGraph> CudaGraph::create(const std::vector<BoundPlan*>& plans, const CudaGraphOptions& options) {
  if (plans.empty()) return InvalidArgument("CUDA graph: no plans to record (give at least one bound plan)");
  auto impl = std::make_unique<Impl>();
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i] || !plans[i]->impl()) {
      return InvalidArgument("CUDA graph: step " + std::to_string(i) +
                             " is not a bound plan (null or moved-from)");
    }
    const BoundPlan::Impl& b = *plans[i]->impl();
    if (i == 0) impl->stream = b.stream;
    if (b.stream != impl->stream) {
      return InvalidArgument(
          "CUDA graph: step " + std::to_string(i) + " ('" + b.engine +
          "') is bound on another stream than step 0; bind every plan on one GpuContext (Session)");
    }
  }
  if (!impl->stream) {
    return InvalidArgument(
        "CUDA graph: the plans run on the legacy default stream, which cannot be captured");
  }
  const std::string where = "CUDA graph";
  // One recording per step (a plan listed twice is recorded twice: each node is its own).
  for (size_t i = 0; i < plans.size(); ++i) {
    BoundPlan::Impl& b = *plans[i]->impl();
    Step s;
    s.plan = plans[i];
    s.keep = b.graph;
    CudaGraphStep info;
    info.engine = b.engine;
    if (options.allow_native)
      s.own = record_native(b, &s.recording, &info.why_not_native);
    else
      info.why_not_native = "the native path was turned off (CudaGraphOptions::allow_native)";
    if (!s.own) {
      s.recording = GraphRecording::kCapture;
      if (options.warm_up_captured) {
        FUSEBOX_RETURN_IF_ERROR(
            plans[i]->execute().WithContext(where + " step " + std::to_string(i) + " warm-up"));
      }
      auto g = record_capture(*plans[i]);
      if (!g.ok()) return g.status().WithContext(where + " step " + std::to_string(i));
      s.own = *g;
    }
    info.recording = s.recording;
    s.workspace_generation = generation_of(b);
    impl->steps.push_back(std::move(s));
    impl->info.push_back(std::move(info));
  }
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaGraphCreate(&impl->parent, 0), where + ": cudaGraphCreate"));
  cudaGraphNode_t prev = nullptr;
  for (auto& s : impl->steps) {
    FUSEBOX_RETURN_IF_ERROR(cuda_status(
        cudaGraphAddChildGraphNode(&s.node, impl->parent, prev ? &prev : nullptr, prev ? 1 : 0, s.own),
        where + ": cudaGraphAddChildGraphNode"));
    prev = s.node;
  }
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaGraphInstantiate(&impl->exec, impl->parent, 0), where + ": cudaGraphInstantiate"));
  return CudaGraph(std::move(impl));
}

Status CudaGraph::launch() {
  if (!impl_) return Internal("CUDA graph: launch of an empty (moved-from) graph");
  Impl& g = *impl_;
  if (g.stale) FUSEBOX_RETURN_IF_ERROR(g.update_plan(nullptr));
  // A grown arena moved the workspace: that step's node follows it once.
  for (size_t i = 0; i < g.steps.size(); ++i) {
    const BoundPlan::Impl& b = *g.steps[i].plan->impl();
    if (b.workspace_bytes > 0 && b.workspace && b.workspace->generation != g.steps[i].workspace_generation) {
      FUSEBOX_RETURN_IF_ERROR(g.update_step(i));
    }
  }
  const cudaError_t st = cudaGraphLaunch(g.exec, g.stream);
  if (st == cudaSuccess) return Status::Ok();
  return cuda_status(st, "CUDA graph: cudaGraphLaunch");
}

Status CudaGraph::rebind(size_t step, int slot, void* ptr, int64_t buffer_bytes) {
  if (!impl_) return Internal("CUDA graph: rebind on an empty (moved-from) graph");
  if (step >= impl_->steps.size()) {
    return InvalidArgument("CUDA graph: rebind of step " + std::to_string(step) + ", the graph has " +
                           std::to_string(impl_->steps.size()) + " steps");
  }
  BoundPlan* plan = impl_->steps[step].plan;
  const std::string where = "CUDA graph step " + std::to_string(step);
  FUSEBOX_RETURN_IF_ERROR(plan->rebind(slot, ptr, buffer_bytes).WithContext(where));
  return impl_->update_plan(plan);
}

Status CudaGraph::rebind(size_t step, std::string_view tensor, void* ptr, int64_t buffer_bytes) {
  if (!impl_) return Internal("CUDA graph: rebind on an empty (moved-from) graph");
  if (step >= impl_->steps.size()) {
    return InvalidArgument("CUDA graph: rebind of step " + std::to_string(step) + ", the graph has " +
                           std::to_string(impl_->steps.size()) + " steps");
  }
  BoundPlan* plan = impl_->steps[step].plan;
  const int slot = plan->slot_of(tensor);
  if (slot < 0) return plan->rebind(tensor, ptr).WithContext("CUDA graph step " + std::to_string(step));
  return rebind(step, slot, ptr, buffer_bytes);
}

Status CudaGraph::update() {
  if (!impl_) return Internal("CUDA graph: update of an empty (moved-from) graph");
  return impl_->update_plan(nullptr);
}

size_t CudaGraph::size() const { return impl_ ? impl_->steps.size() : 0; }
const std::vector<CudaGraphStep>& CudaGraph::steps() const {
  static const std::vector<CudaGraphStep> none;
  return impl_ ? impl_->info : none;
}
BoundPlan* CudaGraph::plan(size_t step) const {
  return impl_ && step < impl_->steps.size() ? impl_->steps[step].plan : nullptr;
}
void* CudaGraph::stream() const { return impl_ ? impl_->stream : nullptr; }

}  // namespace fusebox
