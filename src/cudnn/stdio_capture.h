// cuDNN 9.19 prints diagnostics to stdout and stderr when it cannot use an
// engine (e.g. on a machine with no GPU driver); that would corrupt
// `--json` output. StdioCapture redirects both file descriptors to a
// temporary file for its lifetime and hands the text back. Captures may overlap, from any
// threads: the descriptors are redirected while at least one is alive, and each capture's text
// is what was written meanwhile (with other threads' captures alive, their output too).
#pragma once

#include <cstdint>
#include <string>

namespace fusebox::cudnn {

class StdioCapture {
 public:
  StdioCapture();
  ~StdioCapture();
  StdioCapture(const StdioCapture&) = delete;
  StdioCapture& operator=(const StdioCapture&) = delete;
  // Restores stdout/stderr and returns what was written meanwhile (at most 1 MiB).
  std::string finish();

 private:
  int64_t start_ = 0;  // where the shared capture file ended when this capture began
  bool active_ = false;
};

// The distinct "Reason: ..." and "Plan at index N: ..." lines of a cuDNN log, at most `max_lines`.
std::string distill_cudnn_log(const std::string& log, int max_lines = 6);

}  // namespace fusebox::cudnn
