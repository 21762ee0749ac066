// fusebox: build, select, cache and run cuDNN graphs declared explicitly.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <new>

#include "common.h"

namespace {

// What `fusebox --version` prints: versions known at build time plus the
// loaded cuDNN's, none of which needs a GPU.
std::string version_text() {
  const fusebox::SystemInfo s = fusebox::system_info(/*enumerate_gpus=*/false);
  auto ver = [](int64_t v) {
    return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
           std::to_string(v % 100);
  };
  return "fusebox " + s.fusebox_version + "\ncuDNN Frontend " + s.frontend_version + " (headers)\ncuDNN " +
         ver(s.cudnn_header_version) + " (headers), " + ver(s.cudnn_runtime_version) + " (runtime)";
}

// A command whose output could not be written (disk full, closed pipe) did
// not succeed: report it instead of exiting 0.
int check_stdout(int rc) {
  std::cout.flush();
  errno = 0;
  const bool bad = std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout.good();
  if (!bad) return rc;
  const int err = errno;
  std::fprintf(stderr, "fusebox: IoError: cannot write to standard output%s%s\n", err ? ": " : "",
               err ? std::strerror(err) : "");
  return rc != fusebox::cli::kExitOk ? rc : fusebox::cli::kExitBadInput;
}

int fusebox_main(int argc, char** argv) {
  using namespace fusebox::cli;
  CLI::App app{"fusebox: define cuDNN graphs explicitly, build them, pick the engine, run and verify them"};
  app.require_subcommand(1);
  app.set_version_flag("--version", version_text,
                       "Print the fusebox, cuDNN Frontend and cuDNN versions and exit");
  std::map<CLI::App*, Runner> runners;
  auto add = [&](Runner (*fn)(CLI::App&)) {
    Runner r = fn(app);
    runners[app.get_subcommands({}).back()] = std::move(r);
  };
  add(add_info);
  add(add_devprop);
  add(add_check);
  add(add_build);
  add(add_run);
  add(add_reference);
  add(add_engines);
  add(add_tune);
  add(add_cache);
  add(add_pipeline);
  add(add_shapes);
  add(add_model);
  add(add_ops);
  add(add_backward);
  add(add_train);
  add(add_serve);
  // `model embed`'s arguments are the Python runner's, passed on verbatim: CLI11 would parse
  // them (a sentence that reads like an option or a command), so they bypass it.
  if (argc > 2 && std::strcmp(argv[1], "model") == 0 && std::strcmp(argv[2], "embed") == 0)
    return run_model_embed(std::vector<std::string>(argv + 3, argv + argc));
  // CLI11 reports an unknown command only as "A subcommand is required": name it.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::cerr << "fusebox: unknown command '" << argv[1] << "': accepted commands are " << names
                << " (see fusebox --help)\n";
      return kExitBadInput;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "fusebox: " << e.what() << " (see fusebox --help)\n";
    return kExitBadInput;
  }
  try {
    for (auto* sub : app.get_subcommands()) return runners.at(sub)();
  } catch (const std::bad_alloc&) {
    // A resource limit, like a file-size limit: bad input or environment (exit 2), not a fusebox bug.
    std::string cmd;
    for (auto* sub : app.get_subcommands()) cmd = sub->get_name();
    std::cerr << "fusebox " << cmd << ": IoError: out of host memory while running 'fusebox " << cmd
              << "' (free memory, raise the process's memory limit, or give smaller files)\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "fusebox: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) {
  // A write past the file-size limit (ulimit -f) fails with EFBIG and is reported
  // with its path (temporary files removed), instead of killing the process.
  fusebox::common::ignore_file_size_signal();
  return check_stdout(fusebox_main(argc, argv));
}
