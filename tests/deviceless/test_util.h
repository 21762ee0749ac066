// Helpers shared by the deviceless and GPU tests.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace fusebox::testing {

// The source tree and device file: compiled-in paths, overridable by the
// environment (the GPU machine runs these binaries from another checkout).
inline std::string source_dir() {
  const char* e = std::getenv("FUSEBOX_SOURCE_DIR");
  return e && *e ? e : FUSEBOX_SOURCE_DIR;
}
inline std::string devprop_path() {
  const char* e = std::getenv("FUSEBOX_DEVPROP");
  return e && *e ? e : FUSEBOX_DEVPROP;
}

// Every example graph except the deliberately invalid ones, sorted.
inline std::vector<std::string> example_graphs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(source_dir() + "/examples/graphs")) {
    const std::string p = e.path().string();
    if (e.path().extension() == ".json" && e.path().filename().string().rfind("invalid_", 0) != 0)
      out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace fusebox::testing
