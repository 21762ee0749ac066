// The training loop of `fusebox train lm`, written against the public API (fusebox/train.h,
// docs/training.md): a Llama-style model from a config, trained on a token file, with
// checkpoints every few steps and a resume.
//
//   train_lm CONFIG TRAIN_TOKENS.npy STEPS OUT_DIR [VAL_TOKENS.npy]
#include <fusebox/train.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

int fail(const fusebox::Status& st) {
  std::fprintf(stderr, "train_lm: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: train_lm CONFIG TRAIN_TOKENS.npy STEPS OUT_DIR [VAL_TOKENS.npy]\n");
    return 2;
  }
  const std::string config_path = argv[1], train_path = argv[2], out = argv[4];
  const long long steps = std::atoll(argv[3]);
  if (steps < 1) {
    std::fprintf(stderr, "train_lm: STEPS must be a positive integer, not '%s'\n", argv[3]);
    return 2;
  }

  // 1. The model and the optimizer settings: one JSON file (docs/lm.md).
  auto config = fusebox::load_lm_config(config_path);
  if (!config.ok()) return fail(config.status());
  const int64_t seq = config->model.context;

  // 2. The data: token ids in a 1-D .npy, checked against the vocabulary.
  auto train = fusebox::load_token_stream(train_path, config->model.vocab, seq);
  if (!train.ok()) return fail(train.status());

  // 3. The trainer writes the model's forward pipeline, derives its backward and holds the
  //    fp32 master weights and AdamW moments.
  fusebox::LmTrainerOptions options;
  options.work_dir = out + "/pipelines";
  options.total_steps = steps;
  options.backend = fusebox::TrainBackend::kReference;
  auto trainer = fusebox::LmTrainer::create(*config, options);
  if (!trainer.ok()) return fail(trainer.status());
  fusebox::LmTrainer& t = **trainer;
  std::printf("%lld parameters, %.1f MiB of saved activations per micro-batch\n",
              static_cast<long long>(fusebox::lm_parameter_count(config->model)),
              static_cast<double>(t.saved_activation_bytes()) / (1 << 20));

  // 4. Resume when a checkpoint exists: the step count and data position come back with it.
  const std::string checkpoint = out + "/checkpoint.safetensors";
  if (std::filesystem::exists(checkpoint)) {
    if (fusebox::Status st = t.load_checkpoint(checkpoint); !st.ok()) return fail(st);
    std::printf("resumed at step %lld\n", static_cast<long long>(t.steps_done()));
  }

  // 5. The loop: one call per optimizer step (forward, loss, backward, clipping, AdamW).
  while (t.steps_done() < steps) {
    auto r = t.step(*train);
    if (!r.ok()) return fail(r.status());  // a non-finite loss names the step; nothing changed
    std::printf("step %4lld  loss %.4f  lr %.2e  grad norm %.3f  %.0f tokens/s\n",
                static_cast<long long>(r->step), r->loss, r->lr, r->grad_norm,
                static_cast<double>(r->tokens) / r->seconds);
    if (t.steps_done() % 10 == 0 || t.steps_done() == steps) {
      // Written to a temporary file and renamed: an interrupted save keeps the old one.
      if (fusebox::Status st = t.save_checkpoint(checkpoint); !st.ok()) return fail(st);
    }
  }

  // 6. Validation on text the training never saw, and a greedy continuation.
  if (argc > 5) {
    auto val = fusebox::load_token_stream(argv[5], config->model.vocab, seq);
    if (!val.ok()) return fail(val.status());
    auto loss = t.validation_loss(*val, config->train.val_batches);
    if (!loss.ok()) return fail(loss.status());
    std::printf("validation loss %.4f\n", *loss);
    std::vector<int32_t> prompt(val->tokens.begin(), val->tokens.begin() + std::min<int64_t>(8, seq / 2));
    auto more = t.generate(prompt, std::min<int64_t>(8, seq - static_cast<int64_t>(prompt.size())));
    if (!more.ok()) return fail(more.status());
    std::printf("continuation:");
    for (int32_t id : *more) std::printf(" %d", id);
    std::printf("\n");
  }
  return 0;
}
