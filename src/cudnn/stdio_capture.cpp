#include "stdio_capture.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <vector>

namespace fusebox::cudnn {

StdioCapture::StdioCapture() {
  char path[] = "/tmp/fusebox-cudnn-log-XXXXXX";
  fd_ = mkstemp(path);
  if (fd_ < 0) return;  // no capture: output goes where it went
  unlink(path);
  std::fflush(stdout);
  std::fflush(stderr);
  saved_out_ = dup(1);
  saved_err_ = dup(2);
  if (saved_out_ < 0 || saved_err_ < 0 || dup2(fd_, 1) < 0 || dup2(fd_, 2) < 0) {
    finish();
    return;
  }
  active_ = true;
}

StdioCapture::~StdioCapture() { finish(); }

std::string StdioCapture::finish() {
  std::string text;
  std::fflush(stdout);
  std::fflush(stderr);
  if (saved_out_ >= 0) dup2(saved_out_, 1), close(saved_out_), saved_out_ = -1;
  if (saved_err_ >= 0) dup2(saved_err_, 2), close(saved_err_), saved_err_ = -1;
  if (fd_ >= 0) {
    if (active_ && lseek(fd_, 0, SEEK_SET) == 0) {
      std::vector<char> buf(1 << 20);
      ssize_t n = read(fd_, buf.data(), buf.size());
      if (n > 0) text.assign(buf.data(), static_cast<size_t>(n));
    }
    close(fd_);
    fd_ = -1;
  }
  active_ = false;
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
