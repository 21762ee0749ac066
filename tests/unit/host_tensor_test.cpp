// Host tensors: random inputs and .npy files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "fusebox/tensor.h"
#include "reference_test_util.h"

namespace fusebox {
namespace {

using testing_util::channels_last;
using testing_util::GraphBuilder;
using testing_util::host_from;

ResolvedTensor make(const std::string& name, std::vector<int64_t> dims, DType dtype = DType::kFP32,
                    std::vector<int64_t> strides = {}) {
  GraphBuilder b;
  b.tensor(name, std::move(dims), dtype, std::move(strides));
  return b.g.tensors[0];
}

std::string temp_path(const std::string& file) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("fusebox_npy_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / file).string();
}

TEST(RandomTensor, DeterministicPerSeedAndName) {
  const ResolvedTensor t = make("x", {2, 3, 4, 5}, DType::kBF16);
  EXPECT_EQ(random_tensor(t, 42).data, random_tensor(t, 42).data);
  EXPECT_NE(random_tensor(t, 42).data, random_tensor(t, 43).data);
  const ResolvedTensor u = make("y", {2, 3, 4, 5}, DType::kBF16);
  EXPECT_NE(random_tensor(t, 42).data, random_tensor(u, 42).data);
}

TEST(RandomTensor, InRangeAndNeverConstant) {
  for (DType dt : {DType::kBF16, DType::kFP16, DType::kFP32, DType::kFP8E4M3, DType::kFP8E5M2}) {
    const std::vector<float> v = random_tensor(make("x", {64, 33}, dt), 1, -2.0, 3.0).to_float_logical();
    std::set<float> distinct(v.begin(), v.end());
    EXPECT_GT(distinct.size(), 4u) << dtype_name(dt);
    for (float f : v) {
      EXPECT_GE(f, -2.0f) << dtype_name(dt);
      EXPECT_LE(f, 3.0f) << dtype_name(dt);
    }
  }
  // A range narrower than one fp8 step would round every draw alike.
  const std::vector<float> v =
      random_tensor(make("x", {16}, DType::kFP8E4M3), 1, 1.0, 1.01).to_float_logical();
  EXPECT_GT(std::set<float>(v.begin(), v.end()).size(), 1u);
}

TEST(RandomTensor, IntegersAreSmall) {
  const std::vector<float> v = random_tensor(make("i", {200}, DType::kInt32), 5).to_float_logical();
  std::set<float> distinct(v.begin(), v.end());
  EXPECT_GT(distinct.size(), 1u);
  for (float f : v) {
    EXPECT_EQ(f, std::round(f));
    EXPECT_LE(std::fabs(f), 4.0f);
  }
}

TEST(RandomTensor, LayoutDoesNotChangeLogicalValues) {
  const std::vector<int64_t> d = {2, 3, 4, 5};
  const HostTensor a = random_tensor(make("x", d, DType::kFP16), 3);
  const HostTensor b = random_tensor(make("x", d, DType::kFP16, channels_last(d)), 3);
  EXPECT_EQ(a.to_float_logical(), b.to_float_logical());
  EXPECT_NE(a.data, b.data);
}

TEST(RandomTensor, ScalarGetsItsValue) {
  ResolvedTensor t = make("alpha", {1, 1, 1, 1});
  t.scalar_value = 0.25;
  EXPECT_EQ(random_tensor(t, 1).to_float_logical(), std::vector<float>{0.25f});
}

TEST(HostTensor, AtFollowsStrides) {
  const std::vector<int64_t> d = {1, 2, 2, 3};
  const ResolvedTensor t = make("x", d, DType::kFP32, channels_last(d));
  const HostTensor h = host_from(t, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(h.at({0, 1, 0, 2}), 8.0);
  EXPECT_EQ(h.element_count(), 12);
  // Channel fastest in memory: element (0,1,0,0) sits right after (0,0,0,0).
  float second;
  std::memcpy(&second, h.data.data() + 4, 4);
  EXPECT_EQ(second, 6.0f);
}

void expect_round_trip(const ResolvedTensor& t) {
  const std::string path = temp_path(t.name + ".npy");
  const HostTensor h = random_tensor(t, 11);
  ASSERT_TRUE(write_npy(path, h).ok());
  auto r = read_npy_for(path, t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->data, h.data) << t.name;
  EXPECT_EQ(r->to_float_logical(), h.to_float_logical()) << t.name;
}

TEST(Npy, RoundTripsEachType) {
  expect_round_trip(make("f4", {3, 5}, DType::kFP32));
  expect_round_trip(make("f2", {2, 3, 4}, DType::kFP16));
  expect_round_trip(make("i4", {7}, DType::kInt32));
  expect_round_trip(make("bf16_as_f4", {4, 4}, DType::kBF16));
  expect_round_trip(make("e4m3_as_f4", {4, 4}, DType::kFP8E4M3));
  const std::vector<int64_t> d = {2, 3, 4, 5};
  expect_round_trip(make("nhwc", d, DType::kFP16, channels_last(d)));
}

TEST(Npy, HeaderIsNumpyV1AndAligned) {
  const ResolvedTensor t = make("h", {2, 3}, DType::kFP32);
  const std::string path = temp_path("h.npy");
  ASSERT_TRUE(write_npy(path, random_tensor(t, 1)).ok());
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(1, 5), "NUMPY");
  EXPECT_EQ(bytes[6], 1);
  const size_t hl = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
  EXPECT_EQ((10 + hl) % 64, 0u);
  EXPECT_NE(bytes.find("'descr': '<f4'"), std::string::npos);
  EXPECT_NE(bytes.find("'shape': (2, 3)"), std::string::npos);
  EXPECT_EQ(bytes.size(), 10 + hl + 6 * 4);
}

// A .npy file with the given header dict and `data_bytes` zero bytes of data.
std::string npy_bytes(const std::string& dict, size_t data_bytes, int version = 1) {
  std::string header = dict;
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  if (version != 1) out += std::string(2, '\0');
  return out + header + std::string(data_bytes, '\0');
}

Status read_bytes(const std::string& bytes, const ResolvedTensor& t) {
  const std::string path = temp_path("bad.npy");
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return read_npy_for(path, t).status();
}

TEST(Npy, ReadsVersion2AndF8IntoFloatTensor) {
  const ResolvedTensor t = make("x", {2, 2}, DType::kBF16);
  EXPECT_TRUE(
      read_bytes(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 2), }", 32, 2), t).ok());
  EXPECT_TRUE(
      read_bytes(npy_bytes("{\"descr\":\"<i4\",\"fortran_order\":False,\"shape\":(2,2)}", 16), t).ok());
}

TEST(Npy, RejectsMalformedFiles) {
  const ResolvedTensor t = make("x", {16, 64, 56, 56}, DType::kBF16);
  const ResolvedTensor small = make("x", {2, 3}, DType::kFP32);
  const std::string good = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  ASSERT_TRUE(read_bytes(good, small).ok());

  struct Case {
    std::string what, bytes;
    const ResolvedTensor* t;
    std::string expect_in_message;
  };
  const std::vector<Case> cases = {
      {"empty", "", &small, "magic"},
      {"bad magic", "\x93NUMPX" + good.substr(6), &small, "magic"},
      {"truncated data", good.substr(0, good.size() - 5), &small, "truncated"},
      {"truncated header", good.substr(0, 40), &small, "truncated"},
      {"trailing bytes", good + "xxxx", &small, "trailing"},
      {"bad version", good.substr(0, 6) + '\x07' + good.substr(7), &small, "version"},
      {"wrong shape",
       npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (16, 64, 56), }", 16 * 64 * 56 * 4), &t,
       "shape (16, 64, 56) does not match tensor 'x' dims [16, 64, 56, 56]"},
      {"fortran order", npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), &small,
       "fortran"},
      {"big endian", npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24), &small,
       "big-endian"},
      {"unsupported descr", npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }", 48),
       &small, "unsupported dtype"},
      {"float into int", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24),
       nullptr, "cannot feed"},
      {"missing key", npy_bytes("{'descr': '<f4', 'shape': (2, 3), }", 24), &small, "lacks"},
      {"garbage dict", npy_bytes("{'descr': <f4, 'fortran_order': False, 'shape': (2, 3), }", 24), &small,
       "malformed"},
      {"bad shape", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 24), &small,
       "malformed"},
      {"huge header length", good.substr(0, 8) + "\xff\xff" + good.substr(10), &small, "truncated"},
  };
  const ResolvedTensor int_t = make("x", {2, 3}, DType::kInt32);
  for (const Case& c : cases) {
    const Status st = read_bytes(c.bytes, c.t ? *c.t : int_t);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_NE(st.message().find(c.expect_in_message), std::string::npos) << c.what << ": " << st.ToString();
    EXPECT_NE(st.message().find("bad.npy"), std::string::npos) << c.what << ": " << st.ToString();
  }
}

// Issue #32 case 11: numpy keeps the last 'shape' of a header that repeats it;
// fusebox joined the two and read (56, 56, 56, 56). Repeated keys are refused.
TEST(Npy, RefusesRepeatedHeaderKeys) {
  const ResolvedTensor t = make("x", {2, 3, 2, 3}, DType::kFP32);  // what the joined shapes gave
  const ResolvedTensor small = make("x", {2, 3}, DType::kFP32);
  const std::string twice_shape =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'shape': (2, 3), }", 36 * 4);
  Status st = read_bytes(twice_shape, t);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.ToString();
  EXPECT_NE(st.message().find("'shape' appears twice"), std::string::npos) << st.ToString();
  st = read_bytes(
      npy_bytes("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 24), small);
  EXPECT_NE(st.message().find("'descr' appears twice"), std::string::npos) << st.ToString();
  st = read_bytes(
      npy_bytes("{'descr': '<f4', 'fortran_order': True, 'fortran_order': False, 'shape': (2, 3), }", 24),
      small);
  EXPECT_NE(st.message().find("'fortran_order' appears twice"), std::string::npos) << st.ToString();
}

// Issue #32 case 14: an array fusebox cannot read is bad input (exit 2), not a
// missing feature of fusebox (exit 1).
TEST(Npy, UnreadableDtypeIsInvalidArgument) {
  const ResolvedTensor small = make("x", {2, 3}, DType::kFP32);
  for (const char* descr : {"<c8", ">f4"}) {
    const Status st = read_bytes(
        npy_bytes(std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }", 48),
        small);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << descr << ": " << st.ToString();
  }
}

TEST(Npy, MissingFileIsIoError) {
  auto r = read_npy_for(temp_path("does_not_exist.npy"), make("x", {1}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace fusebox
