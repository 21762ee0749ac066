// fusebox serving: the graphs of one model step (lm_graphs.h).
#include "lm_graphs.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/graph_json.h"
#include "kernels/quantize.h"

namespace fusebox::serve {
namespace {

using Json = nlohmann::json;

using common::json_tensor;
constexpr auto& op = common::json_op;

Result<LmGraph> make(const std::string& key, Json tensors, Json ops) {
  const Json j = common::json_bf16_graph(key, std::move(tensors), std::move(ops));
  FUSEBOX_ASSIGN_OR_RETURN(GraphSpec spec, parse_graph_json(j.dump(), key));
  FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph g, resolve(spec));
  return LmGraph{key, std::move(g)};
}

std::string dims_key(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(v);
  }
  return s;
}

}  // namespace

namespace {

// gemm_graph, or with `norm_eps` normed_gemm_graph.
Result<LmGraph> gemm(int64_t n, int64_t k, int64_t p, Epilogue e, bool fp32_out, bool fp8,
                     std::optional<double> norm_eps) {
  static const char* const kNames[] = {"", "res_", "silu", "mul"};
  const std::string key = std::string(norm_eps ? "ngemm_"
                                      : fp8    ? "gemm8_"
                                               : "gemm_") +
                          kNames[static_cast<int>(e)] + (fp32_out ? "f32_" : "_") + dims_key({n, k, p});
  const char* in_dtype = fp8 ? "fp8_e4m3" : nullptr;
  Json t = Json::array(), o = Json::array();
  if (norm_eps) {  // "a" is the norm's virtual output
    t.push_back(json_tensor("x", {1, n, k}));
    t.push_back(json_tensor("scale", {1, 1, k}, nullptr, "fp32"));
    Json norm = op("rmsnorm", "norm", {{"x", "x"}, {"scale", "scale"}}, {{"y", "a"}});
    norm["epsilon"] = *norm_eps;
    o.push_back(std::move(norm));
  } else {
    t.push_back(json_tensor("a", {1, n, k}, nullptr, in_dtype));
  }
  t.push_back(json_tensor("w", {1, k, p}, fp8 ? "col_major" : nullptr, in_dtype));
  t.push_back(json_tensor("y", {1, n, p}, nullptr, fp32_out ? "fp32" : nullptr));
  // The product ("z", or y itself without an epilogue), descaled first with FP8 weights.
  const std::string z = e == Epilogue::kNone ? "y" : "z";
  if (fp8) {
    t.push_back(json_tensor("sa", {1, n, 1}, nullptr, "fp32"));
    t.push_back(json_tensor("sw", {1, 1, p}, nullptr, "fp32"));
    o.push_back(op("matmul", "mm", {{"a", "a"}, {"b", "w"}}, {{"y", "acc"}}));
    o.push_back(op("mul", "descale_a", {{"a", "acc"}, {"b", "sa"}}, {{"y", "acc_a"}}));
    o.push_back(op("mul", "descale_w", {{"a", "acc_a"}, {"b", "sw"}}, {{"y", z}}));
  } else {
    o.push_back(op("matmul", "mm", {{"a", "a"}, {"b", "w"}}, {{"y", z}}));
  }
  switch (e) {
    case Epilogue::kNone:
      break;
    case Epilogue::kResidual:
      t.push_back(json_tensor("r", {1, n, p}));
      o.push_back(op("add", "res", {{"a", "z"}, {"b", "r"}}, {{"y", "y"}}));
      break;
    case Epilogue::kSilu:
      o.push_back(op("silu", "act", {{"x", "z"}}, {{"y", "y"}}));
      break;
    case Epilogue::kMul:
      t.push_back(json_tensor("g", {1, n, p}));
      o.push_back(op("mul", "glu", {{"a", "g"}, {"b", "z"}}, {{"y", "y"}}));
      break;
  }
  return make(key, std::move(t), std::move(o));
}

}  // namespace

Result<LmGraph> gemm_graph(int64_t n, int64_t k, int64_t p, Epilogue e, bool fp32_out, bool fp8) {
  return gemm(n, k, p, e, fp32_out, fp8, std::nullopt);
}

Result<LmGraph> normed_gemm_graph(const LmModelConfig& m, int64_t n, int64_t k, int64_t p, Epilogue e,
                                  bool fp32_out) {
  return gemm(n, k, p, e, fp32_out, false, m.norm_eps);
}

Result<LmGraph> normed_swiglu_graph(const LmModelConfig& m, int64_t n, int64_t k, int64_t p) {
  Json norm = op("rmsnorm", "norm", {{"x", "x"}, {"scale", "scale"}}, {{"y", "a"}});
  norm["epsilon"] = m.norm_eps;
  return make(
      "ngemm_swiglu_" + dims_key({n, k, p}),
      {json_tensor("x", {1, n, k}), json_tensor("scale", {1, 1, k}, nullptr, "fp32"),
       json_tensor("w_gate", {1, k, p}), json_tensor("w_up", {1, k, p}), json_tensor("y", {1, n, p})},
      Json::array({std::move(norm), op("matmul", "gate", {{"a", "a"}, {"b", "w_gate"}}, {{"y", "zg"}}),
                   op("silu", "act", {{"x", "zg"}}, {{"y", "g"}}),
                   op("matmul", "up", {{"a", "a"}, {"b", "w_up"}}, {{"y", "zu"}}),
                   op("mul", "glu", {{"a", "g"}, {"b", "zu"}}, {{"y", "y"}})}));
}

Fp8Weight quantize_weight(const std::vector<float>& w, int64_t k, int64_t p, bool per_tensor) {
  std::vector<float> t(w.size());  // [p][k]
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < p; ++j) t[static_cast<size_t>(j * k + i)] = w[static_cast<size_t>(i * p + j)];
  Fp8Weight out;
  out.q.resize(t.size());
  out.scale.resize(static_cast<size_t>(p));
  if (per_tensor) {
    kernels::quantize_rows_fp8_host(t.data(), 1, k * p, out.q.data(), out.scale.data());
    std::fill(out.scale.begin() + 1, out.scale.end(), out.scale[0]);
  } else {
    kernels::quantize_rows_fp8_host(t.data(), p, k, out.q.data(), out.scale.data());
  }
  return out;
}

bool fp8_matrix(ServeWeights weights, const LmParameter& param) {
  return weights != ServeWeights::kBF16 && param.init_std != 0 && param.shape.size() == 2 &&
         param.name != "tok_embeddings" && param.name != "output";
}

Result<LmGraph> rmsnorm_graph(const LmModelConfig& m, int64_t n) {
  const int64_t D = m.dim;
  Json o = op("rmsnorm", "rms", {{"x", "x"}, {"scale", "scale"}}, {{"y", "y"}});
  o["epsilon"] = m.norm_eps;
  return make("rmsnorm_" + dims_key({n, D}),
              {json_tensor("x", {n, D, 1, 1}, "nhwc"), json_tensor("scale", {1, D, 1, 1}, "nhwc", "fp32"),
               json_tensor("y", {n, D, 1, 1}, "nhwc")},
              Json::array({o}));
}

Result<LmGraph> rope_graph(const LmModelConfig& m, int64_t B, int64_t H, int64_t S, int64_t freq_rows,
                           int64_t x_row) {
  const int64_t dh = m.head_dim;
  Json x = json_tensor("x", {B, H, S, dh}, x_row > 0 ? nullptr : "bshd");
  if (x_row > 0) x["strides"] = {S * x_row, dh, x_row, 1};
  return make(
      "rope_" + dims_key({B, H, S, dh, freq_rows}) + (x_row > 0 ? "_row" + std::to_string(x_row) : ""),
      {x, json_tensor("freqs", {1, 1, freq_rows, dh / 2}, nullptr, "fp32"),
       json_tensor("offset", {B, 1, 1, 1}, nullptr, "int32"), json_tensor("y", {B, H, S, dh}, "bshd")},
      Json::array(
          {op("rope", "rope", {{"x", "x"}, {"freqs", "freqs"}, {"offset", "offset"}}, {{"y", "y"}})}));
}

Result<LmGraph> attention_graph(const LmModelConfig& m, int64_t B, int64_t S, int64_t max_pages,
                                int64_t pool_pages, int64_t page_size, int64_t q_row, bool fp8_kv) {
  const int64_t dh = m.head_dim;
  std::map<std::string, std::string> inputs = {{"q", "q"},
                                               {"k", "k"},
                                               {"v", "v"},
                                               {"seq_len_q", "lq"},
                                               {"seq_len_kv", "lkv"},
                                               {"page_table_k", "table"},
                                               {"page_table_v", "table"}};
  if (fp8_kv) {
    inputs["descale_k"] = "dk";
    inputs["descale_v"] = "dv";
  }
  Json attn = op("sdpa_fwd", "attn", inputs, {{"o", "o"}});
  attn["causal"] = true;
  attn["alignment"] = "bottom_right";
  attn["attn_scale"] = 1.0 / std::sqrt(static_cast<double>(dh));
  attn["max_seq_len_kv"] = max_pages * page_size;
  const std::vector<int64_t> pool = {pool_pages, m.kv_heads, page_size, dh};
  Json q = json_tensor("q", {B, m.heads, S, dh}, q_row > 0 ? nullptr : "bshd");
  if (q_row > 0) q["strides"] = {S * q_row, dh, q_row, 1};
  const char* pool_dtype = fp8_kv ? "fp8_e4m3" : nullptr;
  Json tensors = {q,
                  json_tensor("k", pool, nullptr, pool_dtype),
                  json_tensor("v", pool, nullptr, pool_dtype),
                  json_tensor("table", {B, 1, max_pages, 1}, nullptr, "int32"),
                  json_tensor("lq", {B, 1, 1, 1}, nullptr, "int32"),
                  json_tensor("lkv", {B, 1, 1, 1}, nullptr, "int32"),
                  json_tensor("o", {B, m.heads, S, dh}, "bshd")};
  if (fp8_kv) {
    const std::vector<int64_t> rows = {pool_pages, m.kv_heads, page_size, 1};
    tensors.push_back(json_tensor("dk", rows, nullptr, "fp32"));
    tensors.push_back(json_tensor("dv", rows, nullptr, "fp32"));
  }
  return make("attn_" + dims_key({B, S, max_pages, pool_pages, page_size}) +
                  (q_row > 0 ? "_row" + std::to_string(q_row) : "") + (fp8_kv ? "_fp8kv" : ""),
              tensors, Json::array({attn}));
}

std::string qkv_name(int64_t layer) { return "layers." + std::to_string(layer) + ".wqkv"; }

std::vector<LmParameter> serve_parameters(const LmModelConfig& m) {
  std::vector<LmParameter> out;
  for (const LmParameter& p : lm_parameters(m)) {
    const auto dot = p.name.rfind('.');
    const std::string leaf = dot == std::string::npos ? p.name : p.name.substr(dot + 1);
    if (leaf == "wk" || leaf == "wv") continue;
    if (leaf == "wq") {
      LmParameter f = p;
      f.name = p.name.substr(0, dot + 1) + "wqkv";
      f.shape = {m.dim, (m.heads + 2 * m.kv_heads) * m.head_dim};
      out.push_back(f);
      continue;
    }
    out.push_back(p);
  }
  return out;
}

void fuse_qkv(const LmModelConfig& m, std::map<std::string, std::vector<float>>* weights) {
  const int64_t D = m.dim, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim, W = q + 2 * kv;
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string pre = "layers." + std::to_string(l) + ".";
    const std::vector<float>& wq = weights->at(pre + "wq");
    const std::vector<float>& wk = weights->at(pre + "wk");
    const std::vector<float>& wv = weights->at(pre + "wv");
    std::vector<float> out(static_cast<size_t>(D * W));
    for (int64_t i = 0; i < D; ++i) {
      std::copy_n(wq.begin() + i * q, q, out.begin() + i * W);
      std::copy_n(wk.begin() + i * kv, kv, out.begin() + i * W + q);
      std::copy_n(wv.begin() + i * kv, kv, out.begin() + i * W + q + kv);
    }
    for (const char* n : {"wq", "wk", "wv"}) weights->erase(pre + n);
    (*weights)[qkv_name(l)] = std::move(out);
  }
}

Result<LmGraph> embedding_graph(const LmModelConfig& m, int64_t n) {
  return make("embed_" + dims_key({n, m.vocab, m.dim}),
              {json_tensor("ids", {n, 1, 1, 1}, nullptr, "int32"),
               json_tensor("table", {m.vocab, m.dim, 1, 1}, "nhwc", "fp32"),
               json_tensor("y", {n, m.dim, 1, 1}, "nhwc")},
              Json::array({op("embedding", "embed", {{"ids", "ids"}, {"table", "table"}}, {{"y", "y"}})}));
}

}  // namespace fusebox::serve
