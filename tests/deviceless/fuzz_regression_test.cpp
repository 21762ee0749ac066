// The seeds and every kept crasher of the fuzzers that reach cuDNN
// (fuzz/corpus/<target>/, fuzz/regressions/<target>/; fuzz/README.md), run
// through the real readers in the normal build: device-properties files into
// DeviceTarget::from_properties_json (and so cuDNN's parser), plan files into
// read_plan_file and a handle-less deserialize_plan, .npy files into
// read_npy_for. Each may be accepted or refused; none may crash, and a refusal
// is a Status of the reader's error classes.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "fusebox/plan.h"
#include "fusebox/plan_file.h"
#include "fusebox/tensor.h"
#include "test_util.h"

using namespace fusebox;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> inputs(const std::string& target) {
  std::vector<fs::path> out;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(fusebox::testing::source_dir()) / "fuzz" / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string scratch(const std::string& name, const std::string& bytes) {
  const std::string p = (fs::temp_directory_path() / ("fusebox_fuzz_regression_" + name)).string();
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

}  // namespace

TEST(FuzzRegression, DeviceProperties) {
  const auto files = inputs("device_properties");
  ASSERT_FALSE(files.empty());
  for (const auto& p : files) {
    SCOPED_TRACE(p.string());
    auto t = DeviceTarget::from_properties_json(read_bytes(p), p.filename().string());
    if (!t.ok()) EXPECT_EQ(t.status().code(), StatusCode::kParseError) << t.status().ToString();
  }
}

TEST(FuzzRegression, PlanFiles) {
  const auto files = inputs("plan_file");
  ASSERT_FALSE(files.empty());
  auto target = DeviceTarget::from_file(fusebox::testing::devprop_path());
  ASSERT_TRUE(target.ok()) << target.status().ToString();
  int deserialized = 0;
  for (const auto& p : files) {
    SCOPED_TRACE(p.string());
    const std::string bytes = read_bytes(p);
    if (bytes.empty()) continue;
    std::string path;
    if (bytes[0] & 1) {  // the fuzzer's mode 1: the rest is a payload under a matching header
      PlanFileInfo info;
      path = scratch("plan", "");
      ASSERT_TRUE(write_plan_file(path, info, std::vector<uint8_t>(bytes.begin() + 1, bytes.end())).ok());
    } else {
      path = scratch("plan", bytes.substr(1));
    }
    auto pf = read_plan_file(path);
    if (!pf.ok()) {
      const auto c = pf.status().code();
      EXPECT_TRUE(c == StatusCode::kParseError || c == StatusCode::kIoError) << pf.status().ToString();
      continue;
    }
    auto plan = deserialize_plan(ResolvedGraph{}, pf->payload, *target, nullptr, pf->info.engine);
    deserialized += plan.ok();
  }
  EXPECT_GT(deserialized, 0) << "no input reached a successful handle-less deserialize";
}

TEST(FuzzRegression, NpyFiles) {
  const auto files = inputs("npy_reader");
  ASSERT_FALSE(files.empty());
  int accepted = 0;
  for (const auto& p : files) {
    SCOPED_TRACE(p.string());
    const std::string bytes = read_bytes(p);
    if (bytes.empty()) continue;
    // The tensor the fuzzer's first byte picks (fuzz/npy_reader_fuzzer.cpp).
    static const DType kTypes[] = {DType::kFP32, DType::kFP16, DType::kInt32, DType::kBF16};
    static const std::vector<int64_t> kDims[] = {{2, 3}, {1}, {4, 1, 2}, {0, 5}};
    ResolvedTensor t;
    t.name = "x";
    t.dtype = kTypes[static_cast<uint8_t>(bytes[0]) & 3];
    t.dims = kDims[(static_cast<uint8_t>(bytes[0]) >> 2) & 3];
    t.strides.assign(t.dims.size(), 1);
    for (size_t i = t.dims.size(); i-- > 1;)
      t.strides[i - 1] = t.strides[i] * std::max<int64_t>(t.dims[i], 1);
    auto r = read_npy_for(scratch("npy", bytes.substr(1)), t);
    if (!r.ok()) {
      const auto c = r.status().code();
      EXPECT_TRUE(c == StatusCode::kParseError || c == StatusCode::kInvalidArgument ||
                  c == StatusCode::kNotSupported)
          << r.status().ToString();
    }
    accepted += r.ok();
  }
  EXPECT_GT(accepted, 0);
}
