// fusebox kernels layer: the last resort of "every valid graph runs" (issue 29). A graph no
// cuDNN engine runs, alone or split (a single op of a partition), runs on fusebox's naive GPU
// reference (include/fusebox/reference.h): every op in fp32 with fp32 accumulation, one thread
// per output value, then each output stored in its graph dtype and strides. Correct by
// construction (it is what every plan is verified against), and slow: the build report says so,
// and a cuDNN engine is always preferred where one builds.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>

#include "common/cuda_status.h"
#include "dtype_access.cuh"
#include "fusebox/reference.h"
#include "kernel_base.h"

namespace fusebox::kernels {

namespace {

constexpr int kMaxRank = 8;

struct StoreShape {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};

// Writes `count` fp32 values, logical row-major, to `dst` in `dtype` through `sh`'s strides.
__global__ void store_kernel(const float* src, void* dst, int dtype, StoreShape sh, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i, off = 0;
    for (int d = sh.rank - 1; d >= 0; --d) {
      off += (rest % sh.dims[d]) * sh.strides[d];
      rest /= sh.dims[d];
    }
    const float v = src[i];
    switch (static_cast<DType>(dtype)) {
      case DType::kFP8E4M3:
        static_cast<__nv_fp8_e4m3*>(dst)[off] = __nv_fp8_e4m3(v);  // saturating, as cuDNN's fp8 outputs
        break;
      case DType::kFP8E5M2:
        static_cast<__nv_fp8_e5m2*>(dst)[off] = __nv_fp8_e5m2(v);
        break;
      case DType::kInt32:
        static_cast<int32_t*>(dst)[off] = static_cast<int32_t>(rintf(v));
        break;
      case DType::kInt64:
        static_cast<int64_t*>(dst)[off] = static_cast<int64_t>(rintf(v));
        break;
      case DType::kUInt8:
        static_cast<uint8_t*>(dst)[off] = static_cast<uint8_t>(rintf(v));
        break;
      default:
        store_from_float(dst, dtype, off, v);
        break;
    }
  }
}

__global__ void fill_kernel(float* dst, float v, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = v;
}

// An attention op's dropout probability (0 without dropout or for an op without it).
double dropout_of(const ResolvedOp& op) {
  const SdpaOptions* o = sdpa_options(op.attrs);
  return o ? o->dropout.value_or(0.0) : 0.0;
}

class ReferenceKernel final : public KernelBase {
 public:
  explicit ReferenceKernel(const ResolvedGraph& g) : g_(g) {
    name_ = kReferenceKernelName;
    where_ = "[graph '" + g.name + "'] " + name_ + ": ";
    const std::vector<int> outputs = g.output_tensors();
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      const ResolvedTensor& t = g.tensors[i];
      if (t.is_virtual || t.scalar_value) continue;
      const bool written = std::find(outputs.begin(), outputs.end(), static_cast<int>(i)) != outputs.end();
      (written ? outputs_ : inputs_).push_back({static_cast<int>(i), tensors_.size()});
      tensors_.push_back(t.name);
    }
    // Dropout exactly 0 keeps every element: its keep-mask output is all ones (make_reference_kernel
    // refuses a mask of any other probability: cuDNN's generator draws it).
    for (const ResolvedOp& op : g.ops)
      if (auto m = op.outputs.find("dropout_mask"); m != op.outputs.end()) all_kept_.push_back(m->second);
  }

  Status launch(void* const* ptrs, void* stream_ptr) const override {
    auto stream = static_cast<cudaStream_t>(stream_ptr);
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    FUSEBOX_RETURN_IF_ERROR(
        common::cuda_status(cudaStreamIsCapturing(stream, &capturing), where_, "cudaStreamIsCapturing"));
    if (capturing != cudaStreamCaptureStatusNone) {
      return NotSupported(where_ +
                          "fusebox's reference kernels synchronize the stream between ops and cannot be "
                          "captured in a CUDA graph; run this plan eagerly (no cuDNN engine runs its graph)");
    }
    std::map<std::string, const void*> in;
    for (const Slot& x : inputs_) in[g_.tensors[static_cast<size_t>(x.tensor)].name] = ptrs[x.ptr];
    // fp32 row-major results, freed in stream order on every return.
    struct Scratch {
      cudaStream_t stream;
      std::map<std::string, float*> out;
      ~Scratch() {
        for (auto& [_, p] : out) cudaFreeAsync(p, stream);
      }
    } scratch{stream, {}};
    for (const Slot& x : outputs_) {
      const ResolvedTensor& t = g_.tensors[static_cast<size_t>(x.tensor)];
      float* p = nullptr;
      const size_t bytes = static_cast<size_t>(std::max<int64_t>(1, t.element_count())) * sizeof(float);
      FUSEBOX_RETURN_IF_ERROR(
          common::cuda_status(cudaMallocAsync(reinterpret_cast<void**>(&p), bytes, stream),
                              where_ + "output '" + t.name + "': ", "cudaMallocAsync"));
      scratch.out[t.name] = p;
    }
    FUSEBOX_RETURN_IF_ERROR(reference_gpu(g_, in, scratch.out, stream));
    for (int idx : all_kept_) {  // never computed by the references (an input to them)
      const ResolvedTensor& t = g_.tensors[static_cast<size_t>(idx)];
      auto it = scratch.out.find(t.name);
      if (it == scratch.out.end() || t.element_count() == 0) continue;
      fill_kernel<<<grid_stride_blocks(t.element_count(), 256), 256, 0, stream>>>(it->second, 1.0f,
                                                                                  t.element_count());
      FUSEBOX_RETURN_IF_ERROR(
          common::cuda_status(cudaGetLastError(), where_ + "output '" + t.name + "': ", "fill_kernel"));
    }
    for (const Slot& x : outputs_) {
      const ResolvedTensor& t = g_.tensors[static_cast<size_t>(x.tensor)];
      StoreShape sh;
      sh.rank = static_cast<int>(t.dims.size());
      for (int d = 0; d < sh.rank; ++d) {
        sh.dims[d] = t.dims[d];
        sh.strides[d] = t.strides[d];
      }
      const int64_t count = t.element_count();
      if (count == 0) continue;
      store_kernel<<<grid_stride_blocks(count, 256), 256, 0, stream>>>(scratch.out.at(t.name), ptrs[x.ptr],
                                                                       static_cast<int>(t.dtype), sh, count);
      FUSEBOX_RETURN_IF_ERROR(
          common::cuda_status(cudaGetLastError(), where_ + "output '" + t.name + "': ", "store_kernel"));
    }
    return Status::Ok();
  }

 private:
  // A tensor the kernel reads or writes: its index in g_ and its pointer's place in launch().
  struct Slot {
    int tensor;
    size_t ptr;
  };
  ResolvedGraph g_;
  std::vector<Slot> inputs_, outputs_;
  std::vector<int> all_kept_;  // keep-mask outputs of dropout 0
};

}  // namespace

Result<std::shared_ptr<const NativeKernel>> make_reference_kernel(const ResolvedGraph& g) {
  const std::string where = "[graph '" + g.name + "'] " + std::string(kReferenceKernelName) + ": ";
  for (const ResolvedTensor& t : g.tensors) {
    if (t.dims.size() > kMaxRank)
      return NotSupported(where + "tensor '" + t.name + "' has rank " + std::to_string(t.dims.size()) +
                          "; the reference kernels take rank <= 8");
    if (!t.is_virtual && !t.scalar_value && t.strides.size() != t.dims.size())
      return InvalidArgument(where + "tensor '" + t.name + "' has no strides");
  }
  for (const ResolvedOp& op : g.ops) {
    if (op.outputs.count("dropout_mask") && dropout_of(op) > 0) {
      return NotSupported(where + "op '" + op.name +
                          "' draws a dropout mask with cuDNN's random generator, which the reference "
                          "kernels only read; it needs a cuDNN engine (dropout 0, which keeps every "
                          "element, runs here)");
    }
  }
  return std::shared_ptr<const NativeKernel>(std::make_shared<ReferenceKernel>(g));
}

}  // namespace fusebox::kernels
