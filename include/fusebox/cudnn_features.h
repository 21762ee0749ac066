// What each cuDNN release adds that fusebox can use, in one table: the
// feature, the oldest cuDNN that has it, and what runs where the loaded cuDNN
// is older. fusebox builds against one cuDNN (the pinned PyPI wheel,
// scripts/setup.sh) and runs on any cuDNN from kMinCudnnVersion up: a feature
// is active only when both the headers it was compiled with and the library
// loaded now have it. `fusebox info` prints the table for the loaded library.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace fusebox {

// The oldest cuDNN fusebox runs on (what PyTorch ships): 9.19.0.
inline constexpr int64_t kMinCudnnVersion = 91900;

struct CudnnFeature {
  std::string_view name;      // stable key, e.g. "rope"
  int64_t min_version;        // major*10000 + minor*100 + patch, e.g. 92400
  std::string_view what;      // what the release adds
  std::string_view fusebox;   // how fusebox uses it where present
  std::string_view fallback;  // what runs on an older cuDNN
};

// Every feature, oldest first.
std::span<const CudnnFeature> cudnn_feature_table();

struct CudnnFeatureState {
  const CudnnFeature* feature = nullptr;
  bool compiled = false;  // the headers fusebox was built with have it
  bool loaded = false;    // the cuDNN loaded now has it
  bool active() const { return compiled && loaded; }
};

// The table against the headers fusebox was built with and `runtime_version`
// (cudnnGetVersion() of the loaded library; system_info().cudnn_runtime_version).
std::vector<CudnnFeatureState> cudnn_feature_states(int64_t runtime_version);

// Whether `name` is active on `runtime_version`; false for a name not in the table.
bool cudnn_feature_active(std::string_view name, int64_t runtime_version);

}  // namespace fusebox
