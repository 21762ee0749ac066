// fusebox model embed: text in, sentence embeddings out (all-MiniLM-L6-v2,
// issue 14). A thin caller of the Python runner fusebox_tools.models.minilm_embed:
// the tokenizer is the `tokenizers` package, so the runner stays the one
// implementation and this command only finds it, starts it and forwards its
// exit code (docs/cli.md, docs/models.md).
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "common.h"

extern char** environ;

namespace fusebox::cli {
namespace {

constexpr const char* kRunner = "fusebox_tools.models.minilm_embed";
constexpr const char* kRunnerFile = "fusebox_tools/models/minilm_embed.py";

bool is_file(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

// The folder to put on PYTHONPATH: $FUSEBOX_PYTHONPATH when set; else, in
// order, the source tree's python/ (this binary in its build tree), a
// checkout's python/ beside the binary's folder (build/fusebox), the
// installed copy (<prefix>/share/fusebox/python, CMake's install rules).
// Empty when none holds the runner; `looked` lists where it looked.
std::string find_tools(const std::filesystem::path& exe, std::string* looked) {
  if (const char* env = std::getenv("FUSEBOX_PYTHONPATH"); env && *env) {
    // A path list, as PYTHONPATH: it is used whole when one of its folders holds the runner.
    const std::string list = env;
    for (size_t start = 0; start <= list.size();) {
      const size_t colon = list.find(':', start);
      const std::string d =
          list.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!d.empty() && is_file(std::filesystem::path(d) / kRunnerFile)) return list;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    *looked = "$FUSEBOX_PYTHONPATH (" + list + ")";
    return "";
  }
  const std::filesystem::path bin = exe.parent_path();
  std::vector<std::filesystem::path> candidates;
#ifdef FUSEBOX_SOURCE_DIR
  if (is_file(bin / "CMakeCache.txt"))
    candidates.push_back(std::filesystem::path(FUSEBOX_SOURCE_DIR) / "python");
#endif
  const std::filesystem::path prefix =
      bin.parent_path();  // build/fusebox -> the checkout; bin/fusebox -> the prefix
  candidates.push_back(prefix / "python");
  candidates.push_back(prefix / "share" / "fusebox" / "python");
  for (const auto& c : candidates) {
    if (is_file(c / kRunnerFile)) return c.string();
    *looked += (looked->empty() ? "" : ", ") + c.string();
  }
  return "";
}

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

// The interpreter's exit status as ours: a signal's death as the shell reports it (128 + signal).
int exit_code_of(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return kExitFailure;
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
  const char* py_env = std::getenv("FUSEBOX_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "python3";
  std::error_code ec;
  const std::filesystem::path exe_path = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string exe = ec ? std::string() : exe_path.string();
  std::string looked;
  const std::string tools = find_tools(exe_path, &looked);
  if (tools.empty()) {
    return fail("model embed",
                InvalidArgument("the Python runner " + std::string(kRunnerFile) + " is not in " + looked +
                                ": set FUSEBOX_PYTHONPATH to the python folder of the "
                                "fusebox source tree (or install fusebox: share/fusebox/python)"));
  }

  std::vector<std::string> argv_s = {python, "-m", kRunner};
  if (!exe.empty()) argv_s.insert(argv_s.end(), {"--fusebox", exe});  // a later --fusebox in args wins
  if (runner_help) {
    argv_s.push_back("--help");
  } else {
    argv_s.insert(argv_s.end(), args.begin(), args.end());
  }
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);

  // The environment as it is, with the tools folder first on PYTHONPATH.
  const char* old_pp = std::getenv("PYTHONPATH");
  std::string pp = "PYTHONPATH=" + tools + (old_pp && *old_pp ? std::string(":") + old_pp : "");
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "PYTHONPATH=", 11) != 0) envp.push_back(*e);
  }
  envp.push_back(pp.data());
  envp.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  // Ctrl-C reaches the runner (same process group), which ends; we wait for it and report its
  // status, as std::system does; the runner gets the default dispositions back.
  struct sigaction ignore {
  }, old_int{}, old_quit{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, &old_int);
  sigaction(SIGQUIT, &ignore, &old_quit);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGQUIT);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  // posix_spawnp: a name without '/' is looked up on PATH, as a shell would.
  const int err = posix_spawnp(&pid, python.c_str(), nullptr, &attr, argv.data(), envp.data());
  posix_spawnattr_destroy(&attr);
  int wstatus = 0;
  pid_t waited = -1;
  if (err == 0) {
    do {
      waited = ::waitpid(pid, &wstatus, 0);
    } while (waited < 0 && errno == EINTR);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGQUIT, &old_quit, nullptr);
  if (err == ENOENT || err == EACCES) {
    const std::string where = python.find('/') != std::string::npos ? "" : " on PATH";
    return fail("model embed",
                InvalidArgument("no Python interpreter '" + python + "'" + where + " (from " +
                                (py_env && *py_env ? "$FUSEBOX_PYTHON" : "the default python3") +
                                "): " + std::strerror(err) +
                                ": install python3 with numpy and tokenizers, or set FUSEBOX_PYTHON to one"));
  }
  if (err != 0) {
    return fail("model embed", InvalidArgument("cannot start the Python interpreter '" + python + "': " +
                                               std::strerror(err) + " (set FUSEBOX_PYTHON to python3)"));
  }
  if (waited < 0) {
    return fail("model embed",
                Internal(std::string("waiting for the Python runner: ") + std::strerror(errno)));
  }
  return exit_code_of(wstatus);
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
