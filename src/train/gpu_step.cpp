// fusebox: the GPU training step (gpu_step.h).
#include "gpu_step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "common/cuda_mem.h"
#include "common/cuda_status.h"
#include "fusebox/pipeline_run.h"
#include "fusebox/plan_cache.h"
#include "fusebox/session.h"
#include "fusebox/tensor.h"
#include "optim_kernels.h"

namespace fusebox {
using common::cuda_status;
namespace {

namespace tk = train_kernels;

using Mem = common::CudaMem;

tk::ElemType elem_type(DType d) { return d == DType::kBF16 ? tk::ElemType::kBF16 : tk::ElemType::kFP32; }

}  // namespace

struct GpuStep::Impl {
  LmConfig cfg;
  const Pipeline* fwd = nullptr;
  const Pipeline* bwd = nullptr;
  const PipelineBackward* derived = nullptr;
  std::vector<LmParameter> params;
  std::optional<PlanCache> cache;
  std::unique_ptr<Session> session;
  PipelineBuild fbuild, bbuild;
  std::unique_ptr<PipelineExecutor> fe, be;
  Mem master, m, v, accum, work, segs, chunks, partials, scalars, hyper;
  Mem pinned_ids, pinned_labels, pinned_hyper, pinned_scalars;
  // train.fp8: the device scaling state (floats: scale, scale_inv, amax, step_amax, fp8_max, then
  // the history rings) and its ring position; the tensors' indices by buffer name.
  Mem fp8_mem, fp8_pos;
  tk::Fp8State fp8;
  std::map<std::string, int> fp8_index;
  std::vector<tk::Segment> host_segs;
  std::vector<tk::Chunk> host_chunks;
  std::vector<int64_t> offset;  // by parameter: its first element in master, m, v, accum
  std::vector<DType> grad_dtype;
  int ids_buf = -1, labels_buf = -1, loss_buf = -1;
  int64_t tokens = 0;  // per micro-batch
  cudaGraphExec_t exec = nullptr;
  bool eager_done = false, graph_failed = false;
  std::string graph_note;
  double build_ms = 0;

  cudaStream_t stream() const { return static_cast<cudaStream_t>(session->context()->stream()); }
  int nchunks() const { return static_cast<int>(host_chunks.size()); }
  int64_t accum_count() const { return cfg.train.accum; }

  // The whole step on the stream: eagerly, or into a capture.
  Status enqueue() {
    const cudaStream_t s = stream();
    const size_t n = static_cast<size_t>(tokens) * sizeof(int32_t);
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(hyper.as<void>(), pinned_hyper.as<void>(),
                                                        sizeof(tk::Hyper), cudaMemcpyHostToDevice, s),
                                        "train: upload the step's hyperparameters"));
    const bool from_grad = accum_count() == 1;
    for (int64_t k = 0; k < accum_count(); ++k) {
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemcpyAsync(fe->device(ids_buf), pinned_ids.as<char>() + k * n, n, cudaMemcpyHostToDevice, s),
          "train: upload token ids"));
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaMemcpyAsync(fe->device(labels_buf), pinned_labels.as<char>() + k * n, n,
                                      cudaMemcpyHostToDevice, s),
                      "train: upload labels"));
      FUSEBOX_RETURN_IF_ERROR(fe->execute());
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(tk::loss_sum(static_cast<const float*>(fe->device(loss_buf)), tokens, k == 0,
                                   scalars.as<tk::StepScalars>(), hyper.as<tk::Hyper>(), s),
                      "train: loss sum"));
      FUSEBOX_RETURN_IF_ERROR(be->execute());
      FUSEBOX_RETURN_IF_ERROR(cuda_status(tk::fp8_fold_amax(fp8, k == 0, s), "train: FP8 amax"));
      if (!from_grad)
        FUSEBOX_RETURN_IF_ERROR(
            cuda_status(tk::accumulate(segs.as<tk::Segment>(), chunks.as<tk::Chunk>(), nchunks(), k == 0, s),
                        "train: gradient accumulation"));
    }
    FUSEBOX_RETURN_IF_ERROR(cuda_status(
        tk::grad_norm(segs.as<tk::Segment>(), chunks.as<tk::Chunk>(), nchunks(), from_grad,
                      partials.as<double>(), scalars.as<tk::StepScalars>(), hyper.as<tk::Hyper>(), s),
        "train: gradient norm"));
    FUSEBOX_RETURN_IF_ERROR(
        cuda_status(tk::adamw(segs.as<tk::Segment>(), chunks.as<tk::Chunk>(), nchunks(), from_grad,
                              scalars.as<tk::StepScalars>(), hyper.as<tk::Hyper>(), s),
                    "train: AdamW"));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(tk::fp8_update(fp8, s), "train: FP8 scales"));
    return cuda_status(cudaMemcpyAsync(pinned_scalars.as<void>(), scalars.as<void>(), sizeof(tk::StepScalars),
                                       cudaMemcpyDeviceToHost, s),
                       "train: download the step's loss and norm");
  }

  // Records the step as a CUDA graph; on failure the step stays eager (graph_note says why).
  void capture() {
    const cudaStream_t s = stream();
    cudaGraph_t g = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      graph_failed = true;
      graph_note = "cudaStreamBeginCapture failed";
      (void)cudaGetLastError();
      return;
    }
    const Status st = enqueue();
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (!st.ok() || end != cudaSuccess || !g) {
      graph_failed = true;
      graph_note = !st.ok() ? st.ToString() : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
      if (g) cudaGraphDestroy(g);
      (void)cudaGetLastError();
      return;
    }
    const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (inst != cudaSuccess) {
      exec = nullptr;
      graph_failed = true;
      graph_note = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
      (void)cudaGetLastError();
    }
  }

  // The pinned hyperparameters and the first micro-batch's ids and labels to the device, on the
  // stream (asynchronous); `what` names the caller in errors.
  Status upload_first_micro_batch(const std::string& what) {
    const cudaStream_t s = stream();
    const size_t n = static_cast<size_t>(tokens) * sizeof(int32_t);
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(hyper.as<void>(), pinned_hyper.as<void>(),
                                                        sizeof(tk::Hyper), cudaMemcpyHostToDevice, s),
                                        what + ": hyperparameters"));
    FUSEBOX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpyAsync(fe->device(ids_buf), pinned_ids.as<void>(), n, cudaMemcpyHostToDevice, s),
                    what + ": token ids"));
    return cuda_status(
        cudaMemcpyAsync(fe->device(labels_buf), pinned_labels.as<void>(), n, cudaMemcpyHostToDevice, s),
        what + ": labels");
  }

  // The step's hyperparameters into pinned memory (the step's first copy uploads them).
  void set_hyper(double lr, int64_t t) {
    const LmTrainConfig& tc = cfg.train;
    tk::Hyper h;
    h.lr = static_cast<float>(lr);
    h.beta1 = static_cast<float>(tc.beta1);
    h.beta2 = static_cast<float>(tc.beta2);
    h.one_minus_beta1 = static_cast<float>(1 - tc.beta1);  // in double first: 1 - float(0.999999999) is 0
    h.one_minus_beta2 = static_cast<float>(1 - tc.beta2);
    h.eps = static_cast<float>(tc.eps);
    h.weight_decay = static_cast<float>(tc.weight_decay);
    h.clip = static_cast<float>(tc.clip);
    h.c1 = static_cast<float>(1 - std::pow(tc.beta1, static_cast<double>(t)));
    h.c2 = static_cast<float>(1 - std::pow(tc.beta2, static_cast<double>(t)));
    h.loss_scale = static_cast<float>(1.0 / static_cast<double>(tokens * tc.accum));
    std::memcpy(pinned_hyper.as<void>(), &h, sizeof h);
  }

  // train.fp8: the device memory of pipeline buffer `name` when it is a scaling buffer
  // (fp8.scale.<b>, fp8.scale_inv.<b>, fp8.amax.<b>), else null.
  void* fp8_buffer(const std::string& name) const {
    for (auto [prefix, base] : {std::pair<const char*, float*>{"fp8.scale.", fp8.scale},
                                std::pair<const char*, float*>{"fp8.scale_inv.", fp8.scale_inv},
                                std::pair<const char*, float*>{"fp8.amax.", fp8.amax}}) {
      const std::string p(prefix);
      if (name.compare(0, p.size(), p) != 0) continue;
      auto it = fp8_index.find(name.substr(p.size()));
      return it == fp8_index.end() ? nullptr : base + static_cast<int64_t>(it->second) * fp8.stride;
    }
    return nullptr;
  }

  // train.fp8: the scaling state, every scale 1 and no amax recorded. scale, scale_inv and amax
  // hold each entry in a 256-byte slot of its own (Fp8State::stride); then step_amax, fp8_max and
  // the history rings, packed.
  Status init_fp8(const GpuFp8& f) {
    const int64_t n = static_cast<int64_t>(f.tensors.size()), h = f.history, st = 64;
    const int64_t floats = 3 * n * st + 2 * n + n * h;
    FUSEBOX_RETURN_IF_ERROR(
        fp8_mem.alloc(static_cast<size_t>(floats) * sizeof(float), false, "FP8 scaling state"));
    FUSEBOX_RETURN_IF_ERROR(fp8_pos.alloc(sizeof(int32_t), false, "FP8 scaling state"));
    std::vector<float> host(static_cast<size_t>(floats), 0.f);
    for (int64_t i = 0; i < n; ++i) {
      fp8_index[f.tensors[static_cast<size_t>(i)].first] = static_cast<int>(i);
      host[static_cast<size_t>(i * st)] = 1.f;         // scale
      host[static_cast<size_t>((n + i) * st)] = 1.f;   // scale_inv
      host[static_cast<size_t>(3 * n * st + n + i)] =  // fp8_max
          static_cast<float>(dtype_saturation(f.tensors[static_cast<size_t>(i)].second));
    }
    float* base = fp8_mem.as<float>();
    fp8.scale = base;
    fp8.scale_inv = base + n * st;
    fp8.amax = base + 2 * n * st;
    fp8.step_amax = base + 3 * n * st;
    fp8.fp8_max = base + 3 * n * st + n;
    fp8.history = base + 3 * n * st + 2 * n;
    fp8.pos = fp8_pos.as<int32_t>();
    fp8.n = static_cast<int32_t>(n);
    fp8.h = static_cast<int32_t>(h);
    fp8.margin = static_cast<int32_t>(f.margin);
    fp8.stride = static_cast<int32_t>(st);
    FUSEBOX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(base, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                    "train: FP8 state"));
    return cuda_status(cudaMemset(fp8.pos, 0, sizeof(int32_t)), "train: FP8 state");
  }

  Status copy_ids(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels, int64_t micro) {
    const size_t want = static_cast<size_t>(tokens * micro);
    if (ids.size() != want || labels.size() != want)
      return InvalidArgument("train: " + std::to_string(ids.size()) + " ids and " +
                             std::to_string(labels.size()) + " labels for " + std::to_string(micro) +
                             " micro-batches of " + std::to_string(tokens) + " tokens");
    std::memcpy(pinned_ids.as<void>(), ids.data(), want * sizeof(int32_t));
    std::memcpy(pinned_labels.as<void>(), labels.data(), want * sizeof(int32_t));
    return Status::Ok();
  }
};

GpuStep::GpuStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuStep::~GpuStep() {
  if (impl_ && impl_->exec) cudaGraphExecDestroy(impl_->exec);
}

Result<std::unique_ptr<GpuStep>> GpuStep::create(const LmConfig& config, const Pipeline& fwd,
                                                 const Pipeline& bwd, const PipelineBackward& derived,
                                                 const std::string& plan_cache, const GpuFp8* fp8) {
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.cfg = config;
  s.fwd = &fwd;
  s.bwd = &bwd;
  s.derived = &derived;
  s.params = lm_parameters(config.model);
  s.tokens = config.train.batch * config.model.context;
  SessionOptions so;
  if (!plan_cache.empty()) {
    s.cache.emplace(PlanCache::open(plan_cache));
    so.cache = &*s.cache;
  }
  FUSEBOX_ASSIGN_OR_RETURN(s.session, Session::create(so));
  const auto t0 = std::chrono::steady_clock::now();
  FUSEBOX_RETURN_IF_ERROR(build_pipeline(*s.session, fwd, PlanRequest{}, &s.fbuild));
  FUSEBOX_RETURN_IF_ERROR(build_pipeline(*s.session, bwd, PlanRequest{}, &s.bbuild));
  s.build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Master weights, moments and gradient sums: one fp32 arena each, parameters in order; the
  // bf16 working copies in one more.
  int64_t total = 0, work_bytes = 0;
  std::vector<int64_t> work_offset;
  for (const LmParameter& p : s.params) {
    s.offset.push_back(total);
    total += (p.elements() + 63) / 64 * 64;  // 256-byte aligned: the forward reads fp32 ones in place
    const int fb = fwd.find_buffer(p.name);
    if (fb < 0) return Internal("train: the model pipeline has no buffer '" + p.name + "'");
    work_offset.push_back(work_bytes);
    if (fwd.buffers[static_cast<size_t>(fb)].dtype == DType::kBF16)
      work_bytes += (p.elements() * 2 + 255) / 256 * 256;
  }
  const size_t fbytes = static_cast<size_t>(total) * sizeof(float);
  FUSEBOX_RETURN_IF_ERROR(s.master.alloc(fbytes, false, "master weights"));
  FUSEBOX_RETURN_IF_ERROR(s.m.alloc(fbytes, false, "AdamW first moments"));
  FUSEBOX_RETURN_IF_ERROR(s.v.alloc(fbytes, false, "AdamW second moments"));
  if (config.train.accum > 1) FUSEBOX_RETURN_IF_ERROR(s.accum.alloc(fbytes, false, "gradient sums"));
  FUSEBOX_RETURN_IF_ERROR(s.work.alloc(static_cast<size_t>(work_bytes), false, "bf16 working weights"));

  if (fp8) FUSEBOX_RETURN_IF_ERROR(s.init_fp8(*fp8));
  // The forward: parameters in the arenas, ids and labels uploaded per step, RoPE angles once,
  // FP8 scaling buffers in the scaling state.
  std::map<int, void*> fext;
  for (int i = 0; i < static_cast<int>(fwd.buffers.size()); ++i)
    if (void* p = s.fp8_buffer(fwd.buffers[static_cast<size_t>(i)].name)) fext[i] = p;
  PipelineHostData fdata;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const int fb = fwd.find_buffer(s.params[i].name);
    const bool bf16 = fwd.buffers[static_cast<size_t>(fb)].dtype == DType::kBF16;
    fext[fb] = bf16 ? static_cast<void*>(s.work.as<char>() + work_offset[i])
                    : static_cast<void*>(s.master.as<float>() + s.offset[i]);
  }
  s.ids_buf = fwd.find_buffer("ids");
  s.labels_buf = fwd.find_buffer("labels");
  s.loss_buf = fwd.find_buffer("loss");
  const int freqs = fwd.find_buffer("freqs");
  if (s.ids_buf < 0 || s.labels_buf < 0 || s.loss_buf < 0 || freqs < 0)
    return Internal("train: the model pipeline lacks ids, labels, loss or freqs");
  fdata.emplace(s.ids_buf, HostTensor::like(buffer_tensor(fwd, s.ids_buf)));
  fdata.emplace(s.labels_buf, HostTensor::like(buffer_tensor(fwd, s.labels_buf)));
  {
    const std::vector<float> a = lm_rope_angles(config.model, config.model.context);
    fdata.emplace(freqs, host_tensor_of(buffer_tensor(fwd, freqs), std::vector<double>(a.begin(), a.end())));
  }
  FUSEBOX_ASSIGN_OR_RETURN(
      s.fe, PipelineExecutor::create(*s.session, fwd, s.fbuild.plans_by_stage(fwd), fdata, fext));

  // The backward reads the forward's buffers in place; its seed is the mean's 1 / (tokens * accum).
  std::map<int, void*> bext;
  PipelineHostData bdata;
  for (int i = 0; i < static_cast<int>(bwd.buffers.size()); ++i) {
    const PipelineBuffer& b = bwd.buffers[static_cast<size_t>(i)];
    if (void* p = s.fp8_buffer(b.name)) {
      bext[i] = p;
      continue;
    }
    if (b.kind != BufferKind::kInput) continue;
    auto it = derived.inputs.find(b.name);
    if (it == derived.inputs.end()) return Internal("train: backward input '" + b.name + "' has no binding");
    if (it->second.kind == BackwardInput::Kind::kGradient) {
      const ResolvedTensor t = buffer_tensor(bwd, i);
      bdata.emplace(i, host_tensor_of(
                           t, std::vector<double>(static_cast<size_t>(t.element_count()),
                                                  1.0 / static_cast<double>(s.tokens * config.train.accum))));
    } else {
      const int fb = fwd.find_buffer(it->second.forward_tensor);
      if (fb < 0)
        return Internal("train: saved buffer '" + it->second.forward_tensor + "' is not the forward's");
      bext[i] = s.fe->device(fb);
    }
  }
  FUSEBOX_ASSIGN_OR_RETURN(
      s.be, PipelineExecutor::create(*s.session, bwd, s.bbuild.plans_by_stage(bwd), bdata, bext,
                                     PipelineExecutorOptions{config.train.share_buffers}));

  // The optimizer's tables.
  for (size_t i = 0; i < s.params.size(); ++i) {
    const LmParameter& p = s.params[i];
    const int gb = bwd.find_buffer(derived.gradients.at(p.name));
    if (gb < 0) return Internal("train: no gradient buffer for '" + p.name + "'");
    const int fb = fwd.find_buffer(p.name);
    tk::Segment seg;
    seg.grad = s.be->device(gb);
    seg.grad_type = elem_type(bwd.buffers[static_cast<size_t>(gb)].dtype);
    s.grad_dtype.push_back(bwd.buffers[static_cast<size_t>(gb)].dtype);
    seg.accum = config.train.accum > 1 ? s.accum.as<float>() + s.offset[i] : nullptr;
    seg.master = s.master.as<float>() + s.offset[i];
    seg.m = s.m.as<float>() + s.offset[i];
    seg.v = s.v.as<float>() + s.offset[i];
    const bool bf16 = fwd.buffers[static_cast<size_t>(fb)].dtype == DType::kBF16;
    seg.work = bf16 ? s.work.as<char>() + work_offset[i] : nullptr;
    seg.work_type = tk::ElemType::kBF16;
    seg.n = p.elements();
    seg.decay = p.decay ? 1 : 0;
    s.host_segs.push_back(seg);
    for (int64_t start = 0; start < seg.n; start += tk::kChunk)
      s.host_chunks.push_back({static_cast<int32_t>(i), start, std::min(tk::kChunk, seg.n - start)});
  }
  FUSEBOX_RETURN_IF_ERROR(s.segs.alloc(s.host_segs.size() * sizeof(tk::Segment), false, "optimizer tables"));
  FUSEBOX_RETURN_IF_ERROR(
      s.chunks.alloc(s.host_chunks.size() * sizeof(tk::Chunk), false, "optimizer tables"));
  FUSEBOX_RETURN_IF_ERROR(s.partials.alloc(s.host_chunks.size() * sizeof(double), false, "norm partials"));
  FUSEBOX_RETURN_IF_ERROR(s.scalars.alloc(sizeof(tk::StepScalars), false, "step scalars"));
  FUSEBOX_RETURN_IF_ERROR(s.hyper.alloc(sizeof(tk::Hyper), false, "step hyperparameters"));
  const size_t ids_bytes = static_cast<size_t>(s.tokens * config.train.accum) * sizeof(int32_t);
  FUSEBOX_RETURN_IF_ERROR(s.pinned_ids.alloc(ids_bytes, true, "token ids"));
  FUSEBOX_RETURN_IF_ERROR(s.pinned_labels.alloc(ids_bytes, true, "labels"));
  FUSEBOX_RETURN_IF_ERROR(s.pinned_hyper.alloc(sizeof(tk::Hyper), true, "step hyperparameters"));
  FUSEBOX_RETURN_IF_ERROR(s.pinned_scalars.alloc(sizeof(tk::StepScalars), true, "step scalars"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(s.segs.as<void>(), s.host_segs.data(), s.host_segs.size() * sizeof(tk::Segment),
                             cudaMemcpyHostToDevice),
                  "train: upload optimizer tables"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(s.chunks.as<void>(), s.host_chunks.data(),
                             s.host_chunks.size() * sizeof(tk::Chunk), cudaMemcpyHostToDevice),
                  "train: upload optimizer tables"));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "train: upload optimizer tables"));
  return std::unique_ptr<GpuStep>(new GpuStep(std::move(impl)));
}

Status GpuStep::upload(const ParamMap& master, const ParamMap& m, const ParamMap& v) {
  Impl& s = *impl_;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: upload"));
  for (size_t i = 0; i < s.params.size(); ++i) {
    const std::string& name = s.params[i].name;
    const size_t bytes = static_cast<size_t>(s.params[i].elements()) * sizeof(float);
    for (const auto& [from, to] : {std::pair{&master, &s.master}, std::pair{&m, &s.m}, std::pair{&v, &s.v}}) {
      auto it = from->find(name);
      if (it == from->end() || it->second.size() * sizeof(float) != bytes)
        return InvalidArgument("train: upload: no values of the right size for '" + name + "'");
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemcpy(to->as<float>() + s.offset[i], it->second.data(), bytes, cudaMemcpyHostToDevice),
          "train: upload '" + name + "'"));
    }
  }
  // The copies above ran on the legacy stream, which the session's non-blocking stream does not
  // wait for: the device waits for them before the working copies (and any later step) read them.
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "train: upload"));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(
      tk::copy_to_working(s.segs.as<tk::Segment>(), s.chunks.as<tk::Chunk>(), s.nchunks(), s.stream()),
      "train: working copies"));
  return cuda_status(cudaStreamSynchronize(s.stream()), "train: working copies");
}

Status GpuStep::download(ParamMap* master, ParamMap* m, ParamMap* v) const {
  const Impl& s = *impl_;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: download"));
  for (size_t i = 0; i < s.params.size(); ++i) {
    const std::string& name = s.params[i].name;
    const size_t n = static_cast<size_t>(s.params[i].elements());
    for (const auto& [to, from] : {std::pair{master, &s.master}, std::pair{m, &s.m}, std::pair{v, &s.v}}) {
      std::vector<float>& dst = (*to)[name];
      dst.resize(n);
      FUSEBOX_RETURN_IF_ERROR(cuda_status(
          cudaMemcpy(dst.data(), from->as<float>() + s.offset[i], n * sizeof(float), cudaMemcpyDeviceToHost),
          "train: download '" + name + "'"));
    }
  }
  return Status::Ok();
}

Result<GpuStepResult> GpuStep::step(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                                    double lr, int64_t t) {
  Impl& s = *impl_;
  FUSEBOX_RETURN_IF_ERROR(s.copy_ids(ids, labels, s.accum_count()));
  s.set_hyper(lr, t);
  GpuStepResult r;
  if (!s.eager_done || s.graph_failed) {
    // The first step runs eagerly: it loads every kernel outside a capture.
    FUSEBOX_RETURN_IF_ERROR(s.enqueue());
    s.eager_done = true;
  } else {
    if (!s.exec) s.capture();
    if (s.exec) {
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaGraphLaunch(s.exec, s.stream()), "train: launch the step's CUDA graph"));
      r.graph = true;
    } else {
      FUSEBOX_RETURN_IF_ERROR(s.enqueue());
    }
  }
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: step"));
  tk::StepScalars sc;
  std::memcpy(&sc, s.pinned_scalars.as<void>(), sizeof sc);
  r.loss = sc.loss_sum;
  r.norm = std::sqrt(sc.sumsq);
  r.finite = sc.finite != 0;
  return r;
}

Result<LmStepProfile> GpuStep::profile(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                                       int iters) {
  Impl& s = *impl_;
  if (iters < 1)
    return InvalidArgument("train: profile: iters must be at least 1, not " + std::to_string(iters));
  FUSEBOX_RETURN_IF_ERROR(s.copy_ids(ids, labels, s.accum_count()));
  s.set_hyper(0.0, 1);
  const cudaStream_t st = s.stream();
  // iters + 1 events recorded between back-to-back runs: the GPU stays busy, so each interval is
  // one run's execution, not the host's launch latency (the events are read after the last run).
  std::vector<cudaEvent_t> ev(static_cast<size_t>(iters) + 1, nullptr);
  struct Events {
    std::vector<cudaEvent_t>& e;
    ~Events() {
      for (cudaEvent_t x : e)
        if (x) cudaEventDestroy(x);
    }
  } destroy{ev};
  for (cudaEvent_t& e : ev)
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "train: profile: cudaEventCreate"));
  auto time = [&](const std::function<Status()>& run) -> Result<double> {
    for (int w = 0; w < 2; ++w) FUSEBOX_RETURN_IF_ERROR(run());  // warm-up
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ev[0], st), "train: profile: cudaEventRecord"));
    for (int i = 0; i < iters; ++i) {
      FUSEBOX_RETURN_IF_ERROR(run());
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ev[static_cast<size_t>(i) + 1], st),
                                          "train: profile: cudaEventRecord"));
    }
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(st), "train: profile"));
    std::vector<float> ms(static_cast<size_t>(iters));
    for (size_t i = 0; i < ms.size(); ++i)
      FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms[i], ev[i], ev[i + 1]),
                                          "train: profile: cudaEventElapsedTime"));
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  LmStepProfile p;
  p.iters = iters;
  p.accum = s.accum_count();
  // The hyperparameters and the first micro-batch's tokens, as the step's first copies leave them.
  FUSEBOX_RETURN_IF_ERROR(s.upload_first_micro_batch("train: profile"));
  auto stages = [&](const char* part, const Pipeline& pl, PipelineExecutor& ex) -> Status {
    for (size_t i = 0; i < ex.steps().size(); ++i) {
      BoundPlan& step = ex.steps()[i];
      const PipelineStage& stage = pl.stages.at(static_cast<size_t>(ex.step_stages().at(i)));
      FUSEBOX_ASSIGN_OR_RETURN(const double ms, time([&] { return step.execute(); }));
      p.rows.push_back({part, stage.name, step.engine_name(), ms, stage.graph.flops()});
    }
    return Status::Ok();
  };
  auto kernel = [&](const char* what, const std::function<cudaError_t()>& launch) -> Status {
    FUSEBOX_ASSIGN_OR_RETURN(
        const double ms, time([&] { return cuda_status(launch(), std::string("train: profile: ") + what); }));
    p.rows.push_back({"optimizer", what, "", ms, 0});
    return Status::Ok();
  };
  const bool from_grad = s.accum_count() == 1;
  FUSEBOX_RETURN_IF_ERROR(stages("forward", *s.fwd, *s.fe));
  FUSEBOX_RETURN_IF_ERROR(kernel("loss sum", [&] {
    return tk::loss_sum(static_cast<const float*>(s.fe->device(s.loss_buf)), s.tokens, true,
                        s.scalars.as<tk::StepScalars>(), s.hyper.as<tk::Hyper>(), st);
  }));
  FUSEBOX_RETURN_IF_ERROR(stages("backward", *s.bwd, *s.be));
  if (!from_grad)
    FUSEBOX_RETURN_IF_ERROR(kernel("gradient accumulation", [&] {
      return tk::accumulate(s.segs.as<tk::Segment>(), s.chunks.as<tk::Chunk>(), s.nchunks(), true, st);
    }));
  FUSEBOX_RETURN_IF_ERROR(kernel("gradient norm", [&] {
    return tk::grad_norm(s.segs.as<tk::Segment>(), s.chunks.as<tk::Chunk>(), s.nchunks(), from_grad,
                         s.partials.as<double>(), s.scalars.as<tk::StepScalars>(), s.hyper.as<tk::Hyper>(),
                         st);
  }));
  FUSEBOX_RETURN_IF_ERROR(kernel("AdamW", [&] {
    return tk::adamw(s.segs.as<tk::Segment>(), s.chunks.as<tk::Chunk>(), s.nchunks(), from_grad,
                     s.scalars.as<tk::StepScalars>(), s.hyper.as<tk::Hyper>(), st);
  }));
  FUSEBOX_ASSIGN_OR_RETURN(p.step_eager_ms, time([&] { return s.enqueue(); }));
  if (!s.exec && !s.graph_failed) s.capture();
  if (s.exec) {
    FUSEBOX_ASSIGN_OR_RETURN(
        p.step_ms,
        time([&] { return cuda_status(cudaGraphLaunch(s.exec, st), "train: profile: the step's graph"); }));
  } else {
    p.graph_note = s.graph_note;
  }
  return p;
}

Result<int> GpuStep::fp8_calibrate(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                                   int max_passes) {
  Impl& s = *impl_;
  if (s.fp8.n == 0) return 0;
  FUSEBOX_RETURN_IF_ERROR(s.copy_ids(ids, labels, 1));
  const cudaStream_t st = s.stream();
  const size_t n = static_cast<size_t>(s.fp8.n);
  std::vector<float> amax(n);
  size_t zero = n + 1;
  int passes = 0;
  while (passes < max_passes) {
    ++passes;
    FUSEBOX_RETURN_IF_ERROR(s.upload_first_micro_batch("train: FP8 calibration"));
    FUSEBOX_RETURN_IF_ERROR(s.fe->execute());
    FUSEBOX_RETURN_IF_ERROR(s.be->execute());
    FUSEBOX_RETURN_IF_ERROR(cuda_status(tk::fp8_fold_amax(s.fp8, true, st), "train: FP8 amax"));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(tk::fp8_update(s.fp8, st), "train: FP8 scales"));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(amax.data(), s.fp8.step_amax, n * sizeof(float), cudaMemcpyDeviceToHost, st),
        "train: FP8 calibration"));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(st), "train: FP8 calibration"));
    size_t now = 0;
    for (float a : amax) now += a > 0.f ? 0 : 1;
    if (now == 0 || now >= zero) break;
    zero = now;
  }
  return passes;
}

Result<std::map<std::string, std::vector<float>>> GpuStep::fp8_state() const {
  const Impl& s = *impl_;
  const size_t n = static_cast<size_t>(s.fp8.n), h = static_cast<size_t>(s.fp8.h);
  const size_t st = static_cast<size_t>(s.fp8.stride);
  std::vector<float> scale(n * st), ring(n * h);
  int32_t pos = 0;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: FP8 state"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(scale.data(), s.fp8.scale, n * st * sizeof(float), cudaMemcpyDeviceToHost),
                  "train: FP8 state"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(ring.data(), s.fp8.history, n * h * sizeof(float), cudaMemcpyDeviceToHost),
                  "train: FP8 state"));
  if (n > 0)
    FUSEBOX_RETURN_IF_ERROR(
        cuda_status(cudaMemcpy(&pos, s.fp8.pos, sizeof pos, cudaMemcpyDeviceToHost), "train: FP8 state"));
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, i] : s.fp8_index) {
    out["fp8_scale." + name] = {scale[static_cast<size_t>(i) * st]};
    std::vector<float>& hist = out["fp8_amax_history." + name];
    for (size_t k = 0; k < h; ++k)  // the slot written next is the oldest
      hist.push_back(ring[static_cast<size_t>(i) * h + (static_cast<size_t>(pos) + k) % h]);
  }
  return out;
}

Status GpuStep::fp8_restore(const std::map<std::string, std::vector<float>>& state) {
  Impl& s = *impl_;
  const size_t n = static_cast<size_t>(s.fp8.n), h = static_cast<size_t>(s.fp8.h);
  const size_t st = static_cast<size_t>(s.fp8.stride);
  std::vector<float> scale(n * st, 0.f), inv(n * st, 0.f), ring(n * h, 0.f);
  for (const auto& [name, i] : s.fp8_index) {
    auto sc = state.find("fp8_scale." + name);
    auto hi = state.find("fp8_amax_history." + name);
    if (sc == state.end() || hi == state.end() || sc->second.size() != 1 || hi->second.size() != h)
      return InvalidArgument("train: FP8 state of '" + name + "' missing or of the wrong size");
    scale[static_cast<size_t>(i) * st] = sc->second[0];
    inv[static_cast<size_t>(i) * st] = 1.f / sc->second[0];
    std::copy(hi->second.begin(), hi->second.end(),
              ring.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(i) * h));
  }
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: FP8 state"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(s.fp8.scale, scale.data(), n * st * sizeof(float), cudaMemcpyHostToDevice),
                  "train: FP8 state"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(s.fp8.scale_inv, inv.data(), n * st * sizeof(float), cudaMemcpyHostToDevice),
                  "train: FP8 state"));
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemcpy(s.fp8.history, ring.data(), n * h * sizeof(float), cudaMemcpyHostToDevice),
                  "train: FP8 state"));
  if (n > 0)  // oldest first from slot 0: slot 0 is written next
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemset(s.fp8.pos, 0, sizeof(int32_t)), "train: FP8 state"));
  return Status::Ok();
}

Result<double> GpuStep::loss(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels) {
  Impl& s = *impl_;
  FUSEBOX_RETURN_IF_ERROR(s.copy_ids(ids, labels, 1));
  const cudaStream_t st = s.stream();
  tk::Hyper h;
  h.loss_scale = static_cast<float>(1.0 / static_cast<double>(s.tokens));
  std::memcpy(s.pinned_hyper.as<void>(), &h, sizeof h);
  FUSEBOX_RETURN_IF_ERROR(s.upload_first_micro_batch("train: validation"));
  FUSEBOX_RETURN_IF_ERROR(s.fe->execute());
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(tk::loss_sum(static_cast<const float*>(s.fe->device(s.loss_buf)), s.tokens, true,
                               s.scalars.as<tk::StepScalars>(), s.hyper.as<tk::Hyper>(), st),
                  "train: validation loss"));
  tk::StepScalars sc;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(&sc, s.scalars.as<void>(), sizeof sc, cudaMemcpyDeviceToHost, st), "train: loss"));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(st), "train: validation"));
  return sc.loss_sum;
}

Result<ParamMap> GpuStep::gradients() const {
  const Impl& s = *impl_;
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "train: gradients"));
  ParamMap out;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const tk::Segment& seg = s.host_segs[i];
    std::vector<float>& g = out[s.params[i].name];
    g.resize(static_cast<size_t>(seg.n));
    if (seg.accum) {
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaMemcpy(g.data(), seg.accum, g.size() * sizeof(float), cudaMemcpyDeviceToHost),
                      "train: gradients"));
      continue;
    }
    const size_t es = dtype_size_bytes(s.grad_dtype[i]);
    std::vector<uint8_t> raw(g.size() * es);
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemcpy(raw.data(), seg.grad, raw.size(), cudaMemcpyDeviceToHost),
                                        "train: gradients"));
    HostTensor h;
    h.dtype = s.grad_dtype[i];
    h.dims = {seg.n};
    h.strides = {1};
    h.data = std::move(raw);
    g = h.to_float_logical();
  }
  return out;
}

Result<std::string> GpuStep::first_non_finite_gradient() const {
  FUSEBOX_ASSIGN_OR_RETURN(ParamMap g, gradients());
  for (const LmParameter& p : impl_->params) {
    const std::vector<float>& v = g.at(p.name);
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) return "'" + p.name + "' (element " + std::to_string(i) + ")";
  }
  return std::string();
}

int64_t GpuStep::device_bytes() const {
  const Impl& s = *impl_;
  return s.fe->buffer_bytes() + s.be->buffer_bytes() + s.session->workspace_bytes() +
         static_cast<int64_t>(s.master.bytes() * 3 + s.accum.bytes() + s.work.bytes());
}

std::string GpuStep::plan_summary() const {
  const Impl& s = *impl_;
  // Where the build time went (issue 33, "start-up, broken down"): cache hits (lookup and
  // deserialization), plans built now (cuDNN's, partitions), fusebox's own kernels, the plan check.
  int partitioned = 0, cached = 0, stages = 0, native = 0, built = 0;
  double cached_ms = 0, built_ms = 0, native_ms = 0, check_ms = 0;
  std::vector<std::pair<double, std::string>> slowest;  // (ms, what), the 3 slowest stage builds
  for (const auto& [b, p] : {std::pair{&s.fbuild, s.fwd}, std::pair{&s.bbuild, s.bwd}})
    for (const StageBuild& sb : b->stages) {
      char what[96];
      std::snprintf(what, sizeof what, " %.0f ms (check %.0f ms%s)", sb.ms, sb.report.plan_check.ms,
                    sb.report.cache == "hit"       ? ", cached"
                    : !sb.report.partition.empty() ? ", partitioned"
                                                   : "");
      slowest.emplace_back(sb.ms, p->stages.at(static_cast<size_t>(sb.stage)).name + what);
      std::sort(slowest.begin(), slowest.end(),
                [](const auto& x, const auto& y) { return x.first > y.first; });
      if (slowest.size() > 3) slowest.pop_back();
      ++stages;
      partitioned += sb.report.partition.empty() ? 0 : 1;
      check_ms += sb.report.plan_check.ms;
      if (sb.report.cache == "hit") {
        ++cached;
        cached_ms += sb.ms;
      } else if (sb.ok && sb.plan.native()) {
        ++native;
        native_ms += sb.ms;
      } else {
        ++built;
        built_ms += sb.ms;
      }
    }
  std::string slow;
  for (const auto& [ms, what] : slowest) slow += (slow.empty() ? "" : ", ") + what;
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "%d stages (%d partitioned, %d from the plan cache) built in %.0f ms [cache hits %d: %.0f ms; "
      "built now %d: %.0f ms; fusebox kernels %d: %.0f ms; plan check %.0f ms of these]",
      stages, partitioned, cached, s.build_ms, cached, cached_ms, built, built_ms, native, native_ms,
      check_ms);
  return buf + (slow.empty() ? "" : "; slowest: " + slow) +
         (s.graph_failed ? "; the step runs eagerly: " + s.graph_note : "");
}

}  // namespace fusebox
