// common/plan_payload_check.h and common/device_properties_check.h: the real
// files pass; each hostile variant is a ParseError naming the file, the field
// and the rule. The real plan payload is the fuzz seed made with
// `fusebox build examples/graphs/conv_bias_relu.json --device
// devices/h200-cudnn-9.27.devprop --plan-out` (cuDNN 9.19, frontend 1.32).
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/device_properties_check.h"
#include "common/plan_payload_check.h"

using namespace fusebox;
using common::check_device_properties;
using common::check_plan_payload;
using nlohmann::json;

namespace {

std::string read_bytes(const std::string& rel) {
  std::ifstream in(std::string(FUSEBOX_SOURCE_DIR) + "/" + rel, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<uint8_t> real_payload() {
  const std::string f = read_bytes("fuzz/corpus/plan_file/conv_bias_relu_file").substr(1);  // mode byte
  const std::string p = f.substr(f.find('\n') + 1);
  return std::vector<uint8_t>(p.begin(), p.end());
}

json real_json() { return json::from_ubjson(real_payload()); }

Status check(const std::vector<uint8_t>& b) { return check_plan_payload(b.data(), b.size(), "x.plan"); }
Status check(const json& j) { return check(json::to_ubjson(j)); }

void expect_error(const Status& st, const std::string& needle) {
  ASSERT_FALSE(st.ok()) << "accepted; expected: " << needle;
  EXPECT_EQ(st.code(), StatusCode::kParseError) << st.ToString();
  EXPECT_EQ(st.message().rfind("x.plan: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
}

// Edits the cuDNN execution-plan JSON inside the payload.
json with_backend(const std::function<void(json&)>& edit) {
  json j = real_json();
  json b = json::parse(j["cudnn_backend_data"].get<std::string>());
  edit(b);
  j["cudnn_backend_data"] = b.dump();
  return j;
}

}  // namespace

TEST(PlanPayloadCheck, RealPayloadPasses) {
  const auto b = real_payload();
  ASSERT_GT(b.size(), 1000u);
  EXPECT_TRUE(check(b).ok()) << check(b).ToString();
}

TEST(PlanPayloadCheck, UbjsonStructure) {
  auto b = real_payload();
  expect_error(check(std::vector<uint8_t>{}), "empty payload");
  expect_error(check(std::vector<uint8_t>(b.begin(), b.end() - 1)), "truncated");
  auto trailing = b;
  trailing.push_back('Z');
  expect_error(check(trailing), "1 trailing bytes after the value");
  // 12 bytes nlohmann would expand into 2^40 nulls.
  const std::vector<uint8_t> bomb = {'[', '$', 'Z', '#', 'L', 0, 0, 1, 0, 0, 0, 0, 0};
  expect_error(check(bomb), "optimized container");
  std::vector<uint8_t> deep(100000, '[');
  expect_error(check(deep), "nested deeper than 32 containers");
  // A string whose length runs past the end, a negative length, an unknown marker.
  expect_error(check(std::vector<uint8_t>{'S', 'l', 0, 0, 1, 0, 'a'}),
               "string length 256 runs past the end of the payload");
  expect_error(check(std::vector<uint8_t>{'S', 'l', 0x7f, 0, 0, 0, 'a'}),
               "exceeds the limit of 67108864 bytes");
  expect_error(check(std::vector<uint8_t>{'S', 'i', 0xff}), "is negative");
  expect_error(check(std::vector<uint8_t>{'{', 'i', 1, 'a', 'q', '}'}), "unexpected type marker 0x71");
  expect_error(check(std::vector<uint8_t>{'N'}), "unexpected type marker 0x4e");
  // A top-level value that is not an object.
  expect_error(check(std::vector<uint8_t>{'Z'}), "'(top level)' must be an object");
}

TEST(PlanPayloadCheck, KeysTheFrontendReadsUnchecked) {
  for (const char* k : {"json_version", "cudnn_backend_data", "behavior_notes", "variant_pack_uids",
                        "variant_pack_replacements", "fe_workspace_size"}) {
    json j = real_json();
    j.erase(k);
    expect_error(check(j), std::string("field '") + k + "' is missing");
  }
  json j = real_json();
  j.erase("gid");
  expect_error(check(j), "'gid' is missing");
  j = real_json();
  j["surprise"] = 1;
  expect_error(check(j), "'surprise' is not written by the cuDNN frontend 1.32");
  j = real_json();
  j["json_version"] = "1.0";
  expect_error(check(j), "'json_version' must be \"2.0\"");
  j = real_json();
  j["fe_workspace_size"] = "0";
  expect_error(check(j), "'fe_workspace_size' must be an integer");
}

TEST(PlanPayloadCheck, Tensors) {
  json j = real_json();
  j["tensors"][0]["is_pass_by_value"] = true;
  j["tensors"][0].erase("pass_by_value");
  expect_error(check(j), "'tensors[0].pass_by_value' is missing (is_pass_by_value is true)");
  j = real_json();
  j["tensors"][1]["dim"] = json::array({1, 2});
  expect_error(check(j), "'tensors[1].stride' has 4 elements, dim has 2");
  j = real_json();
  j["tensors"][1]["dim"][0] = -1;
  expect_error(check(j), "'tensors[1].dim[0]' = -1 is out of range");
  j = real_json();
  j["tensors"][2]["name"] = std::string(5000, 'n');
  expect_error(check(j), "'tensors[2].name' is 5000 bytes long; at most 4096");
  j = real_json();
  j["tensors"][0]["pass_by_value"] = {{"index", 9}, {"value", 1}};
  expect_error(check(j), "'tensors[0].pass_by_value.index' = 9 is out of range [0, 5]");
}

TEST(PlanPayloadCheck, DevicePointerArithmeticIsRefused) {
  json j = real_json();
  j["variant_pack_replacements"] = json::array({json::array({1, json::array({2, 1 << 30})})});
  expect_error(check(j), "'variant_pack_replacements' must be empty");
  j = real_json();
  j["fe_workspace_size"] = 64;
  j["workspace_modifications"] = {{"7", json::array({0, 60, json::array({"3F800000", "3F800000"})})}};
  expect_error(check(j), "writes bytes [60, 68) outside the frontend workspace of 64 bytes");
  j["workspace_modifications"] = {{"7", json::array({1, 0, json::array()})}};
  expect_error(check(j), "must hold the memset size");
  j["workspace_modifications"] = {{"7", json::array({1, 0, json::array({"4F000000"})})}};  // 2^31 bytes
  expect_error(check(j), "(memset size) must be within fe_workspace_size = 64");
  j["workspace_modifications"] = {{"7", json::array({0, 0, json::array({"3F800000", "3F800000"})})}};
  EXPECT_TRUE(check(j).ok()) << check(j).ToString();
  j["workspace_modifications"] = {{"7x", json::array({0, 0, json::array()})}};
  expect_error(check(j), "has key '7x', which is not a decimal tensor uid");
  // Operation 2 only reserves space (what SDPA backward writes on the H200): no values.
  j["workspace_modifications"] = {{"7", json::array({2, 32, json::array()})}};
  EXPECT_TRUE(check(j).ok()) << check(j).ToString();
  j["workspace_modifications"] = {{"7", json::array({2, 65, json::array()})}};
  expect_error(check(j), "[1] (offset)' = 65 is out of range [0, 64]");
  j["workspace_modifications"] = {{"7", json::array({2, 0, json::array({"3F800000"})})}};
  expect_error(check(j), "must be empty (operation 2 writes nothing)");
  j["workspace_modifications"] = {{"7", json::array({3, 0, json::array()})}};
  expect_error(check(j), "[0] (operation)' = 3 is out of range [0, 2]");
}

TEST(PlanPayloadCheck, CudnnExecutionPlanJson) {
  json j = real_json();
  j["cudnn_backend_data"] = "{\"cudnnVersion\": ";
  expect_error(check(j), "'cudnn_backend_data' is not valid JSON");
  j["cudnn_backend_data"] = std::string(40, '[') + std::string(40, ']');
  expect_error(check(j), "'cudnn_backend_data' is nested deeper than 32 levels");
  expect_error(check(with_backend([](json& b) { b.erase("engine"); })),
               "'cudnn_backend_data.engine' is missing");
  expect_error(check(with_backend([](json& b) { b["extra"] = 1; })),
               "'cudnn_backend_data.extra' is not written");
  expect_error(check(with_backend([](json& b) {
                 b["operationGraph"]["tensors"][0]["dim"] = json::array({1, 2, 3, 4, 5, 6, 7, 8, 9});
               })),
               "'cudnn_backend_data.operationGraph.tensors[0].dim' has 9 elements; at most 8");
  expect_error(check(with_backend([](json& b) { b["GPUProfile"]["warpSize"] = 0; })),
               "cudnn_backend_data.GPUProfile: device-properties field 'warpSize' = 0 is out of range");
  expect_error(check(with_backend([](json& b) { b["engine"]["engineId"] = -3; })),
               "'cudnn_backend_data.engine.engineId' = -3 is out of range");
}

TEST(DevicePropertiesCheck, RealFilePassesAndRewritesToAFixedPoint) {
  const std::string text = read_bytes("devices/h200-cudnn-9.27.devprop");
  std::string canonical, again;
  ASSERT_TRUE(check_device_properties(text, "h200.devprop", &canonical).ok());
  ASSERT_TRUE(check_device_properties(canonical, "c", &again).ok());
  EXPECT_EQ(canonical, again);
  EXPECT_EQ(json::parse(canonical), json::parse(text));
}

TEST(DevicePropertiesCheck, HostileVariants) {
  const json real = json::parse(read_bytes("devices/h200-cudnn-9.27.devprop"));
  auto expect = [](const std::string& text, const std::string& needle) {
    const Status st = check_device_properties(text, "d.devprop");
    ASSERT_FALSE(st.ok()) << "accepted; expected: " << needle;
    EXPECT_EQ(st.code(), StatusCode::kParseError);
    EXPECT_EQ(st.message().rfind("d.devprop: ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  auto edited = [&](const std::function<void(json&)>& f) {
    json j = real;
    f(j);
    return j.dump();
  };
  expect(edited([](json& j) { j.erase("multiProcessorCount"); }), "'multiProcessorCount' is missing");
  expect(edited([](json& j) { j["warpSize"] = 0; }), "'warpSize' = 0 is out of range [1, 1024]");
  expect(edited([](json& j) { j["totalGlobalMem"] = -1; }), "'totalGlobalMem' = -1 is out of range");
  expect(edited([](json& j) { j["deviceVer"] = 9.0; }), "'deviceVer' must be an integer, is number");
  expect(edited([](json& j) {
           j["maxGridSize"] = json::array({1, 2});
         }),
         "'maxGridSize' must be an array of 3");
  expect(edited([](json& j) { j["maxBlockSize"][2] = 0; }), "'maxBlockSize[2]' = 0 is out of range");
  expect(edited([](json& j) { j["deviceName"] = std::string(300, 'n'); }),
         "'deviceName' must be 1 to 255 bytes");
  // 256 bytes corrupted cuDNN's heap (fuzz/regressions/device_properties/); 255 is cudaDeviceProp's most.
  expect(edited([](json& j) { j["deviceName"] = std::string(256, 'n'); }), "long, is 256");
  EXPECT_TRUE(
      check_device_properties(edited([](json& j) { j["deviceName"] = std::string(255, 'n'); }), "d").ok());
  expect(edited([](json& j) { j["deviceName"] = "H200\x1b[2J"; }),
         "'deviceName' contains a control character");
  expect(edited([](json& j) { j["newField"] = 1; }), "'\"newField\"' is not one cuDNN 9.19 to 9.27 writes");
  expect(edited([](json& j) {
           j["maxGridSize"] = json::array({"1", 2, 3});
         }),
         "'maxGridSize[0]' must be an integer, is string");
  expect("[1, 2]", "expected a JSON object");
  expect("{\"warpSize\": 1e999}", "invalid JSON");
  expect(std::string(5000, '[') + std::string(5000, ']'), "nested deeper than 2 levels");
  expect("", "invalid JSON");
  // A duplicate key: cuDNN is given fusebox's rewrite, with the value fusebox checked.
  std::string dup = real.dump();
  dup.insert(1, "\"warpSize\": 0, ");
  std::string canonical;
  ASSERT_TRUE(check_device_properties(dup, "d.devprop", &canonical).ok());
  EXPECT_EQ(json::parse(canonical)["warpSize"], 32);
  EXPECT_EQ(canonical.find("\"warpSize\":0"), std::string::npos);
}
