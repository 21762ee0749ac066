// Helpers shared by the deviceless and GPU tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fusebox/graph.h"

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

// A graph from its JSON text, resolved (a test failure if it does not parse or resolve).
// ||a - b||_2 / ||b||_2 over two float vectors (b the reference); infinite (fails every
// tolerance) when their sizes differ.
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return HUGE_VAL;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

inline ResolvedGraph resolved_graph(const std::string& json) {
  auto spec = parse_graph_json(json);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  auto g = resolve(*spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : ResolvedGraph{};
}

// Tensor `name` of `g` (which must hold it).
inline const ResolvedTensor& tensor_named(const ResolvedGraph& g, const std::string& name) {
  return g.tensors.at(static_cast<size_t>(g.find_tensor(name)));
}

}  // namespace fusebox::testing
