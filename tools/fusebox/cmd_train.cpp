// fusebox train lm: train the Llama-style language model of docs/lm.md (issue 33) through
// fusebox/train.h. The command parses, shows progress and writes files; the step is the
// library's.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common.h"
#include "common/file_io.h"
#include "common/json_text.h"
#include "fusebox/distributed.h"
#include "fusebox/train.h"

namespace fusebox::cli {
namespace {

namespace fs = std::filesystem;

struct TrainArgs {
  std::string config, data, out, backend = "reference", dump_grads, prompt;
  int64_t steps = 0, save_every = 0, prompt_tokens = 16, generate = 24, val_batches = -1, stop_after = 0;
  int ranks = 1, profile = 0;
  bool resume = false, check_gradients = false, no_plot = false, fp8 = false;
  CacheFlags cache;
};

std::string duration(double s) {
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(std::fmod(s, 3600) / 60));
  else
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(std::fmod(s, 60)));
  return b;
}

// --profile: where a step's time goes, summed over the layers (".<n>." in a stage name becomes
// ".*."), largest first; every row in OUT/profile.json.
int print_profile(LmTrainer& t, const TokenStream& train, int iters, const fs::path& out) {
  auto p = t.profile_step(train, iters);
  if (!p.ok()) return fail("train lm", p.status());
  const double sum = lm_profile_sum_ms(*p);
  std::printf(
      "profile (%d runs of each, back to back, median): the step %.2f ms as a CUDA graph%s, %.2f ms eagerly; "
      "its %zu parts, each run alone, add up to %.2f ms\n",
      p->iters, p->step_ms, p->step_ms > 0 ? "" : (" (not captured: " + p->graph_note + ")").c_str(),
      p->step_eager_ms, p->rows.size(), sum);
  std::printf("  %9s %6s %5s %8s  %-9s %s\n", "ms/step", "share", "runs", "TFLOP/s", "part",
              "stage (engines)");
  for (const LmStepProfileKind& k : lm_profile_by_kind(*p)) {
    std::string engines;
    for (const std::string& e : k.engines) {
      if (engines.size() > 60) {
        engines += ", ...";
        break;
      }
      engines += (engines.empty() ? "" : ", ") + e;
    }
    std::printf("  %9.3f %5.1f%% %5d %8.1f  %-9s %s%s\n", k.ms, sum > 0 ? 100 * k.ms / sum : 0.0, k.count,
                k.ms > 0 ? k.flops / (k.ms * 1e-3) / 1e12 : 0.0, k.part.c_str(), k.stage.c_str(),
                engines.empty() ? "" : (" (" + engines + ")").c_str());
  }
  const std::string path = (out / "profile.json").string();
  if (Status st = common::write_file_atomic(path, lm_profile_json(*p), "profile"); !st.ok())
    return fail("train lm", st);
  std::printf("profile: %s\n", path.c_str());
  return 0;
}

int run_train(const TrainArgs& a) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "fusebox train lm: %s\n", st.ToString().c_str());
    return exit_code_for(st);
  };
  if (a.profile > 0 && a.backend != "gpu")
    return fail(InvalidArgument("--profile times the GPU step's stages: it needs --backend gpu"));
  // Data parallel (fusebox/distributed.h): torchrun's variables, or --ranks in this process.
  auto launch = parse_launch_env();
  if (!launch.ok()) return fail(launch.status());
  if (launch->world_size > 1)
    return fail(NotSupported(
        "WORLD_SIZE=" + std::to_string(launch->world_size) +
        " (a torchrun-style launch): data parallel across processes needs the NCCL communicator, which is "
        "not built yet (issue 31); --ranks N runs N ranks in this process on the reference backend"));
  auto cfg = load_lm_config(a.config);
  if (!cfg.ok()) return fail(cfg.status());
  if (a.val_batches > 0) cfg->train.val_batches = a.val_batches;
  if (a.fp8) cfg->train.fp8 = true;
  const int64_t S = cfg->model.context;
  // The data: a folder (train.npy, val.npy, vocab_bytes.json) or one token file.
  std::string train_path = a.data, val_path, vocab_path;
  if (fs::is_directory(a.data)) {
    train_path = (fs::path(a.data) / "train.npy").string();
    if (fs::exists(fs::path(a.data) / "val.npy")) val_path = (fs::path(a.data) / "val.npy").string();
    if (fs::exists(fs::path(a.data) / "vocab_bytes.json"))
      vocab_path = (fs::path(a.data) / "vocab_bytes.json").string();
  }
  auto train = load_token_stream(train_path, cfg->model.vocab, S);
  if (!train.ok()) return fail(train.status());
  std::optional<TokenStream> val;
  if (!val_path.empty()) {
    auto v = load_token_stream(val_path, cfg->model.vocab, S);
    if (!v.ok()) return fail(v.status());
    val = std::move(*v);
  }
  std::vector<std::string> vocab;
  if (!vocab_path.empty()) {
    auto v = load_vocab_bytes(vocab_path, cfg->model.vocab);
    if (!v.ok()) return fail(v.status());
    vocab = std::move(*v);
  }
  const fs::path out(a.out);
  const std::string ckpt = (out / "checkpoint.safetensors").string(),
                    init = (out / "init.safetensors").string(), csv = (out / "losses.csv").string();
  std::error_code ec;
  if (!a.resume && fs::exists(ckpt))
    return fail(InvalidArgument(
        a.out + " already holds a checkpoint: pass --resume to continue it, or another --out"));
  if (a.resume && !fs::exists(ckpt)) return fail(InvalidArgument("--resume: " + ckpt + " does not exist"));
  fs::create_directories(out, ec);
  if (ec) return fail(IoError(a.out + ": cannot create the folder: " + ec.message()));
  if (Status st = common::check_outputs_spare_inputs(
          {{"checkpoint", ckpt},
           {"initial checkpoint", init},
           {"loss log", csv},
           {"loss plot", (out / "loss.png").string()},
           {"--dump-grads", a.dump_grads}},
          {{"--config", a.config}, {"training tokens", train_path}, {"validation tokens", val_path}});
      !st.ok())
    return fail(st);

  std::vector<std::unique_ptr<Communicator>> comms;
  if (a.ranks > 1) {
    if (a.backend != "reference")
      return fail(
          NotSupported("--ranks " + std::to_string(a.ranks) +
                       ": data parallel runs on the reference backend only for now (the GPU step needs "
                       "the NCCL communicator, issue 31)"));
    comms = make_thread_communicators(a.ranks);
  }
  LmTrainerOptions opt;
  opt.work_dir = (out / "pipelines").string();
  opt.total_steps = a.steps;
  opt.backend = a.backend == "gpu" ? TrainBackend::kGpu : TrainBackend::kReference;
  if (!a.cache.off) opt.plan_cache = a.cache.path.empty() ? default_cache_path() : a.cache.path;
  if (!comms.empty()) opt.communicator = comms[0].get();
  auto trainer = LmTrainer::create(*cfg, opt);
  if (!trainer.ok()) return fail(trainer.status());
  LmTrainer& t = **trainer;
  // Ranks 1..N-1: trainers of their own (pipelines at batch / N), stepped by threads below.
  std::vector<std::unique_ptr<LmTrainer>> others;
  for (size_t r = 1; r < comms.size(); ++r) {
    LmTrainerOptions o = opt;
    o.work_dir = (out / "pipelines" / ("rank" + std::to_string(r))).string();
    o.communicator = comms[r].get();
    auto other = LmTrainer::create(*cfg, o);
    if (!other.ok()) return fail(other.status().WithContext("rank " + std::to_string(r)));
    if (a.resume)
      if (Status st = (*other)->load_checkpoint(ckpt); !st.ok()) return fail(st);
    others.push_back(std::move(*other));
  }
  std::string log = "step,loss,lr,grad_norm,tokens_per_s\n";
  if (a.resume) {
    if (Status st = t.load_checkpoint(ckpt); !st.ok()) return fail(st);
    // The loss log keeps the rows of the steps the checkpoint holds.
    if (auto old = common::read_file_bounded(csv, 256u << 20, "loss log"); old.ok()) {
      std::istringstream in(*old);
      std::string line;
      std::getline(in, line);
      while (std::getline(in, line))
        if (!line.empty() && std::atoll(line.c_str()) < t.steps_done()) log += line + "\n";
    }
    std::printf("resumed %s at step %lld (sequence %lld)\n", ckpt.c_str(),
                static_cast<long long>(t.steps_done()), static_cast<long long>(t.sequences_done()));
  } else if (Status st = t.save_checkpoint(init); !st.ok()) {
    return fail(st);
  }
  const LmModelConfig& m = cfg->model;
  std::printf(
      "model: %lld parameters (%lld without embeddings), %lld layers, dim %lld, %lld/%lld heads, vocab %lld, "
      "context %lld; batch %lld x %lld micro-batches; backend %s\n",
      static_cast<long long>(lm_parameter_count(m)), static_cast<long long>(lm_parameter_count(m, false)),
      static_cast<long long>(m.layers), static_cast<long long>(m.dim), static_cast<long long>(m.heads),
      static_cast<long long>(m.kv_heads), static_cast<long long>(m.vocab), static_cast<long long>(S),
      static_cast<long long>(cfg->train.batch), static_cast<long long>(cfg->train.accum), a.backend.c_str());
  std::printf("data: %s, %zu tokens (%lld sequences)%s\n", train_path.c_str(), train->tokens.size(),
              static_cast<long long>(train->sequences(S)),
              val ? (", validation " + std::to_string(val->tokens.size()) + " tokens").c_str() : "");
  {
    std::string phases;
    double total = 0;
    for (const auto& [what, ms] : t.startup_ms()) {
      char b[64];
      std::snprintf(b, sizeof b, "%.0f ms", ms);
      phases += (phases.empty() ? "" : "; ") + what + " " + b;
      total += ms;
    }
    std::printf("start-up: %.0f ms (%s)\n", total, phases.c_str());
  }
  std::printf("saved activations per micro-batch: %.1f MiB\n",
              static_cast<double>(t.saved_activation_bytes()) / (1 << 20));
  if (opt.backend == TrainBackend::kGpu)
    std::printf("GPU: %s; %.2f GiB of device memory (buffers, workspace, master weights, moments)\n",
                t.plan_summary().c_str(), static_cast<double>(t.device_bytes()) / (1 << 30));
  if (a.check_gradients) {
    auto g = t.check_gradients(std::min<int64_t>(S, 8));
    if (!g.ok()) return fail(g.status());
    int failed = 0;
    for (const auto& row : g->rows) failed += row.pass ? 0 : 1;
    std::printf(
        "gradient check (finite differences, fp32, batch 1 x %lld tokens): %zu gradients, %d failed\n",
        static_cast<long long>(std::min<int64_t>(S, 8)), g->rows.size(), failed);
    for (const auto& row : g->rows)
      if (!row.pass) std::printf("  %s\n", row.ToString().c_str());
    if (!g->pass()) return fail(Status(StatusCode::kVerificationFailed, "the gradient check failed"));
  }
  const bool tty = isatty(fileno(stderr));
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t first = t.steps_done();
  if (first >= a.steps)
    std::printf("the checkpoint is at step %lld: no steps left of %lld\n", static_cast<long long>(first),
                static_cast<long long>(a.steps));
  const int64_t last = a.stop_after > 0 ? std::min(a.steps, first + a.stop_after) : a.steps;
  // The other ranks make the same collective calls as rank 0: the steps, then the validation.
  std::vector<Status> other_status(others.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < others.size(); ++i) {
    threads.emplace_back([&, i] {
      for (int64_t s = first; s < last && other_status[i].ok(); ++s)
        other_status[i] = others[i]->step(*train).status();
      if (other_status[i].ok() && val)
        other_status[i] = others[i]->validation_loss(*val, cfg->train.val_batches).status();
    });
  }
  // Joins the other ranks; a rank's own error comes before the "another rank failed" it caused.
  auto join = [&](Status st) {
    if (!st.ok() && !comms.empty()) comms[0]->abort();
    for (auto& th : threads) th.join();
    threads.clear();
    for (size_t i = 0; i < other_status.size(); ++i)
      if (!other_status[i].ok() && (st.ok() || st.code() == StatusCode::kInternal))
        return other_status[i].WithContext("rank " + std::to_string(i + 1));
    return st;
  };
  struct Joiner {  // every return below joins the threads first
    std::function<void()> f;
    ~Joiner() { f(); }
  } joiner{[&] {
    if (!threads.empty()) (void)join(Status(StatusCode::kInternal, "rank 0 stopped"));
  }};
  if (!others.empty())
    std::printf("data parallel: %d ranks in this process (global micro-batch %lld = %d x %lld sequences)\n",
                a.ranks, static_cast<long long>(cfg->train.batch), a.ranks,
                static_cast<long long>(cfg->train.batch / a.ranks));
  for (int64_t s = first; s < last; ++s) {
    auto r = t.step(*train);
    if (!r.ok()) {
      if (tty) std::fprintf(stderr, "\n");
      std::fprintf(stderr, "fusebox train lm: the last checkpoint (%s) is unchanged\n",
                   fs::exists(ckpt) ? ckpt.c_str() : init.c_str());
      return fail(join(r.status()));
    }
    const double tps = static_cast<double>(r->tokens) / r->seconds;
    char row[160];
    std::snprintf(row, sizeof row, "%lld,%.6f,%.6g,%.6f,%.1f\n", static_cast<long long>(r->step), r->loss,
                  r->lr, r->grad_norm, tps);
    log += row;
    if (s == first) std::printf("first step: %.0f ms\n", r->seconds * 1e3);
    if (s == first && !a.dump_grads.empty())
      if (Status st = t.save_gradients(a.dump_grads); !st.ok()) return fail(st);
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double eta = elapsed / static_cast<double>(s - first + 1) * static_cast<double>(a.steps - s - 1);
    std::fprintf(stderr, "%sstep %lld/%lld  loss %.4f  lr %.3g  |g| %.3f  %.0f tok/s%s  ETA %s%s",
                 tty ? "\r" : "", static_cast<long long>(s + 1), static_cast<long long>(a.steps), r->loss,
                 r->lr, r->grad_norm, tps, r->cuda_graph ? " (graph)" : "", duration(eta).c_str(),
                 tty ? "   " : "\n");
    if (a.save_every > 0 && (s + 1) % a.save_every == 0 && s + 1 < last) {
      if (Status st = t.save_checkpoint(ckpt); !st.ok()) return fail(st);
      if (Status st = common::write_file_atomic(csv, log, "loss log"); !st.ok()) return fail(st);
    }
  }
  if (!val)
    if (Status st = join(Status::Ok()); !st.ok()) return fail(st);
  if (tty) std::fprintf(stderr, "\n");
  if (Status st = t.save_checkpoint(ckpt); !st.ok()) return fail(st);
  if (Status st = common::write_file_atomic(csv, log, "loss log"); !st.ok()) return fail(st);
  std::printf("checkpoint: %s (step %lld); losses: %s\n", ckpt.c_str(),
              static_cast<long long>(t.steps_done()), csv.c_str());
  if (a.profile > 0)
    if (int rc = print_profile(t, *train, a.profile, out); rc != 0) return rc;
  if (!a.no_plot) {
    // The loss curve, by matplotlib (fusebox_tools.models.lm_plot); a missing matplotlib is a note.
    const std::string png = (out / "loss.png").string();
    if (run_python_module("train lm",
                          {"fusebox_tools.models.lm_plot", "fusebox_tools/models/lm_plot.py", "matplotlib"},
                          {"--out", png, "--title", "fusebox train lm: " + a.config, csv}) != 0)
      std::printf("loss plot: not written (above)\n");
  }
  if (val) {
    auto vl = t.validation_loss(*val, cfg->train.val_batches);
    if (!vl.ok()) return fail(join(vl.status()));
    if (Status st = join(Status::Ok()); !st.ok()) return fail(st);
    std::printf("validation loss: %.4f (%lld micro-batches of %s)\n", *vl,
                static_cast<long long>(cfg->train.val_batches), val_path.c_str());
    const int64_t np = std::min<int64_t>(a.prompt_tokens, S - 1);
    const int64_t ng = std::min<int64_t>(a.generate, S - np);
    if (np > 0 && ng > 0 && static_cast<int64_t>(val->tokens.size()) >= np) {
      std::vector<int32_t> prompt(val->tokens.begin(), val->tokens.begin() + np);
      auto g = t.generate(prompt, ng);
      if (!g.ok() && g.status().code() == StatusCode::kNotSupported) {
        std::printf("greedy continuation: skipped (%s)\n", g.status().message().c_str());
        return 0;
      }
      if (!g.ok()) return fail(g.status());
      std::printf("greedy continuation of the validation text:\n  prompt: %s\n  model:  %s\n",
                  printable_tokens(prompt, vocab).c_str(), printable_tokens(*g, vocab).c_str());
    }
  }
  return 0;
}

}  // namespace

Runner add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto* train = app.add_subcommand("train", "Train a model (docs/training.md)");
  train->require_subcommand(1);
  auto* cmd = train->add_subcommand("lm", "Train the Llama-style language model of docs/lm.md");
  cmd->add_option("--config", a->config, "Model and training config JSON (docs/lm.md)")->required();
  cmd->add_option("--data", a->data,
                  "Data folder (train.npy, val.npy, vocab_bytes.json) or one token .npy file")
      ->required();
  cmd->add_option("--steps", a->steps, "Optimizer steps in all (the schedule's length)")
      ->required()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--out", a->out, "Output folder: checkpoints, losses.csv, the generated pipelines")
      ->required();
  cmd->add_flag("--resume", a->resume, "Continue from OUT/checkpoint.safetensors");
  cmd->add_flag("--fp8", a->fp8,
                "The transformer blocks' GEMMs in FP8 (e4m3 forward, e5m2 gradients, delayed scaling): the "
                "config's train.fp8 (docs/training.md)");
  cmd->add_option("--backend", a->backend, "reference (CPU, small models) or gpu")
      ->check(CLI::IsMember({"reference", "gpu"}));
  cmd->add_option("--save-every", a->save_every, "Also write the checkpoint every K steps")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--dump-grads", a->dump_grads,
                  "Write the first step's gradients (safetensors, grad.<name>) for a comparison");
  cmd->add_option("--val-batches", a->val_batches, "Validation micro-batches (default: the config's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--generate", a->generate, "Tokens of greedy continuation printed at the end (0: none)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option(
         "--stop-after", a->stop_after,
         "Take at most K steps in this run, then write the checkpoint and stop (--resume goes on; the "
         "schedule stays --steps long)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  add_cache_flags(cmd, a->cache);
  cmd->add_flag("--no-plot", a->no_plot, "Do not draw OUT/loss.png (matplotlib, through python3)");
  cmd->add_option("--ranks", a->ranks,
                  "Data parallel in this process: N ranks (threads) share each global micro-batch and "
                  "all-reduce the gradients (reference backend; docs/training.md, \"Data parallel\")")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--profile", a->profile,
                  "After the steps (gpu backend), time each stage of a step alone over K runs and the whole "
                  "step: a table summed over the layers, every row in OUT/profile.json")
      ->check(CLI::Range(1, 10000));
  cmd->add_flag("--check-gradients", a->check_gradients,
                "Before training, check the derived backward against finite differences (small models)");
  return [a]() { return run_train(*a); };
}

}  // namespace fusebox::cli
