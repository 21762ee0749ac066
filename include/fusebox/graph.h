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
#include "fusebox/ops/batchnorm.h"
#include "fusebox/ops/conv.h"
#include "fusebox/ops/cross_entropy.h"
#include "fusebox/ops/embedding.h"
#include "fusebox/ops/matmul.h"
#include "fusebox/ops/norm.h"
#include "fusebox/ops/pointwise.h"
#include "fusebox/ops/pool.h"
#include "fusebox/ops/quantize.h"
#include "fusebox/ops/reduction.h"
#include "fusebox/ops/rope.h"
#include "fusebox/ops/sdpa.h"
#include "fusebox/ops/transpose.h"
#include "fusebox/status.h"

namespace fusebox {

// ---------------------------------------------------------------- tensors

struct TensorSpec {
  std::string name;
  std::vector<int64_t> dims;           // empty: inferred (only for op outputs)
  std::vector<int64_t> strides;        // empty: from `layout`, else inferred/dense
  std::string layout;                  // optional shorthand: "nhwc", "nchw", "row_major", ...
  std::optional<DType> dtype;          // empty: graph io dtype (intermediate dtype if virtual)
  bool is_virtual = false;             // an intermediate that never reaches memory
  std::optional<double> scalar_value;  // a by-value scalar (dims all 1)
  // Fixed contents of a graph input, logical row-major (element_count()
  // values): e.g. per-sequence lengths or FP8 scales. Used instead of random
  // values when fusebox makes inputs; files given with --inputs still win.
  std::vector<double> values;
  // Symbolic dims (GraphSpec::symbols): per dim the symbol it is, "" for a
  // number; empty when no dim is symbolic. `dims` holds the symbols' current
  // values (bind_shape()).
  std::vector<std::string> dim_symbols;
};

// A symbol's declared range, like a TensorRT optimization profile
// (docs/graph-format.md, "Symbolic dims").
struct SymbolRange {
  int64_t min = 1;
  int64_t max = 1;
  int64_t default_value = 1;  // the JSON `default`, else max: used when no value is given
  int64_t value = 1;          // the value the spec's dims hold now
};

// Concrete values of symbols: {"B": 8, "S": 128}.
using ShapeValues = std::map<std::string, int64_t>;

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
// One header per op family; adding a family adds its header here and its
// attrs type(s) to OpAttrs (docs/architecture.md, "Adding an op").
// Every op's attrs type, once (issue 30): OpAttrs below and every layer's per-op declarations
// (src/graph/ops/ops.h, src/reference/ops/ops.h, src/cudnn/ops/ops.h) are generated from this
// list, so adding an op is one line here; a layer without the new op's functions fails to link.
#define FUSEBOX_OP_TYPES(X)  \
  X(ConvFpropAttrs)          \
  X(ConvDgradAttrs)          \
  X(ConvWgradAttrs)          \
  X(MatmulAttrs)             \
  X(PointwiseAttrs)          \
  X(SdpaFwdAttrs)            \
  X(SdpaBwdAttrs)            \
  X(SdpaFp8FwdAttrs)         \
  X(SdpaFp8BwdAttrs)         \
  X(LayerNormAttrs)          \
  X(RmsNormAttrs)            \
  X(LayerNormBwdAttrs)       \
  X(RmsNormBwdAttrs)         \
  X(PoolAttrs)               \
  X(BatchNormAttrs)          \
  X(BatchNormInferenceAttrs) \
  X(BatchNormBwdAttrs)       \
  X(ReductionAttrs)          \
  X(EmbeddingAttrs)          \
  X(RopeAttrs)               \
  X(CrossEntropyAttrs)       \
  X(TransposeAttrs)          \
  X(QuantizeAttrs)

namespace op_list_detail {
struct Begin;
template <typename... T>
struct VariantOf;
template <typename... T>
struct VariantOf<Begin, T...> {
  using type = std::variant<T...>;
};
}  // namespace op_list_detail
#define FUSEBOX_OP_TYPE_AFTER_COMMA(T) , T
using OpAttrs =
    op_list_detail::VariantOf<op_list_detail::Begin FUSEBOX_OP_TYPES(FUSEBOX_OP_TYPE_AFTER_COMMA)>::type;
#undef FUSEBOX_OP_TYPE_AFTER_COMMA

// The SdpaOptions of an sdpa op, nullptr for other ops.
const SdpaOptions* sdpa_options(const OpAttrs& attrs);
SdpaOptions* sdpa_options(OpAttrs& attrs);

// The op's type name as in the JSON format: "conv_fprop", "matmul", "add",
// "bias_add", "relu", "gelu_tanh", ...
std::string_view op_type_name(const OpAttrs& attrs);

// Input roles per op type:
//   conv_fprop: x, w      conv_dgrad: dy, w     conv_wgrad: dy, x
//   matmul: a, b
//   add/sub/mul: a, b     bias_add: x, bias     scale: x, scale
//   relu_bwd: dy, x
//   unary pointwise: x
//   sdpa_fwd: q, k, v     sdpa_bwd: q, k, v, o, do, stats
//   sdpa_fp8_fwd: q, k, v, descale_q, descale_k, descale_v, descale_s, scale_s, scale_o
//   sdpa_fp8_bwd: q, k, v, o, do, stats, descale_q, descale_k, descale_v, descale_o,
//                 descale_do, descale_s, descale_dp, scale_s, scale_dq, scale_dk,
//                 scale_dv, scale_dp
//   every sdpa op, per SdpaOptions: + seq_len_q, seq_len_kv (padding),
//   + bias (bias), + seed, offset (dropout)
//   layernorm: x, scale, bias     rmsnorm: x, scale (+ bias)
//   layernorm_bwd: dy, x, scale, mean, inv_variance   rmsnorm_bwd: dy, x, scale, inv_variance
//   max_pool, avg_pool, global_avg_pool: x
//   batchnorm: x, scale, bias, running_mean, running_var
//   batchnorm_inference: x, scale, bias, mean, inv_variance
//   batchnorm_bwd: dy, x, scale, mean, inv_variance
//   reduce_sum/max/min/amax/mean: x
//   embedding: ids, table (+ add)
std::vector<std::string_view> op_input_roles(const OpAttrs& attrs);
// Output roles per op type: "y" for conv_fprop/matmul/pointwise;
// conv_dgrad "dx"; conv_wgrad "dw"; sdpa_fwd "o"
// (+ "stats"); sdpa_bwd "dq", "dk", "dv"; sdpa_fp8_fwd "o", "amax_s",
// "amax_o" (+ "stats"); sdpa_fp8_bwd "dq", "dk", "dv", "amax_dq", "amax_dk",
// "amax_dv", "amax_dp"; every sdpa op + "dropout_mask" with
// dump_dropout_mask; layernorm "y" (+ "mean", "inv_variance" in the training
// phase); rmsnorm "y" (+ "inv_variance"); layernorm_bwd "dx", "dscale",
// "dbias"; rmsnorm_bwd "dx", "dscale" (+ "dbias"); pooling "y"; batchnorm
// "y", "mean", "inv_variance", "next_running_mean", "next_running_var";
// batchnorm_inference "y"; batchnorm_bwd "dx", "dscale", "dbias"; reductions
// "y"; embedding "y". The first is the primary output.
std::vector<std::string_view> op_output_roles(const OpAttrs& attrs);
std::string_view op_primary_output_role(const OpAttrs& attrs);

struct OpSpec {
  std::string name;  // unique within the graph
  OpAttrs attrs;
  std::map<std::string, std::string> inputs;   // role -> tensor name
  std::map<std::string, std::string> outputs;  // role -> tensor name ("y"; sdpa_fwd: "o", "stats")
  std::optional<DType> compute_dtype;          // empty: graph compute dtype
};

struct GraphSpec {
  std::string name;
  DType io_dtype = DType::kBF16;
  DType intermediate_dtype = DType::kFP32;
  DType compute_dtype = DType::kFP32;
  std::vector<TensorSpec> tensors;  // inputs, outputs and named intermediates
  std::vector<OpSpec> ops;          // any order; resolve() sorts topologically
  // Declared symbols (dims that vary between runs), by name. Empty: a static graph.
  std::map<std::string, SymbolRange> symbols;

  // --- C++ builder helpers. Each returns the name of the tensor it declares
  // or produces, so calls chain: relu("act", bias_add("b", conv_fprop(...), "bias")).
  // An op output is virtual unless declared with tensor()/output().
  std::string tensor(std::string tensor_name, std::vector<int64_t> dims, std::string layout = "",
                     std::optional<DType> dtype = std::nullopt);
  std::string scalar(std::string tensor_name, double value, DType dtype = DType::kFP32);
  std::string conv_fprop(std::string op_name, const std::string& x, const std::string& w,
                         ConvFpropAttrs attrs);
  // Return the "dx" / "dw" output's name (attrs.x_dims / attrs.w_dims required).
  std::string conv_dgrad(std::string op_name, const std::string& dy, const std::string& w,
                         ConvDgradAttrs attrs);
  std::string conv_wgrad(std::string op_name, const std::string& dy, const std::string& x,
                         ConvWgradAttrs attrs);
  std::string matmul(std::string op_name, const std::string& a, const std::string& b);
  std::string pointwise(std::string op_name, PointwiseMode mode, const std::string& in0,
                        const std::string& in1 = "");
  // A reduction of x over `reduce_dims` (empty: every dim); returns "y".
  std::string reduction(std::string op_name, ReductionMode mode, const std::string& x,
                        std::vector<int64_t> reduce_dims = {});
  // Returns the "o" output's name; with attrs.generate_stats the "stats"
  // output is named "<op_name>.stats". sdpa_fwd outputs must be graph
  // outputs: declare them with output(). Optional inputs (padding, bias,
  // dropout) are passed in `extra` by role: {{"bias", "b"}, {"seq_len_q", ...}}.
  std::string sdpa_fwd(std::string op_name, const std::string& q, const std::string& k, const std::string& v,
                       SdpaFwdAttrs attrs = {}, std::map<std::string, std::string> extra = {});
  // Outputs named "<op_name>.dq", ".dk", ".dv"; returns the op name.
  std::string sdpa_bwd(std::string op_name, const std::string& q, const std::string& k, const std::string& v,
                       const std::string& o, const std::string& d_o, const std::string& stats,
                       SdpaBwdAttrs attrs = {}, std::map<std::string, std::string> extra = {});
  // `scales` maps descale_q ... scale_o to tensor names. Outputs "<op_name>.o",
  // ".amax_s", ".amax_o" (+ ".stats"); returns the "o" output's name.
  std::string sdpa_fp8_fwd(std::string op_name, const std::string& q, const std::string& k,
                           const std::string& v, std::map<std::string, std::string> scales,
                           SdpaFp8FwdAttrs attrs = {});
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
  std::vector<double> values;  // fixed contents (TensorSpec::values), else empty
  // The range random inputs are drawn from: [-1, 1] unless an op needs other
  // values (sequence lengths: [1, S]; dropout seed and offset).
  double random_lo = -1.0, random_hi = 1.0;
  // The frontend uid of a non-virtual, non-scalar tensor: 1 + its id in the
  // canonical form (canonicalize()), so that equal canonical forms bind alike
  // whatever the tensors' names and order. 0 for virtual tensors and scalars.
  int64_t uid = 0;

  int64_t element_count() const;     // product of dims
  int64_t storage_elements() const;  // 1 + sum((dim-1)*stride): span of memory touched
  int64_t storage_bytes() const;
};

struct ResolvedOp {
  std::string name;
  OpAttrs attrs;
  std::map<std::string, int> inputs;   // role -> index into ResolvedGraph::tensors
  std::map<std::string, int> outputs;  // role -> index
  DType compute_dtype = DType::kFP32;
  // Filled by resolve(): conv padding/stride/dilation with defaults
  // applied; sdpa attn_scale (1/sqrt(D) when not given) and right_bound
  // (0 when causal).
};

struct ResolvedGraph {
  std::string name;
  DType io_dtype = DType::kBF16;
  DType intermediate_dtype = DType::kFP32;
  DType compute_dtype = DType::kFP32;
  std::vector<ResolvedTensor> tensors;
  std::vector<ResolvedOp> ops;  // topological order (the canonical form's)
  // The canonical form (canonical_form()), filled by resolve().
  std::string canonical;
  // A symbolic graph at one concrete shape: the symbols' values, and the
  // identity shared by every shape of the graph (symbolic_graph_id()), which
  // keys the session's kernel cache. Both empty for a static graph.
  ShapeValues shape;
  std::string symbolic_id;

  int find_tensor(std::string_view tensor_name) const;  // -1 if absent
  std::vector<int> input_tensors() const;
  std::vector<int> output_tensors() const;
  // Useful work, for TFLOP/s: 2*MACs for conv (fprop, dgrad and wgrad alike) and matmul, one per element
  // for pointwise ops, 2*B*Hq*(D+Dv) per kept query/key pair for sdpa_fwd
  // and sdpa_fp8_fwd (4*B*Hq*Sq*Skv*D when Dv == D, about half of it causal),
  // and 2.5 times that for sdpa_bwd (five matmuls against two), 8 per element
  // of x for layernorm, 4 for rmsnorm (5 with a bias), 14 for layernorm_bwd
  // and 11 for rmsnorm_bwd, one per window element per output for pooling,
  // 8 (batchnorm), 4 (batchnorm_inference) and 10 (batchnorm_bwd) per element of x. With padding
  // the lengths are data: `inputs` maps input tensor names to their values
  // (logical order); seq_len tensors missing from it use their fixed values,
  // else count as full length.
  double flops(const std::map<std::string, std::vector<double>>& inputs = {}) const;
  // Bytes of non-virtual tensors read and written once, for GB/s.
  double bytes_moved() const;
};

// The op's attributes as resolve() left them (defaults applied), as a JSON
// object: what `fusebox check --json` prints under "attrs" (docs/cli.md).
std::string op_resolved_attrs_json(const ResolvedGraph& g, const ResolvedOp& op);

// Validates `spec` and infers shapes, strides and dtypes. Errors name the op
// and tensor: "[conv_fprop 'conv1'] input 'w' has C=32 but x has C=64 ...".
Result<ResolvedGraph> resolve(const GraphSpec& spec);

// ---------------------------------------------------------------- symbolic dims

// The spec with its symbols set to `values` (symbols not named take their
// default) and every symbolic dim replaced. A value outside the declared
// range, an unknown symbol, or values for a graph without symbols is
// InvalidArgument naming the symbol, a dim that uses it and the range.
Result<GraphSpec> bind_shape(const GraphSpec& spec, const ShapeValues& values);
// "B=8,S=128" -> values (names and positive integers; errors say the form).
Result<ShapeValues> parse_shape_values(std::string_view text);
// "B=8,S=128" (names in order).
std::string shape_text(const ShapeValues& values);
// One symbol's values to sweep: "B=1..64" (each value), "S=16..512:16"
// (from 16 in steps of 16), "B=1,2,4,8" (a list); at most 4096 values.
struct ShapeSweep {
  std::string symbol;
  std::vector<int64_t> values;
};
Result<ShapeSweep> parse_shape_sweep(std::string_view text);
// Every combination of the sweeps' values (the last sweep varies fastest).
std::vector<ShapeValues> sweep_shapes(const std::vector<ShapeSweep>& sweeps);
// The identity of a symbolic spec, the same at every shape (16 hex digits);
// empty when the spec declares no symbol.
std::string symbolic_graph_id(const GraphSpec& spec);
// The current values of the spec's symbols.
ShapeValues current_shape(const GraphSpec& spec);

// ---------------------------------------------------------------- identity

// The version of the canonical form: a change of what it holds or how it is
// written bumps it, so that plan caches and plan files keyed on an older form
// miss cleanly instead of matching a different graph.
inline constexpr int kCanonicalFormVersion = 1;

// Computes g.canonical, orders g.ops canonically and sets every tensor's uid
// (resolve() calls it; graphs built by hand must too).
Status canonicalize(ResolvedGraph& g);
// The canonical form of g: versioned text of exactly what a plan depends on
// (dtypes, dims, strides, scalars and attributes, numbers exact), independent
// of names and of the order of tensors and ops (src/graph/canonical.cpp).
std::string canonical_form(const ResolvedGraph& g);
// XXH3-64 of the canonical form, 16 hex digits: the graph's identity in plan
// files and plan-cache keys.
std::string graph_fingerprint(const ResolvedGraph& g);

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
