// run_plan: buffers, poisoning, execution, verification, timing.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <set>

#include "common/stopwatch.h"
#include "device_buffers.h"
#include "fusebox/runtime.h"

namespace fusebox {
namespace runtime {
namespace {

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

Result<LatencyStats> time_plan(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers, void* workspace,
                               int warmup, int iters) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  for (int i = 0; i < warmup; ++i) FUSEBOX_RETURN_IF_ERROR(plan.execute(ctx, buffers.pointers(i), workspace));
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(iters));
  Status st;
  for (auto& e : events) {
    if (st.ok()) st = cuda_status(cudaEventCreate(&e), "cudaEventCreate");
  }
  for (int i = 0; i < iters && st.ok(); ++i) {
    cudaEventRecord(events[2 * i], stream);
    st = plan.execute(ctx, buffers.pointers(warmup + i), workspace);
    cudaEventRecord(events[2 * i + 1], stream);
  }
  if (st.ok()) st = cuda_status(cudaStreamSynchronize(stream), "timed runs of '" + plan.engine_name() + "'");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters && st.ok(); ++i) {
    st = cuda_status(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]), "cudaEventElapsedTime");
  }
  for (auto& e : events) {
    if (e) cudaEventDestroy(e);
  }
  FUSEBOX_RETURN_IF_ERROR(st);
  return summarize(std::move(ms));
}

Status sample_plan(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers, void* workspace, int calls,
                   int samples, std::vector<double>& gpu_ms, std::vector<double>& host_ms) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  cudaEvent_t ev[2] = {nullptr, nullptr};
  Status st = cuda_status(cudaEventCreate(&ev[0]), "cudaEventCreate");
  if (st.ok()) st = cuda_status(cudaEventCreate(&ev[1]), "cudaEventCreate");
  int k = 0;  // input set rotation, continued across samples
  for (int s = 0; s < samples && st.ok(); ++s) {
    cudaEventRecord(ev[0], stream);
    for (int i = 0; i < calls && st.ok(); ++i) st = plan.execute(ctx, buffers.pointers(k++), workspace);
    cudaEventRecord(ev[1], stream);
    if (st.ok()) st = cuda_status(cudaEventSynchronize(ev[1]), "back-to-back runs of '" + plan.engine_name() + "'");
    float ms = 0;
    if (st.ok()) st = cuda_status(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
    if (st.ok()) gpu_ms.push_back(static_cast<double>(ms) / calls);
  }
  for (int s = 0; s < samples && st.ok(); ++s) {
    const common::Stopwatch watch;
    st = plan.execute(ctx, buffers.pointers(k++), workspace);
    if (st.ok()) st = cuda_status(cudaStreamSynchronize(stream), "synchronized run of '" + plan.engine_name() + "'");
    if (st.ok()) host_ms.push_back(watch.ms());
  }
  for (auto& e : ev) {
    if (e) cudaEventDestroy(e);
  }
  return st;
}

}  // namespace runtime

using runtime::cuda_status;
using runtime::DeviceBuffer;

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

  // Host inputs: the caller's, else fixed values or seeded random (never constant).
  FUSEBOX_ASSIGN_OR_RETURN(result.inputs,
                           make_inputs(g, options.seed, options.inputs, options.cpu_reference_max_flops));
  const double flops = g.flops(input_values_for_flops(g, result.inputs));
  result.flops = flops;

  // Device buffers for every non-virtual tensor; outputs poisoned with NaN
  // bytes; inputs in several copies when timing, so runs rotate through them.
  runtime::GraphBuffers buffers;
  const int sets = options.iters > 0 && options.rotate_inputs ? runtime::rotation_sets_for(g) : 1;
  FUSEBOX_RETURN_IF_ERROR(buffers.prepare(g, result.inputs, sets, stream));
  result.input_sets = buffers.sets();
  DeviceBuffer workspace;
  FUSEBOX_RETURN_IF_ERROR(workspace.allocate(static_cast<size_t>(plan.workspace_bytes()), "workspace"));

  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "upload inputs"));
  const common::Stopwatch first_execute;
  FUSEBOX_RETURN_IF_ERROR(plan.execute(ctx, buffers.pointers(0), workspace.get()));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "execute '" + plan.engine_name() + "'"));
  result.first_execute_ms = first_execute.ms();

  for (int i : g.output_tensors()) {
    const ResolvedTensor& t = g.tensors[i];
    HostTensor h = HostTensor::like(t);
    FUSEBOX_RETURN_IF_ERROR(cuda_status(
        cudaMemcpy(h.data.data(), buffers.device(t.name), h.data.size(), cudaMemcpyDeviceToHost), "download '" + t.name + "'"));
    result.outputs[t.name] = std::move(h);
  }

  if (options.verify) {
    // cuDNN's dumped dropout masks are references' inputs, not outputs to compare.
    std::set<std::string> dropout_masks;
    for (const auto& op : g.ops) {
      auto it = op.outputs.find("dropout_mask");
      if (it != op.outputs.end()) dropout_masks.insert(g.tensors[it->second].name);
    }
    std::map<std::string, HostTensor> ref_inputs = result.inputs;
    for (const auto& name : dropout_masks) ref_inputs[name] = result.outputs.at(name);
    ReferenceOutputs ref;
    if (flops <= options.cpu_reference_max_flops || !gpu_reference_available()) {
      result.reference_kind = "cpu";
      FUSEBOX_ASSIGN_OR_RETURN(ref, reference_cpu(g, ref_inputs));
    } else {
      result.reference_kind = "gpu";
      std::map<std::string, const void*> d_in;
      std::map<std::string, float*> d_out;
      std::map<std::string, DeviceBuffer> ref_buffers;
      for (const auto& [name, _] : ref_inputs) d_in[name] = buffers.device(name);
      for (int i : g.output_tensors()) {
        const ResolvedTensor& t = g.tensors[i];
        if (dropout_masks.count(t.name)) continue;
        DeviceBuffer& b = ref_buffers[t.name];
        FUSEBOX_RETURN_IF_ERROR(b.allocate(static_cast<size_t>(t.element_count()) * sizeof(float), "reference '" + t.name + "'"));
        d_out[t.name] = static_cast<float*>(b.get());
      }
      FUSEBOX_RETURN_IF_ERROR(reference_gpu(g, d_in, d_out, stream));
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "GPU reference"));
      for (auto& [name, b] : ref_buffers) {
        std::vector<float> v(b.bytes() / sizeof(float));
        FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost), "download reference"));
        ref[name] = std::move(v);
      }
    }
    // Values cuDNN does not define (padded attention rows) are zeroed on both sides.
    std::map<std::string, std::vector<float>> actual;
    for (const auto& [name, out] : result.outputs) actual[name] = out.to_float_logical();
    FUSEBOX_RETURN_IF_ERROR(mask_dont_care(g, result.inputs, actual));
    FUSEBOX_RETURN_IF_ERROR(mask_dont_care(g, result.inputs, ref));
    // The masks themselves: only 0 and 1, kept at rate 1 - p.
    FUSEBOX_ASSIGN_OR_RETURN(std::vector<Comparison> mask_checks, check_dropout_masks(g, result.inputs, actual));
    for (Comparison& c : mask_checks) {
      result.verified_ok = result.verified_ok && c.pass;
      result.comparisons.push_back(std::move(c));
    }
    for (const auto& [name, out] : actual) {
      if (dropout_masks.count(name)) continue;
      auto it = ref.find(name);
      if (it == ref.end()) return Internal("the reference produced no output '" + name + "'");
      Comparison c = compare(name, it->second, out, tolerance_for(g, name));
      result.verified_ok = result.verified_ok && c.pass;
      result.comparisons.push_back(std::move(c));
    }
  }

  if (options.iters > 0) {
    FUSEBOX_ASSIGN_OR_RETURN(result.latency,
                             runtime::time_plan(plan, ctx, buffers, workspace.get(), options.warmup, options.iters));
    if (result.latency.median_ms > 0) {
      result.tflops = flops / (result.latency.median_ms * 1e-3) / 1e12;
      result.gbps = g.bytes_moved() / (result.latency.median_ms * 1e-3) / 1e9;
    }
    if (options.samples > 0) {
      FUSEBOX_RETURN_IF_ERROR(runtime::sample_plan(plan, ctx, buffers, workspace.get(), options.iters,
                                                   options.samples, result.gpu_time_ms, result.host_latency_ms));
    }
  }
  return result;
}

}  // namespace fusebox
