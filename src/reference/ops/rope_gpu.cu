// fusebox: the GPU reference of rope and rope_bwd: one thread per output value,
// in double, reading every tensor through its strides (independent of fusebox's
// own kernel in src/kernels/rope.cu, which handles a pair per thread in fp32).
#include <cuda_runtime.h>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

__global__ void rope_reference_kernel(DevTensor x, DevTensor freqs, DevTensor offset, bool has_offset,
                                      int64_t nh, int64_t ns, int64_t d, int64_t r, int64_t np,
                                      bool interleaved, double scale, double sign, int64_t total, float* y) {
  const int64_t half = r / 2, lead = d - r;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % d, s = (idx / d) % ns, h = (idx / (d * ns)) % nh, b = idx / (d * ns * nh);
    const int64_t base = b * x.strides[0] + h * x.strides[1] + s * x.strides[2];
    const double pos = (has_offset ? static_cast<double>(load_at(offset, b * offset.strides[0])) : 0.0) + s;
    if (!(pos >= 0 && pos < static_cast<double>(np))) {
      y[idx] = NAN;
      continue;
    }
    const double xj = load_at(x, base + j * x.strides[3]);
    if (j < lead) {
      y[idx] = static_cast<float>(scale * xj);
      continue;
    }
    const int64_t k = j - lead;  // within the rotated segment
    const bool upper = interleaved ? (k % 2 == 1) : (k >= half);
    const int64_t pair = interleaved ? k / 2 : (upper ? k - half : k);
    const int64_t partner = lead + (interleaved ? (upper ? k - 1 : k + 1) : (upper ? k - half : k + half));
    const double theta =
        load_at(freqs, static_cast<int64_t>(pos) * freqs.strides[2] + pair * freqs.strides[3]);
    const double c = scale * cos(theta), sn = sign * scale * sin(theta);
    const double xp = load_at(x, base + partner * x.strides[3]);
    y[idx] = static_cast<float>(upper ? xj * c + xp * sn : xj * c - xp * sn);
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const RopeAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index(a.backward ? "dx" : "y"));
  FUSEBOX_ASSIGN_OR_RETURN(Located x, ctx.in(a.backward ? "dy" : "x"));
  FUSEBOX_ASSIGN_OR_RETURN(Located freqs, ctx.in("freqs"));
  Located offset;
  if (a.offset) {
    FUSEBOX_ASSIGN_OR_RETURN(offset, ctx.in("offset"));
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  if (x.dims.size() != 4 || freqs.dims.size() != 4 || (a.offset && offset.dims.size() != 4))
    return InvalidArgument(op_where(op) + "x, freqs and offset must have rank 4");
  const int64_t d = x.dims[3], r = a.rope_dim ? a.rope_dim : d;
  const int64_t total = x.dims[0] * x.dims[1] * x.dims[2] * d;
  if (total > 0) {
    rope_reference_kernel<<<grid_for(total, 256), 256, 0, ctx.stream()>>>(
        x.t, freqs.t, offset.t, a.offset, x.dims[1], x.dims[2], d, r, freqs.dims[2],
        a.layout == RopeLayout::kInterleaved, a.scale, a.backward ? -1.0 : 1.0, total, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
