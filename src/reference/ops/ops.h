// fusebox: the reference layer's op registry (private). One overload per
// OpAttrs alternative and per function, declared from FUSEBOX_OP_TYPES; the
// drivers (reference_cpu.cpp, reference_gpu.cu, compare.cpp) call them through
// std::visit, so an alternative without its definitions fails to link.
// Adding an op: nothing here, only its family's files.
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

// Each family's files: ops/<family>_cpu.cpp (run_cpu, tolerance) and ops/<family>_gpu.cu
// (run_gpu); sdpa_fp8_bwd in ops/sdpa_fp8_bwd_cpu.cpp and ops/sdpa_fp8_bwd_gpu.cu (semantics:
// ops/sdpa_fp8_bwd.h). Declared for every op of FUSEBOX_OP_TYPES (fusebox/graph.h).
#define FUSEBOX_REFERENCE_OP_FUNCTIONS(T)                              \
  Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const T& a); \
  Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const T& a); \
  Tolerance tolerance(const T& a, std::string_view role, DType dtype);
FUSEBOX_OP_TYPES(FUSEBOX_REFERENCE_OP_FUNCTIONS)
#undef FUSEBOX_REFERENCE_OP_FUNCTIONS

}  // namespace fusebox::reference_detail
