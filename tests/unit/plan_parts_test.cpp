// common/plan_parts.h: a partitioned plan's container round-trips, and every
// hostile variant (bad header, parts that overlap, skip or run past the end,
// trailing bytes, a nested container, a bad part payload) is a ParseError.
#include "common/plan_parts.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/plan_payload_check.h"

using namespace fusebox;
using common::decode_plan_parts;
using common::encode_plan_parts;
using common::SerializedPart;

namespace {

std::vector<uint8_t> real_payload() {  // as payload_check_test.cpp reads it
  std::ifstream in(std::string(FUSEBOX_SOURCE_DIR) + "/fuzz/corpus/plan_file/conv_bias_relu_file",
                   std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string f = ss.str().substr(1);
  const std::string p = f.substr(f.find('\n') + 1);
  return std::vector<uint8_t>(p.begin(), p.end());
}

std::vector<SerializedPart> two_parts() {
  return {{0, 3, "eng1", real_payload()}, {3, 1, "eng2", real_payload()}};
}

void expect_parse_error(const std::vector<uint8_t>& b, int ops, const std::string& needle) {
  auto r = decode_plan_parts(b.data(), b.size(), ops, "x.plan");
  ASSERT_FALSE(r.ok()) << "accepted; expected: " << needle;
  EXPECT_EQ(r.status().code(), StatusCode::kParseError) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
}

std::vector<uint8_t> with_header(const std::string& header, const std::vector<uint8_t>& tail) {
  std::string s = std::string(common::kPlanPartsMagic) + header + "\n";
  std::vector<uint8_t> out(s.begin(), s.end());
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

}  // namespace

TEST(PlanParts, RoundTripsAndPassesThePayloadCheck) {
  const auto parts = two_parts();
  const auto bytes = encode_plan_parts(parts);
  ASSERT_TRUE(common::is_plan_parts(bytes.data(), bytes.size()));
  auto back = decode_plan_parts(bytes.data(), bytes.size(), 4, "x.plan");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[1].first_op, 3);
  EXPECT_EQ((*back)[1].engine, "eng2");
  EXPECT_EQ((*back)[0].payload, parts[0].payload);
  // The plan file and cache readers check a container as a whole.
  EXPECT_TRUE(common::check_plan_payload(bytes.data(), bytes.size(), "x.plan").ok());
}

TEST(PlanParts, TemporaryDtypesRoundTrip) {
  const auto bytes = encode_plan_parts(two_parts(), {{5, "bf16"}, {9, "fp32"}});
  common::TemporaryDtypes back;
  auto parts = decode_plan_parts(bytes.data(), bytes.size(), 4, "x.plan", &back);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0], (std::pair<int, std::string>{5, "bf16"}));
  const auto p = real_payload();
  const std::string n = std::to_string(p.size());
  std::vector<uint8_t> both = p;
  both.insert(both.end(), p.begin(), p.end());
  expect_parse_error(
      with_header("{\"temporaries\":[{\"tensor\":-1,\"dtype\":\"bf16\"}],\"parts\":[{\"first_op\":0,"
                  "\"op_count\":2,\"engine\":\"e\",\"bytes\":" +
                      n +
                      "},{\"first_op\":2,\"op_count\":2,"
                      "\"engine\":\"e\",\"bytes\":" +
                      n + "}]}",
                  both),
      4, "a temporary is not");
}

TEST(PlanParts, HostileContainersAreParseErrors) {
  const auto good = encode_plan_parts(two_parts());
  expect_parse_error(good, 5, "cover 4 of 5 ops");
  auto trailing = good;
  trailing.push_back(0);
  expect_parse_error(trailing, 4, "bytes after the last part");
  auto cut = good;
  cut.resize(cut.size() - 10);
  expect_parse_error(cut, 4, "runs past the end");
  const auto p = real_payload();
  const std::string n = std::to_string(p.size());
  expect_parse_error(with_header("not json", p), 4, "");
  expect_parse_error(
      with_header("{\"parts\":[{\"first_op\":0,\"op_count\":4,\"engine\":\"e\",\"bytes\":" + n + "}]}", p), 4,
      "a single part with plan bytes");
  expect_parse_error(with_header("{\"parts\":[]}", {}), 4, "0 parts (1 to");
  std::vector<uint8_t> both = p;
  both.insert(both.end(), p.begin(), p.end());
  expect_parse_error(
      with_header("{\"parts\":[{\"first_op\":0,\"op_count\":2,\"engine\":\"e\",\"bytes\":" + n +
                      "},{\"first_op\":1,\"op_count\":3,\"engine\":\"e\",\"bytes\":" + n + "}]}",
                  both),
      4, "expected to start at op 2");
  expect_parse_error(with_header("{\"parts\":[{\"first_op\":0,\"op_count\":2,\"engine\":\"e\",\"bytes\":-5},"
                                 "{\"first_op\":2,\"op_count\":2,\"engine\":\"e\",\"bytes\":1}]}",
                                 both),
                     4, "out of range");
  // A part that is itself a container.
  std::vector<SerializedPart> nested = two_parts();
  nested[1].payload = good;
  const auto nb = encode_plan_parts(nested);
  expect_parse_error(nb, 4, "itself partitioned");
  // A bad payload inside a part: the frontend payload check names the part.
  std::vector<SerializedPart> broken = two_parts();
  broken[0].payload.assign(broken[0].payload.size(), 'x');
  const auto bb = encode_plan_parts(broken);
  expect_parse_error(bb, 4, "x.plan part 0");
  // A header without its newline within the bound.
  std::string huge = std::string(common::kPlanPartsMagic) + std::string(70000, ' ');
  expect_parse_error(std::vector<uint8_t>(huge.begin(), huge.end()), 4, "header line");
}

// A part fusebox runs with a kernel of its own (the reference fallback, issue 29) has no plan
// bytes and is rebuilt by name; an empty part that names a cuDNN engine is hostile.
TEST(PlanParts, AnOwnKernelPartHasNoBytesAndOnlyItMay) {
  std::vector<SerializedPart> parts = two_parts();
  parts[1] = {3, 1, "fusebox_reference", {}};
  const auto b = encode_plan_parts(parts);
  auto r = decode_plan_parts(b.data(), b.size(), 4, "x.plan");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)[1].engine, "fusebox_reference");
  EXPECT_TRUE((*r)[1].payload.empty());
  EXPECT_EQ((*r)[0].payload, real_payload());
  parts[1].engine = "eng2";
  expect_parse_error(encode_plan_parts(parts), 4, "is not one of fusebox's own kernels");
}

// A whole graph on fusebox's own kernel (Plan::serialize of a native plan): one part, by name.
TEST(PlanParts, OneOwnKernelPartCoversTheWholeGraph) {
  const auto b = encode_plan_parts({{0, 3, "fusebox_rmsnorm", {}}});
  auto r = decode_plan_parts(b.data(), b.size(), 3, "x.plan");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].engine, "fusebox_rmsnorm");
  expect_parse_error(b, 4, "cover 3 of 4 ops");
  expect_parse_error(encode_plan_parts({{0, 3, "eng0", {}}}), 3, "is not one of fusebox's own kernels");
}
