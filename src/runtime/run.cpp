// run_plan: buffers, poisoning, execution, verification, timing.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "fusebox/runtime.h"

namespace fusebox {
namespace {

Status cuda_check(cudaError_t err, const std::string& where) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError, where + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// Device memory that frees itself.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  Status allocate(size_t bytes, const std::string& what) {
    bytes_ = bytes;
    if (bytes == 0) return Status::Ok();
    return cuda_check(cudaMalloc(&ptr_, bytes), "cudaMalloc " + std::to_string(bytes) + " bytes for " + what);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

LatencyStats summarize(std::vector<float> ms) {
  LatencyStats s;
  s.iters = static_cast<int>(ms.size());
  if (ms.empty()) return s;
  std::sort(ms.begin(), ms.end());
  s.min_ms = ms.front();
  s.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  s.p90_ms = ms[std::min(ms.size() - 1, static_cast<size_t>(0.9 * static_cast<double>(ms.size())))];
  double sum = 0;
  for (float v : ms) sum += v;
  s.mean_ms = sum / static_cast<double>(ms.size());
  return s;
}

}  // namespace

Status verify_status(const RunResult& r) {
  if (r.verified_ok) return Status::Ok();
  std::string msg = "outputs do not match the " + r.reference_kind + " reference:";
  for (const auto& c : r.comparisons) {
    if (!c.pass) msg += "\n  " + c.ToString();
  }
  return Status(StatusCode::kVerificationFailed, msg);
}

Result<RunResult> run_plan(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx, const RunOptions& options) {
  RunResult result;
  result.engine = plan.engine_name();
  result.workspace_bytes = plan.workspace_bytes();
  auto stream = static_cast<cudaStream_t>(ctx.stream());

  // Host inputs: the caller's, else seeded random (never constant).
  for (int i : g.input_tensors()) {
    const ResolvedTensor& t = g.tensors[i];
    if (t.scalar_value) continue;
    auto it = options.inputs.find(t.name);
    result.inputs[t.name] = it != options.inputs.end() ? it->second : random_tensor(t, options.seed);
  }
  for (const auto& [name, _] : options.inputs) {
    if (!result.inputs.count(name)) {
      return InvalidArgument("input '" + name + "' is not an input tensor of graph '" + g.name + "'");
    }
  }

  // Device buffers for every non-virtual tensor; outputs poisoned with NaN bytes.
  std::map<std::string, DeviceBuffer> buffers;
  std::map<std::string, void*> pointers;
  for (const ResolvedTensor& t : g.tensors) {
    if (t.is_virtual || t.scalar_value) continue;
    DeviceBuffer& b = buffers[t.name];
    FUSEBOX_RETURN_IF_ERROR(b.allocate(static_cast<size_t>(t.storage_bytes()), "tensor '" + t.name + "'"));
    pointers[t.name] = b.get();
    if (t.is_input) {
      const HostTensor& h = result.inputs[t.name];
      if (h.data.size() != b.bytes()) {
        return InvalidArgument("input '" + t.name + "' holds " + std::to_string(h.data.size()) +
                               " bytes; the tensor's storage needs " + std::to_string(b.bytes()));
      }
      FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaMemcpyAsync(b.get(), h.data.data(), b.bytes(), cudaMemcpyHostToDevice, stream),
                                         "upload '" + t.name + "'"));
    } else {
      FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaMemsetAsync(b.get(), 0xFF, b.bytes(), stream), "poison '" + t.name + "'"));
    }
  }
  DeviceBuffer workspace;
  FUSEBOX_RETURN_IF_ERROR(workspace.allocate(static_cast<size_t>(plan.workspace_bytes()), "workspace"));

  FUSEBOX_RETURN_IF_ERROR(plan.execute(ctx, pointers, workspace.get()));
  FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(stream), "execute '" + plan.engine_name() + "'"));

  for (int i : g.output_tensors()) {
    const ResolvedTensor& t = g.tensors[i];
    HostTensor h = HostTensor::like(t);
    FUSEBOX_RETURN_IF_ERROR(cuda_check(
        cudaMemcpy(h.data.data(), buffers[t.name].get(), h.data.size(), cudaMemcpyDeviceToHost), "download '" + t.name + "'"));
    result.outputs[t.name] = std::move(h);
  }

  if (options.verify) {
    ReferenceOutputs ref;
    if (g.flops() <= options.cpu_reference_max_flops || !gpu_reference_available()) {
      result.reference_kind = "cpu";
      FUSEBOX_ASSIGN_OR_RETURN(ref, reference_cpu(g, result.inputs));
    } else {
      result.reference_kind = "gpu";
      std::map<std::string, const void*> d_in;
      std::map<std::string, float*> d_out;
      std::map<std::string, DeviceBuffer> ref_buffers;
      for (const auto& [name, _] : result.inputs) d_in[name] = buffers[name].get();
      for (int i : g.output_tensors()) {
        const ResolvedTensor& t = g.tensors[i];
        DeviceBuffer& b = ref_buffers[t.name];
        FUSEBOX_RETURN_IF_ERROR(b.allocate(static_cast<size_t>(t.element_count()) * sizeof(float), "reference '" + t.name + "'"));
        d_out[t.name] = static_cast<float*>(b.get());
      }
      FUSEBOX_RETURN_IF_ERROR(reference_gpu(g, d_in, d_out, stream));
      FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaStreamSynchronize(stream), "GPU reference"));
      for (auto& [name, b] : ref_buffers) {
        std::vector<float> v(b.bytes() / sizeof(float));
        FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), "download reference"));
        ref[name] = std::move(v);
      }
    }
    for (const auto& [name, out] : result.outputs) {
      auto it = ref.find(name);
      if (it == ref.end()) return Internal("the reference produced no output '" + name + "'");
      Comparison c = compare(name, it->second, out.to_float_logical(), default_tolerance(out.dtype));
      result.verified_ok = result.verified_ok && c.pass;
      result.comparisons.push_back(std::move(c));
    }
  }

  if (options.iters > 0) {
    for (int i = 0; i < options.warmup; ++i) FUSEBOX_RETURN_IF_ERROR(plan.execute(ctx, pointers, workspace.get()));
    std::vector<cudaEvent_t> events(2 * static_cast<size_t>(options.iters));
    for (auto& e : events) FUSEBOX_RETURN_IF_ERROR(cuda_check(cudaEventCreate(&e), "cudaEventCreate"));
    Status st;
    for (int i = 0; i < options.iters && st.ok(); ++i) {
      cudaEventRecord(events[2 * i], stream);
      st = plan.execute(ctx, pointers, workspace.get());
      cudaEventRecord(events[2 * i + 1], stream);
    }
    if (st.ok()) st = cuda_check(cudaStreamSynchronize(stream), "timed runs");
    std::vector<float> ms(static_cast<size_t>(options.iters));
    for (int i = 0; i < options.iters && st.ok(); ++i) {
      st = cuda_check(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
    }
    for (auto& e : events) cudaEventDestroy(e);
    FUSEBOX_RETURN_IF_ERROR(st);
    result.latency = summarize(std::move(ms));
    if (result.latency.median_ms > 0) {
      result.tflops = g.flops() / (result.latency.median_ms * 1e-3) / 1e12;
      result.gbps = g.bytes_moved() / (result.latency.median_ms * 1e-3) / 1e9;
    }
  }
  return result;
}

}  // namespace fusebox
