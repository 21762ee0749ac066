// fusebox model embed: text in, sentence embeddings out (all-MiniLM-L6-v2,
// issue 14). A thin caller of the Python runner fusebox_tools.models.minilm_embed:
// the tokenizer is the `tokenizers` package, so the runner stays the one
// implementation and this command only finds it, starts it and forwards its
// exit code (docs/cli.md, docs/models.md).
#include <cstdio>
#include <string>
#include <vector>

#include "common.h"

namespace fusebox::cli {
namespace {

constexpr const char* kRunner = "fusebox_tools.models.minilm_embed";
constexpr const char* kRunnerFile = "fusebox_tools/models/minilm_embed.py";

void print_help() {
  std::printf(
      "fusebox model embed: sentence embeddings (all-MiniLM-L6-v2) from text\n"
      "Usage: fusebox model embed [--model DIR] [--text TEXT]... [--file PATH]... [--json] [OPTIONS] "
      "[SENTENCE]...\n"
      "\n"
      "Runs the Python runner `python3 -m %s` (docs/models.md): tokenizes the text with the\n"
      "model's tokenizer.json (the `tokenizers` package), runs the encoder as a fusebox pipeline on\n"
      "the GPU (this fusebox binary), prints the cosine similarities. Arguments go to the runner\n"
      "unchanged; its exit code is this command's (0 ok, 1 a run or check failed, 2 bad input).\n"
      "\n"
      "Options (the runner's; `fusebox model embed --runner-help` lists them all):\n"
      "  --model DIR      the folder `python3 -m fusebox_tools.models.minilm convert` wrote\n"
      "                   (default: models/minilm/fusebox, relative to the current folder)\n"
      "  --text TEXT      one sentence (repeat for more)\n"
      "  --file PATH      a UTF-8 text file, one sentence per non-empty line (at most 4096, 16 MiB)\n"
      "  SENTENCE...      sentences as positional arguments; all sources in order: positional,\n"
      "                   --text, --file; none: 8 example sentences\n"
      "  --json           one JSON document on stdout: model, sentences, token counts, S,\n"
      "                   embeddings [B, hidden], cosine matrix, computed_by; human text on stderr\n"
      "  --no-fusebox     the numpy float32 reference alone (CPU, no GPU)\n"
      "  --reference      also check fusebox against the numpy reference (exit 1 on a mismatch)\n"
      "  --batch-size N   sentences per batch (default 32, as sentence-transformers): sorted by\n"
      "                   token count, each batch padded to its own longest, output in input order\n"
      "  --seq S          instead: one batch, every sentence padded to S tokens\n"
      "                   (either way a sentence is cut at the model's max_seq_length: DIR's\n"
      "                   sentence_bert_config.json (256 for all-MiniLM-L6-v2), else its positions)\n"
      "  --cache F        the plan cache (default: the persistent one, $FUSEBOX_CACHE, else\n"
      "                   $XDG_CACHE_HOME/fusebox/plans.sqlite or ~/.cache/fusebox/plans.sqlite)\n"
      "  --no-cache       build every plan afresh\n"
      "  --tokenizer F    tokenizer.json (default: DIR/host/tokenizer.json)\n"
      "\n"
      "Environment:\n"
      "  FUSEBOX_PYTHON      the Python interpreter (default: python3 on PATH); it needs numpy and "
      "tokenizers\n"
      "  FUSEBOX_PYTHONPATH  the folder holding fusebox_tools (default: the source tree's python/ for a\n"
      "                      build-tree binary, else ../python or ../share/fusebox/python beside the "
      "binary)\n",
      kRunner);
}

}  // namespace

int run_model_embed(const std::vector<std::string>& args) {
  // --help is ours (no Python needed); --runner-help is the runner's full list. The value of
  // --text/--file is never taken for a flag ("--text -h" embeds "-h").
  bool runner_help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--text" || args[i] == "--file" || args[i] == "--model" || args[i] == "--tokenizer" ||
        args[i] == "--cache") {
      ++i;
    } else if (args[i] == "--") {
      break;
    } else if (args[i] == "--help" || args[i] == "-h") {
      print_help();
      return kExitOk;
    } else if (args[i] == "--runner-help") {
      runner_help = true;
    }
  }
  return run_python_module("model embed", {kRunner, kRunnerFile, "numpy and tokenizers"},
                           runner_help ? std::vector<std::string>{"--help"} : args);
}

Runner add_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("model", "Whole models from their inputs (docs/models.md): embed");
  // Never parsed here: main() hands `model embed ...` to run_model_embed with its arguments
  // untouched (they are the runner's); this entry lists it in --help.
  auto* embed = cmd->add_subcommand(
      "embed",
      "Sentence embeddings (all-MiniLM-L6-v2) from --text/--file/SENTENCE: runs the Python runner "
      "fusebox_tools.models.minilm_embed with this fusebox (see fusebox model embed --help)");
  embed->allow_extras();
  return [embed]() {
    if (embed->parsed()) return run_model_embed(embed->remaining());
    return fail("model", InvalidArgument("a subcommand is needed: accepted subcommands are embed "
                                         "(see fusebox model --help)"));
  };
}

}  // namespace fusebox::cli
