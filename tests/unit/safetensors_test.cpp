// read_safetensors_for: bounded headers, parsed once per file (issue #32 case 9).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::GraphBuilder;

ResolvedTensor make(const std::string& name, std::vector<int64_t> dims, DType dtype = DType::kFP32) {
  GraphBuilder b;
  b.tensor(name, std::move(dims), dtype, {});
  return b.g.tensors[0];
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("fusebox_st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  // 8-byte little-endian length, the header text, then `data`.
  std::string write(const std::string& name, const std::string& header, const std::string& data) {
    const std::string path = (dir_ / name).string();
    std::ofstream f(path, std::ios::binary);
    uint64_t n = header.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    f.write(len, 8);
    f << header << data;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsTest, ReadsATensor) {
  float v[2] = {1.5f, -2.0f};
  const std::string path = write("ok.safetensors",
                                 R"({"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2], )"
                                 R"("data_offsets": [0, 8]}})",
                                 std::string(reinterpret_cast<const char*>(v), 8));
  auto r = read_safetensors_for(path, "w", make("w", {2}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->to_float_logical(), (std::vector<float>{1.5f, -2.0f}));
  auto missing = read_safetensors_for(path, "x", make("x", {2}));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no tensor named 'x' (the file holds 1 tensors"),
            std::string::npos)
      << missing.status().ToString();
}

// A deeply nested header used to be parsed whole (7.8 GB for 100 MiB of
// '['): the depth is bounded before any parser sees it.
TEST_F(SafetensorsTest, DeeplyNestedHeaderIsRefusedBeforeParsing) {
  const size_t depth = 1 << 20;
  const std::string header = R"({"__metadata__": )" + std::string(depth, '[') + std::string(depth, ']') +
                             R"(, "w": {"dtype": "F32", )"
                             R"("shape": [1], "data_offsets": [0, 4]}})";
  const std::string path = write("deep.safetensors", header, std::string(4, '\0'));
  auto r = read_safetensors_for(path, "w", make("w", {1}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kParseError);
  EXPECT_NE(r.status().message().find("nests deeper than"), std::string::npos) << r.status().ToString();
}

// 300 constants from one file with a 10 MB header: parsed once per reader (one
// pipeline load), not 300 times
// (600 constants took 116 s before). The bound is loose; the old cost is ~100x it.
TEST_F(SafetensorsTest, HeaderIsParsedOncePerFile) {
  std::string header = R"({"__metadata__": {"pad": ")" + std::string(10 << 20, 'p') + R"("})";
  std::string data;
  const int n = 300;
  for (int i = 0; i < n; ++i) {
    header += ", \"t" + std::to_string(i) + "\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [" +
              std::to_string(4 * i) + ", " + std::to_string(4 * i + 4) + "]}";
    const float v = static_cast<float>(i);
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  header += "}";
  const std::string path = write("many.safetensors", header, data);
  const auto start = std::chrono::steady_clock::now();
  SafetensorsReader reader;  // what one pipeline load uses
  for (int i = 0; i < n; ++i) {
    auto r = reader.read(path, "t" + std::to_string(i), make("t", {1}));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->to_float_logical(), std::vector<float>{static_cast<float>(i)});
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(s, 8.0) << "the header was parsed again for each tensor";
}

// A file rewritten in place is read again, not served from the parsed index.
TEST_F(SafetensorsTest, RewrittenFileIsParsedAgain) {
  float one = 1.0f, two = 2.0f;
  SafetensorsReader reader;
  const std::string h = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  const std::string path = write("re.safetensors", h, std::string(reinterpret_cast<const char*>(&one), 4));
  ASSERT_TRUE(reader.read(path, "w", make("w", {1})).ok());
  const std::string h2 =
      R"({"v": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", )"
      R"("shape": [1], "data_offsets": [0, 4]}})";
  write("re.safetensors", h2, std::string(reinterpret_cast<const char*>(&two), 4));
  auto r = reader.read(path, "v", make("v", {1}));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->to_float_logical(), std::vector<float>{2.0f});
}

}  // namespace
}  // namespace fusebox
