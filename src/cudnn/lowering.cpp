// ResolvedGraph -> cudnn_frontend::graph::Graph.
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "cudnn/internal.h"

namespace fusebox::cudnn {
namespace {

fe::DataType_t to_fe(DType t) {
  switch (t) {
    case DType::kBF16: return fe::DataType_t::BFLOAT16;
    case DType::kFP16: return fe::DataType_t::HALF;
    case DType::kFP32: return fe::DataType_t::FLOAT;
    case DType::kFP8E4M3: return fe::DataType_t::FP8_E4M3;
    case DType::kFP8E5M2: return fe::DataType_t::FP8_E5M2;
    case DType::kInt32: return fe::DataType_t::INT32;
    case DType::kInt64: return fe::DataType_t::INT64;
  }
  return fe::DataType_t::NOT_SET;
}

fe::PointwiseMode_t to_fe(PointwiseMode m) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd: return fe::PointwiseMode_t::ADD;
    case PointwiseMode::kSub: return fe::PointwiseMode_t::SUB;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale: return fe::PointwiseMode_t::MUL;
    case PointwiseMode::kRelu: return fe::PointwiseMode_t::RELU_FWD;
    case PointwiseMode::kGeluTanh: return fe::PointwiseMode_t::GELU_APPROX_TANH_FWD;
    case PointwiseMode::kGeluErf: return fe::PointwiseMode_t::GELU_FWD;
    case PointwiseMode::kSilu: return fe::PointwiseMode_t::SWISH_FWD;
    case PointwiseMode::kSigmoid: return fe::PointwiseMode_t::SIGMOID_FWD;
    case PointwiseMode::kTanh: return fe::PointwiseMode_t::TANH_FWD;
  }
  return fe::PointwiseMode_t::NOT_SET;
}

const char* fe_code_name(fe::error_code_t c) {
  switch (c) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED: return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT: return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE: return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::HANDLE_ERROR: return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE: return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED: return "NVRTC_COMPILATION_FAILED";
  }
  return "UNKNOWN";
}

// Applies the options shared by every sdpa op to SDPA_attributes,
// SDPA_backward_attributes or SDPA_fp8_backward_attributes (the frontend gives
// them the same setters; ALiBi and the RNG dump are set by the callers, as FP8
// backward has neither).
template <typename Attrs>
void apply_sdpa_options(Attrs& attrs, const SdpaOptions& o, double scale,
                        const std::function<std::shared_ptr<fe::graph::Tensor_attributes>(const char*)>& in) {
  attrs.set_attn_scale(static_cast<float>(scale));
  attrs.set_diagonal_alignment(o.alignment == SdpaAlignment::kBottomRight ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                                          : fe::DiagonalAlignment_t::TOP_LEFT);
  // resolve() turns causal into right_bound 0; the fallback guards hand-built graphs.
  if (o.right_bound) {
    attrs.set_diagonal_band_right_bound(static_cast<int>(*o.right_bound));
  } else if (o.causal) {
    attrs.set_diagonal_band_right_bound(0);
  }
  if (o.left_bound) attrs.set_diagonal_band_left_bound(static_cast<int>(*o.left_bound));
  if (o.padding) attrs.set_padding_mask(true).set_seq_len_q(in("seq_len_q")).set_seq_len_kv(in("seq_len_kv"));
  if (o.bias) attrs.set_bias(in("bias"));
  if (o.dropout) attrs.set_dropout(static_cast<float>(*o.dropout), in("seed"), in("offset"));
}

}  // namespace

Status from_fe(fe::error_t err, const std::string& where) {
  if (err.is_good()) return Status::Ok();
  StatusCode code = StatusCode::kCudnnError;
  switch (err.get_code()) {
    case fe::error_code_t::GRAPH_NOT_SUPPORTED:
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: code = StatusCode::kNotSupported; break;
    case fe::error_code_t::ATTRIBUTE_NOT_SET:
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
    case fe::error_code_t::INVALID_TENSOR_NAME:
    case fe::error_code_t::INVALID_VALUE: code = StatusCode::kInvalidArgument; break;
    case fe::error_code_t::CUDA_API_FAILED:
    case fe::error_code_t::INVALID_CUDA_DEVICE: code = StatusCode::kCudaError; break;
    default: break;
  }
  std::string msg = err.get_message();
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  return Status(code, where + ": " + fe_code_name(err.get_code()) + (msg.empty() ? "" : ": " + msg));
}

Status cuda_status(cudaError_t err, const std::string& where) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, where + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

Status cudnn_status(cudnnStatus_t st, const std::string& where) {
  if (st == CUDNN_STATUS_SUCCESS) return Status::Ok();
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return Status(StatusCode::kCudnnError,
                where + ": " + cudnnGetErrorString(st) + (last[0] ? std::string(" (") + last + ")" : ""));
}

Result<std::shared_ptr<fe::DeviceProperties>> device_properties_for(const DeviceTarget& target) {
  auto props = std::make_shared<fe::DeviceProperties>();
  std::vector<uint8_t> bytes(target.properties_json.begin(), target.properties_json.end());
  try {
    FUSEBOX_RETURN_IF_ERROR(from_fe(props->deserialize(bytes), "device properties"));
  }
  FUSEBOX_CATCH_ALL("device properties")
  return props;
}

Result<LoweredGraph> lower(const ResolvedGraph& g, const DeviceTarget& target) {
  LoweredGraph out;
  try {
    auto graph = std::make_shared<FeGraph>();
    graph->set_name(g.name.empty() ? "fusebox" : g.name)
        .set_io_data_type(to_fe(g.io_dtype))
        .set_intermediate_data_type(to_fe(g.intermediate_dtype))
        .set_compute_data_type(to_fe(g.compute_dtype));
    if (target.deviceless()) {
      FUSEBOX_ASSIGN_OR_RETURN(auto props, device_properties_for(target));
      graph->set_device_properties(props);
      // Frontend 1.23+: check_support() otherwise asks the CUDA driver for the
      // SM version and fails without a GPU ("CUDA driver version is insufficient").
      graph->set_sm_version(target.sm_version);
    }

    std::vector<std::shared_ptr<fe::graph::Tensor_attributes>> fe_tensors(g.tensors.size());
    // uids are canonical (ResolvedTensor::uid), so a plan serves every graph
    // with the same canonical form, whatever its tensor names and order.
    for (const ResolvedTensor& t : g.tensors) {
      if (!t.is_virtual && !t.scalar_value && t.uid <= 0) {
        return Internal("lowering '" + g.name + "': tensor '" + t.name +
                        "' has no uid: the graph was not canonicalized (resolve() does it)");
      }
    }
    auto uid_of = [&](size_t index) { return g.tensors[index].uid; };

    // Graph inputs and by-value scalars.
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      const ResolvedTensor& t = g.tensors[i];
      if (t.scalar_value) {
        fe::graph::Tensor_attributes a(static_cast<float>(*t.scalar_value));
        a.set_name(t.name).set_dim(t.dims).set_stride(t.strides);
        fe_tensors[i] = graph->tensor(a);
      } else if (t.is_input) {
        fe_tensors[i] = graph->tensor(fe::graph::Tensor_attributes()
                                          .set_name(t.name)
                                          .set_dim(t.dims)
                                          .set_stride(t.strides)
                                          .set_data_type(to_fe(t.dtype))
                                          .set_uid(uid_of(i)));
        out.uids[t.name] = uid_of(i);
      }
    }

    // Names, dims, strides and dtype of op output `role` from the resolved graph;
    // a uid and the output flag unless virtual.
    auto bind_output = [&](const ResolvedOp& op, const std::string& where, const std::string& role,
                           const std::shared_ptr<fe::graph::Tensor_attributes>& y) -> Status {
      if (!y) return Internal(where + ": the frontend returned no output tensor '" + role + "'");
      auto out_it = op.outputs.find(role);
      if (out_it == op.outputs.end()) return Internal(where + ": no output '" + role + "'");
      const int yi = out_it->second;
      const ResolvedTensor& yt = g.tensors[yi];
      y->set_name(yt.name).set_dim(yt.dims).set_stride(yt.strides).set_data_type(to_fe(yt.dtype));
      if (yt.is_virtual) {
        y->set_is_virtual(true);
      } else {
        y->set_output(true).set_uid(uid_of(yi));
        out.uids[yt.name] = uid_of(yi);
      }
      fe_tensors[yi] = y;
      return Status::Ok();
    };

    for (const ResolvedOp& op : g.ops) {
      const std::string where = "[" + std::string(op_type_name(op.attrs)) + " '" + op.name + "']";
      auto in = [&](const char* role) -> std::shared_ptr<fe::graph::Tensor_attributes> {
        auto it = op.inputs.find(role);
        return it == op.inputs.end() ? nullptr : fe_tensors[it->second];
      };
      if (const SdpaOptions* so = sdpa_options(op.attrs)) {
        // resolve() fills attn_scale; 1/sqrt(D) guards hand-built graphs.
        const double scale = so->attn_scale ? *so->attn_scale
                                            : 1.0 / std::sqrt(static_cast<double>(
                                                        g.tensors[op.inputs.at("q")].dims.back()));
        const std::function<std::shared_ptr<fe::graph::Tensor_attributes>(const char*)> in_fn = in;
        // The RNG dump is a tensor the caller creates and the op writes.
        auto rng_dump = [&]() {
          const int mi = op.outputs.at("dropout_mask");
          const ResolvedTensor& mt = g.tensors[mi];
          auto t = graph->tensor(fe::graph::Tensor_attributes()
                                     .set_name(mt.name)
                                     .set_dim(mt.dims)
                                     .set_stride(mt.strides)
                                     .set_data_type(to_fe(mt.dtype))
                                     .set_output(true)
                                     .set_uid(uid_of(mi)));
          out.uids[mt.name] = uid_of(mi);
          fe_tensors[mi] = t;
          return t;
        };
        if (auto* fwd = std::get_if<SdpaFwdAttrs>(&op.attrs)) {
          auto attrs = fe::graph::SDPA_attributes()
                           .set_name(op.name)
                           .set_generate_stats(fwd->generate_stats)
                           .set_compute_data_type(to_fe(op.compute_dtype));
          apply_sdpa_options(attrs, *so, scale, in_fn);
          if (so->alibi) attrs.set_alibi_mask(true);
          if (so->dump_dropout_mask) attrs.set_rng_dump(rng_dump());
          auto [o, stats] = graph->sdpa(in("q"), in("k"), in("v"), attrs);
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "o", o));
          if (fwd->generate_stats) FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "stats", stats));
        } else if (auto* f8 = std::get_if<SdpaFp8FwdAttrs>(&op.attrs)) {
          auto attrs = fe::graph::SDPA_fp8_attributes()
                           .set_name(op.name)
                           .set_generate_stats(f8->generate_stats)
                           .set_compute_data_type(to_fe(op.compute_dtype));
          apply_sdpa_options(attrs, *so, scale, in_fn);
          if (so->alibi) attrs.set_alibi_mask(true);
          if (so->dump_dropout_mask) attrs.set_rng_dump(rng_dump());
          auto [o, stats, amax_s, amax_o] =
              graph->sdpa_fp8(in("q"), in("k"), in("v"), in("descale_q"), in("descale_k"), in("descale_v"),
                              in("descale_s"), in("scale_s"), in("scale_o"), attrs);
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "o", o));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_s", amax_s));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_o", amax_o));
          if (f8->generate_stats) FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "stats", stats));
        } else if (std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs)) {
          if (so->alibi || so->dump_dropout_mask) {
            return NotSupported(where + std::string(so->alibi ? " alibi" : " a 'dropout_mask' output") +
                                ": the cuDNN frontend has no such option for FP8 backward; remove it");
          }
          auto attrs = fe::graph::SDPA_fp8_backward_attributes().set_name(op.name).set_compute_data_type(
              to_fe(op.compute_dtype));
          apply_sdpa_options(attrs, *so, scale, in_fn);
          auto [dq, dk, dv, amax_dq, amax_dk, amax_dv, amax_dp] = graph->sdpa_fp8_backward(
              in("q"), in("k"), in("v"), in("o"), in("do"), in("stats"), in("descale_q"), in("descale_k"),
              in("descale_v"), in("descale_o"), in("descale_do"), in("descale_s"), in("descale_dp"), in("scale_s"),
              in("scale_dq"), in("scale_dk"), in("scale_dv"), in("scale_dp"), attrs);
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dq", dq));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dk", dk));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dv", dv));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_dq", amax_dq));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_dk", amax_dk));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_dv", amax_dv));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "amax_dp", amax_dp));
        } else {
          auto attrs = fe::graph::SDPA_backward_attributes()
                           .set_name(op.name)
                           .set_compute_data_type(to_fe(op.compute_dtype))
                           .set_deterministic_algorithm(std::get<SdpaBwdAttrs>(op.attrs).deterministic);
          apply_sdpa_options(attrs, *so, scale, in_fn);
          if (so->alibi) attrs.set_alibi_mask(true);
          if (so->dump_dropout_mask) attrs.set_rng_dump(rng_dump());
          auto [dq, dk, dv] =
              graph->sdpa_backward(in("q"), in("k"), in("v"), in("o"), in("do"), in("stats"), attrs);
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dq", dq));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dk", dk));
          FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "dv", dv));
        }
        continue;
      }
      std::shared_ptr<fe::graph::Tensor_attributes> y;
      if (auto* conv = std::get_if<ConvFpropAttrs>(&op.attrs)) {
        y = graph->conv_fprop(in("x"), in("w"),
                              fe::graph::Conv_fprop_attributes()
                                  .set_name(op.name)
                                  .set_padding(conv->padding)
                                  .set_stride(conv->stride)
                                  .set_dilation(conv->dilation)
                                  .set_compute_data_type(to_fe(op.compute_dtype)));
      } else if (std::holds_alternative<MatmulAttrs>(op.attrs)) {
        y = graph->matmul(in("a"), in("b"),
                          fe::graph::Matmul_attributes().set_name(op.name).set_compute_data_type(
                              to_fe(op.compute_dtype)));
      } else if (auto* pw = std::get_if<PointwiseAttrs>(&op.attrs)) {
        auto attrs = fe::graph::Pointwise_attributes()
                         .set_name(op.name)
                         .set_mode(to_fe(pw->mode))
                         .set_compute_data_type(to_fe(op.compute_dtype));
        if (pw->mode == PointwiseMode::kSilu) attrs.set_swish_beta(1.0f);
        std::shared_ptr<fe::graph::Tensor_attributes> a, b;
        switch (pw->mode) {
          case PointwiseMode::kAdd:
          case PointwiseMode::kSub:
          case PointwiseMode::kMul: a = in("a"); b = in("b"); break;
          case PointwiseMode::kBiasAdd: a = in("x"); b = in("bias"); break;
          case PointwiseMode::kScale: a = in("x"); b = in("scale"); break;
          default: a = in("x"); break;
        }
        y = b ? graph->pointwise(a, b, attrs) : graph->pointwise(a, attrs);
      } else {
        return NotSupported(where + " has no cuDNN lowering");
      }
      FUSEBOX_RETURN_IF_ERROR(bind_output(op, where, "y", y));
    }
    out.graph = std::move(graph);
  }
  FUSEBOX_CATCH_ALL("lowering '" + g.name + "'")
  return out;
}

}  // namespace fusebox::cudnn
