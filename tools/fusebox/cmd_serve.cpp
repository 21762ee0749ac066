// fusebox serve lm: generate text with the language model of docs/lm.md through the serving
// engine (fusebox/serve.h, issue 34): prompts given on the command line, streamed, or a request
// trace replayed with latency statistics. Parsing and presentation only.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "common.h"
#include "common/file_io.h"
#include "common/json_text.h"
#include "fusebox/serve.h"
#include "fusebox/tensor.h"
#include "fusebox/train.h"

namespace fusebox::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct ServeArgs {
  std::string model, data, prompt_ids, bench, report, backend = "reference", forced, logits_out;
  std::string weights = "bf16";
  std::string kv_cache = "bf16";
  std::vector<std::string> prompts;
  int64_t max_new = 32, top_k = 0, page_size = 16, pool_pages = 256, max_batch = 8;
  int64_t profile_decode = 0;  // a context length: time the decode step at batch 1 and max_batch
  bool deterministic = false;
  bool tune_decode = false;
  double temperature = 0, top_p = 1;
  uint64_t seed = 0;
  CacheFlags cache;
};

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    const std::string part = s.substr(i, j - i);
    if (part.empty() || part.size() > 10 || part.find_first_not_of("0123456789") != std::string::npos ||
        std::stoll(part) > INT32_MAX)
      return InvalidArgument("--prompt-ids: '" + part + "' is not a token id (comma-separated integers)");
    out.push_back(static_cast<int32_t>(std::stoll(part)));
    i = j + 1;
  }
  return out;
}

// The tokenizer is the data folder's tokenizer.json, through the Python tools (`tokenizers`).
Result<std::vector<int32_t>> encode(const std::string& data, const std::string& text) {
  char tmpl[] = "/tmp/fusebox_prompt_XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) return IoError("serve: cannot create a temporary file for the prompt's ids");
  close(fd);
  const std::string path = tmpl;
  const int rc = run_python_module(
      "serve lm", {"fusebox_tools.models.lm_data", "fusebox_tools/models/lm_data.py", "numpy and tokenizers"},
      {"encode", "--data", data, "--text=" + text, "--out", path});
  auto ids = rc == 0 ? common::read_file_bounded(path, 64u << 20, "prompt ids")
                     : Result<std::string>(InvalidArgument("serve: tokenizing the prompt failed (above)"));
  std::error_code ec;
  fs::remove(path, ec);
  if (!ids.ok()) return ids.status();
  std::string s = *ids;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return parse_ids(s);
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

struct TraceRequest {
  double arrival = 0;
  LmRequest r;
  size_t file_index = 0;  // its place in the trace file (the torch baseline's key)
};

Result<std::vector<TraceRequest>> load_trace(const std::string& path, int64_t vocab) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text, common::read_file_bounded(path, 64u << 20, "request trace"));
  if (common::scan_json_text(text, 6, 8u << 20).kind != common::JsonTextLimit::Kind::kNone)
    return ParseError(path + ": not a request trace (too deep, too many values or a NUL byte)");
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("requests") || !j["requests"].is_array())
    return ParseError(path +
                      ": expected {\"requests\": [{\"arrival_s\", \"prompt\", \"max_new_tokens\"}, ...]}");
  std::vector<TraceRequest> out;
  for (size_t i = 0; i < j["requests"].size(); ++i) {
    const auto& e = j["requests"][i];
    const std::string where = path + ": request " + std::to_string(i) + ": ";
    if (!e.is_object() || !e.contains("arrival_s") || !e["arrival_s"].is_number() || !e.contains("prompt") ||
        !e["prompt"].is_array() || !e.contains("max_new_tokens") || !e["max_new_tokens"].is_number_integer())
      return ParseError(where + "needs arrival_s (seconds), prompt (token ids) and max_new_tokens");
    TraceRequest t;
    t.arrival = e["arrival_s"].get<double>();
    if (!(t.arrival >= 0 && t.arrival < 1e7)) return InvalidArgument(where + "arrival_s must be in [0, 1e7)");
    for (const auto& id : e["prompt"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
        return InvalidArgument(where + "prompt ids must be integers in [0, " + std::to_string(vocab) + ")");
      t.r.prompt.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    t.r.max_new_tokens = e["max_new_tokens"].get<int64_t>();
    t.r.sampling.seed = i;
    t.file_index = i;
    out.push_back(std::move(t));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival < b.arrival; });
  return out;
}

int run_bench(const ServeArgs& a, LmEngine& e, int64_t vocab) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "fusebox serve lm: %s\n", st.ToString().c_str());
    return exit_code_for(st);
  };
  auto trace = load_trace(a.bench, vocab);
  if (!trace.ok()) return fail(trace.status());
  const size_t n = trace->size();
  std::map<int64_t, size_t> index;  // engine id -> trace index
  std::vector<double> first(n, -1), last(n, -1);
  std::vector<int64_t> produced(n, 0);
  std::vector<std::vector<int32_t>> generated(n);
  std::vector<double> gaps;
  int64_t tokens = 0, max_used = 0;
  size_t next = 0, finished = 0;
  const bool tty = isatty(fileno(stderr));
  double last_print = -1;
  const auto t0 = Clock::now();
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  while (finished < n) {
    while (next < n && (*trace)[next].arrival <= now()) {
      auto id = e.add_request((*trace)[next].r);
      if (!id.ok()) return fail(id.status().WithContext("trace request " + std::to_string(next)));
      index[*id] = next++;
    }
    if (e.idle()) {  // nothing to do before the next arrival
      std::this_thread::sleep_for(
          std::chrono::duration<double>(std::max(0.0, (*trace)[next].arrival - now())));
      continue;
    }
    auto ev = e.step();
    if (!ev.ok()) return fail(ev.status());
    const double t = now();
    for (const TokenEvent& x : *ev) {
      const size_t i = index.at(x.request);
      generated[i].push_back(x.token);
      if (first[i] < 0) first[i] = t - (*trace)[i].arrival;
      if (last[i] >= 0) gaps.push_back(t - last[i]);
      last[i] = t;
      ++produced[i];
      ++tokens;
      if (x.finished) ++finished;
    }
    const EngineStats st = e.stats();
    max_used = std::max(max_used, st.pages_used);
    if (!tty && t - last_print < 1 && finished < n) continue;  // a log: a line a second
    last_print = t;
    std::fprintf(stderr,
                 "%s%zu/%zu requests done, %lld running, %lld waiting, KV %lld/%lld pages, %.0f tok/s%s",
                 tty ? "\r" : "", finished, n, static_cast<long long>(st.running),
                 static_cast<long long>(st.waiting), static_cast<long long>(st.pages_used),
                 static_cast<long long>(st.pages_total), static_cast<double>(tokens) / t, tty ? "   " : "\n");
  }
  if (tty) std::fprintf(stderr, "\n");
  const double wall = now();
  std::vector<double> ttft;
  for (double f : first) ttft.push_back(f);
  const EngineStats st = e.stats();
  nlohmann::ordered_json r = {{"trace", a.bench},
                              {"backend", a.backend},
                              {"weights", a.weights},
                              {"kv_cache", a.kv_cache},
                              {"tune_decode", a.tune_decode},
                              {"requests", n},
                              {"tokens", tokens},
                              {"wall_s", wall},
                              {"tokens_per_s", static_cast<double>(tokens) / wall},
                              {"ttft_s", {{"p50", percentile(ttft, 0.5)}, {"p99", percentile(ttft, 0.99)}}},
                              {"itl_s", {{"p50", percentile(gaps, 0.5)}, {"p99", percentile(gaps, 0.99)}}},
                              {"kv_pages", {{"pool", st.pages_total}, {"max_used", max_used}}},
                              {"prefill_tokens", st.prefill_tokens},
                              {"cached_prompt_tokens", st.cached_prompt_tokens},
                              {"decode_tokens", st.decode_tokens},
                              {"steps", st.steps},
                              {"ttft_per_request_s", ttft}};
  // The tokens each request generated, by its place in the trace file: what the torch baseline's
  // report holds too (python3 -m fusebox_tools.models.lm_torch compare-serve A B).
  nlohmann::ordered_json by_request = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) by_request[std::to_string((*trace)[i].file_index)] = generated[i];
  r["tokens_by_request"] = std::move(by_request);
  std::printf("%zu requests, %lld tokens in %.2f s: %.1f tokens/s\n", n, static_cast<long long>(tokens), wall,
              static_cast<double>(tokens) / wall);
  std::printf("time to first token: p50 %.4f s, p99 %.4f s; inter-token latency: p50 %.4f s, p99 %.4f s\n",
              percentile(ttft, 0.5), percentile(ttft, 0.99), percentile(gaps, 0.5), percentile(gaps, 0.99));
  std::printf(
      "KV pool: at most %lld of %lld pages in use; %lld prompt tokens from shared prefix pages, %lld "
      "prefilled\n",
      static_cast<long long>(max_used), static_cast<long long>(st.pages_total),
      static_cast<long long>(st.cached_prompt_tokens), static_cast<long long>(st.prefill_tokens));
  if (!a.report.empty()) {
    if (Status s = common::write_file_atomic(a.report, r.dump(1) + "\n", "serve report"); !s.ok())
      return fail(s);
    std::printf("report: %s\n", a.report.c_str());
    // The latency plot beside it (matplotlib, fusebox_tools.models.lm_trace); a missing matplotlib is a note.
    const std::string png = (fs::path(a.report).replace_extension(".png")).string();
    if (run_python_module("serve lm",
                          {"fusebox_tools.models.lm_trace", "fusebox_tools/models/lm_trace.py", "matplotlib"},
                          {"plot", "--report", a.report, "--out", png}) != 0)
      std::printf("latency plot: not written (above)\n");
  }
  return 0;
}

// --forced FILE: teacher forcing, for verification against an independent implementation
// (python3 -m fusebox_tools.models.lm_torch teacher-forced). Every request of the file at once;
// the logits each forced token was computed with go to DIR/logits_<i>.npy ([forced, vocab] fp32,
// i the request's place in the file).
int run_forced(const ServeArgs& a, LmEngine& e, int64_t vocab) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "fusebox serve lm: %s\n", st.ToString().c_str());
    return exit_code_for(st);
  };
  if (a.logits_out.empty()) return fail(InvalidArgument("--forced needs --logits-out DIR"));
  std::error_code ec;
  if (fs::exists(a.logits_out, ec) && !fs::is_empty(a.logits_out, ec))
    return fail(
        InvalidArgument("--logits-out " + a.logits_out + " exists and is not empty: nothing is overwritten"));
  auto text = common::read_file_bounded(a.forced, 64u << 20, "teacher-forcing file");
  if (!text.ok()) return fail(text.status());
  const std::string where = a.forced + ": ";
  if (common::scan_json_text(*text, 6, 8u << 20).kind != common::JsonTextLimit::Kind::kNone)
    return fail(ParseError(where + "not a teacher-forcing file (too deep, too many values or a NUL byte)"));
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("requests") || !j["requests"].is_array() ||
      j["requests"].empty())
    return fail(ParseError(where + "expected {\"requests\": [{\"prompt\": [ids], \"forced\": [ids]}, ...]}"));
  std::vector<LmRequest> reqs;
  for (size_t i = 0; i < j["requests"].size(); ++i) {
    const auto& r = j["requests"][i];
    const std::string at = where + "request " + std::to_string(i) + ": ";
    LmRequest q;
    for (const char* key : {"prompt", "forced"}) {
      if (!r.is_object() || !r.contains(key) || !r[key].is_array() || r[key].empty())
        return fail(ParseError(at + "needs non-empty \"prompt\" and \"forced\" arrays of token ids"));
      for (const auto& id : r[key]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
          return fail(
              InvalidArgument(at + key + " ids must be integers in [0, " + std::to_string(vocab) + ")"));
        (std::string(key) == "prompt" ? q.prompt : q.forced)
            .push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    q.max_new_tokens = static_cast<int64_t>(q.forced.size());
    reqs.push_back(std::move(q));
  }
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto id = e.add_request(reqs[i]);
    if (!id.ok()) return fail(id.status().WithContext("request " + std::to_string(i)));
    index[*id] = i;
  }
  std::vector<std::vector<float>> logits(reqs.size());
  while (!e.idle()) {
    auto ev = e.step();
    if (!ev.ok()) return fail(ev.status());
    for (const TokenEvent& x : *ev) {
      const std::vector<float>& l = e.last_logits(x.request);
      if (static_cast<int64_t>(l.size()) != vocab)
        return fail(Internal("serve: no logits for request " + std::to_string(x.request)));
      std::vector<float>& dst = logits[index.at(x.request)];
      dst.insert(dst.end(), l.begin(), l.end());
    }
  }
  fs::create_directories(a.logits_out, ec);
  if (ec) return fail(IoError(a.logits_out + ": cannot create the folder: " + ec.message()));
  int64_t total = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    HostTensor t;
    t.dtype = DType::kFP32;
    t.dims = {static_cast<int64_t>(logits[i].size()) / vocab, vocab};
    t.strides = {vocab, 1};
    t.data.resize(logits[i].size() * sizeof(float));
    std::memcpy(t.data.data(), logits[i].data(), t.data.size());
    total += t.dims[0];
    if (Status st =
            write_npy((fs::path(a.logits_out) / ("logits_" + std::to_string(i) + ".npy")).string(), t);
        !st.ok())
      return fail(st);
  }
  std::printf("%zu requests, %lld forced tokens: their logits in %s (logits_<i>.npy, [forced, vocab] fp32)\n",
              reqs.size(), static_cast<long long>(total), a.logits_out.c_str());
  return 0;
}

int run_serve(const ServeArgs& a) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "fusebox serve lm: %s\n", st.ToString().c_str());
    return exit_code_for(st);
  };
  const std::string ck =
      fs::is_directory(a.model) ? (fs::path(a.model) / "checkpoint.safetensors").string() : a.model;
  auto cfg = lm_checkpoint_config(ck);
  if (!cfg.ok()) return fail(cfg.status());
  EngineOptions o;
  o.backend = a.backend == "gpu" ? ServeBackend::kGpu : ServeBackend::kReference;
  o.weights = a.weights == "fp8"          ? ServeWeights::kFP8Channel
              : a.weights == "fp8-tensor" ? ServeWeights::kFP8Tensor
                                          : ServeWeights::kBF16;
  o.page_size = a.page_size;
  o.pool_pages = a.pool_pages;
  o.max_batch = a.max_batch;
  if (!a.cache.off) o.plan_cache = a.cache.path.empty() ? default_cache_path() : a.cache.path;
  o.keep_logits = !a.forced.empty();
  o.warm_prompt_buckets = a.profile_decode == 0;  // a decode profile runs no prompt
  o.deterministic = a.deterministic;
  o.tune_decode = a.tune_decode;
  o.fp8_kv = a.kv_cache == "fp8";
  auto engine = LmEngine::create(*cfg, ck, o);
  if (!engine.ok()) return fail(engine.status());
  LmEngine& e = **engine;
  std::fprintf(stderr, "engine: %s\n", e.summary().c_str());
  if (!a.report.empty())
    if (Status st = common::check_outputs_spare_inputs(
            {{"--report", a.report}, {"latency plot", fs::path(a.report).replace_extension(".png").string()}},
            {{"--model", ck}, {"--bench", a.bench}});
        !st.ok())
      return fail(st);
  if (a.profile_decode > 0) {
    for (int64_t b : {int64_t{1}, a.max_batch}) {
      auto t = e.profile_decode(b, a.profile_decode);
      if (!t.ok()) return fail(t.status());
      std::printf("%s", t->c_str());
      if (a.max_batch == 1) break;
    }
    return 0;
  }
  if (!a.bench.empty()) return run_bench(a, e, cfg->model.vocab);
  if (!a.forced.empty()) return run_forced(a, e, cfg->model.vocab);

  std::vector<std::string> vocab;
  if (!a.data.empty()) {
    auto v = load_vocab_bytes((fs::path(a.data) / "vocab_bytes.json").string(), cfg->model.vocab);
    if (!v.ok()) return fail(v.status());
    vocab = std::move(*v);
  }
  std::vector<std::vector<int32_t>> prompts;
  if (!a.prompt_ids.empty()) {
    auto ids = parse_ids(a.prompt_ids);
    if (!ids.ok()) return fail(ids.status());
    prompts.push_back(std::move(*ids));
  }
  for (const std::string& p : a.prompts) {
    if (a.data.empty()) return fail(InvalidArgument("--prompt needs --data (the tokenizer's data folder)"));
    auto ids = encode(a.data, p);
    if (!ids.ok()) return fail(ids.status());
    prompts.push_back(std::move(*ids));
  }
  if (prompts.empty())
    return fail(InvalidArgument("give --prompt TEXT (with --data), --prompt-ids, or --bench"));
  std::map<int64_t, std::vector<int32_t>> out;
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    LmRequest r;
    r.prompt = prompts[i];
    r.max_new_tokens = a.max_new;
    r.sampling = {a.temperature, a.top_k, a.top_p, a.seed + i};
    auto id = e.add_request(r);
    if (!id.ok()) return fail(id.status().WithContext("prompt " + std::to_string(i)));
    ids.push_back(*id);
  }
  const bool stream = prompts.size() == 1;
  if (stream) std::printf("%s", printable_tokens(prompts[0], vocab).c_str());
  while (!e.idle()) {
    auto ev = e.step();
    if (!ev.ok()) return fail(ev.status());
    for (const TokenEvent& t : *ev) {
      out[t.request].push_back(t.token);
      if (stream) {
        std::printf("%s", printable_tokens({t.token}, vocab).c_str());
        std::fflush(stdout);
      }
    }
  }
  if (stream) std::printf("\n");
  for (size_t i = 0; !stream && i < ids.size(); ++i)
    std::printf("[%zu] %s|%s\n", i, printable_tokens(prompts[i], vocab).c_str(),
                printable_tokens(out[ids[i]], vocab).c_str());
  const EngineStats st = e.stats();
  std::fprintf(stderr,
               "%lld steps, %lld prompt tokens prefilled (%lld from shared prefix pages), %lld decoded\n",
               static_cast<long long>(st.steps), static_cast<long long>(st.prefill_tokens),
               static_cast<long long>(st.cached_prompt_tokens), static_cast<long long>(st.decode_tokens));
  return 0;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* serve = app.add_subcommand("serve", "Serve a model (docs/serving.md)");
  serve->require_subcommand(1);
  auto* cmd =
      serve->add_subcommand("lm", "Generate with the language model of docs/lm.md (the serving engine)");
  cmd->add_option("--model", a->model, "A checkpoint (docs/lm.md), or a `train lm` output folder")
      ->required();
  cmd->add_option("--data", a->data,
                  "The data folder: its tokenizer.json (--prompt) and vocab_bytes.json (output)");
  cmd->add_option("--prompt", a->prompts, "A prompt text (repeat for several requests, served together)");
  cmd->add_option("--prompt-ids", a->prompt_ids, "A prompt as comma-separated token ids");
  cmd->add_option("--max-new", a->max_new, "New tokens per request")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--temperature", a->temperature, "0: greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", a->top_k, "0: all")->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--top-p", a->top_p, "1: all")->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--seed", a->seed, "Sampling seed of the first request (the next ones count up)");
  cmd->add_option("--page-size", a->page_size, "Tokens per KV page")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--pool-pages", a->pool_pages,
                  "KV pages per layer (0 with --backend gpu: as many as the free device memory holds)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  cmd->add_option("--max-batch", a->max_batch, "Running requests at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  cmd->add_option("--backend", a->backend, "reference (CPU, small models) or gpu")
      ->check(CLI::IsMember({"reference", "gpu"}));
  cmd->add_option(
         "--profile-decode", a->profile_decode,
         "With --backend gpu: time a decode step at batch 1 and --max-batch with this many tokens of "
         "context, stage by stage, against the device's copy peak; then exit (the engine builds its decode "
         "buckets only)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option(
         "--weights", a->weights,
         "The layers' matrices: bf16, fp8 (e4m3, a scale per output channel) or fp8-tensor (one scale "
         "per matrix); activations quantized by token")
      ->check(CLI::IsMember({"bf16", "fp8", "fp8-tensor"}));
  cmd->add_option("--kv-cache", a->kv_cache,
                  "The KV cache: bf16, or fp8 (e4m3 with an fp32 descale per token and KV head: about half "
                  "the bytes; the decode step's attention on fusebox's own kernel)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  cmd->add_flag("--tune-decode", a->tune_decode,
                "Tune every decode-step graph at warm-up (CUDA-graph timing, cuDNN's first 4 candidates and "
                "fusebox's pinned-only kernel) and run the winners; stored in the plan cache (--cache, "
                "default $FUSEBOX_CACHE), so a later start reads them");
  cmd->add_flag("--deterministic", a->deterministic,
                "A request's tokens do not depend on the requests beside it, bit for bit: each prompt "
                "prefilled alone, no shared prefix pages, and on the GPU decode kernels whose rows do not "
                "depend on the batch (slower; bf16 weights)");
  cmd->add_option(
      "--bench", a->bench,
      "Replay a request trace (python3 -m fusebox_tools.models.lm_trace make): latencies, tokens/s, KV use");
  cmd->add_option("--report", a->report, "With --bench: write the statistics as JSON");
  cmd->add_option("--forced", a->forced,
                  "Teacher forcing: {\"requests\": [{\"prompt\": [ids], \"forced\": [ids]}]}, all at once "
                  "(verification: python3 -m fusebox_tools.models.lm_torch teacher-forced)");
  cmd->add_option("--logits-out", a->logits_out,
                  "With --forced: a new folder for each request's logits (logits_<i>.npy)");
  add_cache_flags(cmd, a->cache);
  return [a]() { return run_serve(*a); };
}

}  // namespace fusebox::cli
