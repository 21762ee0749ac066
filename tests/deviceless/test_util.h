// Helpers shared by the deviceless and GPU tests.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// A temporary folder, removed at the end of the test.
struct TempDir {
  std::string path;
  TempDir() {
    std::string t = (std::filesystem::temp_directory_path() / "fusebox_test_XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace fusebox::testing
