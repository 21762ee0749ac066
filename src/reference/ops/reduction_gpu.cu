// fusebox: the GPU reference of the reductions: one block per output
// element, its threads stride over the reduced elements and combine in
// double through shared memory.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

constexpr int kThreads = 256;

struct ReductionArgs {
  DevTensor x;
  int mode;    // static_cast<int>(ReductionMode)
  int nk, nr;  // kept and reduced dims of x, outer first
  int64_t kdims[kMaxRank], kstrides[kMaxRank], rdims[kMaxRank], rstrides[kMaxRank];
  int64_t ny, nred;
};

__device__ double combine(int mode, double a, double b) {
  switch (static_cast<ReductionMode>(mode)) {
    case ReductionMode::kMax:
    case ReductionMode::kAmax:
      return fmax(a, b);
    case ReductionMode::kMin:
      return fmin(a, b);
    default:
      return a + b;
  }
}

__global__ void reduction_kernel(ReductionArgs a, float* y) {
  __shared__ double part[kThreads];
  const ReductionMode mode = static_cast<ReductionMode>(a.mode);
  const double init = mode == ReductionMode::kMax ? -INFINITY : mode == ReductionMode::kMin ? INFINITY : 0.0;
  for (int64_t o = blockIdx.x; o < a.ny; o += gridDim.x) {
    int64_t rem = o, base = 0;
    for (int d = a.nk - 1; d >= 0; --d) {
      base += (rem % a.kdims[d]) * a.kstrides[d];
      rem /= a.kdims[d];
    }
    double acc = init;
    for (int64_t r = threadIdx.x; r < a.nred; r += blockDim.x) {
      int64_t rr = r, off = base;
      for (int d = a.nr - 1; d >= 0; --d) {
        off += (rr % a.rdims[d]) * a.rstrides[d];
        rr /= a.rdims[d];
      }
      double v = load_at(a.x, off);
      if (mode == ReductionMode::kAmax) v = fabs(v);
      acc = combine(a.mode, acc, v);
    }
    __syncthreads();  // part may still be read for the previous output
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s /= 2) {
      if (threadIdx.x < s) part[threadIdx.x] = combine(a.mode, part[threadIdx.x], part[threadIdx.x + s]);
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      const double r = part[0];
      y[o] = static_cast<float>(mode == ReductionMode::kMean ? r / static_cast<double>(a.nred) : r);
    }
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const ReductionAttrs& ra) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  const std::vector<int64_t>& ydims = ctx.graph().tensors[yidx].dims;
  FUSEBOX_ASSIGN_OR_RETURN(Located x, ctx.in("x"));
  if (x.dims.size() != ydims.size() || x.dims.size() > static_cast<size_t>(kMaxRank))
    return InvalidArgument(op_where(op) + "y " + dims_string(ydims) + " does not have x's rank " +
                           dims_string(x.dims));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  ReductionArgs a{};
  a.x = x.t;
  a.mode = static_cast<int>(ra.mode);
  a.ny = 1;
  a.nred = 1;
  for (size_t d = 0; d < x.dims.size(); ++d) {
    const int64_t stride = x.t.strides[d];
    if (ydims[d] == x.dims[d] && !(x.dims[d] == 1)) {
      a.kdims[a.nk] = x.dims[d];
      a.kstrides[a.nk++] = stride;
      a.ny *= x.dims[d];
    } else if (ydims[d] == 1) {
      a.rdims[a.nr] = x.dims[d];
      a.rstrides[a.nr++] = stride;
      a.nred *= x.dims[d];
    } else {
      return InvalidArgument(op_where(op) + "y " + dims_string(ydims) + " is not x " + dims_string(x.dims) +
                             " with 1 on the reduced dims");
    }
  }
  if (a.ny > 0 && a.nred > 0) {
    reduction_kernel<<<grid_for(a.ny, 1), kThreads, 0, ctx.stream()>>>(a, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
