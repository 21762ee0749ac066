// fusebox: the language-model serving engine (include/fusebox/serve.h): scheduling, the KV
// pool's pages and sampling here; the model step on the GPU in gpu_forward.cpp, or here on the
// reference backend. Each reference step runs the model over B sequences of up to S new tokens
// (prompts admitted together, padded to the longest; decode: S = 1) stage by stage as graphs through the CPU
// reference, with the training pipeline's stage split (every stage's output rounded to its dtype as a GPU
// buffer would be), RoPE at each sequence's offset, the new keys and values written into the paged pools, and
// paged attention.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "fusebox/reference.h"
#include "fusebox/serve.h"
#include "fusebox/tensor.h"
#include "gpu_forward.h"
#include "kernels/kv_pages.h"
#include "kernels/quantize.h"
#include "kv_pool.h"
#include "lm_graphs.h"

namespace fusebox {
namespace {

using Values = std::vector<float>;

// Values rounded to `d` (what a buffer of that dtype holds).
Values rounded(DType d, const Values& v) {
  if (d == DType::kFP32) return v;
  ResolvedTensor t;
  t.dims = {static_cast<int64_t>(v.size())};
  t.strides = {1};
  t.dtype = d;
  return host_tensor_of(t, std::vector<double>(v.begin(), v.end())).to_float_logical();
}

void store_bf16(HostTensor& t, int64_t i, float f) {
  const uint16_t b = float_to_bf16_bits(f);
  std::memcpy(t.data.data() + i * 2, &b, 2);
}

// Row `row` (dh values at x) of an FP8 cache: e4m3 values and their descale, as the GPU's KV write
// rounds them (kernels::quantize_fp8_row).
void store_fp8_row(HostTensor& pool, HostTensor& descale, int64_t row, int64_t dh, const float* x) {
  const float s = kernels::quantize_fp8_row(x, dh, pool.data.data() + row * dh);
  std::memcpy(descale.data.data() + row * 4, &s, 4);
}

// [B*S, H*dh] rows <-> [B, H, S, dh] logical order.
Values rows_to_bhsd(const Values& x, int64_t B, int64_t S, int64_t H, int64_t dh) {
  Values y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < dh; ++d)
          y[static_cast<size_t>(((b * H + h) * S + s) * dh + d)] =
              x[static_cast<size_t>(((b * S + s) * H + h) * dh + d)];
  return y;
}
Values bhsd_to_rows(const Values& y, int64_t B, int64_t S, int64_t H, int64_t dh) {
  Values x(y.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < dh; ++d)
          x[static_cast<size_t>(((b * S + s) * H + h) * dh + d)] =
              y[static_cast<size_t>(((b * H + h) * S + s) * dh + d)];
  return x;
}

struct Request {
  LmRequest r;
  KvPool::Seq seq;
  std::vector<int32_t> generated;
  int64_t len = 0;  // tokens whose K/V are in the pool
  std::mt19937_64 rng;
  Values logits;
  bool running = false, done = false;
};

}  // namespace

struct LmEngine::Impl {
  LmConfig cfg;
  EngineOptions opt;
  std::map<std::string, Values> w;         // weights as the GPU buffers hold them (FP8: the e4m3 values)
  std::map<std::string, Values> w_scale;   // FP8 matrices' per-channel scales ([p])
  std::vector<HostTensor> k_pool, v_pool;  // by layer: [pages, kv_heads, page_size, head_dim]
  std::vector<HostTensor> k_descale, v_descale;  // fp8_kv: by layer, [pages, kv_heads, page_size, 1]
  std::unique_ptr<KvPool> pool;
  std::map<std::string, ResolvedGraph> graphs;  // by key: built once per shape
  std::map<int64_t, Request> requests;
  std::vector<int64_t> waiting;  // FIFO
  int64_t next_id = 0;
  EngineStats stats;
  Values freqs;                            // [context, head_dim / 2]
  std::unique_ptr<serve::GpuForward> gpu;  // the kGpu backend (then w and the host pools stay empty)

  // ---- graphs (lm_graphs.h), resolved once per key

  Result<const ResolvedGraph*> graph(Result<serve::LmGraph> made) {
    if (!made.ok()) return made.status();
    auto it = graphs.find(made->key);
    if (it == graphs.end()) it = graphs.emplace(made->key, std::move(made->graph)).first;
    return &it->second;
  }

  // Runs `g` on logical inputs (ints as floats), outputs rounded to their dtypes.
  static Result<std::map<std::string, Values>> run(const ResolvedGraph& g,
                                                   const std::map<std::string, const Values*>& in,
                                                   const std::map<std::string, const HostTensor*>& raw = {}) {
    std::map<std::string, HostTensor> inputs;
    for (const ResolvedTensor& t : g.tensors) {
      if (!t.is_input || t.scalar_value) continue;
      if (auto r = raw.find(t.name); r != raw.end()) {
        inputs[t.name] = *r->second;
        continue;
      }
      auto it = in.find(t.name);
      if (it == in.end())
        return Internal("serve: graph '" + g.name + "' input '" + t.name + "' has no value");
      inputs[t.name] = host_tensor_of(t, std::vector<double>(it->second->begin(), it->second->end()));
    }
    FUSEBOX_ASSIGN_OR_RETURN(ReferenceOutputs ref, reference_cpu(g, inputs));
    std::map<std::string, Values> out;
    for (auto& [name, v] : ref)
      out[name] = rounded(g.tensors[static_cast<size_t>(g.find_tensor(name))].dtype, v);
    return out;
  }

  Result<Values> gemm(int64_t n, int64_t k, int64_t p, const Values& a, const std::string& w_name,
                      serve::Epilogue e = serve::Epilogue::kNone, const Values* other = nullptr,
                      bool fp32_out = false) {
    const auto scale = w_scale.find(w_name);
    const bool fp8 = scale != w_scale.end();
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedGraph* gr, graph(serve::gemm_graph(n, k, p, e, fp32_out, fp8)));
    std::map<std::string, const Values*> in = {{"a", &a}, {"w", &w.at(w_name)}};
    Values a8, sa;  // FP8: a's rows quantized as the GPU does (kernels/quantize.h)
    if (fp8) {
      std::vector<uint8_t> q(a.size());
      sa.resize(static_cast<size_t>(n));
      kernels::quantize_rows_fp8_host(a.data(), n, k, q.data(), sa.data());
      a8.resize(q.size());
      for (size_t i = 0; i < q.size(); ++i) a8[i] = fp8_bits_to_float(q[i], DType::kFP8E4M3);
      in["a"] = &a8;
      in["sa"] = &sa;
      in["sw"] = &scale->second;
    }
    if (e == serve::Epilogue::kResidual) in["r"] = other;
    if (e == serve::Epilogue::kMul) in["g"] = other;
    FUSEBOX_ASSIGN_OR_RETURN(auto out, run(*gr, in));
    return std::move(out.at("y"));
  }

  Result<Values> rmsnorm(int64_t n, const Values& x, const std::string& scale) {
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedGraph* g, graph(serve::rmsnorm_graph(cfg.model, n)));
    FUSEBOX_ASSIGN_OR_RETURN(auto out, run(*g, {{"x", &x}, {"scale", &w.at(scale)}}));
    return std::move(out.at("y"));
  }

  Result<Values> rope(int64_t B, int64_t H, int64_t S, const Values& x_bhsd, const Values& offsets,
                      int64_t x_row) {
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedGraph* g,
                             graph(serve::rope_graph(cfg.model, B, H, S, cfg.model.context, x_row)));
    FUSEBOX_ASSIGN_OR_RETURN(auto out, run(*g, {{"x", &x_bhsd}, {"freqs", &freqs}, {"offset", &offsets}}));
    return std::move(out.at("y"));
  }

  // The model over B sequences of counts[b] <= S new tokens each (ids: B x S, padded); returns the
  // logits of each sequence's last new token ([B, vocab]).
  Result<Values> forward(const std::vector<Request*>& batch, int64_t S, const std::vector<int64_t>& counts,
                         const std::vector<int32_t>& ids) {
    const LmModelConfig& m = cfg.model;
    const int64_t B = static_cast<int64_t>(batch.size()), N = B * S, D = m.dim, dh = m.head_dim;
    const int64_t H = m.heads, KV = m.kv_heads, P = opt.page_size;
    Values offsets, lens_q, lens_kv;
    int64_t max_kv = 0;
    for (size_t b = 0; b < batch.size(); ++b) {
      const Request* r = batch[b];
      offsets.push_back(static_cast<float>(r->len));
      lens_q.push_back(static_cast<float>(counts[b]));
      lens_kv.push_back(static_cast<float>(r->len + counts[b]));
      max_kv = std::max(max_kv, r->len + counts[b]);
    }
    const int64_t max_pages = (max_kv + P - 1) / P;
    Values table(static_cast<size_t>(B * max_pages), 0.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0;
           i < max_pages && i < static_cast<int64_t>(batch[static_cast<size_t>(b)]->seq.pages.size()); ++i)
        table[static_cast<size_t>(b * max_pages + i)] =
            static_cast<float>(batch[static_cast<size_t>(b)]->seq.pages[static_cast<size_t>(i)]);

    // Embedding: the fp32 table, rounded to bf16 rows.
    Values h(static_cast<size_t>(N * D));
    const Values& emb = w.at("tok_embeddings");
    for (int64_t n = 0; n < N; ++n)
      std::copy_n(emb.begin() + static_cast<int64_t>(ids[static_cast<size_t>(n)]) * D, D, h.begin() + n * D);
    h = rounded(DType::kBF16, h);

    const int64_t HK = H + KV, W = (HK + KV) * dh;  // the fused projection's heads and row
    FUSEBOX_ASSIGN_OR_RETURN(
        const ResolvedGraph* ag,
        graph(serve::attention_graph(m, B, S, max_pages, opt.pool_pages, P, HK * dh, opt.fp8_kv)));
    for (int64_t l = 0; l < m.layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      FUSEBOX_ASSIGN_OR_RETURN(Values a, rmsnorm(N, h, p + "attention_norm"));
      // One GEMM for Q, K and V; one RoPE over the query and key heads (rows W apart).
      FUSEBOX_ASSIGN_OR_RETURN(Values qkv, gemm(N, D, W, a, serve::qkv_name(l)));
      Values qk(static_cast<size_t>(N * HK * dh)), v(static_cast<size_t>(N * KV * dh));
      for (int64_t n = 0; n < N; ++n) {
        std::copy_n(qkv.begin() + n * W, HK * dh, qk.begin() + n * HK * dh);
        std::copy_n(qkv.begin() + n * W + HK * dh, KV * dh, v.begin() + n * KV * dh);
      }
      FUSEBOX_ASSIGN_OR_RETURN(Values qkr, rope(B, HK, S, rows_to_bhsd(qk, B, S, HK, dh), offsets, W));
      // [B, HK, S, dh]: the query heads, then the key heads.
      Values qr(static_cast<size_t>(B * H * S * dh)), kr(static_cast<size_t>(B * KV * S * dh));
      for (int64_t b = 0; b < B; ++b) {
        std::copy_n(qkr.begin() + b * HK * S * dh, H * S * dh, qr.begin() + b * H * S * dh);
        std::copy_n(qkr.begin() + (b * HK + H) * S * dh, KV * S * dh, kr.begin() + b * KV * S * dh);
      }
      // The new keys and values into their pages: position p of sequence b is row p % P of page
      // table[b][p / P] (a row's padding past its count is not written).
      const Values vb = rows_to_bhsd(v, B, S, KV, dh);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < counts[static_cast<size_t>(b)]; ++s) {
          const int64_t pos = batch[static_cast<size_t>(b)]->len + s;
          const int64_t page = batch[static_cast<size_t>(b)]->seq.pages[static_cast<size_t>(pos / P)];
          for (int64_t hk = 0; hk < KV; ++hk) {
            const int64_t row = (page * KV + hk) * P + pos % P, src = ((b * KV + hk) * S + s) * dh;
            const size_t L = static_cast<size_t>(l);
            if (opt.fp8_kv) {
              store_fp8_row(k_pool[L], k_descale[L], row, dh, kr.data() + src);
              store_fp8_row(v_pool[L], v_descale[L], row, dh, vb.data() + src);
              continue;
            }
            for (int64_t d = 0; d < dh; ++d) {
              store_bf16(k_pool[L], row * dh + d, kr[static_cast<size_t>(src + d)]);
              store_bf16(v_pool[L], row * dh + d, vb[static_cast<size_t>(src + d)]);
            }
          }
        }
      std::map<std::string, const HostTensor*> pools = {{"k", &k_pool[static_cast<size_t>(l)]},
                                                        {"v", &v_pool[static_cast<size_t>(l)]}};
      if (opt.fp8_kv) {
        pools["dk"] = &k_descale[static_cast<size_t>(l)];
        pools["dv"] = &v_descale[static_cast<size_t>(l)];
      }
      FUSEBOX_ASSIGN_OR_RETURN(
          auto att, run(*ag, {{"q", &qr}, {"table", &table}, {"lq", &lens_q}, {"lkv", &lens_kv}}, pools));
      const Values o = bhsd_to_rows(att.at("o"), B, S, H, dh);
      FUSEBOX_ASSIGN_OR_RETURN(Values h1, gemm(N, H * dh, D, o, p + "wo", serve::Epilogue::kResidual, &h));
      FUSEBOX_ASSIGN_OR_RETURN(Values mm, rmsnorm(N, h1, p + "ffn_norm"));
      FUSEBOX_ASSIGN_OR_RETURN(Values g, gemm(N, D, m.ffn_dim, mm, p + "w_gate", serve::Epilogue::kSilu));
      FUSEBOX_ASSIGN_OR_RETURN(Values act, gemm(N, D, m.ffn_dim, mm, p + "w_up", serve::Epilogue::kMul, &g));
      FUSEBOX_ASSIGN_OR_RETURN(h, gemm(N, m.ffn_dim, D, act, p + "w_down", serve::Epilogue::kResidual, &h1));
    }
    // The last new token of each sequence only.
    Values last(static_cast<size_t>(B * D));
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(h.begin() + (b * S + counts[static_cast<size_t>(b)] - 1) * D, D, last.begin() + b * D);
    FUSEBOX_ASSIGN_OR_RETURN(Values hn, rmsnorm(B, last, "norm"));
    return gemm(B, D, m.vocab, hn, "output", serve::Epilogue::kNone, nullptr, /*fp32_out=*/true);
  }

  // One model step over `batch` (counts[b] <= S new tokens each, ids B x S padded) and the token
  // sampled for each: on the GPU, or the reference forward and the host's sampler. Each request
  // draws one uniform per token from its own generator, before the step, in both.
  Result<std::vector<int32_t>> advance(const std::vector<Request*>& batch, int64_t S,
                                       const std::vector<int64_t>& counts, const std::vector<int32_t>& ids) {
    std::uniform_real_distribution<double> dist(0, 1);
    std::vector<double> u;
    for (Request* r : batch) u.push_back(dist(r->rng));
    const auto V = static_cast<size_t>(cfg.model.vocab);
    auto slice = [&](const Values& all, size_t b) {
      return Values(all.begin() + static_cast<std::ptrdiff_t>(b * V),
                    all.begin() + static_cast<std::ptrdiff_t>((b + 1) * V));
    };
    std::vector<int32_t> tokens;
    if (gpu) {
      std::vector<serve::GpuRow> rows;
      for (size_t b = 0; b < batch.size(); ++b)
        rows.push_back({batch[b]->len, counts[b], &batch[b]->seq.pages, batch[b]->r.sampling, u[b]});
      FUSEBOX_ASSIGN_OR_RETURN(serve::GpuStepOut out, gpu->run(rows, S, ids, opt.keep_logits));
      for (size_t b = 0; b < batch.size(); ++b)
        batch[b]->logits = opt.keep_logits ? slice(out.logits, b) : Values{};
      return out.tokens;
    }
    FUSEBOX_ASSIGN_OR_RETURN(Values logits, forward(batch, S, counts, ids));
    for (size_t b = 0; b < batch.size(); ++b) {
      batch[b]->logits = slice(logits, b);
      tokens.push_back(sample_token(batch[b]->logits, batch[b]->r.sampling, u[b]));
    }
    return tokens;
  }

  // Prefills the uncached prompt parts of `group` (admitted, r.len = cached tokens) as one padded
  // batch and samples each first token. On failure every request of the group ends (its pages
  // given back) and the error names them.
  Status prefill(const std::vector<int64_t>& group, std::vector<TokenEvent>* events) {
    std::vector<Request*> batch;
    std::vector<int64_t> counts;
    int64_t S = 0;
    for (int64_t id : group) {
      Request& r = requests.at(id);
      batch.push_back(&r);
      counts.push_back(static_cast<int64_t>(r.r.prompt.size()) - r.len);
      S = std::max(S, counts.back());
    }
    std::vector<int32_t> ids(batch.size() * static_cast<size_t>(S), 0);
    for (size_t b = 0; b < batch.size(); ++b)
      std::copy(batch[b]->r.prompt.begin() + batch[b]->len, batch[b]->r.prompt.end(),
                ids.begin() + static_cast<std::ptrdiff_t>(b * static_cast<size_t>(S)));
    auto tokens = advance(batch, S, counts, ids);
    if (!tokens.ok()) {
      std::string names;
      for (size_t b = 0; b < batch.size(); ++b) {
        pool->release(&batch[b]->seq);
        batch[b]->done = true;
        names += (names.empty() ? "" : ", ") + std::to_string(group[b]);
      }
      return tokens.status().WithContext("serve: prefill of request(s) " + names);
    }
    for (size_t b = 0; b < batch.size(); ++b) {
      Request& r = *batch[b];
      stats.prefill_tokens += counts[b];
      stats.cached_prompt_tokens += r.len;
      r.len = static_cast<int64_t>(r.r.prompt.size());
      pool->publish(r.seq, r.r.prompt);
      events->push_back(emit(group[b], r, (*tokens)[b]));
      r.running = !r.done;
      if (r.done) pool->release(&r.seq);
    }
    ++stats.prefill_batches;
    return Status::Ok();
  }

  TokenEvent emit(int64_t id, Request& r, int32_t sampled) {
    const int32_t t = r.r.forced.empty() ? sampled : r.r.forced[r.generated.size()];
    r.generated.push_back(t);
    r.done = static_cast<int64_t>(r.generated.size()) >= r.r.max_new_tokens || t == r.r.stop_token;
    return {id, t, r.done};
  }
};

LmEngine::LmEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LmEngine::~LmEngine() = default;

Result<std::unique_ptr<LmEngine>> LmEngine::create(const LmConfig& config, const std::string& checkpoint,
                                                   const EngineOptions& options) {
  if (options.max_batch < 1 || options.max_batch > (1 << 16) || options.page_size < 1 ||
      options.page_size > config.model.context ||
      options.pool_pages < (options.backend == ServeBackend::kGpu ? 0 : 1) || options.pool_pages > (1 << 24))
    return InvalidArgument("serve: max_batch must be in [1, 65536], page_size in [1, context = " +
                           std::to_string(config.model.context) +
                           "] and pool_pages in [1, 2^24] (0 on the GPU: as many as its free memory holds)");
  // Weights (fp32 read, then kept) and the pools must fit this machine: refused here, not by a
  // failed allocation.
  const LmModelConfig& mc = config.model;
  // (The GPU backend keeps its pools on the device.)
  const bool gpu = options.backend == ServeBackend::kGpu;
  const double bytes = 8.0 * static_cast<double>(lm_parameter_count(mc)) +
                       (gpu ? 0.0 : 4.0) * static_cast<double>(options.pool_pages) *
                           static_cast<double>(mc.layers) *
                           static_cast<double>(mc.kv_heads * options.page_size * mc.head_dim);
  const double phys =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && bytes > 0.8 * phys)
    return InvalidArgument("serve: the weights and a KV pool of " + std::to_string(options.pool_pages) +
                           " pages need " + std::to_string(bytes / (1 << 30)) +
                           " GiB of host memory; this machine has " + std::to_string(phys / (1 << 30)) +
                           " GiB");
  if (options.deterministic && options.weights != ServeWeights::kBF16)
    return InvalidArgument(
        "serve: the deterministic mode takes bf16 weights (its decode GEMMs are fusebox_gemv's; the FP8 "
        "weights' GEMMs are cuDNN's, whose rows may depend on the batch)");
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->opt = options;
  FUSEBOX_ASSIGN_OR_RETURN(auto weights, load_lm_weights(config, checkpoint));
  serve::fuse_qkv(config.model, &weights);  // wq, wk, wv as one matrix (lm_graphs.h)
  const LmModelConfig& m = config.model;
  if (gpu) {  // it rounds the matrices to bf16 itself, as it uploads them (the same rounding)
    FUSEBOX_ASSIGN_OR_RETURN(impl->gpu, serve::GpuForward::create(config, options, weights));
    impl->opt.pool_pages = impl->gpu->pool_pages();
    impl->pool = std::make_unique<KvPool>(impl->opt.pool_pages, options.page_size);
    return std::unique_ptr<LmEngine>(new LmEngine(std::move(impl)));
  }
  for (const LmParameter& p : serve::serve_parameters(m)) {
    // The forward reads matrices as bf16 copies (or FP8 ones), the embedding table and norm gains in fp32.
    const bool fp32 = p.name == "tok_embeddings" || p.init_std == 0;
    if (serve::fp8_matrix(options.weights, p)) {
      const int64_t k = p.shape[0], n = p.shape[1];
      const serve::Fp8Weight q =
          serve::quantize_weight(weights.at(p.name), k, n, options.weights == ServeWeights::kFP8Tensor);
      Values& v = impl->w[p.name];  // logical [k, n]
      v.resize(q.q.size());
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < n; ++j)
          v[static_cast<size_t>(i * n + j)] =
              fp8_bits_to_float(q.q[static_cast<size_t>(j * k + i)], DType::kFP8E4M3);
      impl->w_scale[p.name] = q.scale;
      continue;
    }
    impl->w[p.name] = fp32 ? std::move(weights.at(p.name)) : rounded(DType::kBF16, weights.at(p.name));
  }
  impl->pool = std::make_unique<KvPool>(options.pool_pages, options.page_size);
  impl->freqs = lm_rope_angles(m, m.context);
  ResolvedTensor pool;
  pool.dims = {options.pool_pages, m.kv_heads, options.page_size, m.head_dim};
  pool.strides = dense_strides_like(pool.dims, {});  // row-major
  pool.dtype = options.fp8_kv ? DType::kFP8E4M3 : DType::kBF16;
  ResolvedTensor descale;  // fp8_kv: one fp32 a row
  descale.dims = {options.pool_pages, m.kv_heads, options.page_size, 1};
  descale.strides = dense_strides_like(descale.dims, {});
  descale.dtype = DType::kFP32;
  for (int64_t l = 0; l < m.layers; ++l) {
    impl->k_pool.push_back(HostTensor::like(pool));
    impl->v_pool.push_back(HostTensor::like(pool));
    if (options.fp8_kv) {
      impl->k_descale.push_back(HostTensor::like(descale));
      impl->v_descale.push_back(HostTensor::like(descale));
    }
  }
  return std::unique_ptr<LmEngine>(new LmEngine(std::move(impl)));
}

Result<int64_t> LmEngine::add_request(const LmRequest& r) {
  Impl& s = *impl_;
  const LmModelConfig& m = s.cfg.model;
  if (r.prompt.empty()) return InvalidArgument("serve: an empty prompt");
  if (r.max_new_tokens < 1) return InvalidArgument("serve: max_new_tokens must be at least 1");
  // Compared without adding first: a max_new_tokens near INT64_MAX must not wrap.
  if (static_cast<int64_t>(r.prompt.size()) > m.context ||
      r.max_new_tokens > m.context - static_cast<int64_t>(r.prompt.size()))
    return InvalidArgument("serve: a prompt of " + std::to_string(r.prompt.size()) + " tokens plus " +
                           std::to_string(r.max_new_tokens) + " new ones is over the context of " +
                           std::to_string(m.context));
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  if (s.pool->pages_for(total) > s.pool->pages())
    return InvalidArgument("serve: the request needs " + std::to_string(s.pool->pages_for(total)) +
                           " KV pages, the whole pool has " + std::to_string(s.pool->pages()));
  for (size_t i = 0; i < r.prompt.size(); ++i)
    if (r.prompt[i] < 0 || r.prompt[i] >= m.vocab)
      return InvalidArgument("serve: prompt token " + std::to_string(i) + " = " +
                             std::to_string(r.prompt[i]) + " is outside the vocabulary [0, " +
                             std::to_string(m.vocab) + ")");
  if (!r.forced.empty() && r.max_new_tokens > static_cast<int64_t>(r.forced.size()))
    return InvalidArgument("serve: " + std::to_string(r.forced.size()) + " forced tokens for " +
                           std::to_string(r.max_new_tokens) +
                           " new ones (teacher forcing needs one per new token)");
  for (size_t i = 0; i < r.forced.size(); ++i)
    if (r.forced[i] < 0 || r.forced[i] >= m.vocab)
      return InvalidArgument("serve: forced token " + std::to_string(i) + " = " +
                             std::to_string(r.forced[i]) + " is outside the vocabulary [0, " +
                             std::to_string(m.vocab) + ")");
  if (!(r.sampling.temperature >= 0) || !(r.sampling.top_p > 0 && r.sampling.top_p <= 1) ||
      r.sampling.top_k < 0)
    return InvalidArgument("serve: sampling needs temperature >= 0, 0 < top_p <= 1 and top_k >= 0");
  const int64_t id = s.next_id++;
  Request& q = s.requests[id];
  q.r = r;
  q.rng.seed(r.sampling.seed);
  s.waiting.push_back(id);
  return id;
}

Result<std::vector<TokenEvent>> LmEngine::step() {
  Impl& s = *impl_;
  // Requests that finished in the last step leave now (their last logits were readable until now).
  for (auto it = s.requests.begin(); it != s.requests.end();)
    it = it->second.done ? s.requests.erase(it) : std::next(it);
  std::vector<TokenEvent> events;
  std::vector<int64_t> running;
  for (auto& [id, r] : s.requests)
    if (r.running) running.push_back(id);
  // Admissions, in arrival order, while the batch and the pool have room.
  std::vector<int64_t> admitted;
  while (!s.waiting.empty() && static_cast<int64_t>(running.size() + admitted.size()) < s.opt.max_batch) {
    const int64_t id = s.waiting.front();
    Request& r = s.requests.at(id);
    // A prompt that would share pages with one admitted in this step waits a step, until that
    // one's pages are published, rather than computing them again (and so do the ones behind it).
    // (Deterministic: no pages are shared.)
    const bool det = s.opt.deterministic;
    bool shares = false;
    for (int64_t other : admitted)
      shares = shares || (!det && s.pool->shareable(r.r.prompt, s.requests.at(other).r.prompt) > 0);
    if (shares) break;
    const int64_t total = static_cast<int64_t>(r.r.prompt.size()) + r.r.max_new_tokens;
    const int64_t cached = s.pool->admit(&r.seq, r.r.prompt, total, /*share=*/!det);
    if (cached < 0) break;  // the pool is full: it waits, and so do the ones behind it
    s.waiting.erase(s.waiting.begin());
    r.len = cached;
    admitted.push_back(id);
  }
  // Their prompts' uncached parts are prefilled together, one padded batch per prefill bucket
  // (prompts of similar length; as many rows as the bucket takes; deterministic: one prompt a
  // batch, so its rows are computed alike whatever else arrived), and each first token sampled.
  std::map<int64_t, std::vector<int64_t>> by_bucket;
  for (int64_t id : admitted) {
    const Request& r = s.requests.at(id);
    by_bucket[serve::prefill_bucket(static_cast<int64_t>(r.r.prompt.size()) - r.len, s.cfg.model.context)]
        .push_back(id);
  }
  std::vector<std::vector<int64_t>> groups;
  for (const auto& [sb, ids] : by_bucket) {
    const auto rows =
        s.opt.deterministic
            ? size_t{1}
            : static_cast<size_t>(serve::prefill_rows(sb, s.cfg.model.context, s.opt.max_batch));
    for (size_t i = 0; i < ids.size(); i += rows)
      groups.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(i),
                          ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), i + rows)));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const Status st = s.prefill(groups[g], &events);
    if (!st.ok()) {
      // The failed group's requests end; later groups' go back to the front of the queue, unharmed.
      for (size_t later = groups.size(); later-- > g + 1;)
        for (auto it = groups[later].rbegin(); it != groups[later].rend(); ++it) {
          Request& r = s.requests.at(*it);
          s.pool->release(&r.seq);
          r.len = 0;
          s.waiting.insert(s.waiting.begin(), *it);
        }
      return st;
    }
  }
  // One decode token for every request that was running before this step.
  std::vector<Request*> batch;
  std::vector<int32_t> ids;
  for (int64_t id : running) {
    Request& r = s.requests.at(id);
    batch.push_back(&r);
    ids.push_back(r.generated.back());
  }
  if (!batch.empty()) {
    auto tokens = s.advance(batch, 1, std::vector<int64_t>(batch.size(), 1), ids);
    if (!tokens.ok()) return tokens.status().WithContext("serve: decode");
    for (size_t b = 0; b < batch.size(); ++b) {
      Request& r = *batch[b];
      r.len += 1;
      events.push_back(s.emit(running[b], r, (*tokens)[b]));
      if (r.done) {
        r.running = false;
        s.pool->release(&r.seq);
      }
    }
    s.stats.decode_tokens += static_cast<int64_t>(batch.size());
  }
  ++s.stats.steps;
  std::sort(events.begin(), events.end(),
            [](const TokenEvent& a, const TokenEvent& b) { return a.request < b.request; });
  return events;
}

bool LmEngine::idle() const {
  if (!impl_->waiting.empty()) return false;
  for (const auto& [id, r] : impl_->requests)
    if (r.running) return false;
  return true;
}

EngineStats LmEngine::stats() const {
  EngineStats st = impl_->stats;
  st.waiting = static_cast<int64_t>(impl_->waiting.size());
  for (const auto& [id, r] : impl_->requests) st.running += r.running ? 1 : 0;
  st.pages_free = impl_->pool->free_pages() - impl_->pool->cached_pages();
  st.pages_cached = impl_->pool->cached_pages();
  st.pages_used = impl_->pool->pages() - impl_->pool->free_pages();
  st.pages_total = impl_->pool->pages();
  return st;
}

std::string LmEngine::summary() const {
  return impl_->gpu ? "GPU: " + impl_->gpu->summary() : "reference backend (the CPU reference)";
}

Result<std::string> LmEngine::profile_decode(int64_t batch, int64_t context, int iters) {
  Impl& s = *impl_;
  if (!s.gpu) return NotSupported("serve: profiling is for the GPU backend");
  if (!s.requests.empty() || s.pool->cached_pages() > 0)
    return InvalidArgument("serve: profile_decode writes into the KV pool: only before any request");
  return s.gpu->profile(batch, context, iters);
}

const std::vector<float>& LmEngine::last_logits(int64_t request) const {
  static const std::vector<float> none;
  auto it = impl_->requests.find(request);
  return it == impl_->requests.end() ? none : it->second.logits;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingParams& p, double u) {
  const int32_t V = static_cast<int32_t>(logits.size());
  if (V == 0) return -1;
  if (p.temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int32_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  // Largest first; ties by index, so that the draw is reproducible.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const size_t k = p.top_k > 0 ? std::min<size_t>(static_cast<size_t>(p.top_k), order.size()) : order.size();
  std::vector<double> prob(k);
  const double top = logits[static_cast<size_t>(order[0])];
  double sum = 0;
  for (size_t i = 0; i < k; ++i)
    sum += prob[i] = std::exp((logits[static_cast<size_t>(order[i])] - top) / p.temperature);
  // top-p: the smallest prefix whose probability reaches top_p.
  size_t keep = k;
  if (p.top_p < 1) {
    double acc = 0;
    for (size_t i = 0; i < k; ++i) {
      acc += prob[i] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += prob[i];
  double x = u * kept;
  for (size_t i = 0; i < keep; ++i) {
    if (x < prob[i]) return order[i];
    x -= prob[i];
  }
  return order[keep - 1];
}

}  // namespace fusebox
