// fusebox_common: host wall-clock timing (steady_clock). GPU work is timed
// with CUDA events instead (run.cpp, tune.cpp).
#pragma once

#include <chrono>

namespace fusebox::common {

// Starts when constructed.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void restart() { start_ = std::chrono::steady_clock::now(); }
  // Milliseconds since construction or the last restart().
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fusebox::common
