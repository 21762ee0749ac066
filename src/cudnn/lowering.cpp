// ResolvedGraph -> cudnn_frontend::graph::Graph.
// Each op family's lowering is in ops/<family>_lowering.cpp (ops/ops.h).
#include <algorithm>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "common/device_properties_check.h"
#include "common/op_where.h"
#include "fusebox/partition.h"
#include "internal.h"
#include "ops/ops.h"
#include "ops/pointwise_fold.h"

namespace fusebox::cudnn {

fe::DataType_t to_fe(DType t) {
  switch (t) {
    case DType::kBF16:
      return fe::DataType_t::BFLOAT16;
    case DType::kFP16:
      return fe::DataType_t::HALF;
    case DType::kFP32:
      return fe::DataType_t::FLOAT;
    case DType::kFP8E4M3:
      return fe::DataType_t::FP8_E4M3;
    case DType::kFP8E5M2:
      return fe::DataType_t::FP8_E5M2;
    case DType::kInt32:
      return fe::DataType_t::INT32;
    case DType::kInt64:
      return fe::DataType_t::INT64;
    case DType::kUInt8:
      return fe::DataType_t::UINT8;
  }
  return fe::DataType_t::NOT_SET;
}

namespace {

const char* fe_code_name(fe::error_code_t c) {
  switch (c) {
    case fe::error_code_t::OK:
      return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
      return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
      return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME:
      return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK:
      return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
      return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
      return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED:
      return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
      return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED:
      return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED:
      return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE:
      return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR:
      return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE:
      return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED:
      return "NVRTC_COMPILATION_FAILED";
  }
  return "UNKNOWN";
}

}  // namespace

Status from_fe(fe::error_t err, const std::string& where) {
  if (err.is_good()) return Status::Ok();
  StatusCode code = StatusCode::kCudnnError;
  switch (err.get_code()) {
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED:
      code = StatusCode::kNotSupported;
      break;
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
    case fe::error_code_t::INVALID_TENSOR_NAME:
    case fe::error_code_t::INVALID_VALUE:
      code = StatusCode::kInvalidArgument;
      break;
    case fe::error_code_t::CUDA_API_FAILED:
    case fe::error_code_t::INVALID_CUDA_DEVICE:
      code = StatusCode::kCudaError;
      break;
    default:
      break;
  }
  std::string msg = err.get_message();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  // A support gap found by a backend call (e.g. build_operation_graph's
  // finalize answering CUDNN_STATUS_NOT_SUPPORTED*) is "not supported", not a
  // library failure: the message carries cuDNN's status name.
  if (code == StatusCode::kCudnnError && msg.find("CUDNN_STATUS_NOT_SUPPORTED") != std::string::npos) {
    code = StatusCode::kNotSupported;
  }
  return Status(code, where + ": " + fe_code_name(err.get_code()) + (msg.empty() ? "" : ": " + msg));
}

Status cudnn_status(cudnnStatus_t st, const std::string& where) {
  if (st == CUDNN_STATUS_SUCCESS) return Status::Ok();
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  // cuDNN 9 numbers its statuses by class: 3000-3999 are CUDNN_STATUS_NOT_SUPPORTED and its sub-codes.
  const bool unsupported = static_cast<int>(st) / 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) / 1000;
  return Status(unsupported ? StatusCode::kNotSupported : StatusCode::kCudnnError,
                where + ": " + cudnnGetErrorString(st) + (last[0] ? std::string(" (") + last + ")" : ""));
}

Result<std::shared_ptr<fe::DeviceProperties>> device_properties_for(const DeviceTarget& target) {
  // Also here: a DeviceTarget can be filled in by hand, not only from a file.
  FUSEBOX_RETURN_IF_ERROR(common::check_device_properties(target.properties_json, "device properties"));
  auto props = std::make_shared<fe::DeviceProperties>();
  std::vector<uint8_t> bytes(target.properties_json.begin(), target.properties_json.end());
  try {
    FUSEBOX_RETURN_IF_ERROR(from_fe(props->deserialize(bytes), "device properties"));
  }
  FUSEBOX_CATCH_ALL("device properties")
  return props;
}

// The driver's state while lowering: every frontend tensor made so far (by
// tensor index) and the uids of the non-virtual ones.
struct LowerState {
  const ResolvedGraph& g;
  FeGraph& graph;
  std::vector<FeTensor> fe_tensors;
  std::unordered_map<std::string, int64_t>& uids;
  std::vector<std::string>& notes;  // LoweredGraph::notes
  const DeviceTarget& target;       // what the plans are built for

  // The one place uids are bound: the canonical uid (ResolvedTensor::uid,
  // docs/architecture.md, "Graph identity and uids").
  int64_t uid(size_t index) {
    const int64_t u = g.tensors[index].uid;
    uids[g.tensors[index].name] = u;
    return u;
  }
};

LowerContext::LowerContext(LowerState& state, const ResolvedOp& op)
    : state_(state), op_(op), where_(common::op_where(op_type_name(op.attrs), op.name)) {}

FeGraph& LowerContext::graph() const { return state_.graph; }
const ResolvedGraph& LowerContext::resolved() const { return state_.g; }
void LowerContext::note(const std::string& text) { state_.notes.push_back(where_ + ": " + text); }
const DeviceTarget& LowerContext::target() const { return state_.target; }

FeTensor LowerContext::in(const char* role) const {
  auto it = op_.inputs.find(role);
  return it == op_.inputs.end() ? nullptr : state_.fe_tensors[it->second];
}

Status LowerContext::bind_output(const std::string& role, const FeTensor& y) {
  if (!y) return Internal(where_ + ": the frontend returned no output tensor '" + role + "'");
  auto out_it = op_.outputs.find(role);
  if (out_it == op_.outputs.end()) return Internal(where_ + ": no output '" + role + "'");
  const int yi = out_it->second;
  const ResolvedTensor& yt = state_.g.tensors[yi];
  y->set_name(yt.name).set_dim(yt.dims).set_stride(yt.strides).set_data_type(to_fe(yt.dtype));
  if (yt.is_virtual) {
    y->set_is_virtual(true);
  } else {
    y->set_output(true).set_uid(state_.uid(yi));
  }
  state_.fe_tensors[yi] = y;
  return Status::Ok();
}

FeTensor LowerContext::create_output(const std::string& role) {
  const int mi = op_.outputs.at(role);
  const ResolvedTensor& mt = state_.g.tensors[mi];
  FeTensor t = state_.graph.tensor(fe::graph::Tensor_attributes()
                                       .set_name(mt.name)
                                       .set_dim(mt.dims)
                                       .set_stride(mt.strides)
                                       .set_data_type(to_fe(mt.dtype))
                                       .set_output(true)
                                       .set_uid(state_.uid(mi)));
  state_.fe_tensors[mi] = t;
  return t;
}

Result<LoweredGraph> lower(const ResolvedGraph& given, const DeviceTarget& target, bool dynamic_shape,
                           bool override_shapes) {
  LoweredGraph out;
  // Matmul graphs with two or more batch dims are lowered folded to rank 3 (ops/ops.h).
  std::string fold_note;
  std::optional<ResolvedGraph> folded = fold_matmul_batch_dims(given, &fold_note);
  // Pointwise graphs whose broadcasts cuDNN's pointwise engine gets wrong unfolded (ops/pointwise_fold.h).
  bool pointwise_folded = false;
  if (!folded) {
    folded = fold_pointwise_broadcast_dims(given, &fold_note);
    pointwise_folded = folded.has_value();
  }
  const ResolvedGraph& g = folded ? *folded : given;
  if (folded) out.notes.push_back("[graph '" + given.name + "']: " + fold_note);
  // One connected graph per cuDNN plan (independent_op_groups, fusebox/partition.h says why).
  const std::vector<int> groups = independent_op_groups(g);
  const int last_group = groups.empty() ? 0 : *std::max_element(groups.begin(), groups.end());
  if (last_group > 0) {
    std::vector<std::string> names(static_cast<size_t>(last_group) + 1);
    for (size_t i = 0; i < g.ops.size(); ++i) {
      std::string& s = names[static_cast<size_t>(groups[i])];
      s += (s.empty() ? "" : ", ") + g.ops[i].name;
    }
    std::string list;
    for (const std::string& s : names) list += (list.empty() ? "[" : " | [") + s + "]";
    return NotSupported(
        "graph '" + g.name + "': its ops form " + std::to_string(names.size()) + " independent groups (" +
        list +
        ", joined only by shared inputs); cuDNN runs one connected graph per plan, and its engines "
        "gave wrong values for independent ones: the session's partition runs each group as a part");
  }
  try {
    auto graph = std::make_shared<FeGraph>();
    graph->set_name(g.name.empty() ? "fusebox" : g.name)
        .set_io_data_type(to_fe(g.io_dtype))
        .set_intermediate_data_type(to_fe(g.intermediate_dtype))
        .set_compute_data_type(to_fe(g.compute_dtype));
    // Before any op: the frontend picks an op's implementation (e.g. composite
    // or unified SDPA) when the op is added, by whether shapes are dynamic.
    if (dynamic_shape) graph->set_dynamic_shape_enabled(true);
    if (override_shapes) graph->set_override_shape_enabled(true);
    if (target.deviceless()) {
      FUSEBOX_ASSIGN_OR_RETURN(auto props, device_properties_for(target));
      graph->set_device_properties(props);
      // Frontend 1.23+: check_support() otherwise asks the CUDA driver for the
      // SM version and fails without a GPU ("CUDA driver version is insufficient").
      graph->set_sm_version(target.sm_version);
    }
    // uids are canonical (ResolvedTensor::uid), so a plan serves every graph
    // with the same canonical form, whatever its tensor names and order.
    for (const ResolvedTensor& t : g.tensors) {
      if (!t.is_virtual && !t.scalar_value && t.uid <= 0) {
        return Internal("lowering '" + g.name + "': tensor '" + t.name +
                        "' has no uid: the graph was not canonicalized (resolve() does it)");
      }
    }
    LowerState state{g, *graph, std::vector<FeTensor>(g.tensors.size()), out.uids, out.notes, target};

    // Graph inputs and by-value scalars.
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      const ResolvedTensor& t = g.tensors[i];
      if (t.scalar_value) {
        fe::graph::Tensor_attributes a(static_cast<float>(*t.scalar_value));
        a.set_name(t.name).set_dim(t.dims).set_stride(t.strides);
        state.fe_tensors[i] = graph->tensor(a);
      } else if (t.is_input) {
        state.fe_tensors[i] = graph->tensor(fe::graph::Tensor_attributes()
                                                .set_name(t.name)
                                                .set_dim(t.dims)
                                                .set_stride(t.strides)
                                                .set_data_type(to_fe(t.dtype))
                                                .set_uid(state.uid(i)));
      }
    }

    // Each op by its family's lower_op() (ops/ops.h).
    for (const ResolvedOp& op : g.ops) {
      LowerContext ctx(state, op);
      FUSEBOX_RETURN_IF_ERROR(
          std::visit([&](const auto& attrs) { return lower_op(ctx, op, attrs); }, op.attrs));
    }
    for (const ResolvedTensor& t : g.tensors) {
      if (out.uids.count(t.name)) out.tensor_bytes[t.name] = t.storage_bytes();
    }
    // Override shapes are computed from the graph's dims (shape_override_between): an op whose
    // lowering gives a tensor cuDNN sees other dims or strides (a reshaped view) rules them out.
    if (override_shapes && pointwise_folded)
      out.override_obstacle = "its broadcast dims are folded (" + fold_note + ")";
    for (size_t i = 0; override_shapes && i < g.tensors.size() && out.override_obstacle.empty(); ++i) {
      const ResolvedTensor& t = g.tensors[i];
      const FeTensor& fe_t = state.fe_tensors[i];
      if (t.is_virtual || t.scalar_value || !fe_t) continue;
      if (fe_t->get_dim() != t.dims || fe_t->get_stride() != t.strides) {
        out.override_obstacle =
            "tensor '" + t.name + "' is lowered with other dims or strides than the graph's";
      }
    }
    out.graph = std::move(graph);
  }
  FUSEBOX_CATCH_ALL("lowering '" + g.name + "'")
  return out;
}

}  // namespace fusebox::cudnn
