// fusebox kernels layer: which graphs fusebox runs itself, and the kernel for one.
#include "kernels/native_kernel.h"

#include <variant>

#include "common/op_where.h"
#include "cross_entropy.h"
#include "embedding.h"
#include "fusebox/op_traits.h"
#include "gemv.h"
#include "norm.h"
#include "pointwise.h"
#include "pool.h"
#include "quantize_op.h"
#include "reduction.h"
#include "rope.h"
#include "sdpa_decode.h"
#include "skinny_gemm.h"

namespace fusebox::kernels {

namespace {
bool is_native(const ResolvedOp& op) { return op_traits(op.attrs).native_only; }
}  // namespace

bool has_native_op(const ResolvedGraph& g) {
  for (const ResolvedOp& op : g.ops)
    if (is_native(op)) return true;
  return false;
}

namespace {

// The kernel of an op only fusebox runs (OpTraits::native_only), by overload.
template <typename A>
Result<std::shared_ptr<const NativeKernel>> native_kernel_for(const ResolvedGraph&, const ResolvedOp&,
                                                              const A&, const std::string& where) {
  return Internal(where + " is native_only (src/graph/ops/traits.h) but src/kernels/ has no kernel for it");
}
Result<std::shared_ptr<const NativeKernel>> native_kernel_for(const ResolvedGraph& g, const ResolvedOp& op,
                                                              const EmbeddingAttrs& a, const std::string&) {
  return make_embedding_kernel(g, op, a);
}
Result<std::shared_ptr<const NativeKernel>> native_kernel_for(const ResolvedGraph& g, const ResolvedOp& op,
                                                              const RopeAttrs& a, const std::string&) {
  return make_rope_kernel(g, op, a);
}
Result<std::shared_ptr<const NativeKernel>> native_kernel_for(const ResolvedGraph& g, const ResolvedOp& op,
                                                              const CrossEntropyAttrs& a,
                                                              const std::string&) {
  return make_cross_entropy_kernel(g, op, a);
}
Result<std::shared_ptr<const NativeKernel>> native_kernel_for(const ResolvedGraph& g, const ResolvedOp& op,
                                                              const QuantizeAttrs& a, const std::string&) {
  return make_quantize_kernel(g, op, a);
}

}  // namespace

Result<std::shared_ptr<const NativeKernel>> make_native_kernel(const ResolvedGraph& g) {
  const ResolvedOp* native = nullptr;
  std::string others;
  for (const ResolvedOp& op : g.ops) {
    if (is_native(op) && !native) {
      native = &op;
    } else {
      others += (others.empty() ? "" : ", ") + std::string(op_type_name(op.attrs)) + " '" + op.name + "'";
    }
  }
  if (!native) return InvalidArgument("graph '" + g.name + "' has no op fusebox runs with its own kernel");
  const std::string where = common::op_where(op_type_name(native->attrs), native->name);
  if (!others.empty() && std::holds_alternative<QuantizeAttrs>(native->attrs)) {
    // Casts of a pointwise graph's outputs (FP8 training's, fused into the stage that computes them).
    if (auto k = make_pointwise_quantize_kernel(g)) return k;
    return NotSupported(where +
                        " fusebox's pointwise-quantize kernel takes a graph of quantize ops only "
                        "after a compiled pointwise form (the gated MLPs', with every tensor of one 16-bit "
                        "dtype, a multiple of 8 elements a row, FP8 copies in the form's layout or one "
                        "transposed one): graph '" +
                        g.name + "' also has " + others + "; it runs in parts");
  }
  if (!others.empty()) {
    return InvalidArgument(
        where + " fusebox runs " + std::string(op_type_name(native->attrs)) +
        " with a CUDA kernel of its own (cuDNN 9.19 has no op for it), so it must be the only op "
        "of its graph; graph '" +
        g.name + "' also has " + others +
        ": move them to another graph (in a pipeline, a stage of their own)");
  }
  return std::visit([&](const auto& a) { return native_kernel_for(g, *native, a, where); }, native->attrs);
}

namespace {

// The kernel that runs a graph whose only op is `a`, where cuDNN runs it much
// slower; by overload, one per op type that has one (none: the template).
template <typename A>
FasterKernel faster_kernel_for(const ResolvedGraph&, const ResolvedOp&, const A&) {
  return {};
}

// Measured on the H200 (cuDNN 9.19, 2026-12-04, bench/results): a bf16 global
// average pool of 32x2048x7x7 took 206 us on eng2, the one resample engine
// left for bf16 (eng3 gives wrong values or faults there, pool_lowering.cpp),
// against 15 us in torch; the same reduction as one GEMM took 6.6 us.
// Any other bf16 pool: eng3, the resample engine the heuristics rank first, is barred for bf16
// (wrong values, pool_lowering.cpp); eng2 took 56.0 us for the ResNet-50 stem's max pool
// (3x3/2 pad 1, 32x64x112x112 NHWC) against torch.compile's 53.3 us, for 64 MB moved (~16 us).
FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp& op, const PoolAttrs& a) {
  if (auto k = make_global_avg_pool_kernel(g, op, a)) {
    return {k,
            "cuDNN 9.19's resample engines take a global average pool 14-30x slower than a "
            "bandwidth-bound kernel (206 us for bf16 32x2048x7x7 on the H200, eng3 barred for bf16)"};
  }
  if (g.tensors[static_cast<size_t>(op.inputs.at("x"))].dtype == DType::kBF16) {
    if (auto k = make_window_pool_kernel(g, op, a)) {
      return {k,
              "cuDNN 9.19's fast resample engine (eng3) gives wrong bf16 pools on the H200 and is barred; "
              "the one left is slower than a bandwidth-bound kernel (56.0 us for the ResNet-50 stem's max "
              "pool, 32x64x112x112)"};
    }
  }
  return {};
}

// Measured on the H200 (cuDNN 9.19, 2026-12-01, BENCHMARKS.md): the bias gradient of an
// NHWC dy, reduce_sum of bf16 32x64x112x112 over N, H, W into fp32, took 69.6 us (torch.compile
// 56.2 us); the 51 MB it reads take about 13 us at the H200's bandwidth.
FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp& op, const ReductionAttrs& a) {
  if (auto k = make_reduce_rows_kernel(g, op, a)) {
    return {k,
            "cuDNN 9.19's reduction engines sum the outer dims of a tensor several times slower than a "
            "bandwidth-bound kernel (69.6 us for the bias gradient of bf16 32x64x112x112 NHWC on the H200)"};
  }
  return {};
}

// Measured on the H200 (cuDNN 9.19, 2026-12-06, docs/serving.md): the serving engine's decode
// step of the Llama-3.2-1B shapes at batch 1 ran its GEMMs (one row of a times the weights) at
// 0.2-1.5 TB/s, where reading the weights once allows about 4 TB/s. With an RMSNorm before the
// matmul (the prologue), cuDNN runs no single plan at all: the graph would be two.
FasterKernel gemv_kernel(const ResolvedGraph& g) {
  bool faster = false;
  if (auto k = make_gemv_kernel(g, &faster)) {
    if (!faster) {  // more rows, or weights outside the measured range: for batch invariance, pinned
      return {k,
              "a row's values do not depend on the other rows, bit for bit (the serving engine's "
              "deterministic mode); cuDNN's GEMM is faster here",
              false};
    }
    return {k,
            "cuDNN 9.19's GEMM engines are much slower than the memory allows for a few rows times a weight "
            "matrix: 0.2-1.5 TB/s of weights read on the H200 (the Llama-3.2-1B decode step at batch 1)"};
  }
  return {};
}

// The few-row matmul on tensor cores (9 to 64 rows): slower than cuDNN's GEMMs (skinny_gemm.h), so
// a graph's faster kernel only where a build pins it by name.
FasterKernel skinny_gemm_kernel(const ResolvedGraph& g) {
  const auto form = match_gemv_form(g);
  if (auto k = form ? make_skinny_gemm_kernel(*form) : nullptr) {
    return {k,
            "fusebox's tensor-core form of a few rows, when pinned; cuDNN's GEMM is faster here (H100, the "
            "1B decode GEMMs at 64 rows: about twice cuDNN's time, skinny_gemm.h)",
            false};
  }
  return {};
}

// Measured on the H200 (cuDNN 9.19, 2026-12-04, bench/results): layernorm
// training forward of bf16 8192x4096 with fp32 scale and bias took 157.5 us
// (rmsnorm 122.3 us), with bf16 scale and bias 51.2 us (34.2 us); torch 57 us.
// cuDNN's fast norm kernels take only params of x's dtype.
constexpr const char* kNormWhy =
    "cuDNN 9.19 runs a norm with fp32 scale on 16-bit x about 3x slower than with params of x's dtype "
    "(layernorm 8192x4096 on the H200: 157.5 us against 51.2 us)";
FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp& op, const LayerNormAttrs& a) {
  if (auto k = make_norm_kernel(g, op, false, a.epsilon)) return {k, kNormWhy};
  return {};
}
FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp& op, const RmsNormAttrs& a) {
  if (g.ops.size() > 1) return gemv_kernel(g);  // an RMSNorm before a few-row matmul
  if (auto k = make_norm_kernel(g, op, true, a.epsilon)) return {k, kNormWhy};
  return {};
}

// Not by default: measured on an H100 (cuDNN 9.19, 2026-12-06, docs/serving.md), cuDNN's paged
// decode engine took 0.399 ms on example sdpa_paged_decode (64 sequences) and 10.8 us on
// sdpa_paged_decode_b1, this kernel 0.731 ms and 23.3 us; its tensor-core form (head dim 64,
// session 38) 0.177 ms against cuDNN's 0.094 on the 1B shapes at batch 64, 19.5 against 10.6 us at 1. (It was
// taken by default from 2026-12-05 on a misreading of the serving profile: cuDNN read K and V there at
// about 3.7 TB/s, not 0.23.) Pinned, it gives a sequence the same output at any batch size.
FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp& op, const SdpaFwdAttrs& a) {
  if (auto k = make_sdpa_decode_kernel(g, op, a)) {
    if (a.fp8_kv) {
      return {k,
              "an FP8 K/V cache with 16-bit q: cuDNN 9.19 has no mixed-precision SDPA (its FP8 SDPA takes "
              "fp8 q and writes fp8 o), so fusebox's kernel is the only one that runs it without the GPU "
              "reference"};
    }
    return {k,
            "a sequence's output does not depend on the batch it runs in, bit for bit (cuDNN's engine, "
            "the default, is faster: 0.399 ms against 0.731 on example sdpa_paged_decode, H100)",
            false};
  }
  return {};
}

FasterKernel faster_kernel_for(const ResolvedGraph& g, const ResolvedOp&, const MatmulAttrs&) {
  return gemv_kernel(g);
}

// Whether the faster kernel of an op may take the ops after it too (a matmul's epilogue, an RMSNorm's
// matmul).
template <typename A>
constexpr bool fuses_epilogue(const A&) {
  return false;
}
constexpr bool fuses_epilogue(const MatmulAttrs&) { return true; }
constexpr bool fuses_epilogue(const RmsNormAttrs&) { return true; }

// A graph of pointwise ops only: cuDNN 9.19 builds one output per pointwise plan, so a graph of
// several outputs runs as a partitioned plan that reads the inputs once per output. fusebox_pointwise
// runs it in one pass. Its interpreted program is slow, so it runs only when pinned; the gated-MLP
// forms (pointwise.cu) run compiled and are taken by default. Measured on an H100 (2026-12-06,
// `run --verify`, bf16 [32768, 2816]):
//   SwiGLU backward (3 in, 2 out): cuDNN 0.738 ms (three parts), interpreted 1.52 ms, form 0.308 ms;
//   forward silu(a) * b:            cuDNN 0.209 ms,               interpreted 1.03 ms, form 0.185 ms
// (the form moves 2.99 TB/s, cuDNN's one-output plan 2.65 TB/s).
FasterKernel pointwise_graph_kernel(const ResolvedGraph& g) {
  if (auto k = make_pointwise_graph_kernel(g)) {
    if (const char* form = pointwise_form_name(*k)) {
      return {k,
              std::string("the ") + form +
                  " form compiled, one pass over memory (H100, bf16 [32768, 2816]: 0.308 ms against cuDNN's "
                  "0.738 on the SwiGLU backward, 0.185 against 0.209 on the forward)",
              true};
    }
    return {k,
            "one pass over memory for any number of outputs, but slower than cuDNN's pointwise engine "
            "(H100: 1.52 ms against 0.738 ms on the SwiGLU backward of bf16 32768x2816)",
            false};
  }
  return {};
}

}  // namespace

FasterKernel faster_native_kernel(const ResolvedGraph& g, const std::string& pinned) {
  if (g.ops.empty()) return {};
  if (pinned == kSkinnyGemmName) {  // a kernel of fusebox's that runs only when asked for by name
    if (auto k = skinny_gemm_kernel(g); k.kernel) return k;
  }
  if (auto k = pointwise_graph_kernel(g); k.kernel) return k;
  const ResolvedOp& op = g.ops[0];
  return std::visit(
      [&](const auto& a) {
        return g.ops.size() == 1 || fuses_epilogue(a) ? faster_kernel_for(g, op, a) : FasterKernel{};
      },
      op.attrs);
}

}  // namespace fusebox::kernels
