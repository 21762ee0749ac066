// Plan files that lie in their numbers, or are not files at all: ParseError
// or IoError before any byte reaches cuDNN (no cuDNN call is made here).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "fusebox/plan_file.h"

namespace fusebox {
namespace {

class PlanFileLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/limits_" + std::to_string(::getpid()) + ".plan";
    PlanFileInfo info;
    info.graph_fingerprint = "0123456789abcdef";
    info.engine = "eng0";
    info.device_name = "NVIDIA H200";
    info.sm_version = 90;
    info.sm_count = 132;
    info.cudnn_version = 91900;
    info.frontend_version = "1.32.0";
    info.fusebox_version = "0.1.0";
    // A real payload (the fuzz seed: conv_bias_relu built deviceless): read_plan_file checks it.
    std::ifstream seed(std::string(FUSEBOX_SOURCE_DIR) + "/fuzz/corpus/plan_file/conv_bias_relu_payload",
                       std::ios::binary);
    std::vector<uint8_t> payload(std::istreambuf_iterator<char>(seed), {});
    ASSERT_GT(payload.size(), 1u);
    payload.erase(payload.begin());  // the fuzzer's mode byte
    ASSERT_TRUE(write_plan_file(path_, info, payload).ok());
    std::ifstream f(path_, std::ios::binary);
    good_.assign(std::istreambuf_iterator<char>(f), {});
    ASSERT_TRUE(read_plan_file(path_).ok());
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // The good file with `field`'s value in the header replaced by `value`.
  Result<PlanFile> read_with(const std::string& field, const std::string& value) {
    std::string s = good_;
    const std::string key = "\"" + field + "\":";
    const size_t at = s.find(key);
    EXPECT_NE(at, std::string::npos) << field;
    const size_t begin = at + key.size();
    size_t end = begin;
    while (end < s.size() && s[end] != ',' && s[end] != '}') ++end;
    s.replace(begin, end - begin, value);
    std::ofstream(path_, std::ios::binary | std::ios::trunc) << s;
    return read_plan_file(path_);
  }

  std::string path_, good_;
};

TEST_F(PlanFileLimits, IntegersBeyondTheirRangeAreParseErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"format", "4294967297"},  // would truncate to 1 as an int
      {"format", "1.0"},         // not an integer literal
      {"format", "1e400"},
      {"payload_bytes", "18446744073709551615"},
      {"payload_bytes", "123456789012345678901234567890"},
      {"sm_version", "4294967386"},  // would truncate to 90
      {"sm_count", "-1"},
      {"workspace_bytes", "9223372036854775808"},
      {"cudnn", "1e30"},
  };
  for (const auto& [field, value] : cases) {
    auto r = read_with(field, value);
    ASSERT_FALSE(r.ok()) << field << " = " << value;
    EXPECT_EQ(r.status().code(), StatusCode::kParseError)
        << field << " = " << value << ": " << r.status().ToString();
    // 1e400 fails JSON parsing itself ("bad header"); the others name the field.
    const bool names_it =
        r.status().message().find(field) != std::string::npos ||
        (std::string(value) == "1e400" && r.status().message().find("header") != std::string::npos);
    EXPECT_TRUE(names_it) << r.status().message();
  }
}

TEST_F(PlanFileLimits, SpecialFilesAreRefusedWithoutBlocking) {
  for (const char* dev : {"/dev/zero", "/dev/null"}) {
    auto r = read_plan_file(dev);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status().ToString();
  }
  const std::string fifo = path_ + ".fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = read_plan_file(fifo);
  std::remove(fifo.c_str());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().message();
}

TEST_F(PlanFileLimits, WriteRefusesALinkAndLeavesNoTemporary) {
  const std::string victim = path_ + ".victim", link = path_ + ".link";
  std::ofstream(victim) << "precious";
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  PlanFileInfo info;
  Status st = write_plan_file(link, info, std::vector<uint8_t>(8, 1));
  EXPECT_FALSE(st.ok());
  std::ifstream f(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), "precious");
  std::remove(link.c_str());
  std::remove(victim.c_str());
}

}  // namespace
}  // namespace fusebox
