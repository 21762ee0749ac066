// fusebox: the references of quantize (include/fusebox/ops/quantize.h), CPU and GPU in one file,
// and its tolerance. y = fp8(x * scale), saturating, nearest even; amax = max |x|.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "gpu_util.cuh"
#include "ops/cpu_context.h"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

DType y_dtype(const ResolvedGraph& g, const ResolvedOp& op) {
  return g.tensors[static_cast<size_t>(op.outputs.at("y"))].dtype;
}

struct QuantizeArgs {
  DevTensor x, scale;  // x broadcast to its own dims (logical row-major order)
  int64_t n;
  bool e5m2;
};

__global__ void quantize_kernel(QuantizeArgs a, float* y, unsigned* amax_bits) {
  const float s = load_at(a.scale, 0);
  float m = 0.f;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < a.n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = o, off = 0;
    for (int k = a.x.rank - 1; k >= 0; --k) {
      off += (rem % a.x.dims[k]) * a.x.strides[k];
      rem /= a.x.dims[k];
    }
    const float v = load_at(a.x, off);
    m = fmaxf(m, fabsf(v));  // NaN-ignoring, as fmaxf is
    y[o] = round_fp8(v * s, a.e5m2);
  }
  if (amax_bits) atomicMax(amax_bits, __float_as_uint(m));  // non-negative floats order as their bits
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const QuantizeAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* scale, ctx.in("scale"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  if (scale->data.size() != 1)
    return InvalidArgument(op_where(op) + "scale has " + std::to_string(scale->data.size()) +
                           " values, not 1");
  const DType t = y_dtype(ctx.graph(), op);
  const float s = scale->data[0];
  float m = 0.f;
  for (size_t i = 0; i < x->data.size(); ++i) {
    const float v = x->data[i];
    m = std::fmax(m, std::fabs(v));
    y->data[i] = fp8_bits_to_float(float_to_fp8_bits(v * s, t), t);
  }
  if (a.amax) {
    FUSEBOX_ASSIGN_OR_RETURN(Values * am, ctx.out("amax"));
    am->data.assign(1, m);
  }
  if (a.y2) {
    FUSEBOX_ASSIGN_OR_RETURN(Values * y2, ctx.out("y2"));
    y2->data = y->data;  // logical values: the layout is where a kernel writes them
  }
  return Status::Ok();
}

// y is exact given x * scale in fp32 (one rounding, the same in every implementation): the
// default fp8 tolerance covers a product that lands on a tie differently; amax is exact (the
// bound is fp32's rounding of a maximum that is one of x's values).
Tolerance tolerance(const QuantizeAttrs&, std::string_view role, DType dtype) {
  if (role == "amax") return Tolerance{1e-7, 1e-7};
  return default_tolerance(dtype);
}

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const QuantizeAttrs& qa) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(Located x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(Located scale, ctx.in("scale"));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  QuantizeArgs a{};
  a.x = broadcast_to(x, x.dims);
  a.scale = broadcast_to(scale, std::vector<int64_t>(1, 1));
  a.n = product(x.dims);
  a.e5m2 = y_dtype(ctx.graph(), op) == DType::kFP8E5M2;
  unsigned* amax = nullptr;
  if (qa.amax) {
    FUSEBOX_ASSIGN_OR_RETURN(const int midx, ctx.output_index("amax"));
    FUSEBOX_ASSIGN_OR_RETURN(float* m, ctx.destination(midx));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMemsetAsync(m, 0, sizeof(float), ctx.stream()));
    amax = reinterpret_cast<unsigned*>(m);
  }
  if (a.n > 0) {
    quantize_kernel<<<grid_for(a.n, 256), 256, 0, ctx.stream()>>>(a, y, amax);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  if (qa.y2 && a.n > 0) {
    FUSEBOX_ASSIGN_OR_RETURN(const int y2idx, ctx.output_index("y2"));
    FUSEBOX_ASSIGN_OR_RETURN(float* y2, ctx.destination(y2idx));
    FUSEBOX_CUDA_RETURN(op_where(op), cudaMemcpyAsync(y2, y, static_cast<size_t>(a.n) * sizeof(float),
                                                      cudaMemcpyDeviceToDevice, ctx.stream()));
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
