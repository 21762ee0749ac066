// Every input the graph_loader_fuzzer crashed on (fuzz/regressions/graph_loader/,
// see fuzz/README.md) goes through what the fuzzer calls: parse_graph_json,
// resolve, describe, graph_to_json and a re-parse. Each may be accepted or
// refused; the test is that none crashes (ASan would have found it under the
// fuzzer, here a crash fails the test binary) and every refusal is a Status with
// a message that starts with the file it names.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusebox/graph.h"

using namespace fusebox;
namespace fs = std::filesystem;

namespace {

fs::path regressions_dir() { return fs::path(FUSEBOX_SOURCE_DIR) / "fuzz/regressions/graph_loader"; }

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(GraphLoaderRegression, EveryKeptCrasherIsAStatus) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(regressions_dir())) {
    if (e.is_regular_file() && e.path().filename() != "README.md") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty()) << "no inputs in " << regressions_dir();
  for (const auto& p : files) {
    SCOPED_TRACE(p.filename().string());
    const std::string origin = p.filename().string();
    auto spec = parse_graph_json(read_bytes(p), origin);
    if (!spec.ok()) {
      EXPECT_NE(spec.status().code(), StatusCode::kInternal) << spec.status().ToString();
      EXPECT_EQ(spec.status().message().rfind(origin + ": ", 0), 0u)
          << spec.status().message().substr(0, 300);
      continue;
    }
    auto resolved = resolve(*spec);
    if (resolved.ok()) {
      EXPECT_FALSE(describe(*resolved).empty());
    } else {
      EXPECT_NE(resolved.status().code(), StatusCode::kInternal) << resolved.status().ToString();
    }
    auto again = parse_graph_json(graph_to_json(*spec), origin);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(resolve(*again).ok(), resolved.ok());
  }
}
