// fusebox: the references of transpose (include/fusebox/ops/transpose.h), CPU and GPU in one
// file, and its tolerance. y's logical element i takes x's at the index with j[p_k] = i_k.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "ops/cpu_context.h"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

Status check_permutation(const ResolvedOp& op, const TransposeAttrs& a, const std::vector<int64_t>& xdims) {
  if (a.permutation.size() != xdims.size() || xdims.size() > static_cast<size_t>(kMaxRank)) {
    return InvalidArgument(op_where(op) + "permutation " + dims_string(a.permutation) + " does not fit x " +
                           dims_string(xdims) + " (rank at most " + std::to_string(kMaxRank) + ")");
  }
  return Status::Ok();
}

struct TransposeArgs {
  DevTensor x;  // x's strides taken in y's dim order: xs[k] = x.strides[p_k]
  int rank;
  int64_t ydims[kMaxRank];
  int64_t xs[kMaxRank];
  int64_t ny;
};

__global__ void transpose_kernel(TransposeArgs a, float* y) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < a.ny;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = o, off = 0;
    for (int k = a.rank - 1; k >= 0; --k) {
      off += (rem % a.ydims[k]) * a.xs[k];
      rem /= a.ydims[k];
    }
    y[o] = load_at(a.x, off);
  }
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const TransposeAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  FUSEBOX_RETURN_IF_ERROR(check_permutation(op, a, x->dims));
  const size_t rank = x->dims.size();
  const std::vector<int64_t> xs = dense_row_major(x->dims);
  std::vector<int64_t> ydims(rank), step(rank);
  for (size_t k = 0; k < rank; ++k) {
    ydims[k] = x->dims[static_cast<size_t>(a.permutation[k])];
    step[k] = xs[static_cast<size_t>(a.permutation[k])];
  }
  if (y->dims != ydims)
    return InvalidArgument(op_where(op) + "y " + dims_string(y->dims) + " is not x " + dims_string(x->dims) +
                           " permuted by " + dims_string(a.permutation));
  const int64_t n = product(ydims);
  std::vector<int64_t> idx(rank, 0);
  int64_t xoff = 0;
  for (int64_t i = 0; i < n; ++i) {
    y->data[static_cast<size_t>(i)] = x->data[static_cast<size_t>(xoff)];
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {  // next index of y, carrying xoff
      if (++idx[d] < ydims[d]) {
        xoff += step[d];
        break;
      }
      xoff -= step[d] * (ydims[d] - 1);
      idx[d] = 0;
    }
  }
  return Status::Ok();
}

// The default of y's dtype: the copy itself is exact, but an op fused before it (a matmul
// epilogue) rounds as usual.
Tolerance tolerance(const TransposeAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const TransposeAttrs& ta) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(Located x, ctx.in("x"));
  FUSEBOX_RETURN_IF_ERROR(check_permutation(op, ta, x.dims));
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  TransposeArgs a{};
  a.x = x.t;
  a.rank = static_cast<int>(x.dims.size());
  a.ny = 1;
  for (int k = 0; k < a.rank; ++k) {
    const auto p = static_cast<size_t>(ta.permutation[static_cast<size_t>(k)]);
    a.ydims[k] = x.dims[p];
    a.xs[k] = x.t.strides[p];
    a.ny *= a.ydims[k];
  }
  if (a.ny > 0) {
    transpose_kernel<<<grid_for(a.ny, 256), 256, 0, ctx.stream()>>>(a, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
