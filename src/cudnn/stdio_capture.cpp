#include "stdio_capture.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

namespace fusebox::cudnn {

namespace {

// File descriptors 1 and 2 belong to the process, so one redirection serves every capture alive
// at a time: the first capture redirects both into one temporary file, each capture remembers
// where the file ended when it began, and the last one to finish restores them. (Captures that
// saved and restored the descriptors on their own, from two threads, left stdout pointing into a
// deleted file: `pipeline run --devices 0,0` printed nothing.)
struct Redirect {
  std::mutex mu;
  int users = 0;
  int fd = -1, saved_out = -1, saved_err = -1;
};

Redirect& redirect() {
  static Redirect r;
  return r;
}

void restore(Redirect& r) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (r.saved_out >= 0) dup2(r.saved_out, 1), close(r.saved_out), r.saved_out = -1;
  if (r.saved_err >= 0) dup2(r.saved_err, 2), close(r.saved_err), r.saved_err = -1;
  if (r.fd >= 0) close(r.fd), r.fd = -1;
}

}  // namespace

StdioCapture::StdioCapture() {
  Redirect& r = redirect();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.users == 0) {
    char path[] = "/tmp/fusebox-cudnn-log-XXXXXX";
    r.fd = mkstemp(path);
    if (r.fd < 0) return;  // no capture: output goes where it went
    unlink(path);
    std::fflush(stdout);
    std::fflush(stderr);
    r.saved_out = dup(1);
    r.saved_err = dup(2);
    if (r.saved_out < 0 || r.saved_err < 0 || dup2(r.fd, 1) < 0 || dup2(r.fd, 2) < 0) {
      restore(r);
      return;
    }
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const off_t end = lseek(r.fd, 0, SEEK_END);
  start_ = end < 0 ? 0 : static_cast<int64_t>(end);
  ++r.users;
  active_ = true;
}

StdioCapture::~StdioCapture() { finish(); }

std::string StdioCapture::finish() {
  std::string text;
  if (!active_) return text;
  active_ = false;
  Redirect& r = redirect();
  std::lock_guard<std::mutex> lock(r.mu);
  std::fflush(stdout);
  std::fflush(stderr);
  const off_t end = lseek(r.fd, 0, SEEK_END);
  if (end > start_) {
    // What was written since this capture began (with concurrent captures, theirs too), at most 1 MiB.
    const size_t n = std::min<size_t>(static_cast<size_t>(end - start_), size_t{1} << 20);
    text.resize(n);
    const ssize_t got = pread(r.fd, text.data(), n, static_cast<off_t>(start_));
    text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  }
  if (--r.users == 0) restore(r);
  return text;
}
std::string distill_cudnn_log(const std::string& log, int max_lines) {
  std::set<std::string> seen;
  std::string out;
  std::istringstream in(log);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::string reason;
    if (auto pos = line.find("Reason: "); pos != std::string::npos) {
      reason = line.substr(pos + 8);
    } else if (line.rfind("Plan at index ", 0) == 0) {
      reason = line;
    } else {
      continue;
    }
    if (!seen.insert(reason).second) continue;
    if (n++ < max_lines) out += "\n  cuDNN: " + reason;
  }
  if (n > max_lines) out += "\n  cuDNN: ... (" + std::to_string(n - max_lines) + " more distinct reasons)";
  return out;
}

}  // namespace fusebox::cudnn
