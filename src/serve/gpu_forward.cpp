// fusebox serving: the model step on the GPU (gpu_forward.h).
#include "gpu_forward.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>

#include "common/cuda_mem.h"
#include "common/cuda_status.h"
#include "common/stopwatch.h"
#include "fusebox/plan_cache.h"
#include "fusebox/session.h"
#include "kernels/kv_pages.h"
#include "kernels/native_kernel.h"
#include "kernels/quantize.h"
#include "kernels/sampling.h"
#include "lm_graphs.h"

namespace fusebox::serve {
namespace {

using common::cuda_status;
using Mem = common::CudaMem;

constexpr int64_t kMinPrefillBucket = 16;
constexpr int64_t kPoolContexts = 4;  // pool_pages 0: at most this many full contexts per request
constexpr size_t kAlign = 256;        // every buffer and input segment (cuDNN wants 16 bytes)

size_t aligned(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t bucket(int64_t n, int64_t floor, int64_t cap) {
  int64_t b = floor;
  while (b < n) b *= 2;
  return std::min(b, cap);
}

std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16_bits(v[i]);
  return out;
}

}  // namespace

int64_t prefill_bucket(int64_t S, int64_t context) { return bucket(S, kMinPrefillBucket, context); }

int64_t prefill_rows(int64_t Sb, int64_t context, int64_t max_batch) {
  return std::max<int64_t>(1, std::min(max_batch, context / std::max<int64_t>(Sb, 1)));
}

struct GpuForward::Impl {
  LmConfig cfg;
  EngineOptions opt;
  std::optional<PlanCache> cache;
  std::unique_ptr<Session> session;
  std::map<std::string, Mem> w;        // parameters on the device (FP8 matrices: e4m3, column-major)
  std::map<std::string, Mem> w_scale;  // FP8 matrices' per-channel scales, fp32 [p]
  Mem x8, x8_scale;                    // FP8: a GEMM's input rows quantized, and their scales
  Mem freqs;
  // The KV pools by layer (a deque: Mem does not move): [pool_pages, kv_heads, page_size, head_dim] bf16.
  std::deque<Mem> kpool, vpool;
  // EngineOptions::fp8_kv: the pools are e4m3 and these their rows' descales, [pool_pages, kv_heads,
  // page_size] fp32 by layer (kernels::KvWrite::fp8_scale).
  std::deque<Mem> kscale, vscale;
  // Activations, sized for the largest bucket's rows.
  Mem h, a, qkv, qkr, o, h1, mm, g, act, last, hn, logits, tokens, top_keys;
  // The step's inputs: one pinned block uploaded with one copy, in aligned segments.
  Mem in_host, in_dev, out_host;
  size_t off_ids = 0, off_table = 0, off_lq = 0, off_lkv = 0, off_start = 0, off_count = 0, off_params = 0;
  size_t in_bytes = 0;
  int64_t max_pages = 0, freq_rows = 0;
  std::vector<int64_t> prefill_last_rows;  // the rows prompt chunks' logits come from (eager programs only)

  std::map<std::string, LmGraph> graphs;
  std::map<std::string, Plan> plans;
  struct Program {
    int64_t B = 0, S = 0;
    std::deque<BoundPlan> bound;
    std::vector<std::function<Status()>> steps;
    std::vector<std::string> labels;  // one per step: the graph's key, or the kernel's name
    cudaGraphExec_t exec = nullptr;
    std::string graph_note;
  };
  std::map<std::pair<int64_t, int64_t>, Program> programs;
  double warmup_ms = 0;
  // Where the warm-up went (summary()): every get_plan's wall time, split by where the plan came
  // from, the plan checks inside it, the slowest graphs, the eager runs and the graph captures.
  struct PlanCost {
    int built = 0, cached = 0, tuned = 0, tune_hits = 0;
    double built_ms = 0, cached_ms = 0, check_ms = 0, tune_ms = 0;
    std::vector<std::pair<double, std::string>> slowest;  // (ms, graph key), the 3 slowest
    // Engines a plan check refused (the graph then served by the next candidate): "graph: engine".
    std::vector<std::string> refused;
  } plan_cost;
  double eager_ms = 0, capture_ms = 0;

  ~Impl() {
    for (auto& [key, p] : programs)
      if (p.exec) cudaGraphExecDestroy(p.exec);
  }

  cudaStream_t stream() const { return static_cast<cudaStream_t>(session->context()->stream()); }
  char* in(size_t off) const { return in_dev.as<char>() + off; }

  Status upload(Mem& m, const void* src, size_t bytes, const std::string& what) {
    FUSEBOX_RETURN_IF_ERROR(m.alloc(aligned(bytes), false, what, "serve"));
    return cuda_status(cudaMemcpy(m.as<void>(), src, bytes, cudaMemcpyHostToDevice), "serve: upload " + what);
  }

  // The plan of `made` (with `engine` pinned, else the session's choice).
  Result<const Plan*> plan(Result<LmGraph> made, const std::string& engine = "") {
    if (!made.ok()) return made.status();
    auto it = plans.find(made->key);
    if (it != plans.end()) return &it->second;
    auto gi = graphs.emplace(made->key, std::move(*made)).first;
    if (tuning && engine.empty()) {
      if (auto tuned = tuned_plan(gi->second))
        return &plans.emplace(gi->first, std::move(*tuned)).first->second;
    }
    PlanReport rep;
    PlanRequest request;
    request.engine = engine;
    FUSEBOX_ASSIGN_OR_RETURN(Plan p, session->get_plan(gi->second.graph, request, &rep));
    const bool built = rep.source == PlanSource::kBuilt;
    (built ? plan_cost.built : plan_cost.cached) += 1;
    (built ? plan_cost.built_ms : plan_cost.cached_ms) += rep.total_ms;
    plan_cost.check_ms += rep.plan_check.ms;
    for (const auto& r : rep.plan_check.rejected)
      plan_cost.refused.push_back(gi->first + ": " + r.engine + " -> " + p.engine_name());
    auto& slow = plan_cost.slowest;
    slow.emplace_back(rep.total_ms, gi->first);
    std::sort(slow.begin(), slow.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    if (slow.size() > 3) slow.pop_back();
    return &plans.emplace(gi->first, std::move(p)).first->second;
  }

  // EngineOptions::tune_decode: the tuned (or cached tuned) winner of `g`, verified; none where the
  // graph cannot be tuned or no candidate verifies (the session's choice then).
  std::optional<Plan> tuned_plan(const LmGraph& g) {
    TunePolicy policy;
    policy.cuda_graph = true;  // the decode step runs as a CUDA graph
    policy.top_k = 4;          // cuDNN's first 4, and fusebox's kernel (tune times it whatever top_k leaves)
    policy.warmup = 3;
    policy.iters = 20;
    const common::Stopwatch watch;
    auto t = session->tune(g.graph, policy);
    plan_cost.tune_ms += watch.ms();
    if (!t.ok() || (!t->hit && !t->result.winner_run.verified_ok)) return std::nullopt;
    (t->hit ? plan_cost.tune_hits : plan_cost.tuned) += 1;
    return std::move(t->plan);
  }

  std::string refused_text() const;

  static void add(Program& p, std::string label, std::function<Status()> step) {
    p.steps.push_back(std::move(step));
    p.labels.push_back(std::move(label));
  }

  Status bind(Program& p, Result<LmGraph> made, const std::map<std::string, void*>& buffers,
              const std::string& engine = "") {
    const std::string key = made.ok() ? made->key : std::string();
    FUSEBOX_ASSIGN_OR_RETURN(const Plan* pl, plan(std::move(made), engine));
    FUSEBOX_ASSIGN_OR_RETURN(BoundPlan b, session->bind(*pl, buffers));
    BoundPlan* bp = &p.bound.emplace_back(std::move(b));
    add(p, key, [bp] { return bp->execute(); });
    return Status::Ok();
  }

  // FP8 weights: quantizes the N rows of `x` ([N, k] bf16) into x8 and x8_scale (a step).
  void quantize(Program& p, const Mem& x, int64_t N, int64_t k) {
    kernels::Fp8Rows r;
    r.x = x.as<void>();
    r.rows = N;
    r.cols = k;
    r.ld = k;
    r.q = x8.as<void>();
    r.scale = x8_scale.as<float>();
    add(p, "quantize_fp8_" + std::to_string(N) + "x" + std::to_string(k),
        [this, r] { return kernels::quantize_rows_fp8(r, stream()); });
  }

  // y = x @ weight `name` (x [N, k] bf16, or with FP8 weights the rows quantize() left in x8),
  // then the epilogue with `extra` ("r" or "g").
  Status gemm(Program& p, int64_t N, int64_t k, int64_t n_out, Epilogue e, const std::string& name,
              const Mem& x, const Mem& y, std::map<std::string, void*> extra = {}) {
    const auto sc = w_scale.find(name);
    const bool fp8 = sc != w_scale.end();
    extra["w"] = w.at(name).as<void>();
    extra["y"] = y.as<void>();
    if (fp8) {
      extra["a"] = x8.as<void>();
      extra["sa"] = x8_scale.as<void>();
      extra["sw"] = sc->second.as<void>();
    } else {
      extra["a"] = x.as<void>();
    }
    return bind(p, gemm_graph(N, k, n_out, e, false, fp8), extra, row_engine("fusebox_gemv"));
  }

  // The deterministic mode's decode step (EngineOptions::deterministic; one token a row): `kernel`,
  // pinned, whose rows do not depend on the batch; else "" (the session's choice).
  bool rows_pinned = false;
  bool tuning = false;  // EngineOptions::tune_decode while a decode bucket is built
  std::string row_engine(const char* kernel) const { return rows_pinned ? kernel : ""; }

  // y = rmsnorm(x) (gain `scale`) @ weight `name`, then the epilogue with `extra`: one graph, which
  // fusebox's few-row matmul runs as one kernel (the decode buckets of at most 8 rows, bf16).
  Status normed_gemm(Program& p, int64_t N, int64_t k, int64_t n_out, Epilogue e, const std::string& name,
                     const Mem& x, void* scale, void* y, std::map<std::string, void*> extra = {}) {
    extra["x"] = x.as<void>();
    extra["scale"] = scale;
    extra["w"] = w.at(name).as<void>();
    extra["y"] = y;
    return bind(p, normed_gemm_graph(cfg.model, N, k, n_out, e), extra, row_engine("fusebox_gemv"));
  }

  // Every step of bucket (B, S): the inputs' upload, the model, sampling, the tokens' download.
  Status build_program(Program& p) {
    const LmModelConfig& m = cfg.model;
    const int64_t B = p.B, S = p.S, N = B * S, D = m.dim, H = m.heads, KV = m.kv_heads, dh = m.head_dim;
    const int64_t P = opt.page_size, F = m.ffn_dim, HK = H + KV, W = (HK + KV) * dh;
    add(p, "upload_inputs", [this] {
      return cuda_status(
          cudaMemcpyAsync(in_dev.as<void>(), in_host.as<void>(), in_bytes, cudaMemcpyHostToDevice, stream()),
          "serve: upload the step's inputs");
    });
    FUSEBOX_RETURN_IF_ERROR(
        bind(p, embedding_graph(m, N),
             {{"ids", in(off_ids)}, {"table", w.at("tok_embeddings").as<void>()}, {"y", h.as<void>()}}));
    const bool fp8 = !w_scale.empty();
    rows_pinned = opt.deterministic && S == 1;
    tuning = opt.tune_decode && S == 1 && !rows_pinned;
    // Decode buckets of at most 8 rows (bf16 weights): each RMSNorm goes into the GEMMs that read
    // it (fusebox_gemv's prologue): no norm launch, the normalized rows never stored. Only where
    // that kernel takes the graph (large enough weights): elsewhere the graph would be partitioned.
    // The deterministic mode's decode step: always (pinned; a graph it cannot take fails to build).
    auto takes = [&](const Result<LmGraph>& g) {
      if (rows_pinned) return true;
      if (!g.ok()) return false;
      const auto f = kernels::faster_native_kernel(g->graph);
      return f.kernel != nullptr && f.by_default;
    };
    auto gemv_takes = [&](int64_t rows, int64_t k, int64_t n_out, Epilogue e, bool fp32_out) {
      return takes(normed_gemm_graph(m, rows, k, n_out, e, fp32_out));
    };
    const bool fuse_qkv = !fp8 && gemv_takes(N, D, W, Epilogue::kNone, false),
               fuse_ffn = !fp8 && gemv_takes(N, D, F, Epilogue::kSilu, false) &&
                          gemv_takes(N, D, F, Epilogue::kMul, false);
    // The gate and up projections as one graph where the few-row matmul's gated form takes it: one
    // launch over both weights instead of two, the gate's activations never stored.
    const bool fuse_swiglu = fuse_ffn && takes(normed_swiglu_graph(m, N, D, F));
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string pre = "layers." + std::to_string(l) + ".";
      auto wp = [&](const char* name) { return w.at(pre + name).as<void>(); };
      // One GEMM for Q, K and V (rows of W = (H + 2 KV) x dh), one RoPE over the query and key
      // heads into qkr (rows of HK = H + KV heads).
      if (fuse_qkv) {
        FUSEBOX_RETURN_IF_ERROR(
            normed_gemm(p, N, D, W, Epilogue::kNone, qkv_name(l), h, wp("attention_norm"), qkv.as<void>()));
      } else {
        FUSEBOX_RETURN_IF_ERROR(
            bind(p, rmsnorm_graph(m, N),
                 {{"x", h.as<void>()}, {"scale", wp("attention_norm")}, {"y", a.as<void>()}}));
        if (fp8) quantize(p, a, N, D);
        FUSEBOX_RETURN_IF_ERROR(gemm(p, N, D, W, Epilogue::kNone, qkv_name(l), a, qkv));
      }
      FUSEBOX_RETURN_IF_ERROR(bind(p, rope_graph(m, B, HK, S, freq_rows, W),
                                   {{"x", qkv.as<void>()},
                                    {"freqs", freqs.as<void>()},
                                    {"offset", in(off_start)},
                                    {"y", qkr.as<void>()}}));
      // The new keys (rotated: qkr's last KV heads) and values (qkv's last KV heads) into the
      // pools, read as [B, KV, S, dh], both in one launch.
      kernels::KvWrite wr;
      wr.src = qkr.as<char>() + H * dh * 2;
      wr.src2 = qkv.as<char>() + HK * dh * 2;
      wr.batch = B;
      wr.heads = KV;
      wr.tokens = S;
      wr.dim = dh;
      const int64_t k_strides[4] = {S * HK * dh, dh, HK * dh, 1}, v_strides[4] = {S * W, dh, W, 1};
      std::copy(k_strides, k_strides + 4, wr.src_strides);
      std::copy(v_strides, v_strides + 4, wr.src2_strides);
      wr.elem_bytes = 2;
      wr.pool = kpool[static_cast<size_t>(l)].as<void>();
      wr.pool2 = vpool[static_cast<size_t>(l)].as<void>();
      if (opt.fp8_kv) {
        wr.fp8_scale = kscale[static_cast<size_t>(l)].as<float>();
        wr.fp8_scale2 = vscale[static_cast<size_t>(l)].as<float>();
      }
      wr.num_pages = opt.pool_pages;
      wr.page_size = P;
      wr.max_pages = max_pages;
      wr.page_table = reinterpret_cast<const int32_t*>(in(off_table));
      wr.start = reinterpret_cast<const int32_t*>(in(off_start));
      wr.count = reinterpret_cast<const int32_t*>(in(off_count));
      add(p, "write_kv_pages", [this, wr] { return kernels::write_kv_pages(wr, stream()); });
      std::map<std::string, void*> att = {{"q", qkr.as<void>()},
                                          {"k", kpool[static_cast<size_t>(l)].as<void>()},
                                          {"v", vpool[static_cast<size_t>(l)].as<void>()},
                                          {"table", in(off_table)},
                                          {"lq", in(off_lq)},
                                          {"lkv", in(off_lkv)},
                                          {"o", o.as<void>()}};
      if (opt.fp8_kv) {
        att["dk"] = kscale[static_cast<size_t>(l)].as<void>();
        att["dv"] = vscale[static_cast<size_t>(l)].as<void>();
      }
      FUSEBOX_RETURN_IF_ERROR(
          bind(p, attention_graph(m, B, S, max_pages, opt.pool_pages, P, HK * dh, opt.fp8_kv), att,
               row_engine("fusebox_sdpa_decode")));
      if (fp8) quantize(p, o, N, H * dh);
      FUSEBOX_RETURN_IF_ERROR(
          gemm(p, N, H * dh, D, Epilogue::kResidual, pre + "wo", o, h1, {{"r", h.as<void>()}}));
      if (fuse_swiglu) {
        FUSEBOX_RETURN_IF_ERROR(bind(p, normed_swiglu_graph(m, N, D, F),
                                     {{"x", h1.as<void>()},
                                      {"scale", wp("ffn_norm")},
                                      {"w_gate", w.at(pre + "w_gate").as<void>()},
                                      {"w_up", w.at(pre + "w_up").as<void>()},
                                      {"y", act.as<void>()}},
                                     row_engine("fusebox_gemv")));
      } else if (fuse_ffn) {
        FUSEBOX_RETURN_IF_ERROR(
            normed_gemm(p, N, D, F, Epilogue::kSilu, pre + "w_gate", h1, wp("ffn_norm"), g.as<void>()));
        FUSEBOX_RETURN_IF_ERROR(normed_gemm(p, N, D, F, Epilogue::kMul, pre + "w_up", h1, wp("ffn_norm"),
                                            act.as<void>(), {{"g", g.as<void>()}}));
      } else {
        FUSEBOX_RETURN_IF_ERROR(bind(
            p, rmsnorm_graph(m, N), {{"x", h1.as<void>()}, {"scale", wp("ffn_norm")}, {"y", mm.as<void>()}}));
        if (fp8) quantize(p, mm, N, D);
        FUSEBOX_RETURN_IF_ERROR(gemm(p, N, D, F, Epilogue::kSilu, pre + "w_gate", mm, g));
        FUSEBOX_RETURN_IF_ERROR(
            gemm(p, N, D, F, Epilogue::kMul, pre + "w_up", mm, act, {{"g", g.as<void>()}}));
      }
      if (fp8) quantize(p, act, N, F);
      FUSEBOX_RETURN_IF_ERROR(
          gemm(p, N, F, D, Epilogue::kResidual, pre + "w_down", act, h, {{"r", h1.as<void>()}}));
    }
    // The logits of each sequence's last new token: every row in decode, rows
    // `prefill_last_rows` of prompt chunks (copied out; such programs run eagerly).
    void* x = h.as<void>();
    if (S > 1) {
      x = last.as<void>();
      add(p, "last_rows", [this, D] {
        for (size_t b = 0; b < prefill_last_rows.size(); ++b)
          FUSEBOX_RETURN_IF_ERROR(
              cuda_status(cudaMemcpyAsync(last.as<char>() + static_cast<int64_t>(b) * D * 2,
                                          h.as<char>() + prefill_last_rows[b] * D * 2,
                                          static_cast<size_t>(D) * 2, cudaMemcpyDeviceToDevice, stream()),
                          "serve: a prompt's last row"));
        return Status::Ok();
      });
    }
    if (gemv_takes(B, D, m.vocab, Epilogue::kNone, true)) {  // the final norm in the logits GEMM
      FUSEBOX_RETURN_IF_ERROR(bind(p, normed_gemm_graph(m, B, D, m.vocab, Epilogue::kNone, /*fp32_out=*/true),
                                   {{"x", x},
                                    {"scale", w.at("norm").as<void>()},
                                    {"w", w.at("output").as<void>()},
                                    {"y", logits.as<void>()}},
                                   row_engine("fusebox_gemv")));
    } else {
      FUSEBOX_RETURN_IF_ERROR(
          bind(p, rmsnorm_graph(m, B), {{"x", x}, {"scale", w.at("norm").as<void>()}, {"y", hn.as<void>()}}));
      FUSEBOX_RETURN_IF_ERROR(
          bind(p, gemm_graph(B, D, m.vocab, Epilogue::kNone, /*fp32_out=*/true),
               {{"a", hn.as<void>()}, {"w", w.at("output").as<void>()}, {"y", logits.as<void>()}}));
    }
    add(p, "sample_tokens", [this, B] {
      return kernels::sample_tokens(logits.as<float>(), B, cfg.model.vocab, cfg.model.vocab,
                                    reinterpret_cast<const kernels::SamplingRow*>(in(off_params)),
                                    tokens.as<int32_t>(), stream(), top_keys.as<uint64_t>());
    });
    add(p, "download_tokens", [this, B] {
      return cuda_status(cudaMemcpyAsync(out_host.as<void>(), tokens.as<void>(), static_cast<size_t>(B) * 4,
                                         cudaMemcpyDeviceToHost, stream()),
                         "serve: download the sampled tokens");
    });
    return Status::Ok();
  }

  Status enqueue(Program& p) {
    for (auto& s : p.steps) FUSEBOX_RETURN_IF_ERROR(s());
    return Status::Ok();
  }

  // Records a decode program as one CUDA graph; on failure it stays eager (graph_note says why).
  void capture(Program& p) {
    const cudaStream_t s = stream();
    cudaGraph_t gr = nullptr;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
      p.graph_note = "cudaStreamBeginCapture failed";
      (void)cudaGetLastError();
      return;
    }
    const Status st = enqueue(p);
    const cudaError_t end = cudaStreamEndCapture(s, &gr);
    if (!st.ok() || end != cudaSuccess || !gr) {
      p.graph_note =
          !st.ok() ? st.ToString() : std::string("cudaStreamEndCapture: ") + cudaGetErrorString(end);
      if (gr) cudaGraphDestroy(gr);
      (void)cudaGetLastError();
      return;
    }
    const cudaError_t inst = cudaGraphInstantiate(&p.exec, gr, 0);
    cudaGraphDestroy(gr);
    if (inst != cudaSuccess) {
      p.exec = nullptr;
      p.graph_note = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(inst);
      (void)cudaGetLastError();
    }
  }

  // The inputs of a step into the pinned block; padding rows (past rows.size()) have count 0.
  void fill(const std::vector<GpuRow>& rows, int64_t B, int64_t S, int64_t S_in,
            const std::vector<int32_t>& ids) {
    char* base = in_host.as<char>();
    std::memset(base, 0, in_bytes);
    auto i32 = [&](size_t off) { return reinterpret_cast<int32_t*>(base + off); };
    auto* params = reinterpret_cast<kernels::SamplingRow*>(base + off_params);
    for (int64_t b = 0; b < B; ++b) {
      i32(off_lq)[b] = 1;
      i32(off_lkv)[b] = 1;
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const GpuRow& row = rows[r];
      const auto b = static_cast<int64_t>(r);
      for (int64_t s = 0; s < S_in; ++s) i32(off_ids)[b * S + s] = ids[static_cast<size_t>(b * S_in + s)];
      for (size_t i = 0; i < row.pages->size() && static_cast<int64_t>(i) < max_pages; ++i)
        i32(off_table)[b * max_pages + static_cast<int64_t>(i)] = (*row.pages)[i];
      i32(off_lq)[b] = static_cast<int32_t>(row.count);
      i32(off_lkv)[b] = static_cast<int32_t>(row.start + row.count);
      i32(off_start)[b] = static_cast<int32_t>(row.start);
      i32(off_count)[b] = static_cast<int32_t>(row.count);
      params[r] = {row.sampling.temperature, row.sampling.top_k, row.sampling.top_p, row.u};
    }
  }

  Status launch(Program& p) {
    if (p.exec) return cuda_status(cudaGraphLaunch(p.exec, stream()), "serve: launch the decode CUDA graph");
    return enqueue(p);
  }

  Result<Program*> program(int64_t B, int64_t S) {
    auto [it, fresh] = programs.try_emplace({B, S});
    if (fresh) {
      it->second.B = B;
      it->second.S = S;
      const Status st = build_program(it->second);
      if (!st.ok()) {
        programs.erase(it);
        return st.WithContext("serve: the step of " + std::to_string(B) + " sequences x " +
                              std::to_string(S) + " tokens");
      }
    }
    return &it->second;
  }
};

GpuForward::GpuForward(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GpuForward::~GpuForward() = default;

Result<std::unique_ptr<GpuForward>> GpuForward::create(
    const LmConfig& config, const EngineOptions& options,
    const std::map<std::string, std::vector<float>>& weights) {
  const auto t0 = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.cfg = config;
  s.opt = options;
  const LmModelConfig& m = config.model;
  SessionOptions so;
  if (!options.plan_cache.empty()) {
    s.cache.emplace(PlanCache::open(options.plan_cache));
    so.cache = &*s.cache;
  }
  auto session = Session::create(so);
  if (!session.ok())
    return NotSupported("serve: the GPU backend needs a GPU: " + session.status().ToString());
  s.session = std::move(*session);
  if (s.session->deviceless()) return NotSupported("serve: the GPU backend needs a GPU");

  // Weights: matrices and the output projection bf16 (or the layers' matrices FP8 with their
  // scales), the embedding table and gains fp32.
  for (const LmParameter& p : serve_parameters(m)) {
    const std::vector<float>& v = weights.at(p.name);
    const bool fp32 = p.name == "tok_embeddings" || p.init_std == 0;
    if (fp8_matrix(options.weights, p)) {
      const Fp8Weight q =
          quantize_weight(v, p.shape[0], p.shape[1], options.weights == ServeWeights::kFP8Tensor);
      FUSEBOX_RETURN_IF_ERROR(s.upload(s.w[p.name], q.q.data(), q.q.size(), p.name));
      FUSEBOX_RETURN_IF_ERROR(
          s.upload(s.w_scale[p.name], q.scale.data(), q.scale.size() * 4, p.name + " scales"));
    } else if (fp32) {
      FUSEBOX_RETURN_IF_ERROR(s.upload(s.w[p.name], v.data(), v.size() * 4, p.name));
    } else {
      const std::vector<uint16_t> b = bf16_bits(v);
      FUSEBOX_RETURN_IF_ERROR(s.upload(s.w[p.name], b.data(), b.size() * 2, p.name));
    }
  }
  const int64_t prefill_cap = m.context;
  s.max_pages = (m.context + options.page_size - 1) / options.page_size;
  s.freq_rows = m.context + prefill_cap;  // a padded chunk's rows may sit past the context
  const std::vector<float> f = lm_rope_angles(m, s.freq_rows);
  FUSEBOX_RETURN_IF_ERROR(s.upload(s.freqs, f.data(), f.size() * 4, "RoPE angles"));
  const int64_t B = options.max_batch, N = std::max(B, prefill_cap), D = m.dim;
  const int64_t qw = m.heads * m.head_dim, kvw = m.kv_heads * m.head_dim;
  const std::pair<Mem*, int64_t> acts[] = {{&s.h, N * D},
                                           {&s.a, N * D},
                                           {&s.qkv, N * (qw + 2 * kvw)},
                                           {&s.qkr, N * (qw + kvw)},
                                           {&s.o, N * qw},
                                           {&s.h1, N * D},
                                           {&s.mm, N * D},
                                           {&s.g, N * m.ffn_dim},
                                           {&s.act, N * m.ffn_dim},
                                           {&s.last, B * D},
                                           {&s.hn, B * D}};
  for (const auto& [mem, elems] : acts)
    FUSEBOX_RETURN_IF_ERROR(
        mem->alloc(aligned(static_cast<size_t>(elems) * 2), false, "activations", "serve"));
  // A prompt batch's padding rows are normalized and sampled from (then dropped): zeros, not
  // whatever the memory held.
  FUSEBOX_RETURN_IF_ERROR(
      cuda_status(cudaMemset(s.last.as<void>(), 0, s.last.bytes()), "serve: clear the last rows"));
  if (options.weights != ServeWeights::kBF16) {
    const int64_t widest = std::max({D, qw + 2 * kvw, m.ffn_dim});
    FUSEBOX_RETURN_IF_ERROR(
        s.x8.alloc(aligned(static_cast<size_t>(N * widest)), false, "FP8 activations", "serve"));
    FUSEBOX_RETURN_IF_ERROR(
        s.x8_scale.alloc(aligned(static_cast<size_t>(N) * 4), false, "FP8 scales", "serve"));
  }
  FUSEBOX_RETURN_IF_ERROR(s.logits.alloc(static_cast<size_t>(B * m.vocab) * 4, false, "logits", "serve"));
  FUSEBOX_RETURN_IF_ERROR(s.tokens.alloc(static_cast<size_t>(B) * 4, false, "tokens", "serve"));
  FUSEBOX_RETURN_IF_ERROR(s.top_keys.alloc(static_cast<size_t>(B) * 8, false, "argmax scratch", "serve"));
  // The input block: ids, page table, lq, lkv, start, count, sampling rows.
  size_t off = 0;
  auto seg = [&](size_t* o, size_t bytes) {
    *o = off;
    off += aligned(bytes);
  };
  seg(&s.off_ids, static_cast<size_t>(N) * 4);
  seg(&s.off_table, static_cast<size_t>(B * s.max_pages) * 4);
  for (size_t* o : {&s.off_lq, &s.off_lkv, &s.off_start, &s.off_count}) seg(o, static_cast<size_t>(B) * 4);
  seg(&s.off_params, static_cast<size_t>(B) * sizeof(kernels::SamplingRow));
  s.in_bytes = off;
  FUSEBOX_RETURN_IF_ERROR(s.in_host.alloc(off, true, "step inputs", "serve"));
  FUSEBOX_RETURN_IF_ERROR(s.in_dev.alloc(off, false, "step inputs", "serve"));
  FUSEBOX_RETURN_IF_ERROR(s.out_host.alloc(static_cast<size_t>(B) * 4, true, "sampled tokens", "serve"));
  // The pools: pool_pages per layer, or (0) as many as 90% of the free memory holds after a
  // reserve for the workspace arena, cuDNN and the CUDA graphs, at most kPoolContexts full
  // contexts per running request (every request at the full context, and prefix pages for as
  // many again, twice). More would sit unused, and the attention plan's check would fill a pool of
  // millions of pages with random values (a tiny model on an H100 asked for 16M pages: the check
  // ran past 150 s).
  // A page of one pool: bf16 values, or e4m3 ones and an fp32 descale a row.
  const size_t rows_a_page = static_cast<size_t>(m.kv_heads * options.page_size);
  const size_t value_bytes = rows_a_page * static_cast<size_t>(m.head_dim) * (options.fp8_kv ? 1 : 2);
  const size_t scale_bytes = options.fp8_kv ? rows_a_page * 4 : 0;
  const size_t page_bytes = value_bytes + scale_bytes;
  if (s.opt.pool_pages == 0) {
    size_t free = 0, total = 0;
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaMemGetInfo(&free, &total), "serve: free device memory"));
    const double reserve = 2.0 * (1 << 30);
    const double usable = 0.9 * static_cast<double>(free) - reserve;
    const double per_page = 2.0 * static_cast<double>(m.layers) * static_cast<double>(page_bytes);
    const int64_t useful = kPoolContexts * options.max_batch * s.max_pages;
    s.opt.pool_pages = usable > 0 ? std::min<int64_t>(static_cast<int64_t>(usable / per_page), useful) : 0;
    if (s.opt.pool_pages < s.max_pages)
      return InvalidArgument("serve: the device's free memory (" + std::to_string(free >> 20) +
                             " MiB after the weights) holds " + std::to_string(s.opt.pool_pages) +
                             " KV pages; one request at the full context needs " +
                             std::to_string(s.max_pages) +
                             ": give pool_pages, or a smaller model or context");
  }
  const size_t pool_bytes = static_cast<size_t>(s.opt.pool_pages) * value_bytes;
  for (int64_t l = 0; l < m.layers; ++l) {
    for (auto* pool : {&s.kpool.emplace_back(), &s.vpool.emplace_back()}) {
      FUSEBOX_RETURN_IF_ERROR(pool->alloc(pool_bytes, false, "KV pool", "serve"));
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaMemset(pool->as<void>(), 0, pool_bytes), "serve: clear the KV pool"));
    }
    if (!options.fp8_kv) continue;
    const size_t bytes = static_cast<size_t>(s.opt.pool_pages) * scale_bytes;
    for (auto* scale : {&s.kscale.emplace_back(), &s.vscale.emplace_back()}) {
      FUSEBOX_RETURN_IF_ERROR(scale->alloc(bytes, false, "KV descales", "serve"));
      FUSEBOX_RETURN_IF_ERROR(
          cuda_status(cudaMemset(scale->as<void>(), 0, bytes), "serve: clear the KV descales"));
    }
  }

  // Warm-up: every bucket's plans, one eager run of each (all rows padding: nothing written to
  // the pools), then the decode buckets' CUDA graphs (the workspace arena no longer grows).
  // The buckets are what run() picks (bucket()), every one of them.
  for (int64_t b = bucket(1, 1, B);; b = bucket(b + 1, 1, B)) {
    FUSEBOX_RETURN_IF_ERROR(s.program(b, 1).status());
    if (b >= B) break;
  }
  for (int64_t sb = prefill_bucket(2, prefill_cap); s.opt.warm_prompt_buckets;
       sb = prefill_bucket(sb + 1, prefill_cap)) {
    const int64_t rows = prefill_rows(sb, prefill_cap, B);
    for (int64_t b = bucket(1, 1, rows);; b = bucket(b + 1, 1, rows)) {
      FUSEBOX_RETURN_IF_ERROR(s.program(b, sb).status());
      if (b >= rows) break;
    }
    if (sb >= prefill_cap) break;
  }
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  };
  const auto t_eager = std::chrono::steady_clock::now();
  for (auto& [key, p] : s.programs) {
    s.fill({}, p.B, p.S, p.S, {});
    FUSEBOX_RETURN_IF_ERROR(s.enqueue(p));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "serve: warm-up"));
  }
  s.eager_ms = since(t_eager);
  const auto t_capture = std::chrono::steady_clock::now();
  for (auto& [key, p] : s.programs)
    if (p.S == 1) s.capture(p);
  s.capture_ms = since(t_capture);
  s.warmup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return std::unique_ptr<GpuForward>(new GpuForward(std::move(impl)));
}

Result<GpuStepOut> GpuForward::run(const std::vector<GpuRow>& rows, int64_t S,
                                   const std::vector<int32_t>& ids, bool want_logits) {
  Impl& s = *impl_;
  const auto n = static_cast<int64_t>(rows.size());
  const int64_t context = s.cfg.model.context;
  const int64_t Sb = S == 1 ? 1 : prefill_bucket(S, context);
  const int64_t cap = S == 1 ? s.opt.max_batch : prefill_rows(Sb, context, s.opt.max_batch);
  bool counts_ok = true;
  for (const GpuRow& r : rows) counts_ok = counts_ok && r.count >= 1 && r.count <= S;
  if (n < 1 || S < 1 || n > cap || S > context || static_cast<int64_t>(ids.size()) != n * S || !counts_ok)
    return Internal("serve: a GPU step of " + std::to_string(n) + " rows x " + std::to_string(S) +
                    " tokens (" + std::to_string(ids.size()) + " ids; at most " + std::to_string(cap) +
                    " rows, counts in [1, S])");
  const int64_t B = bucket(n, 1, cap);
  FUSEBOX_ASSIGN_OR_RETURN(Impl::Program * p, s.program(B, Sb));
  s.fill(rows, B, Sb, S, ids);
  s.prefill_last_rows.clear();
  for (int64_t b = 0; b < n; ++b)
    s.prefill_last_rows.push_back(b * Sb + rows[static_cast<size_t>(b)].count - 1);
  FUSEBOX_RETURN_IF_ERROR(s.launch(*p));
  FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s.stream()), "serve: step"));
  GpuStepOut out;
  out.tokens.assign(s.out_host.as<int32_t>(), s.out_host.as<int32_t>() + n);
  if (want_logits) {
    out.logits.resize(static_cast<size_t>(n * s.cfg.model.vocab));
    FUSEBOX_RETURN_IF_ERROR(cuda_status(
        cudaMemcpy(out.logits.data(), s.logits.as<void>(), out.logits.size() * 4, cudaMemcpyDeviceToHost),
        "serve: download the logits"));
  }
  return out;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Milliseconds between two recorded events (0 when either failed).
double elapsed(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  return cudaEventElapsedTime(&ms, a, b) == cudaSuccess ? static_cast<double>(ms) : 0.0;
}

}  // namespace

Result<std::string> GpuForward::profile(int64_t B, int64_t context, int iters) {
  Impl& s = *impl_;
  const LmModelConfig& m = s.cfg.model;
  if (B < 1 || B > s.opt.max_batch || context < 1 || context > m.context || iters < 1 || iters > 10000)
    return InvalidArgument("serve: profile a decode step of 1.." + std::to_string(s.opt.max_batch) +
                           " sequences at 1.." + std::to_string(m.context) + " tokens, 1..10000 runs");
  const int64_t P = s.opt.page_size;
  if (B * ((context + P - 1) / P) > s.opt.pool_pages)
    return InvalidArgument("serve: " + std::to_string(B) + " sequences of " + std::to_string(context) +
                           " tokens need more than the pool's " + std::to_string(s.opt.pool_pages) +
                           " pages");
  const int64_t bucket_b = bucket(B, 1, s.opt.max_batch);
  FUSEBOX_ASSIGN_OR_RETURN(Impl::Program * p, s.program(bucket_b, 1));
  // Each sequence on pages of its own, its new token at position context - 1.
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(B));
  std::vector<GpuRow> rows;
  int32_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < (context + P - 1) / P; ++i) pages[static_cast<size_t>(b)].push_back(next++);
    rows.push_back({context - 1, 1, &pages[static_cast<size_t>(b)], SamplingParams{}, 0.5});
  }
  s.fill(rows, bucket_b, 1, 1, std::vector<int32_t>(static_cast<size_t>(B), 1));
  const cudaStream_t st = s.stream();
  std::vector<cudaEvent_t> ev(p->steps.size() + 1);
  for (auto& e : ev) FUSEBOX_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "serve: profile events"));
  auto destroy = [&] {
    for (auto& e : ev) cudaEventDestroy(e);
  };
  std::vector<double> graph_ms, eager_ms;
  std::vector<std::vector<double>> step_ms(p->steps.size());
  Status bad = Status::Ok();
  for (int it = 0; it <= iters && bad.ok(); ++it) {  // run 0 warms up
    if (p->exec) {
      cudaEventRecord(ev[0], st);
      bad = s.launch(*p);
      cudaEventRecord(ev[1], st);
      if (bad.ok()) bad = cuda_status(cudaStreamSynchronize(st), "serve: profile");
      if (bad.ok() && it > 0) graph_ms.push_back(elapsed(ev[0], ev[1]));
    }
    for (size_t i = 0; i < p->steps.size() && bad.ok(); ++i) {
      cudaEventRecord(ev[i], st);
      bad = p->steps[i]();
    }
    cudaEventRecord(ev.back(), st);
    if (bad.ok()) bad = cuda_status(cudaStreamSynchronize(st), "serve: profile");
    if (!bad.ok() || it == 0) continue;
    eager_ms.push_back(elapsed(ev[0], ev.back()));
    for (size_t i = 0; i < p->steps.size(); ++i) step_ms[i].push_back(elapsed(ev[i], ev[i + 1]));
  }
  destroy();
  FUSEBOX_RETURN_IF_ERROR(bad);
  // The copy peak: a device-to-device copy of up to 1 GiB (read and write both counted).
  double peak_gbs = 0;
  {
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    const size_t bytes = std::min<size_t>(size_t{1} << 30, free / 4) & ~size_t{255};
    Mem a, b;
    if (bytes > (size_t{1} << 20) && a.alloc(bytes, false, "copy peak", "serve").ok() &&
        b.alloc(bytes, false, "copy peak", "serve").ok()) {
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<double> t;
      for (int i = 0; i < 6; ++i) {
        cudaEventRecord(e0, st);
        cudaMemcpyAsync(b.as<void>(), a.as<void>(), bytes, cudaMemcpyDeviceToDevice, st);
        cudaEventRecord(e1, st);
        cudaStreamSynchronize(st);
        if (i > 0) t.push_back(elapsed(e0, e1));
      }
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      const double ms = median(t);
      if (ms > 0) peak_gbs = 2.0 * static_cast<double>(bytes) / (ms * 1e6);
    }
    (void)cudaGetLastError();
  }
  // What a step must read: every weight but the embedding table (B rows of it), the KV cache.
  double weights = 0;
  for (const auto* ws : {&s.w, &s.w_scale})
    for (const auto& [name, mem] : *ws)
      if (name != "tok_embeddings") weights += static_cast<double>(mem.bytes());
  weights += static_cast<double>(B * m.dim * 4);
  // K and V: bf16 values, or e4m3 ones and an fp32 descale a row (fp8_kv).
  const double row_bytes =
      s.opt.fp8_kv ? static_cast<double>(m.head_dim + 4) : 2.0 * static_cast<double>(m.head_dim);
  const double kv = 2.0 * static_cast<double>(m.layers * B * context * m.kv_heads) * row_bytes;
  const double step = p->exec ? median(graph_ms) : median(eager_ms);
  const double gbs = step > 0 ? (weights + kv) / (step * 1e6) : 0;
  char line[512];
  std::string out;
  std::snprintf(line, sizeof line,
                "decode step, %lld sequence(s) at %lld tokens (bucket %lld): %.4f ms %s (%.4f ms eager, "
                "steps one by one), %.0f tokens/s; reads %.1f MB weights + %.1f MB KV = %.2f TB/s, %.0f%% "
                "of the %.2f TB/s copy peak measured now\n",
                static_cast<long long>(B), static_cast<long long>(context), static_cast<long long>(bucket_b),
                step, p->exec ? "as a CUDA graph" : "eager (no CUDA graph)", median(eager_ms),
                step > 0 ? 1e3 * static_cast<double>(B) / step : 0.0, weights / 1e6, kv / 1e6, gbs / 1e3,
                peak_gbs > 0 ? 100.0 * gbs / peak_gbs : 0.0, peak_gbs / 1e3);
  out += line;
  // Steps by label (the graph's key: one line per distinct shape, summed over the layers).
  std::map<std::string, std::pair<int, double>> by;
  std::vector<std::string> order;
  double sum = 0;
  for (size_t i = 0; i < p->steps.size(); ++i) {
    const double ms = median(step_ms[i]);
    sum += ms;
    auto [it, fresh] = by.try_emplace(p->labels[i], 0, 0.0);
    if (fresh) order.push_back(p->labels[i]);
    it->second.first += 1;
    it->second.second += ms;
  }
  std::sort(order.begin(), order.end(),
            [&](const std::string& a, const std::string& b) { return by[a].second > by[b].second; });
  for (const std::string& label : order) {
    std::snprintf(line, sizeof line, "  %-44s x%-3d %9.1f us  %5.1f%%\n", label.c_str(), by[label].first,
                  1e3 * by[label].second, sum > 0 ? 100.0 * by[label].second / sum : 0.0);
    out += line;
  }
  return out;
}

std::string GpuForward::summary() const {
  const Impl& s = *impl_;
  int graphs = 0;
  std::string notes;
  for (const auto& [key, p] : s.programs) {
    graphs += p.exec ? 1 : 0;
    if (p.S == 1 && !p.exec) notes += "; batch " + std::to_string(p.B) + " eager: " + p.graph_note;
  }
  const char* weights = s.opt.weights == ServeWeights::kBF16         ? "bf16"
                        : s.opt.weights == ServeWeights::kFP8Channel ? "FP8 e4m3 per channel"
                                                                     : "FP8 e4m3 per tensor";
  return std::string("weights ") + weights + ", " + std::to_string(s.programs.size()) + " step programs (" +
         std::to_string(graphs) + " decode CUDA graphs), " + std::to_string(s.plans.size()) + " plans, " +
         std::to_string(s.opt.pool_pages) + " KV pages of " + std::to_string(s.opt.page_size) + " tokens (" +
         (s.opt.fp8_kv ? "e4m3 with a descale a row" : "bf16") +
         "), prompts served by length and row buckets (static stage graphs: no execute-time shape "
         "override" +
         (s.opt.warm_prompt_buckets ? ""
                                    : "; prompt buckets not built at warm-up: each prompt bucket builds on "
                                      "first use") +
         "), warm-up " + std::to_string(static_cast<int64_t>(s.warmup_ms)) + " ms (" + warmup_breakdown() +
         "), " + std::to_string(device_bytes() >> 20) + " MiB on the device" + notes;
}

// The plan checks' refusals (the first 3), or "".
std::string GpuForward::Impl::refused_text() const {
  const auto& r = plan_cost.refused;
  if (r.empty()) return "";
  std::string t = "; plan checks refused " + std::to_string(r.size()) + " engine(s): ";
  for (size_t i = 0; i < r.size() && i < 3; ++i) t += (i ? ", " : "") + r[i];
  return t + (r.size() > 3 ? ", ..." : "");
}

std::string GpuForward::warmup_breakdown() const {
  const Impl& s = *impl_;
  const Impl::PlanCost& c = s.plan_cost;
  auto ms = [](double v) { return std::to_string(static_cast<int64_t>(v)) + " ms"; };
  std::string slowest;
  for (const auto& [t, key] : c.slowest) slowest += (slowest.empty() ? "" : ", ") + key + " " + ms(t);
  return "plans: " + std::to_string(c.built) + " built in " + ms(c.built_ms) + ", " +
         std::to_string(c.cached) + " from the plan cache in " + ms(c.cached_ms) + ", plan checks " +
         ms(c.check_ms) + " of that" +
         (c.tuned + c.tune_hits > 0
              ? ", " + std::to_string(c.tuned) + " tuned now and " + std::to_string(c.tune_hits) +
                    " tuned winners read in " + ms(c.tune_ms)
              : std::string()) +
         (slowest.empty() ? "" : "; slowest " + slowest) + s.refused_text() + "; eager runs " +
         ms(s.eager_ms) + ", CUDA graph captures " + ms(s.capture_ms);
}

int64_t GpuForward::pool_pages() const { return impl_->opt.pool_pages; }

int64_t GpuForward::device_bytes() const {
  const Impl& s = *impl_;
  int64_t n = 0;
  for (const auto* ws : {&s.w, &s.w_scale})
    for (const auto& [name, m] : *ws) n += static_cast<int64_t>(m.bytes());
  for (const auto* pools : {&s.kpool, &s.vpool, &s.kscale, &s.vscale})
    for (const Mem& m : *pools) n += static_cast<int64_t>(m.bytes());
  for (const Mem* m : {&s.h, &s.a, &s.qkv, &s.qkr, &s.o, &s.h1, &s.mm, &s.g, &s.act, &s.last, &s.hn,
                       &s.logits, &s.tokens, &s.top_keys, &s.in_dev, &s.freqs, &s.x8, &s.x8_scale})
    n += static_cast<int64_t>(m->bytes());
  return n + s.session->workspace_bytes();
}

}  // namespace fusebox::serve
