// Device-properties files: see common/device_properties_check.h. The keys are
// those cuDNN 9.19 writes (devices/h200-cudnn-9.19.devprop), and the three that
// cuDNN 9.27 adds and requires (optional_integer_fields).
#include "common/device_properties_check.h"

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>

#include "common/json_util.h"

namespace fusebox::common {
namespace {

struct Range {
  int64_t lo, hi;
};

constexpr int64_t kInt32Max = INT32_MAX;

// Generous: several times any GPU made so far, but no zero where cuDNN divides.
const std::map<std::string, Range>& integer_fields() {
  static const std::map<std::string, Range> f = {
      {"regsPerBlock", {1, 1 << 24}},
      {"multiProcessorCount", {1, 4096}},
      {"warpSize", {1, 1024}},
      {"maxSharedMemoryPerBlock", {1, 1 << 26}},
      {"maxSharedMemoryPerBlockOptin", {1, 1 << 26}},
      {"reservedSharedMemoryPerBlock", {0, 1 << 26}},
      {"maxRegistersPerSM", {1, 1 << 24}},
      {"maxCtasPerSM", {1, 1 << 16}},
      {"maxThreadsPerBlock", {1, 1 << 16}},
      {"maxThreadsPerSM", {1, 1 << 20}},
      {"pciDeviceId", {0, kInt32Max}},
      {"isTccDriver", {0, 1}},
      {"supportCoopLaunch", {0, 1}},
      {"totalGlobalMem", {1, int64_t{1} << 50}},
      {"smClockRateKHz", {1, 100'000'000}},
      {"memClockRateKHz", {1, 100'000'000}},
      {"l2CacheSize", {0, int64_t{1} << 36}},
      {"cudaDeviceId", {0, 1023}},
      {"deviceVer", {500, 9999}},  // SM major*100 + minor*10
      {"driverVer", {1000, 999'999}},
  };
  return f;
}

// Keys newer cuDNN releases write, and need, that 9.19 neither writes nor
// reads: present in a file captured under cuDNN 9.27 (read from the names
// libcudnn_graph.so.9.27 looks up), absent from one captured under 9.19.
const std::map<std::string, Range>& optional_integer_fields() {
  static const std::map<std::string, Range> f = {
      // CUDNN_SM_COUNT_ORIGIN_FULL_DEVICE (0) or _GREEN_CONTEXT (1)
      {"smCountOrigin", {0, 1}},
      {"oversizedSharedMemoryPerBlock", {0, 1 << 26}},
      {"memoryBusWidth", {1, 1 << 16}},
  };
  return f;
}

const std::map<std::string, Range>& vector_fields() {
  static const std::map<std::string, Range> f = {{"maxGridSize", {1, kInt32Max}},
                                                 {"maxBlockSize", {1, 1 << 16}}};
  return f;
}

// cudaDeviceProp::name is char[256] with its NUL: cuDNN 9.19 corrupts its heap
// (ASan: bad-free in cudnnBackendDestroyDescriptor) on a 256-byte name.
// Found by fuzz/device_properties_fuzzer.cpp; fuzz/regressions/device_properties/.
constexpr size_t kMaxNameBytes = 255;

}  // namespace

Status check_device_properties(std::string_view text, const std::string& origin, std::string* canonical) {
  auto bad = [&](const std::string& field, const std::string& rule) {
    return ParseError(origin + ": device-properties field '" + field + "' " + rule);
  };
  // The object is flat: anything nested deeper is not a device file, and a
  // bound here keeps nlohmann's recursive destructor and dump() safe.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > 2)
        return ParseError(origin + ": not a cuDNN device-properties file (nested deeper than 2 levels)");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // e.g. a number literal beyond a double (out_of_range), a truncated file
    return ParseError(origin + ": not a cuDNN device-properties file: invalid JSON: " + e.what());
  }
  if (!j.is_object()) {
    return ParseError(origin +
                      ": not a cuDNN device-properties file (expected a JSON object as written by "
                      "`fusebox devprop`)");
  }
  // The two keys fusebox itself reads first: a graph file given as --device says so.
  for (const char* k : {"deviceVer", "multiProcessorCount"}) {
    if (!j.contains(k)) return bad(k, "is missing");
  }
  const auto& ints = integer_fields();
  const auto& vecs = vector_fields();
  const auto& optional = optional_integer_fields();
  for (const auto& [k, _] : j.items()) {
    if (!ints.count(k) && !vecs.count(k) && !optional.count(k) && k != "deviceName") {
      return bad(json_dump(nlohmann::json(k)).substr(0, 60),
                 "is not one cuDNN 9.19 to 9.27 writes (capture the file again with `fusebox devprop`)");
    }
  }
  auto check_int = [&](const nlohmann::json& v, const std::string& field, Range r) -> Status {
    if (!v.is_number_integer()) return bad(field, "must be an integer, is " + std::string(v.type_name()));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return bad(field, "is out of range [" + std::to_string(r.lo) + ", " + std::to_string(r.hi) + "]");
    }
    const int64_t x = v.get<int64_t>();
    if (x < r.lo || x > r.hi) {
      return bad(field, "= " + std::to_string(x) + " is out of range [" + std::to_string(r.lo) + ", " +
                            std::to_string(r.hi) + "]");
    }
    return Status::Ok();
  };
  for (const auto& [k, r] : ints) {
    if (!j.contains(k)) return bad(k, "is missing");
    FUSEBOX_RETURN_IF_ERROR(check_int(j[k], k, r));
  }
  for (const auto& [k, r] : optional) {
    if (j.contains(k)) FUSEBOX_RETURN_IF_ERROR(check_int(j[k], k, r));
  }
  for (const auto& [k, r] : vecs) {
    if (!j.contains(k)) return bad(k, "is missing");
    const auto& v = j[k];
    if (!v.is_array() || v.size() != 3) return bad(k, "must be an array of 3 integers (x, y, z)");
    for (size_t i = 0; i < 3; ++i)
      FUSEBOX_RETURN_IF_ERROR(check_int(v[i], k + "[" + std::to_string(i) + "]", r));
  }
  if (!j.contains("deviceName")) return bad("deviceName", "is missing");
  const auto& name = j["deviceName"];
  if (!name.is_string()) return bad("deviceName", "must be a string");
  const std::string& s = name.get_ref<const std::string&>();
  if (s.empty() || s.size() > kMaxNameBytes) {
    return bad("deviceName", "must be 1 to " + std::to_string(kMaxNameBytes) + " bytes long, is " +
                                 std::to_string(s.size()));
  }
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return bad("deviceName", "contains a control character");
  }
  if (canonical) *canonical = json_dump(j);
  return Status::Ok();
}

std::vector<std::string> device_properties_missing_newer_keys(std::string_view canonical) {
  std::vector<std::string> missing;
  const nlohmann::json j = nlohmann::json::parse(canonical, nullptr, /*allow_exceptions=*/false);
  for (const auto& [k, _] : optional_integer_fields()) {
    if (!j.is_object() || !j.contains(k)) missing.push_back(k);
  }
  return missing;
}

}  // namespace fusebox::common
