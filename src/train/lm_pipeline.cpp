// fusebox: the language model's forward pipeline (docs/lm.md, "The forward"), one graph per
// stage. Native ops (embedding, RoPE, cross-entropy) are alone in their stages; each GEMM
// carries its epilogue (the residual add, SwiGLU's silu and product), so that each stage is
// one cuDNN graph with one MMA.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/graph_json.h"
#include "fusebox/train.h"

namespace fusebox {
namespace {

using Json = nlohmann::json;

using common::json_tensor;
constexpr auto& graph = common::json_bf16_graph;
constexpr auto& op = common::json_op;

class Builder {
 public:
  explicit Builder(const LmModelConfig& m, int64_t batch, int64_t seq)
      : m_(m), B_(batch), S_(seq), N_(batch * seq) {}

  void stage(const std::string& name, Json g, Json bind) {
    const std::string file = "graphs/" + name + ".json";
    graphs_[name] = file;
    files_.push_back({file, g.dump(1)});
    bind_[name] = std::move(bind);
  }
  void buffer(const std::string& name, const char* kind, bool reshape = false) {
    Json b = {{"kind", kind}};
    if (reshape) b["reshape"] = true;
    buffers_[name] = b;
  }

  // y = rmsnorm(x) * scale over rows of `dim`, saving inv_variance.
  void rmsnorm(const std::string& name, const std::string& x, const std::string& scale,
               const std::string& y) {
    stage(name,
          graph(name,
                {json_tensor("x", {N_, m_.dim, 1, 1}, "nhwc"),
                 json_tensor("scale", {1, m_.dim, 1, 1}, "nhwc", "fp32"),
                 json_tensor("y", {N_, m_.dim, 1, 1}, "nhwc"),
                 json_tensor("inv_variance", {N_, 1, 1, 1}, nullptr, "fp32")},
                {[&] {
                  Json o = op("rmsnorm", "rms", {{"x", "x"}, {"scale", "scale"}},
                              {{"y", "y"}, {"inv_variance", "inv_variance"}});
                  o["epsilon"] = m_.norm_eps;
                  return o;
                }()}),
          {{"x", x}, {"scale", scale}, {"y", y}, {"inv_variance", name + ".inv_variance"}});
    buffer(y, "intermediate", true);
    buffer(name + ".inv_variance", "output");
  }

  // y = a @ w [+ residual]: a [1, N, K], w [1, K, P].
  void gemm(const std::string& name, const std::string& a, const std::string& w, int64_t k, int64_t p,
            const std::string& y, const std::string& residual = "") {
    Json tensors = {json_tensor("a", {1, N_, k}), json_tensor("w", {1, k, p}), json_tensor("y", {1, N_, p})};
    Json ops = Json::array();
    Json bind = {{"a", a}, {"w", w}, {"y", y}};
    if (residual.empty()) {
      ops.push_back(op("matmul", "gemm", {{"a", "a"}, {"b", "w"}}, {{"y", "y"}}));
    } else {
      tensors.push_back(json_tensor("residual", {1, N_, p}));
      ops.push_back(op("matmul", "gemm", {{"a", "a"}, {"b", "w"}}, {{"y", "proj"}}));
      ops.push_back(op("add", "residual", {{"a", "proj"}, {"b", "residual"}}, {{"y", "y"}}));
      bind["residual"] = residual;
    }
    stage(name, graph(name, tensors, ops), bind);
    buffer(y, "intermediate", true);
  }

  // The SwiGLU MLP's two gate GEMMs: g = silu(m @ w_gate), then act = g * (m @ w_up).
  void swiglu(const std::string& l, const std::string& x, const std::string& act) {
    const int64_t d = m_.dim, f = m_.ffn_dim;
    stage(l + "gate",
          graph(l + "gate",
                {json_tensor("x", {1, N_, d}), json_tensor("w", {1, d, f}), json_tensor("g", {1, N_, f})},
                {op("matmul", "gemm", {{"a", "x"}, {"b", "w"}}, {{"y", "pre"}}),
                 op("silu", "silu", {{"x", "pre"}}, {{"y", "g"}})}),
          {{"x", x}, {"w", l + "w_gate"}, {"g", l + "gate"}});
    buffer(l + "gate", "intermediate");
    stage(l + "up",
          graph(l + "up",
                {json_tensor("x", {1, N_, d}), json_tensor("w", {1, d, f}), json_tensor("g", {1, N_, f}),
                 json_tensor("y", {1, N_, f})},
                {op("matmul", "gemm", {{"a", "x"}, {"b", "w"}}, {{"y", "up"}}),
                 op("mul", "glu", {{"a", "g"}, {"b", "up"}}, {{"y", "y"}})}),
          {{"x", x}, {"w", l + "w_up"}, {"g", l + "gate"}, {"y", act}});
    buffer(act, "intermediate");
  }

  // The SwiGLU MLP split (LmTrainConfig::swiglu "split"): a = x @ w_gate and b = x @ w_up written
  // by plain GEMMs, act = silu(a) * b by a pointwise stage. The derived backward reads a and b
  // (recomputing only silu(a), a pointwise op) instead of recomputing either GEMM.
  void swiglu_split(const std::string& l, const std::string& x, const std::string& act) {
    const int64_t f = m_.ffn_dim;
    gemm(l + "gate", x, l + "w_gate", m_.dim, f, l + "gate_pre");
    gemm(l + "up", x, l + "w_up", m_.dim, f, l + "up_pre");
    stage(l + "glu",
          graph(l + "glu",
                {json_tensor("a", {1, N_, f}), json_tensor("b", {1, N_, f}), json_tensor("y", {1, N_, f})},
                {op("silu", "silu", {{"x", "a"}}, {{"y", "g"}}),
                 op("mul", "glu", {{"a", "g"}, {"b", "b"}}, {{"y", "y"}})}),
          {{"a", l + "gate_pre"}, {"b", l + "up_pre"}, {"y", act}});
    buffer(act, "intermediate");
  }

  // The whole SwiGLU MLP and its residual as one stage: y = (silu(x @ w_gate) * (x @ w_up)) @ w_down
  // + residual. Only the product `act` reaches memory (the down GEMM's weight gradient reads it
  // transposed, a view of memory); silu(x @ w_gate) and x @ w_up stay virtual and the backward
  // recomputes them from x: one [tokens, ffn_dim] activation per layer fewer, two GEMMs more.
  void mlp_fused(const std::string& l, const std::string& x, const std::string& residual,
                 const std::string& y) {
    const int64_t d = m_.dim, f = m_.ffn_dim;
    stage(
        l + "mlp",
        graph(l + "mlp",
              {json_tensor("x", {1, N_, d}), json_tensor("w_gate", {1, d, f}), json_tensor("w_up", {1, d, f}),
               json_tensor("w_down", {1, f, d}), json_tensor("residual", {1, N_, d}),
               json_tensor("act", {1, N_, f}), json_tensor("y", {1, N_, d})},
              {op("matmul", "gate_gemm", {{"a", "x"}, {"b", "w_gate"}}, {{"y", "pre"}}),
               op("silu", "silu", {{"x", "pre"}}, {{"y", "g"}}),
               op("matmul", "up_gemm", {{"a", "x"}, {"b", "w_up"}}, {{"y", "up"}}),
               op("mul", "glu", {{"a", "g"}, {"b", "up"}}, {{"y", "act"}}),
               op("matmul", "down_gemm", {{"a", "act"}, {"b", "w_down"}}, {{"y", "proj"}}),
               op("add", "residual", {{"a", "proj"}, {"b", "residual"}}, {{"y", "y"}})}),
        {{"x", x},
         {"w_gate", l + "w_gate"},
         {"w_up", l + "w_up"},
         {"w_down", l + "w_down"},
         {"residual", residual},
         {"act", l + "act"},
         {"y", y}});
    buffer(l + "act", "output");
    buffer(y, "intermediate", true);
  }

  void rope(const std::string& name, const std::string& x, int64_t heads, const std::string& y) {
    stage(name,
          graph(name,
                {json_tensor("x", {B_, heads, S_, m_.head_dim}, "bshd"),
                 json_tensor("freqs", {1, 1, S_, m_.head_dim / 2}, nullptr, "fp32"),
                 json_tensor("y", {B_, heads, S_, m_.head_dim}, "bshd")},
                {op("rope", "rope", {{"x", "x"}, {"freqs", "freqs"}}, {{"y", "y"}})}),
          {{"x", x}, {"freqs", "freqs"}, {"y", y}});
    buffer(y, "intermediate", true);
  }

  Result<std::string> write(const std::string& dir) {
    for (const char* in : {"ids", "labels", "freqs"}) buffer(in, "input");
    for (const LmParameter& p : lm_parameters(m_)) buffer(p.name, "input");
    const Json pipeline = {{"name", "lm"}, {"graphs", graphs_}, {"buffers", buffers_}, {"bind", bind_}};
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(dir) / "graphs", ec);
    if (ec) return IoError(dir + ": cannot create the folder: " + ec.message());
    for (const auto& [file, text] : files_)
      FUSEBOX_RETURN_IF_ERROR(
          common::write_file_atomic((std::filesystem::path(dir) / file).string(), text, "model graph file"));
    const std::string path = (std::filesystem::path(dir) / "lm.json").string();
    FUSEBOX_RETURN_IF_ERROR(common::write_file_atomic(path, pipeline.dump(1), "model pipeline file"));
    return path;
  }

  const LmModelConfig& m_;
  const int64_t B_, S_, N_;

 private:
  Json graphs_ = Json::object(), buffers_ = Json::object(), bind_ = Json::object();
  std::vector<std::pair<std::string, std::string>> files_;
};

}  // namespace

Result<std::string> write_lm_pipeline(const LmModelConfig& m, int64_t batch, int64_t seq,
                                      const std::string& dir, const std::string& recompute,
                                      const std::string& swiglu) {
  if (batch < 1 || seq < 1 || seq > m.context)
    return InvalidArgument("write_lm_pipeline: batch " + std::to_string(batch) + " and sequence length " +
                           std::to_string(seq) + " (accepted: batch >= 1, 1 <= seq <= context " +
                           std::to_string(m.context) + ")");
  if (recompute != "none" && recompute != "mlp")
    return InvalidArgument("write_lm_pipeline: recompute '" + recompute + "' (accepted: none, mlp)");
  if (swiglu != "fused" && swiglu != "split")
    return InvalidArgument("write_lm_pipeline: swiglu '" + swiglu + "' (accepted: fused, split)");
  if (recompute == "mlp" && swiglu == "split")
    return InvalidArgument("write_lm_pipeline: swiglu 'split' with recompute 'mlp' (choose one)");
  Builder b(m, batch, seq);
  const int64_t N = batch * seq, D = m.dim, q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  b.stage("embed",
          graph("embed",
                {json_tensor("ids", {N, 1, 1, 1}, nullptr, "int32"),
                 json_tensor("table", {m.vocab, D, 1, 1}, "nhwc", "fp32"),
                 json_tensor("y", {N, D, 1, 1}, "nhwc")},
                {op("embedding", "embed", {{"ids", "ids"}, {"table", "table"}}, {{"y", "y"}})}),
          {{"ids", "ids"}, {"table", "tok_embeddings"}, {"y", "h0"}});
  b.buffer("h0", "intermediate", true);
  std::string h = "h0";
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    b.rmsnorm(l + "attention_norm.op", h, l + "attention_norm", l + "a");
    b.gemm(l + "q", l + "a", l + "wq", D, q, l + "q");
    b.gemm(l + "k", l + "a", l + "wk", D, kv, l + "k");
    b.gemm(l + "v", l + "a", l + "wv", D, kv, l + "v");
    b.rope(l + "rope_q", l + "q", m.heads, l + "q_rot");
    b.rope(l + "rope_k", l + "k", m.kv_heads, l + "k_rot");
    Json attn =
        op("sdpa_fwd", "attn", {{"q", "q"}, {"k", "k"}, {"v", "v"}}, {{"o", "o"}, {"stats", "stats"}});
    attn["causal"] = true;
    attn["attn_scale"] = 1.0 / std::sqrt(static_cast<double>(m.head_dim));
    b.stage(l + "attn",
            graph(l + "attn",
                  {json_tensor("q", {batch, m.heads, seq, m.head_dim}, "bshd"),
                   json_tensor("k", {batch, m.kv_heads, seq, m.head_dim}, "bshd"),
                   json_tensor("v", {batch, m.kv_heads, seq, m.head_dim}, "bshd"),
                   json_tensor("o", {batch, m.heads, seq, m.head_dim}, "bshd"),
                   json_tensor("stats", {batch, m.heads, seq, 1}, nullptr, "fp32")},
                  {attn}),
            {{"q", l + "q_rot"},
             {"k", l + "k_rot"},
             {"v", l + "v"},
             {"o", l + "o"},
             {"stats", l + "attn.stats"}});
    b.buffer(l + "o", "intermediate", true);
    b.buffer(l + "attn.stats", "output");
    b.gemm(l + "wo", l + "o", l + "wo", q, D, l + "h_attn", h);
    b.rmsnorm(l + "ffn_norm.op", l + "h_attn", l + "ffn_norm", l + "m");
    const std::string next = std::string("h").append(std::to_string(i + 1));
    if (recompute == "mlp") {
      b.mlp_fused(l, l + "m", l + "h_attn", next);
    } else if (swiglu == "split") {
      b.swiglu_split(l, l + "m", l + "act");
      b.gemm(l + "down", l + "act", l + "w_down", m.ffn_dim, D, next, l + "h_attn");
    } else {
      b.swiglu(l, l + "m", l + "act");
      b.gemm(l + "down", l + "act", l + "w_down", m.ffn_dim, D, next, l + "h_attn");
    }
    h = next;
  }
  b.rmsnorm("norm.op", h, "norm", "h_norm");
  b.gemm("output", "h_norm", "output", D, m.vocab, "logits");
  b.stage("xent",
          graph("xent",
                {json_tensor("logits", {N, m.vocab, 1, 1}, "nhwc"),
                 json_tensor("labels", {N, 1, 1, 1}, nullptr, "int32"),
                 json_tensor("loss", {N, 1, 1, 1}, nullptr, "fp32"),
                 json_tensor("lse", {N, 1, 1, 1}, nullptr, "fp32")},
                {op("cross_entropy", "xent", {{"logits", "logits"}, {"labels", "labels"}},
                    {{"loss", "loss"}, {"lse", "lse"}})}),
          {{"logits", "logits"}, {"labels", "labels"}, {"loss", "loss"}, {"lse", "lse"}});
  b.buffer("loss", "output");
  b.buffer("lse", "output");
  return b.write(dir);
}

}  // namespace fusebox
