// fusebox: build, select, cache and run cuDNN graphs declared explicitly.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>

#include "common.h"

namespace {

int fusebox_main(int argc, char** argv) {
  using namespace fusebox::cli;
  CLI::App app{"fusebox: define cuDNN graphs explicitly, build them, pick the engine, run and verify them"};
  app.require_subcommand(1);
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
  add(add_engines);
  add(add_tune);
  add(add_cache);
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
  } catch (const CLI::ParseError& e) {
    std::cerr << "fusebox: " << e.what() << " (see fusebox --help)\n";
    return kExitBadInput;
  }
  try {
    for (auto* sub : app.get_subcommands()) return runners.at(sub)();
  } catch (const std::exception& e) {
    std::cerr << "fusebox: internal error: " << e.what() << "\n";
    return kExitFailure;
  }
  return kExitBadInput;
}

}  // namespace

int main(int argc, char** argv) { return fusebox_main(argc, argv); }
