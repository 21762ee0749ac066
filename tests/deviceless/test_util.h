// Helpers shared by the deviceless and GPU tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace fusebox::testing {

// Every example graph except the deliberately invalid ones, sorted.
inline std::vector<std::string> example_graphs() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs")) {
    const std::string p = e.path().string();
    if (e.path().extension() == ".json" && e.path().filename().string().rfind("invalid_", 0) != 0) out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline std::string stem(const std::string& path) { return std::filesystem::path(path).stem().string(); }

}  // namespace fusebox::testing
