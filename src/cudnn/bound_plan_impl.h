// Private to src/cudnn/: the state behind BoundPlan, shared with CudaGraph
// (cuda_graph.cpp), which records and updates bound plans in CUDA graphs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "internal.h"

namespace fusebox {

struct BoundPlan::Impl {
  std::shared_ptr<cudnn::fe::graph::Graph> graph;  // keeps the plan alive
  const cudnn::FeGraph* fe = nullptr;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;  // the context's (CudaGraph checks all its plans share it)
  int64_t plan_index = -1;
  std::string engine;
  int64_t workspace_bytes = 0;
  std::shared_ptr<const WorkspaceBinding> workspace;
  uint64_t workspace_generation = 0;

  std::shared_ptr<const kernels::NativeKernel> native;  // fusebox's own kernel (then no cuDNN plan)
  // A plan serving another shape than its built one (plan_at_shape): executed through the
  // frontend with the overrides, never direct, recorded in CUDA graphs by stream capture.
  std::shared_ptr<const cudnn::ShapeOverride> shape_override;
  // A partitioned plan (several cuDNN plans): executed through Plan::execute
  // from names and pointers; the plan and context outlive the binding.
  const Plan* composite = nullptr;
  GpuContext* ctx = nullptr;

  std::vector<std::string> names;  // slot order = ascending uid (the frontend's user slots)
  std::vector<void*> user_ptrs;    // parallel to names
  std::vector<int64_t> user_uids;  // parallel to names
  std::vector<int64_t> bytes;      // parallel to names: the tensor's storage bytes, -1 unknown

  // Direct path: the frontend's template completed with our pointers, and
  // the variant pack built from it.
  bool direct = false;
  cudnnBackendDescriptor_t backend_plan = nullptr;
  std::vector<int> user_slot_index;  // names[i] -> index into all_ptrs
  std::vector<void*> all_ptrs;       // template order (all uids the backend sees)
  std::vector<int64_t> all_uids;
  std::vector<int64_t> alignment;  // per user slot, 1 when cuDNN asks none
  cudnnBackendDescriptor_t pack = nullptr;

  ~Impl() {
    if (pack) cudnnBackendDestroyDescriptor(pack);
  }

  // cuDNN's alignment rule for a pointer (checked by the frontend on every
  // execute; here once per bind or rebind).
  Status check_alignment(size_t i) const {
    if (i >= alignment.size() || reinterpret_cast<uintptr_t>(user_ptrs[i]) % alignment[i] == 0)
      return Status::Ok();
    return InvalidArgument("bind '" + engine + "': the pointer for '" + names[i] + "' is not aligned to " +
                           std::to_string(alignment[i]) + " bytes");
  }

  void* ws_ptr() const { return workspace ? workspace->ptr : nullptr; }

  Status check_workspace() const {
    if (workspace_bytes == 0) return Status::Ok();
    if (!workspace || !workspace->ptr || workspace->bytes < workspace_bytes) {
      return InvalidArgument("execute '" + engine + "': plan needs " + std::to_string(workspace_bytes) +
                             " bytes of workspace, the bound workspace has " +
                             std::to_string(workspace ? workspace->bytes : 0));
    }
    return Status::Ok();
  }

  // (Re)builds the variant pack from all_ptrs and the current workspace.
  Status build_pack() {
    using cudnn::cudnn_status;
    if (pack) {
      cudnnBackendDestroyDescriptor(pack);
      pack = nullptr;
    }
    FUSEBOX_RETURN_IF_ERROR(check_workspace());
    FUSEBOX_RETURN_IF_ERROR(
        cudnn_status(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack),
                     "bind: create variant pack"));
    void* ws = ws_ptr();
    const auto n = static_cast<int64_t>(all_uids.size());
    FUSEBOX_RETURN_IF_ERROR(cudnn_status(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
        "bind: variant pack workspace"));
    FUSEBOX_RETURN_IF_ERROR(cudnn_status(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                                                  CUDNN_TYPE_VOID_PTR, n, all_ptrs.data()),
                                         "bind: variant pack pointers"));
    FUSEBOX_RETURN_IF_ERROR(cudnn_status(cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                                                  CUDNN_TYPE_INT64, n, all_uids.data()),
                                         "bind: variant pack uids"));
    FUSEBOX_RETURN_IF_ERROR(cudnn_status(cudnnBackendFinalize(pack), "bind: finalize variant pack"));
    workspace_generation = workspace ? workspace->generation : 0;
    return Status::Ok();
  }
};

}  // namespace fusebox
