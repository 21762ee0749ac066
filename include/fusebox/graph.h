// fusebox: graph description.
//
// A GraphSpec is what the user declares (from C++ or from a JSON file, see
// docs/graph-format.md). resolve() validates it and infers every missing
// shape, stride and dtype, giving a ResolvedGraph: the form every backend
// (cuDNN lowering, references) consumes. Neither type mentions cuDNN.
//
// Conventions (those of cuDNN's graph API):
//   * dims are in logical order: convolution tensors [N, C, (D,) H, W],
//     filters [K, C, (T,) R, S]; matmul tensors [batch..., M, K] x [batch..., K, N].
//     Matmul tensors have rank >= 3: write [1, M, K] for a plain GEMM.
//   * strides are in elements and say the memory layout; a layout name such as
//     "nhwc" expands to strides (layout_strides()).
//   * binary pointwise ops broadcast like numpy over equal ranks (a dim of 1
//     broadcasts).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/status.h"

namespace fusebox {

// ---------------------------------------------------------------- tensors

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;     // empty: inferred (only for op outputs)
  std::vector<int64_t> strides;  // empty: from `layout`, else inferred/dense
  std::string layout;            // optional shorthand: "nhwc", "nchw", "row_major", ...
  std::optional<DType> dtype;    // empty: graph io dtype (intermediate dtype if virtual)
  bool is_virtual = false;       // an intermediate that never reaches memory
  std::optional<double> scalar_value;  // a by-value scalar (dims all 1)
};

// Strides for `dims` laid out as `layout`:
//   "nchw", "ncdhw", "row_major", "packed": dense, last dim fastest;
//   "nhwc", "ndhwc", "channels_last": dim 1 fastest, then the spatial dims;
//   "col_major": the last two dims swapped (matrices stored column-major);
//   "bhsd": rank 4, dense (same as row_major);
//   "bshd": rank 4 dims [B,H,S,D] stored as [B,S,H,D] (attention tensors
//           with heads interleaved): strides [S*H*D, D, H*D, 1].
Result<std::vector<int64_t>> layout_strides(const std::vector<int64_t>& dims, std::string_view layout);
// Dense strides with the same stride order as `like_strides` (ties: later dim faster).
std::vector<int64_t> dense_strides_like(const std::vector<int64_t>& dims,
                                        const std::vector<int64_t>& like_strides);

// ---------------------------------------------------------------- ops

struct ConvFpropAttrs {
  std::vector<int64_t> padding;   // per spatial dim; default 0
  std::vector<int64_t> stride;    // default 1
  std::vector<int64_t> dilation;  // default 1
};

struct MatmulAttrs {};

enum class PointwiseMode {
  kAdd,       // y = a + b            (inputs a, b)
  kSub,       // y = a - b            (inputs a, b)
  kMul,       // y = a * b            (inputs a, b)
  kBiasAdd,   // y = x + bias         (inputs x, bias; bias broadcast, e.g. [1,K,1,1])
  kScale,     // y = x * scale        (inputs x, scale; scale a by-value scalar or tensor)
  kRelu,      // y = max(x, 0)        (input x)
  kGeluTanh,  // tanh approximation   (input x)
  kGeluErf,   // exact erf form       (input x)
  kSilu,      // x * sigmoid(x)       (input x)
  kSigmoid,   // (input x)
  kTanh,      // (input x)
};

struct PointwiseAttrs {
  PointwiseMode mode = PointwiseMode::kAdd;
};

// Scaled-dot-product attention, forward (cuDNN's fused flash attention):
//   o = softmax(attn_scale * q @ k^T  [+ causal mask]) @ v
// Inputs q [B,Hq,Sq,D], k [B,Hk,Skv,D], v [B,Hk,Skv,Dv] with Hq % Hk == 0
// (grouped-query / multi-query attention: q head h reads kv head h / (Hq/Hk)).
// Outputs "o" [B,Hq,Sq,Dv] and, with generate_stats, "stats" [B,Hq,Sq,1] fp32:
// the per-row logsumexp of the scaled, masked scores in natural log
// (max + log(sum(exp(s - max)))), as cuDNN defines it.
struct SdpaFwdAttrs {
  std::optional<double> attn_scale;  // empty: 1/sqrt(D); resolve() fills it in
  bool causal = false;               // top-left aligned: q row i sees kv rows j <= i
  bool generate_stats = false;       // also write the "stats" output
};

using OpAttrs = std::variant<ConvFpropAttrs, MatmulAttrs, PointwiseAttrs, SdpaFwdAttrs>;

// The op's type name as in the JSON format: "conv_fprop", "matmul", "add",
// "bias_add", "relu", "gelu_tanh", ...
std::string_view op_type_name(const OpAttrs& attrs);
std::string_view pointwise_mode_name(PointwiseMode m);
std::optional<PointwiseMode> parse_pointwise_mode(std::string_view s);
bool pointwise_is_unary(PointwiseMode m);

// Input roles per op type:
//   conv_fprop: x, w      matmul: a, b
//   add/sub/mul: a, b     bias_add: x, bias     scale: x, scale
//   unary pointwise: x    sdpa_fwd: q, k, v
std::vector<std::string_view> op_input_roles(const OpAttrs& attrs);
// Output roles per op type: "y" for every op but sdpa_fwd, which has "o"
// and, with generate_stats, "stats". The first is the primary output.
std::vector<std::string_view> op_output_roles(const OpAttrs& attrs);
std::string_view op_primary_output_role(const OpAttrs& attrs);
// Query/key pairs sdpa_fwd scores per (batch, head): Sq*Skv, or with the
// top-left causal mask sum over rows i of min(i + 1, Skv).
double sdpa_unmasked_pairs(int64_t sq, int64_t skv, bool causal);

struct OpSpec {
  std::string name;                           // unique within the graph
  OpAttrs attrs;
  std::map<std::string, std::string> inputs;  // role -> tensor name
  std::map<std::string, std::string> outputs; // role -> tensor name ("y"; sdpa_fwd: "o", "stats")
  std::optional<DType> compute_dtype;         // empty: graph compute dtype
};

struct GraphSpec {
  std::string name;
  DType io_dtype = DType::kBF16;
  DType intermediate_dtype = DType::kFP32;
  DType compute_dtype = DType::kFP32;
  std::vector<TensorSpec> tensors;  // inputs, outputs and named intermediates
  std::vector<OpSpec> ops;          // any order; resolve() sorts topologically

  // --- C++ builder helpers. Each returns the name of the tensor it declares
  // or produces, so calls chain: relu("act", bias_add("b", conv_fprop(...), "bias")).
  // An op output is virtual unless declared with tensor()/output().
  std::string tensor(std::string tensor_name, std::vector<int64_t> dims, std::string layout = "",
                     std::optional<DType> dtype = std::nullopt);
  std::string scalar(std::string tensor_name, double value, DType dtype = DType::kFP32);
  std::string conv_fprop(std::string op_name, const std::string& x, const std::string& w,
                         ConvFpropAttrs attrs);
  std::string matmul(std::string op_name, const std::string& a, const std::string& b);
  std::string pointwise(std::string op_name, PointwiseMode mode, const std::string& in0,
                        const std::string& in1 = "");
  // Returns the "o" output's name; with attrs.generate_stats the "stats"
  // output is named "<op_name>.stats". sdpa_fwd outputs must be graph
  // outputs: declare them with output().
  std::string sdpa_fwd(std::string op_name, const std::string& q, const std::string& k, const std::string& v,
                       SdpaFwdAttrs attrs = {});
  // Declares the tensor `tensor_name` (produced by some op) a graph output
  // with an optional layout; dims are inferred.
  void output(const std::string& tensor_name, std::string layout = "",
              std::optional<DType> dtype = std::nullopt);
};

// ---------------------------------------------------------------- resolved form

struct ResolvedTensor {
  std::string name;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  DType dtype = DType::kBF16;
  bool is_virtual = false;
  bool is_input = false;   // non-virtual, produced by no op: the caller supplies it
  bool is_output = false;  // non-virtual, produced by an op
  std::optional<double> scalar_value;

  int64_t element_count() const;    // product of dims
  int64_t storage_elements() const; // 1 + sum((dim-1)*stride): span of memory touched
  int64_t storage_bytes() const;
};

struct ResolvedOp {
  std::string name;
  OpAttrs attrs;
  std::map<std::string, int> inputs;   // role -> index into ResolvedGraph::tensors
  std::map<std::string, int> outputs;  // role -> index
  DType compute_dtype = DType::kFP32;
  // Filled by resolve(): conv_fprop padding/stride/dilation with defaults
  // applied; sdpa_fwd attn_scale (1/sqrt(D) when not given).
};

struct ResolvedGraph {
  std::string name;
  DType io_dtype = DType::kBF16;
  DType intermediate_dtype = DType::kFP32;
  DType compute_dtype = DType::kFP32;
  std::vector<ResolvedTensor> tensors;
  std::vector<ResolvedOp> ops;  // topological order

  int find_tensor(std::string_view tensor_name) const;  // -1 if absent
  std::vector<int> input_tensors() const;
  std::vector<int> output_tensors() const;
  // Useful work, for TFLOP/s: 2*MACs for conv and matmul, one per element
  // for pointwise ops, 2*B*Hq*(D+Dv) per unmasked query/key pair for sdpa_fwd
  // (4*B*Hq*Sq*Skv*D when Dv == D, about half of it causal).
  double flops() const;
  // Bytes of non-virtual tensors read and written once, for GB/s.
  double bytes_moved() const;
};

// Validates `spec` and infers shapes, strides and dtypes. Errors name the op
// and tensor: "[conv_fprop 'conv1'] input 'w' has C=32 but x has C=64 ...".
Result<ResolvedGraph> resolve(const GraphSpec& spec);

// ---------------------------------------------------------------- JSON

// Parses the JSON graph format (docs/graph-format.md). `origin` names the
// source in error messages (a file path).
Result<GraphSpec> parse_graph_json(std::string_view text, std::string_view origin = "<json>");
Result<GraphSpec> load_graph_file(const std::string& path);
// Writes a spec back to JSON (round-trips through parse_graph_json).
std::string graph_to_json(const GraphSpec& spec, int indent = 2);

// A human-readable listing of tensors and ops with inferred shapes.
std::string describe(const ResolvedGraph& g);

}  // namespace fusebox
