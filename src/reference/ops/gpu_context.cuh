// fusebox: what a GPU reference of one op sees of the driver (private to the
// reference layer; the driver is reference_gpu.cu), and the host-side helpers
// the families share. Device helpers: reference/gpu_util.cuh.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_status.h"
#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::reference_detail {

namespace gpu {

constexpr int kMaxRank = 8;

// How a kernel reads one tensor: pointer, dtype and strides (in elements).
// Passed by value; dims are left-padded with 1s to the kernel's rank.
struct DevTensor {
  const void* ptr = nullptr;
  int dtype = 0;  // static_cast<int>(DType)
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  float scalar = 0;  // used when ptr == nullptr (a by-value scalar)
};

// Where a tensor's values are on the device, and how to read them.
struct Located {
  DevTensor t;
  std::vector<int64_t> dims;
};

// Broadcasts `in` (dims d) to rank `rank` over `out_dims`: left-pads and zeroes
// the strides of size-1 dims (and of every dim for a one-element tensor).
DevTensor broadcast_to(const Located& in, const std::vector<int64_t>& out_dims);

inline int grid_for(int64_t count, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((count + threads - 1) / threads, 1 << 20)));
}

}  // namespace gpu

#define FUSEBOX_CUDA_RETURN(where, expr) \
  FUSEBOX_RETURN_IF_ERROR(::fusebox::common::cuda_status((expr), (where), #expr))

// The state of one GPU reference run: the caller's buffers, where each
// tensor is, and the temporaries to free (the driver's; reference_gpu.cu).
struct GpuRun {
  GpuRun(const ResolvedGraph& g, const std::map<std::string, const void*>& in,
         const std::map<std::string, float*>& out, cudaStream_t stream)
      : g(g), inputs(in), outputs(out), stream(stream), located(g.tensors.size()) {}
  ~GpuRun();

  const ResolvedGraph& g;
  const std::map<std::string, const void*>& inputs;
  const std::map<std::string, float*>& outputs;
  cudaStream_t stream;
  std::vector<std::optional<gpu::Located>> located;
  std::vector<float*> temporaries;
};

// One op's tensors during a GPU reference run. Inputs are read where they
// are (graph dtype and strides); tensors ops produce are fp32, logical
// row-major: the caller's output buffers, else temporaries.
class GpuOpContext {
 public:
  GpuOpContext(GpuRun& run, const ResolvedOp& op) : run_(run), op_(op) {}

  const ResolvedGraph& graph() const { return run_.g; }
  // The caller's device inputs by tensor name.
  const std::map<std::string, const void*>& device_inputs() const { return run_.inputs; }
  cudaStream_t stream() const { return run_.stream; }

  // Input `role` of the op; InvalidArgument when it has none.
  Result<gpu::Located> in(const std::string& role);
  // Tensor `idx` read as input `role` (the role names it in messages).
  Result<gpu::Located> tensor(const std::string& role, int idx);
  // The index of output `role`; InvalidArgument when the op has no valid one.
  Result<int> output_index(const std::string& role) const;
  // The fp32 buffer that receives tensor `idx`, from then on where later ops read it.
  Result<float*> destination(int idx);
  // A device buffer of `count` floats, freed after the run.
  Result<float*> temporary(int64_t count);

 private:
  GpuRun& run_;
  const ResolvedOp& op_;
};

}  // namespace fusebox::reference_detail
