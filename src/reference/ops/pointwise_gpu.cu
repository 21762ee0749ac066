// fusebox: the GPU reference of the pointwise ops: one thread per output
// element, inputs broadcast through zero strides.
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

struct PointwiseArgs {
  int rank;
  int64_t out_dims[kMaxRank];
  int64_t count;
  int mode;  // static_cast<int>(PointwiseMode)
  int binary;
  DevTensor in0, in1;  // strides already 0 along broadcast dims
};

__device__ float apply_pointwise(int mode, float a, float b) {
  switch (static_cast<PointwiseMode>(mode)) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd:
      return a + b;
    case PointwiseMode::kSub:
      return a - b;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale:
      return a * b;
    case PointwiseMode::kRelu:
      return a > 0.0f ? a : 0.0f;
    case PointwiseMode::kGeluTanh: {
      const float k = 0.7978845608028654f;  // sqrt(2/pi)
      return 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
    }
    case PointwiseMode::kGeluErf:
      return 0.5f * a * (1.0f + erff(a * 0.7071067811865476f));
    case PointwiseMode::kSilu:
      return a / (1.0f + expf(-a));
    case PointwiseMode::kSigmoid:
      return 1.0f / (1.0f + expf(-a));
    case PointwiseMode::kTanh:
      return tanhf(a);
    case PointwiseMode::kReluBwd:
      return b > 0.0f ? a : 0.0f;  // a = dy, b = x
    case PointwiseMode::kGeluTanhBwd: {
      const float k = 0.7978845608028654f, t = tanhf(k * (b + 0.044715f * b * b * b));
      return a * (0.5f * (1.0f + t) + 0.5f * b * (1.0f - t * t) * k * (1.0f + 3.0f * 0.044715f * b * b));
    }
    case PointwiseMode::kGeluErfBwd:
      return a *
             (0.5f * (1.0f + erff(b * 0.7071067811865476f)) + b * expf(-0.5f * b * b) * 0.3989422804014327f);
    case PointwiseMode::kSiluBwd: {
      const float s = 1.0f / (1.0f + expf(-b));
      return a * s * (1.0f + b * (1.0f - s));
    }
    case PointwiseMode::kSigmoidBwd: {
      const float s = 1.0f / (1.0f + expf(-b));
      return a * s * (1.0f - s);
    }
    case PointwiseMode::kTanhBwd: {
      const float t = tanhf(b);
      return a * (1.0f - t * t);
    }
  }
  return a;
}

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
    y[i] = apply_pointwise(args.mode, a, b);
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
