// fusebox: building, tuning and running pipelines (include/fusebox/pipeline_run.h).
#include "fusebox/pipeline_run.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <new>
#include <optional>
#include <set>
#include <thread>
#include <variant>

#include "common/dims_string.h"
#include "common/file_io.h"
#include "common/stopwatch.h"
#include "common/strided.h"
#include "device_buffers.h"
#include "fusebox/cuda_graph.h"
#include "fusebox/op_traits.h"
#include "pipeline_text.h"

namespace fusebox {

namespace {

using runtime::cuda_status;
using runtime::DeviceBuffer;

using runtime::sq;
using runtime::stage_where;
using runtime::where;

std::vector<const Plan*> by_stage(const Pipeline& p, const std::vector<std::pair<int, const Plan*>>& built) {
  std::vector<const Plan*> out(p.stages.size(), nullptr);
  for (const auto& [s, plan] : built) out[static_cast<size_t>(s)] = plan;
  return out;
}

// A HostTensor laid out as `t` holding `logical` (row-major fp32), rounded to t's dtype.
HostTensor from_logical(const ResolvedTensor& t, const std::vector<float>& logical) {
  HostTensor h = HostTensor::like(t);
  const int64_t esize = static_cast<int64_t>(dtype_size_bytes(h.dtype));
  common::for_each_element(h.dims, h.strides, [&](int64_t i, int64_t off) {
    store_element(h.data.data() + off * esize, h.dtype, logical[static_cast<size_t>(i)]);
  });
  return h;
}

// A view buffer's value from its parent's (the parent is dense: its bytes in memory order).
HostTensor view_part(const Pipeline& p, int view, const HostTensor& parent) {
  const PipelineBuffer& b = p.buffers[static_cast<size_t>(view)];
  HostTensor h = HostTensor::like(buffer_tensor(p, view));
  const size_t begin = static_cast<size_t>(b.view_offset_elements(p)) * dtype_size_bytes(b.dtype);
  std::copy_n(parent.data.begin() + static_cast<std::ptrdiff_t>(begin), h.data.size(), h.data.begin());
  return h;
}

// The bytes of a buffer as stage tensor `t` sees them: the same memory with
// t's dims and strides (they differ only for a "reshape" buffer's views).
HostTensor view_as(const HostTensor& h, const ResolvedTensor& t) {
  HostTensor v = h;
  v.dims = t.dims;
  v.strides = t.strides;
  return v;
}

}  // namespace

// ---------------------------------------------------------------- build, tune

std::vector<const Plan*> PipelineBuild::plans_by_stage(const Pipeline& p) const {
  std::vector<std::pair<int, const Plan*>> built;
  for (const auto& s : stages)
    if (s.ok) built.emplace_back(s.stage, &s.plan);
  return by_stage(p, built);
}

std::vector<const Plan*> PipelineTune::plans_by_stage(const Pipeline& p) const {
  std::vector<std::pair<int, const Plan*>> built;
  for (const auto& s : stages)
    if (s.ok) built.emplace_back(s.stage, &s.tune.plan);
  return by_stage(p, built);
}

Status build_pipeline(Session& session, const Pipeline& p, const PlanRequest& request, PipelineBuild* out,
                      bool keep_going) {
  const common::Stopwatch total;
  out->stages.clear();
  out->stages.reserve(p.order.size());  // Plans are referenced by pointer later
  Status first;
  size_t failed = 0;
  for (int s : p.order) {
    StageBuild& sb = out->stages.emplace_back();
    sb.stage = s;
    const common::Stopwatch watch;
    auto plan = session.get_plan(p.stages[s].graph, request, &sb.report);
    sb.ms = watch.ms();
    out->total_ms = total.ms();
    if (!plan.ok()) {
      sb.error = plan.status().WithContext(stage_where(p, s) + " (graph " + sq(p.stages[s].graph.name) + ")");
      if (!keep_going) return sb.error;
      if (failed++ == 0) first = sb.error;
      continue;
    }
    sb.plan = std::move(plan).value();
    sb.ok = true;
  }
  out->total_ms = total.ms();
  if (failed > 0)
    return Status(first.code(), first.message() + " [" + std::to_string(failed) + " of " +
                                    std::to_string(p.order.size()) +
                                    " stages failed to build; this is the first]");
  return Status::Ok();
}

Status tune_pipeline(Session& session, const Pipeline& p, const TunePolicy& policy, PipelineTune* out) {
  const common::Stopwatch total;
  out->stages.clear();
  out->stages.reserve(p.order.size());
  for (int s : p.order) {
    StageTune& st = out->stages.emplace_back();
    st.stage = s;
    const common::Stopwatch watch;
    auto tuned = session.tune(p.stages[s].graph, policy);
    st.ms = watch.ms();
    out->total_ms = total.ms();
    const std::string at = stage_where(p, s) + " (graph " + sq(p.stages[s].graph.name) + ")";
    if (!tuned.ok()) return tuned.status().WithContext(at);
    st.tune = std::move(tuned).value();
    if (!st.tune.hit && !st.tune.result.winner_run.verified_ok) {
      Status vs = verify_status(st.tune.result.winner_run);
      return vs.WithContext(at + " winner " + st.tune.plan.engine_name());
    }
    st.ok = true;
  }
  out->total_ms = total.ms();
  return Status::Ok();
}

// ---------------------------------------------------------------- host data

ResolvedTensor buffer_tensor(const Pipeline& p, int b) {
  const PipelineBuffer& buf = p.buffers[static_cast<size_t>(b)];
  ResolvedTensor t;
  // The first reading (else the writing) graph tensor gives fixed values and the random range.
  const BufferUse* use = !buf.readers.empty() ? &buf.readers.front() : (buf.writer ? &*buf.writer : nullptr);
  if (use) {
    const ResolvedGraph& g = p.stages[static_cast<size_t>(use->stage)].graph;
    const int ti = g.find_tensor(use->tensor);
    if (ti >= 0) t = g.tensors[static_cast<size_t>(ti)];
  }
  t.name = buf.name;  // random values differ per buffer, not per graph tensor name
  t.dtype = buf.dtype;
  t.dims = buf.dims;
  t.strides = buf.strides;
  t.is_virtual = false;
  t.scalar_value.reset();
  return t;
}

Result<PipelineHostData> load_pipeline_data(const Pipeline& p, uint64_t seed,
                                            const std::map<std::string, std::string>& input_files) {
  for (const auto& [name, file] : input_files) {
    const int b = p.find_buffer(name);
    if (b < 0 || p.buffers[static_cast<size_t>(b)].kind != BufferKind::kInput) {
      std::string inputs;
      for (const auto& buf : p.buffers)
        if (buf.kind == BufferKind::kInput) inputs += (inputs.empty() ? "" : ", ") + sq(buf.name);
      return InvalidArgument(where(p) + ": --input " + sq(name) + " (" + file +
                             ") is not an input buffer: the inputs are " +
                             (inputs.empty() ? "(none)" : inputs));
    }
  }
  // Every input and constant is read (or made) on its own: the files are read and converted on
  // several threads (ResNet-50's 108 weight files: most of a warm start's host time was this),
  // the results kept in buffer order, the first failure in that order reported.
  std::vector<size_t> todo;
  for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
    const BufferKind k = p.buffers[bi].kind;
    if (k == BufferKind::kInput || k == BufferKind::kConstant) todo.push_back(bi);
  }
  std::vector<Result<HostTensor>> got(todo.size(), Status(StatusCode::kInternal, "not loaded"));
  SafetensorsReader safetensors;  // each file's header parsed once, however many constants it holds
  auto load_one_unguarded = [&](size_t j) {
    const size_t bi = todo[j];
    const PipelineBuffer& buf = p.buffers[bi];
    const ResolvedTensor t = buffer_tensor(p, static_cast<int>(bi));
    std::string file, path;
    if (buf.kind == BufferKind::kConstant) {
      file = buf.file;
      path = buf.file_path;
    } else if (auto it = input_files.find(buf.name); it != input_files.end()) {
      file = path = it->second;
    }
    if (path.empty()) {
      got[j] = make_input(t, seed);
      return;
    }
    auto h = buf.kind == BufferKind::kConstant && !buf.key.empty()
                 ? safetensors.read(path, buf.key, t)
                 : read_npy_for(path, t, /*same_kind=*/true);
    if (!h.ok()) {
      const std::string expected = std::string(dtype_is_float(buf.dtype) ? "a float" : "an integer") +
                                   " array of shape " + common::dims_string(buf.dims) + " for " +
                                   std::string(dtype_name(buf.dtype)) + " " + common::dims_string(buf.dims);
      got[j] = Status(h.status().code(),
                      where(p) + ": " + std::string(buffer_kind_name(buf.kind)) + " buffer " + sq(buf.name) +
                          ": file '" + file + (buf.key.empty() ? "" : "' tensor '" + buf.key) +
                          "' does not fit: expected " + expected + ": " + h.status().message());
      return;
    }
    got[j] = std::move(h);
  };
  // On the loader threads an exception would end the process: running out of memory is an error.
  auto load_one = [&](size_t j) {
    try {
      load_one_unguarded(j);
    } catch (const std::bad_alloc&) {
      got[j] = common::out_of_host_memory(where(p) + ": loading buffer " + sq(p.buffers[todo[j]].name));
    }
  };
  const size_t threads =
      std::min<size_t>({todo.size(), std::max(1u, std::thread::hardware_concurrency()), size_t{8}});
  if (threads <= 1) {
    for (size_t j = 0; j < todo.size(); ++j) load_one(j);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (size_t w = 0; w < threads; ++w) {
      pool.emplace_back([&] {
        for (size_t j = next++; j < todo.size(); j = next++) load_one(j);
      });
    }
    for (auto& th : pool) th.join();
  }
  PipelineHostData data;
  for (size_t j = 0; j < todo.size(); ++j) {
    if (!got[j].ok()) return got[j].status();
    data[static_cast<int>(todo[j])] = std::move(got[j]).value();
  }
  // Values an op must check before it runs: an embedding's ids, when a stage reads them from an
  // input or a constant (only those tensors are copied for the check, not the stage's weights).
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const PipelineStage& st = p.stages[s];
    std::map<std::string, HostTensor> ids;
    for (const ResolvedOp& op : st.graph.ops) {
      for (std::string_view role : op_traits(op.attrs).index_inputs) {
        const std::string& name = st.graph.tensors[op.inputs.at(std::string(role))].name;
        auto b = st.bind.find(name);
        auto it = b == st.bind.end() ? data.end() : data.find(b->second);
        if (it != data.end()) ids.emplace(name, it->second);
      }
    }
    if (ids.empty()) continue;
    FUSEBOX_RETURN_IF_ERROR(
        check_embedding_ids(st.graph, ids).WithContext(stage_where(p, static_cast<int>(s))));
  }
  return data;
}

// ---------------------------------------------------------------- executor

BufferArenaPlan plan_buffer_arena(const Pipeline& p, const std::vector<int>& buffers) {
  constexpr int64_t kAlign = 256;
  auto aligned = [&](int64_t bytes) { return (std::max<int64_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; };
  BufferArenaPlan plan;
  plan.offsets.assign(p.buffers.size(), -1);
  // Each buffer's life: the steps of the stages that bind it or a view of it.
  std::vector<int> step_of(p.stages.size(), -1);
  for (size_t i = 0; i < p.order.size(); ++i) step_of[static_cast<size_t>(p.order[i])] = static_cast<int>(i);
  auto root = [&](int b) {
    while (p.buffers[static_cast<size_t>(b)].is_view()) b = p.buffers[static_cast<size_t>(b)].view_of;
    return b;
  };
  std::vector<int> first(p.buffers.size(), std::numeric_limits<int>::max()), last(p.buffers.size(), -1);
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const int step = step_of[s];
    if (step < 0) continue;
    for (const auto& [tensor, b] : p.stages[s].bind) {
      const size_t r = static_cast<size_t>(root(b));
      first[r] = std::min(first[r], step);
      last[r] = std::max(last[r], step);
    }
  }
  struct Item {
    int b;
    int64_t bytes;
  };
  std::vector<Item> items;
  for (int b : buffers) {
    const int64_t bytes = aligned(buffer_tensor(p, b).storage_bytes());
    plan.separate_bytes += bytes;
    items.push_back({b, bytes});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& c) { return a.bytes > c.bytes; });
  std::vector<Item> placed;
  for (const Item& it : items) {
    const size_t b = static_cast<size_t>(it.b);
    // The placed buffers alive beside it, by offset: it goes in the first gap that fits.
    std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end)
    for (const Item& q : placed) {
      const size_t c = static_cast<size_t>(q.b);
      if (first[b] <= last[c] && first[c] <= last[b])
        busy.push_back({plan.offsets[c], plan.offsets[c] + q.bytes});
    }
    std::sort(busy.begin(), busy.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (at + it.bytes <= lo) break;
      at = std::max(at, hi);
    }
    plan.offsets[b] = at;
    plan.arena_bytes = std::max(plan.arena_bytes, at + it.bytes);
    placed.push_back(it);
  }
  return plan;
}

namespace {

// Intermediates that may share memory: floating-point ones with memory of their own. (Integer ones,
// indices a later stage reads, keep theirs: a stage run alone, as --profile does, would otherwise
// read another buffer's bits as indices.)
bool shareable(const PipelineBuffer& b) {
  return b.kind == BufferKind::kIntermediate && !b.is_view() && dtype_is_float(b.dtype);
}

}  // namespace

BufferArenaPlan plan_buffer_arena(const Pipeline& p) {
  std::vector<int> intermediates;
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (shareable(p.buffers[b])) intermediates.push_back(static_cast<int>(b));
  return plan_buffer_arena(p, intermediates);
}

struct PipelineExecutor::Impl {
  Session* session = nullptr;
  const Pipeline* p = nullptr;
  std::vector<DeviceBuffer> buffers;  // by buffer index (none allocated for a view)
  DeviceBuffer shared;                // the intermediates' arena (PipelineExecutorOptions)
  std::vector<void*> ptrs;            // by buffer index: its memory, a view's inside its parent's
  std::vector<BoundPlan> steps;
  std::vector<int> step_stages;
  int64_t buffer_bytes = 0;

  cudaStream_t stream() const { return static_cast<cudaStream_t>(session->context()->stream()); }
};

PipelineExecutor::PipelineExecutor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PipelineExecutor::~PipelineExecutor() = default;

Result<std::unique_ptr<PipelineExecutor>> PipelineExecutor::create(Session& session, const Pipeline& p,
                                                                   const std::vector<const Plan*>& plans,
                                                                   const PipelineHostData& data,
                                                                   const std::map<int, void*>& external,
                                                                   const PipelineExecutorOptions& options) {
  if (session.deviceless() || !session.context())
    return Status(StatusCode::kNoDevice, where(p) + ": a deviceless session cannot run a pipeline");
  if (plans.size() != p.stages.size())
    return InvalidArgument(where(p) + ": " + std::to_string(plans.size()) + " plans for " +
                           std::to_string(p.stages.size()) + " stages");
  auto impl = std::make_unique<Impl>();
  impl->session = &session;
  impl->p = &p;
  impl->buffers.resize(p.buffers.size());
  impl->ptrs.assign(p.buffers.size(), nullptr);
  for (const auto& [bi, ptr] : external)
    if (bi < 0 || bi >= static_cast<int>(p.buffers.size()) || p.buffers[static_cast<size_t>(bi)].is_view())
      return InvalidArgument(where(p) + ": external memory for buffer index " + std::to_string(bi) +
                             ": not a buffer with memory of its own (a view takes its parent's)");
  BufferArenaPlan arena;
  if (options.share_intermediates) {
    std::vector<int> shared;
    for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
      const PipelineBuffer& buf = p.buffers[bi];
      if (shareable(buf) && !external.count(static_cast<int>(bi)) && !data.count(static_cast<int>(bi)))
        shared.push_back(static_cast<int>(bi));
    }
    arena = plan_buffer_arena(p, shared);
    if (!shared.empty()) {
      FUSEBOX_RETURN_IF_ERROR(impl->shared.allocate(static_cast<size_t>(arena.arena_bytes),
                                                    where(p) + ": the intermediates' arena"));
      impl->buffer_bytes += arena.arena_bytes;
    }
  }
  for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
    const PipelineBuffer& buf = p.buffers[bi];
    if (buf.is_view()) continue;  // below, once its parent has memory
    const ResolvedTensor t = buffer_tensor(p, static_cast<int>(bi));
    const int64_t bytes = std::max<int64_t>(t.storage_bytes(), 1);
    auto ext = external.find(static_cast<int>(bi));
    if (ext != external.end()) {
      if (!ext->second)
        return InvalidArgument(where(p) + ": buffer " + sq(buf.name) + ": a null external pointer");
      impl->ptrs[bi] = ext->second;  // the caller's memory: neither allocated nor poisoned here
    } else if (!arena.offsets.empty() && arena.offsets[bi] >= 0) {
      impl->ptrs[bi] = static_cast<char*>(impl->shared.get()) + arena.offsets[bi];
    } else {
      DeviceBuffer& d = impl->buffers[bi];
      FUSEBOX_RETURN_IF_ERROR(d.allocate(static_cast<size_t>(bytes), where(p) + ": buffer " + sq(buf.name)));
      impl->ptrs[bi] = d.get();
      impl->buffer_bytes += bytes;
    }
    auto it = data.find(static_cast<int>(bi));
    if (it != data.end()) {
      if (it->second.data.size() != static_cast<size_t>(t.storage_bytes()))
        return InvalidArgument(where(p) + ": buffer " + sq(buf.name) + ": the data holds " +
                               std::to_string(it->second.data.size()) + " bytes, the buffer " +
                               std::to_string(t.storage_bytes()));
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemcpy(impl->ptrs[bi], it->second.data.data(), it->second.data.size(), cudaMemcpyHostToDevice),
          where(p) + ": upload buffer " + sq(buf.name)));
    } else if (ext != external.end()) {
      // The caller fills it.
    } else if (buf.kind == BufferKind::kInput || buf.kind == BufferKind::kConstant) {
      return InvalidArgument(where(p) + ": no data for " + std::string(buffer_kind_name(buf.kind)) +
                             " buffer " + sq(buf.name));
    } else {
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemset(impl->ptrs[bi], 0xFF, static_cast<size_t>(bytes)),
                                          where(p) + ": poison buffer " + sq(buf.name)));
    }
  }
  for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
    const PipelineBuffer& buf = p.buffers[bi];
    if (!buf.is_view()) continue;
    impl->ptrs[bi] = static_cast<char*>(impl->ptrs[static_cast<size_t>(buf.view_of)]) +
                     buf.view_offset_elements(p) * static_cast<int64_t>(dtype_size_bytes(buf.dtype));
  }
  // The session's stream is non-blocking: nothing orders it after the legacy stream's copies.
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), where(p) + ": upload buffers"));
  // The arena sized once to the largest plan, so no bind waits to regrow it.
  int64_t ws = 0;
  for (int s : p.order) {
    if (!plans[static_cast<size_t>(s)]) return InvalidArgument(stage_where(p, s) + ": no plan");
    ws = std::max(ws, plans[static_cast<size_t>(s)]->workspace_bytes());
  }
  FUSEBOX_RETURN_IF_ERROR(session.reserve_workspace(ws));
  for (int s : p.order) {
    std::map<std::string, void*> ptrs;
    for (const auto& [tensor, bi] : p.stages[static_cast<size_t>(s)].bind)
      ptrs[tensor] = impl->ptrs[static_cast<size_t>(bi)];
    auto bound = session.bind(*plans[static_cast<size_t>(s)], ptrs);
    if (!bound.ok()) return bound.status().WithContext(stage_where(p, s));
    impl->steps.push_back(std::move(bound).value());
    impl->step_stages.push_back(s);
  }
  return std::unique_ptr<PipelineExecutor>(new PipelineExecutor(std::move(impl)));
}

std::vector<BoundPlan>& PipelineExecutor::steps() { return impl_->steps; }
const std::vector<int>& PipelineExecutor::step_stages() const { return impl_->step_stages; }

Status PipelineExecutor::execute() {
  for (size_t i = 0; i < impl_->steps.size(); ++i) {
    Status st = impl_->steps[i].execute();
    if (!st.ok()) return st.WithContext(stage_where(*impl_->p, impl_->step_stages[i]));
  }
  return Status::Ok();
}

Status PipelineExecutor::synchronize() {
  return cuda_status(cudaStreamSynchronize(impl_->stream()), where(*impl_->p) + ": run");
}

void* PipelineExecutor::device(int buffer) const { return impl_->ptrs[static_cast<size_t>(buffer)]; }

Result<HostTensor> PipelineExecutor::download(int buffer) const {
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(impl_->stream()), where(*impl_->p) + ": run"));
  HostTensor h = HostTensor::like(buffer_tensor(*impl_->p, buffer));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(
      cudaMemcpy(h.data.data(), device(buffer), h.data.size(), cudaMemcpyDeviceToHost),
      where(*impl_->p) + ": download buffer " + sq(impl_->p->buffers[static_cast<size_t>(buffer)].name)));
  return h;
}

int64_t PipelineExecutor::buffer_bytes() const { return impl_->buffer_bytes; }
int64_t PipelineExecutor::peak_device_bytes() const {
  return impl_->buffer_bytes + impl_->session->workspace_bytes();
}

// ---------------------------------------------------------------- verification

Tolerance chain_tolerance(const Pipeline& p, int buffer) {
  // Longest path (in stages) from the inputs to each stage, in stage order.
  std::vector<int> depth(p.stages.size(), 0);
  for (int s : p.order) {
    int d = 0;
    for (const auto& [tensor, bi] : p.stages[static_cast<size_t>(s)].bind) {
      const PipelineBuffer& b = p.buffers[static_cast<size_t>(bi)];
      if (b.writer && b.writer->stage != s) d = std::max(d, depth[static_cast<size_t>(b.writer->stage)]);
    }
    depth[static_cast<size_t>(s)] = d + 1;
  }
  const PipelineBuffer& b = p.buffers[static_cast<size_t>(buffer)];
  if (!b.writer) return default_tolerance(b.dtype);
  const int s = b.writer->stage;
  Tolerance t = tolerance_for(p.stages[static_cast<size_t>(s)].graph, b.writer->tensor);
  t.rel_l2 *= depth[static_cast<size_t>(s)];
  t.max_abs_rel *= depth[static_cast<size_t>(s)];
  return t;
}

namespace {

// The reference outputs of stage `s` from host inputs (by graph tensor).
Result<ReferenceOutputs> stage_reference(const ResolvedGraph& g,
                                         const std::map<std::string, HostTensor>& inputs,
                                         double cpu_max_flops, bool* gpu) {
  const double flops = g.flops(input_values_for_flops(g, inputs));
  *gpu = flops > cpu_max_flops && gpu_reference_available() && gpu_count() > 0;
  return *gpu ? reference_gpu_host(g, inputs) : reference_cpu(g, inputs);
}

std::string kind_of(bool cpu, bool gpu) { return cpu && gpu ? "cpu+gpu" : gpu ? "gpu" : "cpu"; }

}  // namespace

Result<std::map<std::string, std::vector<float>>> reference_chain(const Pipeline& p,
                                                                  const PipelineHostData& data,
                                                                  double cpu_reference_max_flops,
                                                                  std::string* kind) {
  std::map<int, HostTensor> values = data;  // by buffer index, as the buffers lay them out
  std::map<std::string, std::vector<float>> out;
  bool any_cpu = false, any_gpu = false;
  for (int s : p.order) {
    const PipelineStage& st = p.stages[static_cast<size_t>(s)];
    std::map<std::string, HostTensor> inputs;
    for (const auto& [tensor, bi] : st.bind) {
      const ResolvedTensor& t = st.graph.tensors[static_cast<size_t>(st.graph.find_tensor(tensor))];
      if (!t.is_input) continue;
      const PipelineBuffer& b = p.buffers[static_cast<size_t>(bi)];
      auto it = values.find(b.is_view() ? b.view_of : bi);
      if (it == values.end())
        return Internal(stage_where(p, s) + ": reference chain: buffer " + sq(p.buffers[bi].name) +
                        " has no value");
      inputs[tensor] = view_as(b.is_view() ? view_part(p, bi, it->second) : it->second, t);
    }
    bool gpu = false;
    auto ref = stage_reference(st.graph, inputs, cpu_reference_max_flops, &gpu);
    if (!ref.ok()) return ref.status().WithContext(stage_where(p, s) + ": reference");
    (gpu ? any_gpu : any_cpu) = true;
    for (const auto& [tensor, bi] : st.bind) {
      const ResolvedTensor& t = st.graph.tensors[static_cast<size_t>(st.graph.find_tensor(tensor))];
      if (!t.is_output) continue;
      auto it = ref->find(tensor);
      if (it == ref->end()) continue;  // a dropout mask: no reference value
      values[bi] = from_logical(t, it->second);
      out[p.buffers[static_cast<size_t>(bi)].name] = std::move(it->second);
    }
  }
  if (kind) *kind = kind_of(any_cpu, any_gpu);
  return out;
}

Status verify_pipeline(const Pipeline& p, const PipelineHostData& data, std::map<int, HostTensor> host,
                       double cpu_reference_max_flops, PipelineRunResult* result) {
  PipelineRunResult& r = *result;
  if (r.stages.empty()) {
    for (int s : p.order) {
      StageRun sr;
      sr.stage = s;
      r.stages.push_back(std::move(sr));
    }
  }
  for (const auto& [bi, h] : data) host.emplace(bi, h);  // constants
  for (size_t bi = 0; bi < p.buffers.size(); ++bi)
    if (!host.count(static_cast<int>(bi)))
      return InvalidArgument(where(p) + ": verify: no value for buffer " + sq(p.buffers[bi].name));
  for (StageRun& sr : r.stages) {
    const PipelineStage& st = p.stages[static_cast<size_t>(sr.stage)];
    const ResolvedGraph& g = st.graph;
    const std::set<std::string> masks = dropout_mask_outputs(g);
    std::map<std::string, HostTensor> inputs, outputs;
    for (const auto& [tensor, bi] : st.bind) {
      const ResolvedTensor& t = g.tensors[static_cast<size_t>(g.find_tensor(tensor))];
      if (t.is_input || masks.count(tensor)) inputs[tensor] = view_as(host.at(bi), t);
      if (t.is_output) outputs[tensor] = view_as(host.at(bi), t);
    }
    bool gpu = false;
    auto ref = stage_reference(g, inputs, cpu_reference_max_flops, &gpu);
    if (!ref.ok()) return ref.status().WithContext(stage_where(p, sr.stage) + ": reference");
    sr.reference_kind = gpu ? "gpu" : "cpu";
    auto compared = compare_with_reference(g, inputs, outputs, std::move(ref).value());
    if (!compared.ok()) return compared.status().WithContext(stage_where(p, sr.stage));
    sr.comparisons = std::move(compared).value();
    // Named by buffer: that is what the pipeline's user knows (the keep-mask checks keep the tensor's).
    for (Comparison& c : sr.comparisons)
      if (!masks.count(c.tensor) && st.bind.count(c.tensor))
        c.tensor = p.buffers[static_cast<size_t>(st.bind.at(c.tensor))].name;
    for (const Comparison& c : sr.comparisons) sr.verified_ok = sr.verified_ok && c.pass;
    r.verified_ok = r.verified_ok && sr.verified_ok;
  }

  // The whole chain on the references alone.
  std::string kind;
  auto chain = reference_chain(p, data, cpu_reference_max_flops, &kind);
  if (!chain.ok()) return chain.status();
  r.chain_reference_kind = kind;
  for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
    const PipelineBuffer& b = p.buffers[bi];
    if (b.kind != BufferKind::kOutput) continue;
    auto it = chain->find(b.name);
    if (it == chain->end()) continue;  // a dropout mask
    Comparison c = compare(b.name, it->second, host.at(static_cast<int>(bi)).to_float_logical(),
                           chain_tolerance(p, static_cast<int>(bi)));
    r.verified_ok = r.verified_ok && c.pass;
    r.chain.push_back(std::move(c));
  }
  return Status::Ok();
}

Result<PipelineRunResult> run_pipeline(Session& session, const Pipeline& p,
                                       const std::vector<const Plan*>& plans, const PipelineHostData& data,
                                       const PipelineRunOptions& options) {
  PipelineRunResult r;
  if (options.share_intermediates && (options.verify || options.keep_intermediates))
    return InvalidArgument(where(p) + ": sharing the intermediates' memory leaves none to " +
                           (options.verify ? "verify" : "keep") + ": run without one of the two");
  FUSEBOX_ASSIGN_OR_RETURN(std::unique_ptr<PipelineExecutor> ex,
                           PipelineExecutor::create(session, p, plans, data, {},
                                                    PipelineExecutorOptions{options.share_intermediates}));
  r.buffer_bytes = ex->buffer_bytes();
  r.workspace_bytes = session.workspace_bytes();
  r.peak_device_bytes = ex->peak_device_bytes();
  r.flops = p.flops();
  for (size_t i = 0; i < ex->steps().size(); ++i) {
    StageRun sr;
    sr.stage = ex->step_stages()[i];
    sr.engine = ex->steps()[i].engine_name();
    sr.workspace_bytes = ex->steps()[i].workspace_bytes();
    sr.flops = p.stages[static_cast<size_t>(sr.stage)].graph.flops();
    r.stages.push_back(std::move(sr));
  }

  const common::Stopwatch first;
  FUSEBOX_RETURN_IF_ERROR(ex->execute());
  FUSEBOX_RETURN_IF_ERROR(ex->synchronize());
  r.first_execute_ms = first.ms();

  // Every buffer on the host: each has one writer and is never overwritten,
  // so after the run each stage's inputs are exactly what it read.
  std::map<int, HostTensor> host;
  for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
    const PipelineBuffer& b = p.buffers[bi];
    const bool want = b.kind == BufferKind::kOutput || b.kind == BufferKind::kInput ||
                      (b.kind == BufferKind::kIntermediate &&
                       (options.verify || options.keep_intermediates || options.cuda_graph));
    if (!want) continue;
    FUSEBOX_ASSIGN_OR_RETURN(host[static_cast<int>(bi)], ex->download(static_cast<int>(bi)));
    if (b.kind == BufferKind::kInput) r.inputs[b.name] = host[static_cast<int>(bi)];
    if (b.kind == BufferKind::kOutput || (b.kind == BufferKind::kIntermediate && options.keep_intermediates))
      r.outputs[b.name] = host[static_cast<int>(bi)];
  }

  if (options.verify)
    FUSEBOX_RETURN_IF_ERROR(verify_pipeline(p, data, host, options.cpu_reference_max_flops, &r));

  auto stream = static_cast<cudaStream_t>(session.context()->stream());
  auto time_runs = [&](const std::function<Status()>& run, LatencyStats* out) -> Status {
    FUSEBOX_ASSIGN_OR_RETURN(*out, runtime::time_calls(
                                       stream, options.warmup, options.iters, [&](int) { return run(); },
                                       where(p) + ": timed runs"));
    return Status::Ok();
  };
  auto eager = [&]() { return ex->execute(); };

  std::optional<CudaGraph> graph;
  if (options.cuda_graph) {
    CudaGraphRun& cg = r.cuda_graph;
    const common::Stopwatch made;
    std::vector<BoundPlan*> steps;
    for (BoundPlan& b : ex->steps()) steps.push_back(&b);
    auto g = CudaGraph::create(steps);
    if (!g.ok())
      return g.status().WithContext(where(p) + ": CUDA graph of " + std::to_string(steps.size()) + " steps");
    graph.emplace(std::move(g).value());
    cg.used = true;
    cg.create_ms = made.ms();
    std::map<std::string, int> kinds;
    for (size_t i = 0; i < graph->steps().size(); ++i) {
      const CudaGraphStep& st = graph->steps()[i];
      ++kinds[std::string(graph_recording_name(st.recording))];
      if (st.recording == GraphRecording::kCapture && cg.why_not_native.empty())
        cg.why_not_native = stage_where(p, ex->step_stages()[i]) + ": " + st.why_not_native;
    }
    if (kinds.size() == 1) {
      cg.recording = kinds.begin()->first;
    } else {
      for (const auto& [k, n] : kinds)
        cg.recording += (cg.recording.empty() ? "" : ", ") + std::to_string(n) + " " + k;
    }
    // The graph's outputs must be its own: poison every written buffer, launch once, compare.
    FUSEBOX_RETURN_IF_ERROR(ex->synchronize());
    for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
      const BufferKind k = p.buffers[bi].kind;
      if (k != BufferKind::kOutput && k != BufferKind::kIntermediate) continue;
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(ex->device(static_cast<int>(bi)), 0xFF,
                                                          host[static_cast<int>(bi)].data.size(), stream),
                                          where(p) + ": poison buffer " + sq(p.buffers[bi].name)));
    }
    FUSEBOX_RETURN_IF_ERROR(graph->launch());
    FUSEBOX_RETURN_IF_ERROR(ex->synchronize());
    std::map<std::string, HostTensor> eager_bytes, graph_bytes;
    for (size_t bi = 0; bi < p.buffers.size(); ++bi) {
      const BufferKind k = p.buffers[bi].kind;
      if (k != BufferKind::kOutput && k != BufferKind::kIntermediate) continue;
      eager_bytes[p.buffers[bi].name] = host[static_cast<int>(bi)];
      FUSEBOX_ASSIGN_OR_RETURN(graph_bytes[p.buffers[bi].name], ex->download(static_cast<int>(bi)));
    }
    std::string not_reproducible;
    for (const auto& st : p.stages) {
      std::string why = not_bit_reproducible(st.graph);
      if (!why.empty()) {
        not_reproducible = "stage " + sq(st.name) + ": " + why;
        break;
      }
    }
    FUSEBOX_RETURN_IF_ERROR(runtime::check_graph_outputs(
        eager_bytes, graph_bytes, not_reproducible,
        [&](const std::string& name) { return chain_tolerance(p, p.find_buffer(name)); },
        where(p) + ": the CUDA graph's buffers differ from the eager run's", cg));
  }

  if (options.iters > 0) {
    if (graph) {
      FUSEBOX_RETURN_IF_ERROR(time_runs(eager, &r.eager_latency));
      FUSEBOX_RETURN_IF_ERROR(time_runs([&]() { return graph->launch(); }, &r.latency));
    } else {
      FUSEBOX_RETURN_IF_ERROR(time_runs(eager, &r.latency));
    }
    if (r.latency.median_ms > 0) r.tflops = r.flops / (r.latency.median_ms * 1e-3) / 1e12;
    if (options.profile) {
      std::vector<BoundPlan>& steps = ex->steps();
      for (size_t i = 0; i < steps.size() && i < r.stages.size(); ++i) {
        BoundPlan& step = steps[i];
        FUSEBOX_RETURN_IF_ERROR(time_runs([&]() { return step.execute(); }, &r.stages[i].latency));
      }
    }
  }
  return r;
}

Status pipeline_verify_status(const Pipeline& p, const PipelineRunResult& r) {
  if (r.verified_ok) return Status::Ok();
  for (const StageRun& sr : r.stages) {
    if (sr.verified_ok) continue;
    std::string msg = stage_where(p, sr.stage) + " (graph " +
                      sq(p.stages[static_cast<size_t>(sr.stage)].graph.name) + ", engine " + sr.engine +
                      ") is the first stage whose outputs do not match the " + sr.reference_kind +
                      " reference on its own inputs:";
    for (const auto& c : sr.comparisons)
      if (!c.pass) msg += "\n  buffer " + c.ToString();
    return Status(StatusCode::kVerificationFailed, msg);
  }
  std::string msg = where(p) +
                    ": every stage matches its reference, but the final outputs do not match the " +
                    r.chain_reference_kind + " references chained on their own outputs:";
  for (const auto& c : r.chain)
    if (!c.pass) msg += "\n  buffer " + c.ToString();
  return Status(StatusCode::kVerificationFailed, msg);
}

}  // namespace fusebox
