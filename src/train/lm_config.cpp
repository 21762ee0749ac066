// fusebox: the language model's config, parameters, schedule and token data (docs/lm.md).
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>

#include "common/file_io.h"
#include "common/json_text.h"
#include "fusebox/tensor.h"
#include "fusebox/train.h"

namespace fusebox {
namespace {

constexpr uint64_t kMaxConfigBytes = 1 << 20;
// Generous bounds: a config past them is a mistake (or hostile), not a model.
constexpr int64_t kMaxDim = 1 << 16, kMaxLayers = 1024, kMaxVocab = int64_t{1} << 24, kMaxContext = 1 << 20;

using Json = nlohmann::json;

struct Field {
  const char* name;
  int64_t* i = nullptr;
  double* d = nullptr;
  double lo, hi;  // accepted range, inclusive
};

Status read_fields(const Json& obj, const std::string& where, std::vector<Field> fields) {
  if (!obj.is_object()) return InvalidArgument(where + " must be a JSON object");
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const Field* f = nullptr;
    for (const Field& g : fields)
      if (it.key() == g.name) f = &g;
    if (!f) {
      std::string known;
      for (const Field& g : fields) known += std::string(known.empty() ? "" : ", ") + g.name;
      return InvalidArgument(where + ": unknown key '" + it.key() + "' (accepted: " + known + ")");
    }
    const Json& v = it.value();
    const std::string what = where + "." + f->name;
    if (f->i) {
      if (!v.is_number_integer())
        return InvalidArgument(what + " must be an integer in [" +
                               std::to_string(static_cast<int64_t>(f->lo)) + ", " +
                               std::to_string(static_cast<int64_t>(f->hi)) + "]");
      const int64_t x = v.get<int64_t>();
      if (x < f->lo || x > f->hi)
        return InvalidArgument(what + " = " + std::to_string(x) + " is outside [" +
                               std::to_string(static_cast<int64_t>(f->lo)) + ", " +
                               std::to_string(static_cast<int64_t>(f->hi)) + "]");
      *f->i = x;
    } else {
      if (!v.is_number()) return InvalidArgument(what + " must be a number");
      const double x = v.get<double>();
      if (!std::isfinite(x) || x < f->lo || x > f->hi)
        return InvalidArgument(what + " = " + v.dump() + " is outside [" + Json(f->lo).dump() + ", " +
                               Json(f->hi).dump() + "]");
      *f->d = x;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<LmConfig> parse_lm_config(std::string_view text, std::string_view origin) {
  const std::string where(origin);
  if (common::scan_json_text(text, 8, 1000).kind != common::JsonTextLimit::Kind::kNone)
    return ParseError(where + ": not a model config (nested too deeply, too many values or a NUL byte)");
  const Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return ParseError(where + ": not valid JSON");
  if (!root.is_object())
    return InvalidArgument(where + ": a config is a JSON object {\"model\": ..., \"train\": ...}");
  LmConfig c;
  LmModelConfig& m = c.model;
  LmTrainConfig& t = c.train;
  int64_t seed = 1;
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it.key() != "model" && it.key() != "train")
      return InvalidArgument(where + ": unknown key '" + it.key() + "' (accepted: model, train)");
  if (!root.contains("model")) return InvalidArgument(where + ": no \"model\" object");
  FUSEBOX_RETURN_IF_ERROR(read_fields(root["model"], where + ": model",
                                      {{"vocab", &m.vocab, nullptr, 2, kMaxVocab},
                                       {"dim", &m.dim, nullptr, 2, kMaxDim},
                                       {"layers", &m.layers, nullptr, 1, kMaxLayers},
                                       {"heads", &m.heads, nullptr, 1, 1024},
                                       {"kv_heads", &m.kv_heads, nullptr, 1, 1024},
                                       {"head_dim", &m.head_dim, nullptr, 2, 512},
                                       {"ffn_dim", &m.ffn_dim, nullptr, 1, kMaxDim * 8},
                                       {"context", &m.context, nullptr, 1, kMaxContext},
                                       {"rope_theta", nullptr, &m.rope_theta, 1, 1e9},
                                       {"norm_eps", nullptr, &m.norm_eps, 0, 1},
                                       {"init_std", nullptr, &m.init_std, 1e-6, 10}}));
  if (!root["model"].contains("vocab")) return InvalidArgument(where + ": model.vocab is required");
  Json train = root.contains("train") ? root["train"] : Json::object();
  if (train.is_object() && train.contains("recompute")) {
    const Json& r = train["recompute"];
    if (!r.is_string() || (r.get<std::string>() != "none" && r.get<std::string>() != "mlp"))
      return InvalidArgument(
          where + ": train.recompute = " + r.dump().substr(0, 40) +
          " (accepted: \"none\", \"mlp\": the MLP's activations recomputed in the backward)");
    t.recompute = r.get<std::string>();
    train.erase("recompute");
  }
  if (train.is_object() && train.contains("swiglu")) {
    const Json& v = train["swiglu"];
    if (!v.is_string() || (v.get<std::string>() != "fused" && v.get<std::string>() != "split"))
      return InvalidArgument(where + ": train.swiglu = " + v.dump().substr(0, 40) +
                             " (accepted: \"fused\", the activations in the GEMMs' epilogues; \"split\", "
                             "two plain GEMMs and a pointwise stage)");
    t.swiglu = v.get<std::string>();
    train.erase("swiglu");
  }
  if (t.recompute == "mlp" && t.swiglu == "split")
    return InvalidArgument(where +
                           ": train.swiglu \"split\" keeps the MLP's activations, train.recompute "
                           "\"mlp\" recomputes them: choose one");
  for (auto [key, flag] : {std::pair<const char*, bool*>{"deterministic", &t.deterministic},
                           std::pair<const char*, bool*>{"share_buffers", &t.share_buffers},
                           std::pair<const char*, bool*>{"fp8", &t.fp8},
                           std::pair<const char*, bool*>{"fp8_fuse_casts", &t.fp8_fuse_casts}}) {
    if (!train.is_object() || !train.contains(key)) continue;
    if (!train[key].is_boolean()) return InvalidArgument(where + ": train." + key + " must be true or false");
    *flag = train[key].get<bool>();
    train.erase(key);
  }
  if (root.contains("train"))
    FUSEBOX_RETURN_IF_ERROR(read_fields(train, where + ": train",
                                        {{"batch", &t.batch, nullptr, 1, 1 << 20},
                                         {"accum", &t.accum, nullptr, 1, 1 << 16},
                                         {"warmup", &t.warmup, nullptr, 0, 1e12},
                                         {"val_batches", &t.val_batches, nullptr, 1, 1 << 20},
                                         {"lr", nullptr, &t.lr, 0, 10},
                                         {"min_lr", nullptr, &t.min_lr, 0, 10},
                                         {"weight_decay", nullptr, &t.weight_decay, 0, 10},
                                         {"beta1", nullptr, &t.beta1, 0, 0.999999},
                                         {"beta2", nullptr, &t.beta2, 0, 0.999999999},
                                         {"eps", nullptr, &t.eps, 1e-30, 1},
                                         {"clip", nullptr, &t.clip, 0, 1e12},
                                         {"seed", &seed, nullptr, 0, 1e15},
                                         {"fp8_history", &t.fp8_history, nullptr, 1, 1024},
                                         {"fp8_margin", &t.fp8_margin, nullptr, 0, 32}}));
  t.seed = static_cast<uint64_t>(seed);
  if (m.heads % m.kv_heads != 0)
    return InvalidArgument(where + ": model.heads = " + std::to_string(m.heads) +
                           " must be a multiple of model.kv_heads = " + std::to_string(m.kv_heads));
  if (m.head_dim % 2 != 0)
    return InvalidArgument(where + ": model.head_dim = " + std::to_string(m.head_dim) +
                           " must be even (RoPE rotates pairs)");
  if (t.min_lr > t.lr)
    return InvalidArgument(where + ": train.min_lr = " + Json(t.min_lr).dump() +
                           " is above train.lr = " + Json(t.lr).dump());
  return c;
}

Result<LmConfig> load_lm_config(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text,
                           common::read_file_bounded(path, kMaxConfigBytes, "model config"));
  return parse_lm_config(text, path);
}

std::string lm_config_json(const LmConfig& c) {
  const LmModelConfig& m = c.model;
  const LmTrainConfig& t = c.train;
  Json j = {{"model",
             {{"vocab", m.vocab},
              {"dim", m.dim},
              {"layers", m.layers},
              {"heads", m.heads},
              {"kv_heads", m.kv_heads},
              {"head_dim", m.head_dim},
              {"ffn_dim", m.ffn_dim},
              {"context", m.context},
              {"rope_theta", m.rope_theta},
              {"norm_eps", m.norm_eps},
              {"init_std", m.init_std}}},
            {"train",
             {{"batch", t.batch},
              {"accum", t.accum},
              {"warmup", t.warmup},
              {"val_batches", t.val_batches},
              {"lr", t.lr},
              {"min_lr", t.min_lr},
              {"weight_decay", t.weight_decay},
              {"beta1", t.beta1},
              {"beta2", t.beta2},
              {"eps", t.eps},
              {"clip", t.clip},
              {"seed", t.seed},
              {"recompute", t.recompute},
              {"swiglu", t.swiglu},
              {"deterministic", t.deterministic},
              {"share_buffers", t.share_buffers},
              {"fp8", t.fp8},
              {"fp8_fuse_casts", t.fp8_fuse_casts},
              {"fp8_history", t.fp8_history},
              {"fp8_margin", t.fp8_margin}}}};
  return j.dump();
}

int64_t LmParameter::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<LmParameter> lm_parameters(const LmModelConfig& m) {
  const double out_std = m.init_std / std::sqrt(2.0 * static_cast<double>(m.layers));
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  std::vector<LmParameter> p;
  p.push_back({"tok_embeddings", {m.vocab, m.dim}, true, m.init_std});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = "layers." + std::to_string(i) + ".";
    p.push_back({l + "attention_norm", {m.dim}, false, 0});
    p.push_back({l + "wq", {m.dim, q}, true, m.init_std});
    p.push_back({l + "wk", {m.dim, kv}, true, m.init_std});
    p.push_back({l + "wv", {m.dim, kv}, true, m.init_std});
    p.push_back({l + "wo", {q, m.dim}, true, out_std});
    p.push_back({l + "ffn_norm", {m.dim}, false, 0});
    p.push_back({l + "w_gate", {m.dim, m.ffn_dim}, true, m.init_std});
    p.push_back({l + "w_up", {m.dim, m.ffn_dim}, true, m.init_std});
    p.push_back({l + "w_down", {m.ffn_dim, m.dim}, true, out_std});
  }
  p.push_back({"norm", {m.dim}, false, 0});
  p.push_back({"output", {m.dim, m.vocab}, true, m.init_std});
  return p;
}

int64_t lm_parameter_count(const LmModelConfig& m, bool with_embeddings) {
  int64_t n = 0;
  for (const LmParameter& p : lm_parameters(m))
    if (with_embeddings || (p.name != "tok_embeddings" && p.name != "output")) n += p.elements();
  return n;
}

double lm_learning_rate(const LmTrainConfig& t, int64_t step, int64_t total_steps) {
  if (step < t.warmup) return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - t.warmup));
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup) / span);
  return t.min_lr + (t.lr - t.min_lr) * (1 + std::cos(std::numbers::pi * progress)) / 2;
}

std::vector<float> lm_rope_angles(const LmModelConfig& m, int64_t seq) {
  const int64_t half = m.head_dim / 2;
  std::vector<float> a(static_cast<size_t>(seq * half));
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < half; ++i)
      a[static_cast<size_t>(p * half + i)] = static_cast<float>(
          static_cast<double>(p) *
          std::pow(m.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(m.head_dim)));
  return a;
}

int64_t TokenStream::sequences(int64_t seq) const {
  return tokens.empty() ? 0 : (static_cast<int64_t>(tokens.size()) - 1) / seq;
}

Result<TokenStream> load_token_stream(const std::string& path, int64_t vocab, int64_t seq) {
  constexpr int64_t kMaxTokens = int64_t{1} << 33;  // 8 Gi tokens: 64 GiB as int64 at most
  TokenStream s;
  s.path = path;
  auto t = read_npy_int32_vector(path, kMaxTokens);
  if (!t.ok()) return t.status().WithContext("token file (docs/lm.md: a 1-D .npy of token ids)");
  s.tokens = std::move(*t);
  for (size_t i = 0; i < s.tokens.size(); ++i)
    if (s.tokens[i] < 0 || s.tokens[i] >= vocab)
      return InvalidArgument(path + ": token " + std::to_string(i) + " = " + std::to_string(s.tokens[i]) +
                             " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  if (static_cast<int64_t>(s.tokens.size()) < seq + 1)
    return InvalidArgument(path + ": " + std::to_string(s.tokens.size()) +
                           " tokens are too few for one sequence of " + std::to_string(seq) + " (needs " +
                           std::to_string(seq + 1) + ": inputs and next-token labels)");
  return s;
}

void lm_micro_batch(const TokenStream& s, int64_t seq, int64_t batch, int64_t first,
                    std::vector<int32_t>* ids, std::vector<int32_t>* labels) {
  const int64_t n_seq = s.sequences(seq);
  ids->resize(static_cast<size_t>(batch * seq));
  labels->resize(static_cast<size_t>(batch * seq));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t start = ((first + b) % n_seq) * seq;
    for (int64_t i = 0; i < seq; ++i) {
      (*ids)[static_cast<size_t>(b * seq + i)] = s.tokens[static_cast<size_t>(start + i)];
      (*labels)[static_cast<size_t>(b * seq + i)] = s.tokens[static_cast<size_t>(start + i + 1)];
    }
  }
}

Result<std::vector<std::string>> load_vocab_bytes(const std::string& path, int64_t vocab) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text, common::read_file_bounded(path, 64u << 20, "vocabulary file"));
  if (common::scan_json_text(text, 4, static_cast<size_t>(vocab) + 16).kind !=
      common::JsonTextLimit::Kind::kNone)
    return ParseError(path + ": not a vocabulary file (too deep, too many values or a NUL byte)");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    return ParseError(path + ": expected {\"vocab\": V, \"tokens\": [hex strings]}");
  const auto& toks = j["tokens"];
  if (static_cast<int64_t>(toks.size()) != vocab)
    return InvalidArgument(path + ": holds " + std::to_string(toks.size()) +
                           " tokens, the model's vocabulary is " + std::to_string(vocab));
  std::vector<std::string> out;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (!toks[i].is_string())
      return ParseError(path + ": token " + std::to_string(i) + " is not a hex string");
    const std::string& h = toks[i].get_ref<const std::string&>();
    if (h.size() % 2 != 0 || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return ParseError(path + ": token " + std::to_string(i) + " '" + h.substr(0, 32) +
                        "' is not a hex string");
    std::string bytes;
    for (size_t k = 0; k < h.size(); k += 2)
      bytes += static_cast<char>(std::stoi(h.substr(k, 2), nullptr, 16));
    out.push_back(std::move(bytes));
  }
  return out;
}

}  // namespace fusebox
