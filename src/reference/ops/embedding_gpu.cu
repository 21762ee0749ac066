// fusebox: the GPU reference of the embedding lookup: one thread per output
// element, reading every tensor through its strides (independent of
// fusebox's own kernel in src/kernels/, which reads rows vectorized).
#include <cuda_runtime.h>

#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

__global__ void embedding_reference_kernel(DevTensor ids, DevTensor table, DevTensor add, bool has_add,
                                           int64_t n, int64_t v, int64_t h, int64_t p, float* y) {
  const int64_t total = n * h;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / h, c = i % h;
    const float idf = load_at(ids, r * ids.strides[0]);
    float out = NAN;
    if (idf >= 0.f && idf < static_cast<float>(v)) {
      const int64_t row = static_cast<int64_t>(idf);
      double s = load_at(table, row * table.strides[0] + c * table.strides[1]);
      if (has_add) s += load_at(add, (r % p) * add.strides[0] + c * add.strides[1]);
      out = static_cast<float>(s);
    }
    y[i] = out;
  }
}

// embedding_bwd: one thread per column, summing the rows of dy in the order of n.
__global__ void embedding_bwd_reference_kernel(DevTensor ids, DevTensor dy, int64_t n, int64_t v, int64_t h,
                                               float* dtable) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < h;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t row = 0; row < v; ++row) dtable[row * h + c] = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      const float idf = load_at(ids, r * ids.strides[0]);
      if (!(idf >= 0.f && idf < static_cast<float>(v))) continue;
      dtable[static_cast<int64_t>(idf) * h + c] += load_at(dy, r * dy.strides[0] + c * dy.strides[1]);
    }
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const EmbeddingAttrs& a) {
  if (a.backward) {
    FUSEBOX_ASSIGN_OR_RETURN(const int didx, ctx.output_index("dtable"));
    FUSEBOX_ASSIGN_OR_RETURN(Located ids, ctx.in("ids"));
    FUSEBOX_ASSIGN_OR_RETURN(Located dy, ctx.in("dy"));
    FUSEBOX_ASSIGN_OR_RETURN(float* dtable, ctx.destination(didx));
    if (ids.dims.size() != 4 || dy.dims.size() != 4)
      return InvalidArgument(op_where(op) + "ids and dy must have rank 4");
    const int64_t n = ids.dims[0], h = dy.dims[1];
    if (h > 0) {
      embedding_bwd_reference_kernel<<<grid_for(h, 128), 128, 0, ctx.stream()>>>(ids.t, dy.t, n, a.rows, h,
                                                                                 dtable);
      FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
    }
    return Status::Ok();
  }
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  FUSEBOX_ASSIGN_OR_RETURN(Located ids, ctx.in("ids"));
  FUSEBOX_ASSIGN_OR_RETURN(Located table, ctx.in("table"));
  Located add;
  if (a.add) {
    FUSEBOX_ASSIGN_OR_RETURN(add, ctx.in("add"));
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  if (ids.dims.size() != 4 || table.dims.size() != 4 || (a.add && add.dims.size() != 4))
    return InvalidArgument(op_where(op) + "ids, table and add must have rank 4");
  const int64_t n = ids.dims[0], v = table.dims[0], h = table.dims[1], p = a.add ? add.dims[0] : 1;
  if (n * h > 0) {
    embedding_reference_kernel<<<grid_for(n * h, 256), 256, 0, ctx.stream()>>>(ids.t, table.t, add.t, a.add,
                                                                               n, v, h, p, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
