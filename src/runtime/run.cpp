// run_plan: buffers, poisoning, execution, verification, timing.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <set>

#include "common/stopwatch.h"
#include "device_buffers.h"
#include "fusebox/cuda_graph.h"
#include "fusebox/op_traits.h"
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

// RunOptions::cuda_graph: one bound plan and one CUDA graph per input set.
struct GraphRunner {
  std::shared_ptr<WorkspaceBinding> workspace;
  std::vector<std::unique_ptr<BoundPlan>> bound;  // stable addresses: the graphs point at them
  std::vector<CudaGraph> graphs;

  // One bound plan per input set (no graphs).
  Status bind(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers, void* ws) {
    workspace = std::make_shared<WorkspaceBinding>(WorkspaceBinding{ws, plan.workspace_bytes(), 1});
    for (int s = 0; s < buffers.sets(); ++s) {
      FUSEBOX_ASSIGN_OR_RETURN(BoundPlan b, BoundPlan::bind(plan, ctx, buffers.pointers(s), workspace));
      bound.push_back(std::make_unique<BoundPlan>(std::move(b)));
    }
    return Status::Ok();
  }
  // bind(), and a one-execute CUDA graph of each.
  Status record(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers, void* ws) {
    FUSEBOX_RETURN_IF_ERROR(bind(plan, ctx, buffers, ws));
    for (const auto& b : bound) {
      FUSEBOX_ASSIGN_OR_RETURN(CudaGraph cg, CudaGraph::create({b.get()}));
      graphs.push_back(std::move(cg));
    }
    return Status::Ok();
  }
  // GPU time per execute of one CUDA graph of `calls` executes (the bound plans in rotation),
  // launched once untimed, then `samples` times between two events.
  Status time_chain(GpuContext& ctx, int calls, int samples, std::vector<double>& gpu_ms) const;
};

Result<LatencyStats> time_calls(cudaStream_t stream, int warmup, int iters,
                                const std::function<Status(int)>& run, const std::string& what) {
  for (int i = 0; i < warmup; ++i) FUSEBOX_RETURN_IF_ERROR(run(i));
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(iters), nullptr);
  Status st;
  for (auto& e : events) {
    if (st.ok()) st = cuda_status(cudaEventCreate(&e), "cudaEventCreate");
  }
  for (int i = 0; i < iters && st.ok(); ++i) {
    cudaEventRecord(events[2 * i], stream);
    st = run(warmup + i);
    cudaEventRecord(events[2 * i + 1], stream);
  }
  if (st.ok()) st = cuda_status(cudaStreamSynchronize(stream), what);
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

// `iters` launches of the graphs (rotating the input sets) each between two events.
Result<LatencyStats> time_graphs(std::vector<CudaGraph>& graphs, GpuContext& ctx, int warmup, int iters) {
  return time_calls(
      static_cast<cudaStream_t>(ctx.stream()), warmup, iters,
      [&](int i) { return graphs[static_cast<size_t>(i) % graphs.size()].launch(); },
      "timed CUDA graph launches");
}

Status GraphRunner::time_chain(GpuContext& ctx, int calls, int samples, std::vector<double>& gpu_ms) const {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  std::vector<BoundPlan*> chain;
  for (int i = 0; i < calls; ++i) chain.push_back(bound[static_cast<size_t>(i) % bound.size()].get());
  FUSEBOX_ASSIGN_OR_RETURN(CudaGraph many, CudaGraph::create(chain));
  cudaEvent_t ev[2] = {nullptr, nullptr};
  Status st = cuda_status(cudaEventCreate(&ev[0]), "cudaEventCreate");
  if (st.ok()) st = cuda_status(cudaEventCreate(&ev[1]), "cudaEventCreate");
  if (st.ok()) st = many.launch();  // warm-up: the graph's first launch uploads it
  for (int s = 0; s < samples && st.ok(); ++s) {
    cudaEventRecord(ev[0], stream);
    st = many.launch();
    cudaEventRecord(ev[1], stream);
    if (st.ok())
      st = cuda_status(cudaEventSynchronize(ev[1]), "CUDA graph of " + std::to_string(calls) + " executes");
    float ms = 0;
    if (st.ok()) st = cuda_status(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
    if (st.ok()) gpu_ms.push_back(static_cast<double>(ms) / calls);
  }
  for (auto& e : ev) {
    if (e) cudaEventDestroy(e);
  }
  return st;
}

// Samples through CUDA graphs: GPU time per execute of one graph of `calls`
// executes back to back (input sets in rotation), and host latency of one
// launch of a one-execute graph until its stream is synchronized.
Status sample_graphs(GraphRunner& runner, GpuContext& ctx, int calls, int samples,
                     std::vector<double>& gpu_ms, std::vector<double>& host_ms) {
  auto stream = static_cast<cudaStream_t>(ctx.stream());
  Status st = runner.time_chain(ctx, calls, samples, gpu_ms);
  for (int s = 0; s < samples && st.ok(); ++s) {
    const common::Stopwatch watch;
    st = runner.graphs[s % runner.graphs.size()].launch();
    if (st.ok()) st = cuda_status(cudaStreamSynchronize(stream), "synchronized CUDA graph launch");
    if (st.ok()) host_ms.push_back(watch.ms());
  }
  return st;
}

namespace {

// Byte-for-byte comparison of the graph's outputs with the eager ones.
void compare_bytes(const std::map<std::string, HostTensor>& eager,
                   const std::map<std::string, HostTensor>& graph, CudaGraphRun& out) {
  out.bit_identical = true;
  for (const auto& [name, e] : eager) {
    auto it = graph.find(name);
    if (it == graph.end() || it->second.data.size() != e.data.size()) {
      out.bit_identical = false;
      out.mismatches.push_back(name + ": missing or of another size in the CUDA graph's outputs");
      continue;
    }
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < e.data.size(); ++i) {
      if (e.data[i] != it->second.data[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++differ;
      }
    }
    out.bytes_compared += static_cast<int64_t>(e.data.size());
    if (differ) {
      out.bit_identical = false;
      out.mismatches.push_back(name + ": " + std::to_string(differ) + " of " + std::to_string(e.data.size()) +
                               " bytes differ, first at byte " + std::to_string(first));
    }
  }
}

}  // namespace

Status check_graph_outputs(const std::map<std::string, HostTensor>& eager,
                           const std::map<std::string, HostTensor>& graph,
                           const std::string& not_reproducible,
                           const std::function<Tolerance(const std::string&)>& tolerance,
                           const std::string& what, CudaGraphRun& out) {
  compare_bytes(eager, graph, out);
  if (out.bit_identical) return Status::Ok();
  if (!not_reproducible.empty()) {
    out.not_reproducible = not_reproducible;
    out.within_tolerance = true;
    out.mismatches.clear();
    for (const auto& [name, e] : eager) {
      auto it = graph.find(name);
      if (it == graph.end() || it->second.data.size() != e.data.size()) {
        out.within_tolerance = false;
        out.mismatches.push_back(name + ": missing or of another size in the CUDA graph's outputs");
        continue;
      }
      Comparison c = compare(name, e.to_float_logical(), it->second.to_float_logical(), tolerance(name));
      out.within_tolerance = out.within_tolerance && c.pass;
      out.mismatches.push_back(c.ToString());
    }
    if (out.within_tolerance) return Status::Ok();
  }
  std::string msg =
      what + " (" + out.recording + " recording)" +
      (out.not_reproducible.empty() ? ":" : ", beyond tolerance (" + out.not_reproducible + "):");
  for (const auto& m : out.mismatches) msg += "\n  " + m;
  return Status(StatusCode::kVerificationFailed, msg);
}

}  // namespace runtime

std::string not_bit_reproducible(const ResolvedGraph& g) {
  for (const auto& op : g.ops) {
    if (std::string why = op_not_bit_reproducible(g, op); !why.empty()) return why;
  }
  return "";
}

namespace runtime {

Result<LatencyStats> time_plan(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers,
                               void* workspace, int warmup, int iters) {
  return time_calls(
      static_cast<cudaStream_t>(ctx.stream()), warmup, iters,
      [&](int i) { return plan.execute(ctx, buffers.pointers(i), workspace); },
      "timed runs of '" + plan.engine_name() + "'");
}

Result<LatencyStats> time_plan_in_graph(const Plan& plan, GpuContext& ctx, const GraphBuffers& buffers,
                                        void* workspace, int warmup, int iters, int replays) {
  const std::string what =
      "'" + plan.engine_name() + "' in a CUDA graph of " + std::to_string(iters) + " executes";
  for (int i = 0; i < warmup; ++i) FUSEBOX_RETURN_IF_ERROR(plan.execute(ctx, buffers.pointers(i), workspace));
  GraphRunner runner;
  Status st = runner.bind(plan, ctx, buffers, workspace);
  std::vector<double> per_execute;
  if (st.ok()) st = runner.time_chain(ctx, iters, replays, per_execute);
  if (!st.ok()) return st.WithContext(what);
  return summarize(std::vector<float>(per_execute.begin(), per_execute.end()));
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
    if (st.ok())
      st = cuda_status(cudaEventSynchronize(ev[1]), "back-to-back runs of '" + plan.engine_name() + "'");
    float ms = 0;
    if (st.ok()) st = cuda_status(cudaEventElapsedTime(&ms, ev[0], ev[1]), "cudaEventElapsedTime");
    if (st.ok()) gpu_ms.push_back(static_cast<double>(ms) / calls);
  }
  for (int s = 0; s < samples && st.ok(); ++s) {
    const common::Stopwatch watch;
    st = plan.execute(ctx, buffers.pointers(k++), workspace);
    if (st.ok())
      st = cuda_status(cudaStreamSynchronize(stream), "synchronized run of '" + plan.engine_name() + "'");
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
using runtime::GraphRunner;

Status verify_status(const RunResult& r) {
  if (r.verified_ok) return Status::Ok();
  std::string msg = "outputs do not match the " + r.reference_kind + " reference:";
  for (const auto& c : r.comparisons) {
    if (!c.pass) msg += "\n  " + c.ToString();
  }
  return Status(StatusCode::kVerificationFailed, msg);
}

std::set<std::string> dropout_mask_outputs(const ResolvedGraph& g) {
  std::set<std::string> out;
  for (const auto& op : g.ops) {
    auto it = op.outputs.find("dropout_mask");
    if (it != op.outputs.end()) out.insert(g.tensors[it->second].name);
  }
  return out;
}

Result<std::vector<Comparison>> compare_with_reference(const ResolvedGraph& g,
                                                       const std::map<std::string, HostTensor>& inputs,
                                                       const std::map<std::string, HostTensor>& outputs,
                                                       ReferenceOutputs reference) {
  const std::set<std::string> dropout_masks = dropout_mask_outputs(g);
  // Large outputs of graphs without attention are compared as stored (compare() reads 16- and
  // 32-bit ones in place: no float copy of up to 10^9 elements). Only what the checks below read is
  // converted here: attention outputs (the masks), dropout masks, fp8 outputs and their scalar amaxes.
  const bool attention = std::any_of(g.ops.begin(), g.ops.end(),
                                     [](const ResolvedOp& op) { return sdpa_options(op.attrs) != nullptr; });
  std::map<std::string, std::vector<float>> actual;
  for (const auto& [name, out] : outputs) {
    const bool fp8 = out.dtype == DType::kFP8E4M3 || out.dtype == DType::kFP8E5M2;
    if (attention || fp8 || dropout_masks.count(name) || out.element_count() < (int64_t{1} << 20)) {
      actual[name] = out.to_float_logical();
    }
  }
  // Values cuDNN does not define (padded attention rows) are zeroed on both sides.
  FUSEBOX_RETURN_IF_ERROR(mask_dont_care(g, inputs, actual));
  FUSEBOX_RETURN_IF_ERROR(mask_dont_care(g, inputs, reference));
  // The masks themselves: only 0 and 1, kept at rate 1 - p.
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<Comparison> out, check_dropout_masks(g, inputs, actual));
  // An fp8 output's amax against the output it describes.
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<Comparison> amax, check_fp8_amax(g, inputs, actual));
  out.insert(out.end(), amax.begin(), amax.end());
  // Every output in name order, as before: the converted ones from `actual`, the others as stored.
  for (const auto& [name, stored] : outputs) {
    if (dropout_masks.count(name)) continue;
    auto it = reference.find(name);
    if (it == reference.end()) return Internal("the reference produced no output '" + name + "'");
    auto converted = actual.find(name);
    out.push_back(converted != actual.end()
                      ? compare(name, it->second, converted->second, tolerance_for(g, name))
                      : compare(name, it->second, stored, tolerance_for(g, name)));
  }
  // FP8 attention backward: a failing dq, dk or dv again, with the reference moved toward it within
  // the reach of cuDNN's internal fp8 rounding ties (reference.h): what they explain is no error.
  std::set<std::string> failing;
  for (const Comparison& c : out)
    if (!c.pass && c.error.empty() && actual.count(c.tensor) && reference.count(c.tensor))
      failing.insert(c.tensor);
  if (failing.empty()) return out;
  const auto searched = move_reference_within_fp8_ties(g, inputs, actual, failing, reference);
  if (!searched.ok()) {
    // The failed comparisons stand; the report says why no tie could explain them.
    for (Comparison& c : out)
      if (failing.count(c.tensor)) c.tie_search_error = searched.status().ToString();
    return out;
  }
  const auto& moved = *searched;
  for (Comparison& c : out) {
    auto m = moved.find(c.tensor);
    if (m == moved.end()) continue;
    if (m->second.ties > 0) c = compare(c.tensor, reference.at(c.tensor), actual.at(c.tensor), c.tolerance);
    c.ties_taken = m->second.ties;
    c.tie_largest_move = m->second.largest;
  }
  return out;
}

Result<RunResult> run_plan(const ResolvedGraph& g, const Plan& plan, GpuContext& ctx,
                           const RunOptions& options) {
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

  // Every output of the graph from the device; `which` names the run in errors.
  auto download_outputs = [&](const std::string& which) -> Result<std::map<std::string, HostTensor>> {
    std::map<std::string, HostTensor> out;
    for (int i : g.output_tensors()) {
      const ResolvedTensor& t = g.tensors[i];
      HostTensor h = HostTensor::like(t);
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemcpy(h.data.data(), buffers.device(t.name), h.data.size(), cudaMemcpyDeviceToHost),
          "download '" + t.name + "'" + which));
      out[t.name] = std::move(h);
    }
    return out;
  };
  FUSEBOX_ASSIGN_OR_RETURN(result.outputs, download_outputs(""));

  GraphRunner runner;
  if (options.cuda_graph) {
    CudaGraphRun& cg = result.cuda_graph;
    cg.used = true;
    const common::Stopwatch recording;
    FUSEBOX_RETURN_IF_ERROR(runner.record(plan, ctx, buffers, workspace.get()));
    cg.create_ms = recording.ms();
    cg.recording = std::string(graph_recording_name(runner.graphs[0].steps()[0].recording));
    cg.why_not_native = runner.graphs[0].steps()[0].why_not_native;
    // Poisoned again after recording (a captured plan's warm-up wrote them).
    for (int i : g.output_tensors()) {
      const ResolvedTensor& t = g.tensors[i];
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemsetAsync(buffers.device(t.name), 0xFF, result.outputs.at(t.name).data.size(), stream),
          "poison '" + t.name + "'"));
    }
    FUSEBOX_RETURN_IF_ERROR(runner.graphs[0].launch());
    FUSEBOX_RETURN_IF_ERROR(
        cuda_status(cudaStreamSynchronize(stream), "CUDA graph of '" + plan.engine_name() + "'"));
    FUSEBOX_ASSIGN_OR_RETURN(auto graph_outputs, download_outputs(" (CUDA graph)"));
    FUSEBOX_RETURN_IF_ERROR(runtime::check_graph_outputs(
        result.outputs, graph_outputs, not_bit_reproducible(g),
        [&](const std::string& name) { return tolerance_for(g, name); },
        "the CUDA graph's outputs differ from the eager execution's", cg));
    result.outputs = std::move(graph_outputs);  // verified below: what the graph computed
  }

  if (options.verify) {
    // cuDNN's dumped dropout masks are references' inputs, not outputs to compare.
    const std::set<std::string> dropout_masks = dropout_mask_outputs(g);
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
        FUSEBOX_RETURN_IF_ERROR(
            b.allocate(static_cast<size_t>(t.element_count()) * sizeof(float), "reference '" + t.name + "'"));
        d_out[t.name] = static_cast<float*>(b.get());
      }
      FUSEBOX_RETURN_IF_ERROR(reference_gpu(g, d_in, d_out, stream));
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "GPU reference"));
      for (auto& [name, b] : ref_buffers) {
        std::vector<float> v(b.bytes() / sizeof(float));
        FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemcpy(v.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost),
                                            "download reference"));
        ref[name] = std::move(v);
      }
    }
    FUSEBOX_ASSIGN_OR_RETURN(result.comparisons,
                             compare_with_reference(g, result.inputs, result.outputs, std::move(ref)));
    for (const Comparison& c : result.comparisons) result.verified_ok = result.verified_ok && c.pass;
  }

  if (options.iters > 0 && options.cuda_graph) {
    FUSEBOX_ASSIGN_OR_RETURN(result.latency,
                             runtime::time_graphs(runner.graphs, ctx, options.warmup, options.iters));
    if (result.latency.median_ms > 0) {
      result.tflops = flops / (result.latency.median_ms * 1e-3) / 1e12;
      result.gbps = g.bytes_moved() / (result.latency.median_ms * 1e-3) / 1e9;
    }
    if (options.samples > 0) {
      FUSEBOX_RETURN_IF_ERROR(runtime::sample_graphs(runner, ctx, options.iters, options.samples,
                                                     result.gpu_time_ms, result.host_latency_ms));
    }
  } else if (options.iters > 0) {
    FUSEBOX_ASSIGN_OR_RETURN(result.latency, runtime::time_plan(plan, ctx, buffers, workspace.get(),
                                                                options.warmup, options.iters));
    if (result.latency.median_ms > 0) {
      result.tflops = flops / (result.latency.median_ms * 1e-3) / 1e12;
      result.gbps = g.bytes_moved() / (result.latency.median_ms * 1e-3) / 1e9;
    }
    if (options.samples > 0) {
      FUSEBOX_RETURN_IF_ERROR(runtime::sample_plan(plan, ctx, buffers, workspace.get(), options.iters,
                                                   options.samples, result.gpu_time_ms,
                                                   result.host_latency_ms));
    }
  }
  if (options.time_parts && options.iters > 0) {
    for (int i = 0; i < plan.part_count(); ++i) {
      RunOptions alone;
      alone.seed = options.seed + 1 + static_cast<uint64_t>(i);
      alone.warmup = options.warmup;
      alone.iters = options.iters;
      alone.rotate_inputs = options.rotate_inputs;
      alone.cuda_graph = options.cuda_graph;
      auto r = run_plan(*plan.part_graph(i), *plan.part_plan(i), ctx, alone);
      if (!r.ok()) return r.status().WithContext("timing part " + std::to_string(i) + " alone");
      result.parts.push_back({r->engine, r->latency.median_ms});
    }
  }
  return result;
}

}  // namespace fusebox
