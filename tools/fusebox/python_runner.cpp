// Starting a Python runner of fusebox_tools (common.h, run_python_module): found beside the
// binary or in the source tree, with this fusebox's path, its exit status forwarded.
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

bool is_file(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

// The folder to put on PYTHONPATH: $FUSEBOX_PYTHONPATH when set; else, in
// order, the source tree's python/ (this binary in its build tree), a
// checkout's python/ beside the binary's folder (build/fusebox), the
// installed copy (<prefix>/share/fusebox/python, CMake's install rules).
// Empty when none holds the runner; `looked` lists where it looked.
std::string find_tools(const std::filesystem::path& exe, const char* runner_file, std::string* looked) {
  if (const char* env = std::getenv("FUSEBOX_PYTHONPATH"); env && *env) {
    // A path list, as PYTHONPATH: it is used whole when one of its folders holds the runner.
    const std::string list = env;
    for (size_t start = 0; start <= list.size();) {
      const size_t colon = list.find(':', start);
      const std::string d =
          list.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!d.empty() && is_file(std::filesystem::path(d) / runner_file)) return list;
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
    if (is_file(c / runner_file)) return c.string();
    *looked += (looked->empty() ? "" : ", ") + c.string();
  }
  return "";
}

// The interpreter's exit status as ours: a signal's death as the shell reports it (128 + signal).
int exit_code_of(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return kExitFailure;
}

}  // namespace

int run_python_module(const std::string& command, const PythonRunner& r,
                      const std::vector<std::string>& args) {
  const char* py_env = std::getenv("FUSEBOX_PYTHON");
  const std::string python = py_env && *py_env ? py_env : "python3";
  std::error_code ec;
  const std::filesystem::path exe_path = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string exe = ec ? std::string() : exe_path.string();
  std::string looked;
  const std::string tools = find_tools(exe_path, r.file, &looked);
  if (tools.empty()) {
    return fail(command, InvalidArgument("the Python runner " + std::string(r.file) + " is not in " + looked +
                                         ": set FUSEBOX_PYTHONPATH to the python folder of the "
                                         "fusebox source tree (or install fusebox: share/fusebox/python)"));
  }

  std::vector<std::string> argv_s = {python, "-m", r.module};
  if (!exe.empty()) argv_s.insert(argv_s.end(), {"--fusebox", exe});  // a later --fusebox in args wins
  argv_s.insert(argv_s.end(), args.begin(), args.end());
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
    return fail(command, InvalidArgument("no Python interpreter '" + python + "'" + where + " (from " +
                                         (py_env && *py_env ? "$FUSEBOX_PYTHON" : "the default python3") +
                                         "): " + std::strerror(err) + ": install python3 with " +
                                         std::string(r.needs) + ", or set FUSEBOX_PYTHON to one"));
  }
  if (err != 0) {
    return fail(command, InvalidArgument("cannot start the Python interpreter '" + python +
                                         "': " + std::strerror(err) + " (set FUSEBOX_PYTHON to python3)"));
  }
  if (waited < 0) {
    return fail(command, Internal(std::string("waiting for the Python runner: ") + std::strerror(errno)));
  }
  return exit_code_of(wstatus);
}

}  // namespace fusebox::cli
