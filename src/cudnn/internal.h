// Private to src/cudnn/: the cuDNN-typed state behind Plan and GpuContext,
// and the conversions at the boundary.
#pragma once

#include <cuda_runtime_api.h>

#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>

#include "common/cuda_status.h"
#include "frontend.h"
#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "kernels/native_kernel.h"
#include "shape_override.h"

namespace fusebox {
namespace cudnn {

// What stands behind libcuda.so.1 in this process (driver_stub.cpp): the GPU
// driver, the CUDA toolkit's stub (no driver here: cuDNN >= 9.2x needs the
// library to load even for deviceless builds), or nothing.
enum class DriverLoad { kDriver, kStub, kNone };
DriverLoad driver_load();

}  // namespace cudnn

struct GpuContext::Impl {
  int device_id = 0;
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;      // where work goes now
  cudaStream_t own_stream = nullptr;  // created and destroyed by the context
};

// A partitioned plan's parts (fusebox/partition.h), shared by copies of the plan.
struct PlanParts {
  struct Part {
    int first_op = 0;
    int op_count = 0;
    ResolvedGraph graph;
    Plan plan;
  };
  std::vector<Part> parts;
  // Temporaries between parts: tensor name -> byte offset at the start of the workspace.
  std::vector<std::pair<std::string, int64_t>> temporaries;
  int64_t temporaries_bytes = 0;
  std::vector<std::pair<int, std::string>> temporary_dtypes;  // tensor index -> dtype name (serialized)
};

struct Plan::Impl {
  std::shared_ptr<cudnn::fe::graph::Graph>
      graph;  // a cudnn::FeGraph (built or deserialized); null when native
  // fusebox's own kernel instead of a cuDNN plan (an op cuDNN has none for).
  std::shared_ptr<const kernels::NativeKernel> native;
  int native_ops = 0;  // the graph's op count (a native plan serializes as one part, by name)
  std::string engine;
  int64_t plan_index = -1;  // -1: the graph's own candidate (deserialized plans)
  int64_t workspace_bytes = 0;
  // graph tensor name -> frontend uid, for every non-virtual, non-scalar tensor
  std::unordered_map<std::string, int64_t> uids;
  // graph tensor name -> storage bytes (ResolvedTensor::storage_bytes), same keys as uids
  std::unordered_map<std::string, int64_t> tensor_bytes;
  // A partitioned plan: its parts run in turn (then no graph and no kernel of its own).
  std::shared_ptr<const PlanParts> parts;
  // Built override-enabled, every uid tensor lowered at the graph's own dims and strides:
  // plan_at_shape may serve other shapes with it.
  bool override_enabled = false;
  // Serving another shape than the built one (plan_at_shape); null for the built shape.
  std::shared_ptr<const cudnn::ShapeOverride> shape_override;
  // The cuDNN execution plan to run: plan_index, else the graph's current candidate.
  int64_t index_to_run() const;
};

struct KernelCache::Impl {
  std::shared_ptr<cudnn::fe::KernelCache> cache;
};

namespace cudnn {

// The frontend's Graph, plus access to per-candidate state the frontend
// keeps in a protected member (numerical notes, per-index support check).
class FeGraph : public fe::graph::Graph {
 public:
  std::vector<std::string> numerical_notes_at(int64_t i) const {
    std::vector<std::string> out;
    if (i < 0 || i >= static_cast<int64_t>(plans.numeric_notes.size())) return out;
    for (auto n : plans.numeric_notes[i]) {
      if (n != fe::NumericalNote_t::NOT_SET) out.push_back(nlohmann::json(n).get<std::string>());
    }
    return out;
  }
  // Candidate i's behavior notes by name (RUNTIME_COMPILATION, ...); nullopt when unknown.
  std::optional<std::vector<std::string>> behavior_notes_at(int64_t i) {
    std::vector<fe::BehaviorNote_t> notes;
    if (!get_behavior_notes_for_plan_at_index(i, notes).is_good()) return std::nullopt;
    std::vector<std::string> out;
    for (auto n : notes) {
      if (n != fe::BehaviorNote_t::NOT_SET) out.push_back(nlohmann::json(n).get<std::string>());
    }
    return out;
  }
  fe::error_t check_support_at(int64_t i) { return plans.check_support_at_index(i); }
  // The plan execute() runs when no index is given.
  int64_t current_candidate() const { return plans.candidate; }
  // The built backend execution plan of candidate i, or null.
  const fe::ExecutionPlan* execution_plan_at(int64_t i) const {
    if (i < 0 || i >= static_cast<int64_t>(plans.execution_plans.size())) return nullptr;
    return plans.execution_plans[i].get();
  }
};

using common::cuda_status;  // "<where>: cudaErrorX: text"

// A frontend error as a fusebox Status, prefixed with the step or op.
Status from_fe(fe::error_t err, const std::string& where);

// Partitioned plans (partitioned_plan.cpp).
Status execute_parts(const PlanParts& p, GpuContext& ctx, const std::map<std::string, void*>& buffers,
                     void* workspace);
Result<std::vector<uint8_t>> serialize_parts(const PlanParts& p);
Result<Plan> deserialize_parts(const ResolvedGraph& g, const std::vector<uint8_t>& bytes,
                               const DeviceTarget& target, GpuContext* ctx);
Status cudnn_status(cudnnStatus_t st, const std::string& where);

// The frontend graph for a ResolvedGraph, with each non-virtual tensor's uid
// (tensor index + 1). Settings for the target are applied.
struct LoweredGraph {
  std::shared_ptr<FeGraph> graph;
  std::unordered_map<std::string, int64_t> uids;
  std::unordered_map<std::string, int64_t> tensor_bytes;  // same keys as uids
  std::vector<std::string> notes;                         // LowerContext::note(), in op order
  // Candidates never to build (engine rules, BuildOptions::excluded_engines): name -> why.
  std::map<std::string, std::string> excluded;
  // With override shapes: why the plan cannot serve other shapes (an op's lowering gave a tensor
  // with a uid other dims or strides than the graph's, so the graph's dims are not what cuDNN
  // would need overridden); empty when it can.
  std::string override_obstacle;
};
// `dynamic_shape`: build with cuDNN's dynamic shapes (set before any op is added); `override_shapes`
// too, with execute-time shape override (LoweredGraph::override_obstacle says where it cannot serve).
Result<LoweredGraph> lower(const ResolvedGraph& g, const DeviceTarget& target, bool dynamic_shape = false,
                           bool override_shapes = false);

// Device properties for a deviceless target (parsed once per target).
Result<std::shared_ptr<fe::DeviceProperties>> device_properties_for(const DeviceTarget& target);

}  // namespace cudnn
}  // namespace fusebox

// Runs `expr`, turning any exception from the frontend or the standard
// library into a Status naming `where`.
#define FUSEBOX_CATCH_ALL(where)                                                                   \
  catch (const std::exception& e) {                                                                \
    return ::fusebox::Status(::fusebox::StatusCode::kCudnnError,                                   \
                             std::string(where) + ": exception from cuDNN frontend: " + e.what()); \
  }                                                                                                \
  catch (...) {                                                                                    \
    return ::fusebox::Status(::fusebox::StatusCode::kCudnnError,                                   \
                             std::string(where) + ": unknown exception from cuDNN frontend");      \
  }
