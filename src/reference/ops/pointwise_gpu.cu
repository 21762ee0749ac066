// fusebox: the GPU reference of the pointwise ops: one thread per output
// element, inputs broadcast through zero strides.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "common/pointwise_math.cuh"
#include "gpu_util.cuh"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

using namespace gpu;

struct PointwiseArgs {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t count;
  int mode;  // static_cast<int>(PointwiseMode)
  int binary;
  DevTensor in0, in1;  // strides already 0 along broadcast dims
};

__global__ void pointwise_kernel(PointwiseArgs args, float* y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < args.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = i, off0 = 0, off1 = 0;
    for (int d = args.rank - 1; d >= 0; --d) {
      const int64_t c = rem % args.out_dims[d];
      rem /= args.out_dims[d];
      off0 += c * args.in0.strides[d];
      off1 += c * args.in1.strides[d];
    }
    const float a = load_at(args.in0, off0);
    const float b = args.binary ? load_at(args.in1, off1) : 0.0f;
    y[i] = common::pointwise_apply(static_cast<PointwiseMode>(args.mode), a, b);
  }
}

}  // namespace

Status run_gpu(GpuOpContext& ctx, const ResolvedOp& op, const PointwiseAttrs& pw) {
  FUSEBOX_ASSIGN_OR_RETURN(const int yidx, ctx.output_index("y"));
  const std::vector<int64_t>& ydims = ctx.graph().tensors[yidx].dims;
  std::vector<std::string> roles;
  for (std::string_view r : op_input_roles(op.attrs)) roles.emplace_back(r);
  std::vector<Located> in;
  for (const std::string& role : roles) {
    FUSEBOX_ASSIGN_OR_RETURN(Located l, ctx.in(role));
    in.push_back(l);
  }
  FUSEBOX_ASSIGN_OR_RETURN(float* y, ctx.destination(yidx));
  const int64_t count = product(ydims);
  if (static_cast<int>(pw.mode) < 0 || pw.mode > PointwiseMode::kTanhBwd)
    return NotSupported(op_where(op) + "the GPU reference does not implement this pointwise mode");
  PointwiseArgs a{};
  a.rank = static_cast<int>(ydims.size());
  for (int d = 0; d < a.rank; ++d) a.out_dims[d] = ydims[d];
  a.count = count;
  a.mode = static_cast<int>(pw.mode);
  a.binary = in.size() == 2;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::vector<int64_t> p(in[i].dims);
    if (product(p) != 1) {
      if (p.size() > ydims.size())
        return InvalidArgument(op_where(op) + "input '" + roles[i] + "' has more dims than the output");
      for (size_t d = 0; d < p.size(); ++d) {
        const int64_t od = ydims[ydims.size() - p.size() + d];
        if (p[d] != 1 && p[d] != od)
          return InvalidArgument(op_where(op) + "input '" + roles[i] + "' dims " + dims_string(p) +
                                 " do not broadcast to " + dims_string(ydims));
      }
    }
    (i == 0 ? a.in0 : a.in1) = broadcast_to(in[i], ydims);
  }
  if (count > 0) {
    pointwise_kernel<<<grid_for(count, 256), 256, 0, ctx.stream()>>>(a, y);
    FUSEBOX_CUDA_RETURN(op_where(op), cudaGetLastError());
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail
