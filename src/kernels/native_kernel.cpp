// fusebox kernels layer: which graphs fusebox runs itself, and the kernel for one.
#include "kernels/native_kernel.h"

#include <variant>

#include "common/op_where.h"
#include "embedding.h"
#include "norm.h"
#include "pool.h"
#include "reduction.h"

namespace fusebox::kernels {

namespace {
bool is_native(const ResolvedOp& op) { return std::holds_alternative<EmbeddingAttrs>(op.attrs); }
}  // namespace

bool has_native_op(const ResolvedGraph& g) {
  for (const ResolvedOp& op : g.ops)
    if (is_native(op)) return true;
  return false;
}

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
  if (!others.empty()) {
    return InvalidArgument(where + " fusebox runs " + std::string(op_type_name(native->attrs)) +
                           " with a CUDA kernel of its own (cuDNN 9.19 has no op for it), so it must be the only op "
                           "of its graph; graph '" + g.name + "' also has " + others +
                           ": move them to another graph (in a pipeline, a stage of their own)");
  }
  return make_embedding_kernel(g, *native, std::get<EmbeddingAttrs>(native->attrs));
}

FasterKernel faster_native_kernel(const ResolvedGraph& g) {
  if (g.ops.size() != 1) return {};
  const ResolvedOp& op = g.ops[0];
  // Measured on the H200 (cuDNN 9.19, 2026-12-04, bench/results): a bf16 global
  // average pool of 32x2048x7x7 took 206 us on eng2, the one resample engine
  // left for bf16 (eng3 gives wrong values or faults there, pool_lowering.cpp),
  // against 15 us in torch; the same reduction as one GEMM took 6.6 us.
  // Any other bf16 pool: eng3, the resample engine the heuristics rank first, is barred for bf16
  // (wrong values, pool_lowering.cpp); eng2 took 56.0 us for the ResNet-50 stem's max pool
  // (3x3/2 pad 1, 32x64x112x112 NHWC) against torch.compile's 53.3 us, for 64 MB moved (~16 us).
  if (const auto* a = std::get_if<PoolAttrs>(&op.attrs)) {
    if (auto k = make_global_avg_pool_kernel(g, op, *a)) {
      return {k, "cuDNN 9.19's resample engines take a global average pool 14-30x slower than a "
                 "bandwidth-bound kernel (206 us for bf16 32x2048x7x7 on the H200, eng3 barred for bf16)"};
    }
    const DType x_dtype = g.tensors[static_cast<size_t>(op.inputs.at("x"))].dtype;
    if (x_dtype == DType::kBF16) {
      if (auto k = make_window_pool_kernel(g, op, *a)) {
        return {k, "cuDNN 9.19's fast resample engine (eng3) gives wrong bf16 pools on the H200 and is barred; "
                   "the one left is slower than a bandwidth-bound kernel (56.0 us for the ResNet-50 stem's max "
                   "pool, 32x64x112x112)"};
      }
    }
  }
  // Measured on the H200 (cuDNN 9.19, 2026-12-01, BENCHMARKS.md): the bias gradient of an
  // NHWC dy, reduce_sum of bf16 32x64x112x112 over N, H, W into fp32, took 69.6 us (torch.compile
  // 56.2 us); the 51 MB it reads take about 13 us at the H200's bandwidth.
  if (const auto* a = std::get_if<ReductionAttrs>(&op.attrs)) {
    if (auto k = make_reduce_rows_kernel(g, op, *a)) {
      return {k, "cuDNN 9.19's reduction engines sum the outer dims of a tensor several times slower than a "
                 "bandwidth-bound kernel (69.6 us for the bias gradient of bf16 32x64x112x112 NHWC on the H200)"};
    }
  }
  // Measured on the H200 (cuDNN 9.19, 2026-12-04, bench/results): layernorm
  // training forward of bf16 8192x4096 with fp32 scale and bias took 157.5 us
  // (rmsnorm 122.3 us), with bf16 scale and bias 51.2 us (34.2 us); torch 57 us.
  // cuDNN's fast norm kernels take only params of x's dtype.
  const char* norm = "cuDNN 9.19 runs a norm with fp32 scale on 16-bit x about 3x slower than with params of x's dtype "
                     "(layernorm 8192x4096 on the H200: 157.5 us against 51.2 us)";
  if (const auto* a = std::get_if<LayerNormAttrs>(&op.attrs)) {
    if (auto k = make_norm_kernel(g, op, false, a->epsilon)) return {k, norm};
  }
  if (const auto* a = std::get_if<RmsNormAttrs>(&op.attrs)) {
    if (auto k = make_norm_kernel(g, op, true, a->epsilon)) return {k, norm};
  }
  return {};
}

}  // namespace fusebox::kernels
