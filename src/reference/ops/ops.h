// fusebox: the reference layer's op registry (private). One overload per
// OpAttrs alternative and per function; the drivers (reference_cpu.cpp,
// reference_gpu.cu, compare.cpp) call them through std::visit, so an
// alternative without its overloads is a compile error. Adding an op: its
// lines here, in its family's files.
//
// Declare overloads for the concrete attrs types only: the sdpa ones derive
// from SdpaOptions, and an SdpaOptions overload would silently take a new
// sdpa op.
#pragma once

#include <string_view>

#include "fusebox/dtype.h"
#include "fusebox/graph.h"
#include "fusebox/reference.h"
#include "fusebox/status.h"

namespace fusebox::reference_detail {

class CpuOpContext;  // ops/cpu_context.h: an op's inputs and outputs on the host
class GpuOpContext;  // ops/gpu_context.cuh: the same on the device, and the stream

// run_cpu: computes the op's outputs (logical row-major fp32), accumulating in double.
// run_gpu: launches the op's kernels on ctx's stream.
// tolerance: how close cuDNN's output `role` of dtype `dtype` must come to
//   the reference (default_tolerance(dtype) unless the op needs its own).

// ---- conv: ops/conv_cpu.cpp (run_cpu, tolerance), ops/conv_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvFpropAttrs& a);
Tolerance tolerance(const ConvFpropAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvDgradAttrs& a);
Tolerance tolerance(const ConvDgradAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ConvWgradAttrs& a);
Tolerance tolerance(const ConvWgradAttrs& a, std::string_view role, DType dtype);

// ---- matmul: ops/matmul_cpu.cpp, ops/matmul_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const MatmulAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const MatmulAttrs& a);
Tolerance tolerance(const MatmulAttrs& a, std::string_view role, DType dtype);

// ---- pointwise: ops/pointwise_cpu.cpp, ops/pointwise_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const PointwiseAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const PointwiseAttrs& a);
Tolerance tolerance(const PointwiseAttrs& a, std::string_view role, DType dtype);

// ---- sdpa: ops/sdpa_cpu.cpp, ops/sdpa_gpu.cu; sdpa_fp8_bwd in
// ops/sdpa_fp8_bwd_cpu.cpp and ops/sdpa_fp8_bwd_gpu.cu (semantics: ops/sdpa_fp8_bwd.h)
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& a);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& a);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& a);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaBwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8FwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const SdpaFp8BwdAttrs& a);
Tolerance tolerance(const SdpaFwdAttrs& a, std::string_view role, DType dtype);
Tolerance tolerance(const SdpaBwdAttrs& a, std::string_view role, DType dtype);
Tolerance tolerance(const SdpaFp8FwdAttrs& a, std::string_view role, DType dtype);
Tolerance tolerance(const SdpaFp8BwdAttrs& a, std::string_view role, DType dtype);

// ---- norm: ops/norm_cpu.cpp, ops/norm_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const LayerNormAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const LayerNormAttrs& a);
Tolerance tolerance(const LayerNormAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const RmsNormAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RmsNormAttrs& a);
Tolerance tolerance(const RmsNormAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const LayerNormBwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const LayerNormBwdAttrs& a);
Tolerance tolerance(const LayerNormBwdAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const RmsNormBwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RmsNormBwdAttrs& a);
Tolerance tolerance(const RmsNormBwdAttrs& a, std::string_view role, DType dtype);

// ---- pool: ops/pool_cpu.cpp, ops/pool_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const PoolAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const PoolAttrs& a);
Tolerance tolerance(const PoolAttrs& a, std::string_view role, DType dtype);

// ---- batchnorm: ops/batchnorm_cpu.cpp, ops/batchnorm_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const BatchNormAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormAttrs& a);
Tolerance tolerance(const BatchNormAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormInferenceAttrs& a);
Tolerance tolerance(const BatchNormInferenceAttrs& a, std::string_view role, DType dtype);
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const BatchNormBwdAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const BatchNormBwdAttrs& a);
Tolerance tolerance(const BatchNormBwdAttrs& a, std::string_view role, DType dtype);

// ---- reduction: ops/reduction_cpu.cpp, ops/reduction_gpu.cu
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ReductionAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ReductionAttrs& a);
Tolerance tolerance(const ReductionAttrs& a, std::string_view role, DType dtype);

// ---- embedding: ops/embedding_cpu.cpp, ops/embedding_gpu.cu (fusebox's own kernel: src/kernels/)
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const EmbeddingAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const EmbeddingAttrs& a);
Tolerance tolerance(const EmbeddingAttrs& a, std::string_view role, DType dtype);

// ---- rope: ops/rope_cpu.cpp, ops/rope_gpu.cu (fusebox's own kernel: src/kernels/rope.cu)
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const RopeAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RopeAttrs& a);
Tolerance tolerance(const RopeAttrs& a, std::string_view role, DType dtype);

// ---- cross_entropy: ops/cross_entropy_cpu.cpp, ops/cross_entropy_gpu.cu (fusebox's own kernel:
// src/kernels/cross_entropy.cu)
Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const CrossEntropyAttrs& a);
Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const CrossEntropyAttrs& a);
Tolerance tolerance(const CrossEntropyAttrs& a, std::string_view role, DType dtype);
}  // namespace fusebox::reference_detail
