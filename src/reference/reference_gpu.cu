// fusebox: the naive GPU reference's driver. fp32 accumulation; inputs are
// read in their graph dtype and strides; tensors produced by ops live in
// fp32, logical row-major buffers. Each op family's kernels are in
// ops/<family>_gpu.cu (ops/ops.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <variant>

#include "fusebox/reference.h"
#include "ops/gpu_context.cuh"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::op_where;
using reference_detail::product;

bool gpu_reference_available() { return true; }

namespace reference_detail {

gpu::DevTensor gpu::broadcast_to(const Located& in, const std::vector<int64_t>& out_dims) {
  DevTensor t = in.t;
  const int rank = static_cast<int>(out_dims.size());
  const int pad = rank - static_cast<int>(in.dims.size());
  const bool scalar = product(in.dims) == 1;
  t.rank = rank;
  for (int d = 0; d < rank; ++d) {
    const int src = d - pad;
    const int64_t dim = src >= 0 ? in.dims[src] : 1;
    t.dims[d] = dim;
    t.strides[d] = (scalar || dim == 1 || src < 0) ? 0 : in.t.strides[src];
  }
  return t;
}

GpuRun::~GpuRun() {
  for (float* p : temporaries) cudaFreeAsync(p, stream);  // stream-ordered after the kernels
}

using gpu::kMaxRank;
using gpu::Located;

Result<Located> GpuOpContext::tensor(const std::string& role, int idx) {
  const ResolvedGraph& g = run_.g;
  if (idx < 0 || idx >= static_cast<int>(g.tensors.size()))
    return InvalidArgument(op_where(op_) + "input '" + role + "' refers to a tensor outside the graph");
  if (run_.located[idx]) return *run_.located[idx];
  const ResolvedTensor& t = g.tensors[idx];
  if (t.dims.size() > kMaxRank)
    return NotSupported(op_where(op_) + "tensor '" + t.name + "' has rank " + std::to_string(t.dims.size()) +
                        "; the GPU reference handles rank <= 8");
  Located l;
  l.dims = t.dims;
  l.t.rank = static_cast<int>(t.dims.size());
  l.t.dtype = static_cast<int>(t.dtype);
  for (size_t d = 0; d < t.dims.size(); ++d) {
    l.t.dims[d] = t.dims[d];
    l.t.strides[d] = d < t.strides.size() ? t.strides[d] : 0;
  }
  if (t.scalar_value) {
    l.t.ptr = nullptr;
    l.t.scalar = static_cast<float>(*t.scalar_value);
  } else {
    auto it = run_.inputs.find(t.name);
    if (it == run_.inputs.end() || !it->second)
      return InvalidArgument(op_where(op_) + "input '" + role + "': no device pointer for tensor '" + t.name +
                             "'");
    if (t.strides.size() != t.dims.size())
      return InvalidArgument(op_where(op_) + "tensor '" + t.name + "' has no strides");
    l.t.ptr = it->second;
  }
  run_.located[idx] = l;
  return l;
}

Result<Located> GpuOpContext::in(const std::string& role) {
  auto it = op_.inputs.find(role);
  if (it == op_.inputs.end()) return InvalidArgument(op_where(op_) + "missing input '" + role + "'");
  return tensor(role, it->second);
}

Result<int> GpuOpContext::output_index(const std::string& role) const {
  auto it = op_.outputs.find(role);
  if (it == op_.outputs.end() || it->second < 0 || it->second >= static_cast<int>(run_.g.tensors.size()))
    return InvalidArgument(op_where(op_) + "has no valid output '" + role + "'");
  return it->second;
}

// The caller's buffer for outputs, a temporary otherwise.
Result<float*> GpuOpContext::destination(int idx) {
  const ResolvedTensor& t = run_.g.tensors[idx];
  if (t.dims.size() > kMaxRank) return NotSupported(op_where(op_) + "output '" + t.name + "' has rank > 8");
  float* p = nullptr;
  if (!t.is_virtual) {
    auto it = run_.outputs.find(t.name);
    if (it == run_.outputs.end() || !it->second)
      return InvalidArgument(op_where(op_) + "no device output buffer for tensor '" + t.name + "'");
    p = it->second;
  } else {
    const size_t bytes = std::max<size_t>(1, static_cast<size_t>(product(t.dims))) * sizeof(float);
    FUSEBOX_CUDA_RETURN(op_where(op_), cudaMallocAsync(reinterpret_cast<void**>(&p), bytes, run_.stream));
    run_.temporaries.push_back(p);
  }
  Located l;
  l.dims = t.dims;
  l.t.ptr = p;
  l.t.dtype = static_cast<int>(DType::kFP32);
  l.t.rank = static_cast<int>(t.dims.size());
  const std::vector<int64_t> s = dense_row_major(t.dims);
  for (size_t d = 0; d < t.dims.size(); ++d) l.t.dims[d] = t.dims[d], l.t.strides[d] = s[d];
  run_.located[idx] = l;
  return p;
}

Result<float*> GpuOpContext::temporary(int64_t count) {
  float* p = nullptr;
  FUSEBOX_CUDA_RETURN(
      op_where(op_),
      cudaMallocAsync(reinterpret_cast<void**>(&p),
                      std::max<size_t>(1, static_cast<size_t>(count)) * sizeof(float), run_.stream));
  run_.temporaries.push_back(p);
  return p;
}

}  // namespace reference_detail

namespace {

Status run_graph(const ResolvedGraph& g, const std::map<std::string, const void*>& in,
                 const std::map<std::string, float*>& out, cudaStream_t stream) {
  reference_detail::GpuRun run(g, in, out, stream);
  for (const ResolvedOp& op : g.ops) {
    reference_detail::GpuOpContext ctx(run, op);
    FUSEBOX_RETURN_IF_ERROR(
        std::visit([&](const auto& attrs) { return reference_detail::run_gpu(ctx, op, attrs); }, op.attrs));
  }
  FUSEBOX_CUDA_RETURN("[reference_gpu] ", cudaStreamSynchronize(stream));
  return Status::Ok();
}

}  // namespace

Status reference_gpu(const ResolvedGraph& g, const std::map<std::string, const void*>& device_inputs,
                     const std::map<std::string, float*>& device_outputs, void* stream) {
  try {
    return run_graph(g, device_inputs, device_outputs, static_cast<cudaStream_t>(stream));
  } catch (const std::exception& e) {
    return Internal("[reference_gpu] unexpected exception: " + std::string(e.what()));
  }
}

Result<ReferenceOutputs> reference_gpu_host(const ResolvedGraph& g,
                                            const std::map<std::string, HostTensor>& inputs) {
  const std::string where = "[reference_gpu] graph '" + g.name + "': ";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return Status(StatusCode::kNoDevice, where + "no CUDA GPU");
  }
  // Device buffers freed on every return.
  struct Buffers {
    std::vector<void*> ptrs;
    ~Buffers() {
      for (void* p : ptrs) cudaFree(p);
    }
    Status alloc(size_t bytes, const std::string& where, void** p) {
      FUSEBOX_CUDA_RETURN(where, cudaMalloc(p, std::max<size_t>(bytes, 1)));
      ptrs.push_back(*p);
      return Status::Ok();
    }
  } buffers;
  std::map<std::string, const void*> d_in;
  for (const auto& [name, h] : inputs) {
    void* p = nullptr;
    FUSEBOX_RETURN_IF_ERROR(buffers.alloc(h.data.size(), where + "input '" + name + "': ", &p));
    FUSEBOX_CUDA_RETURN(where, cudaMemcpy(p, h.data.data(), h.data.size(), cudaMemcpyHostToDevice));
    d_in[name] = p;
  }
  // Every output but the dropout masks (inputs to the reference, never computed).
  std::vector<bool> is_mask(g.tensors.size(), false);
  for (const ResolvedOp& op : g.ops) {
    auto m = op.outputs.find("dropout_mask");
    if (m != op.outputs.end() && m->second >= 0 && m->second < static_cast<int>(is_mask.size()))
      is_mask[m->second] = true;
  }
  std::map<std::string, float*> d_out;
  for (int i : g.output_tensors()) {
    if (is_mask[i]) continue;
    const ResolvedTensor& t = g.tensors[i];
    void* p = nullptr;
    FUSEBOX_RETURN_IF_ERROR(buffers.alloc(static_cast<size_t>(t.element_count()) * sizeof(float),
                                          where + "output '" + t.name + "': ", &p));
    d_out[t.name] = static_cast<float*>(p);
  }
  FUSEBOX_RETURN_IF_ERROR(reference_gpu(g, d_in, d_out, nullptr));
  ReferenceOutputs out;
  for (const auto& [name, p] : d_out) {
    std::vector<float> v(static_cast<size_t>(g.tensors[g.find_tensor(name)].element_count()));
    FUSEBOX_CUDA_RETURN(where, cudaMemcpy(v.data(), p, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    out[name] = std::move(v);
  }
  return out;
}

}  // namespace fusebox
