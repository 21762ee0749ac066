// Checks a serialized plan before the cuDNN frontend deserializes it; see
// common/plan_payload_check.h. The schema is what frontend 1.32's
// Graph::serialize() writes and Graph::deserialize() reads
// (third_party/cudnn-frontend/include/cudnn_frontend/graph_interface.h).
#include "common/plan_payload_check.h"

#include <charconv>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/device_properties_check.h"
#include "common/json_text.h"
#include "common/json_util.h"
#include "common/plan_parts.h"

namespace fusebox::common {
namespace {

using json = nlohmann::json;
using Limits = PlanPayloadLimits;

// ---------------------------------------------------------------- UBJSON structure

class UbjsonScanner {
 public:
  UbjsonScanner(const uint8_t* d, size_t n, const std::string& where) : d_(d), n_(n), where_(where) {}

  Status run() {
    if (n_ == 0) return fail("empty payload");
    struct Frame {
      bool object;
      bool want_key;
    };
    std::vector<Frame> stack;
    bool have_top = false;
    while (true) {
      if (stack.empty() && have_top) break;
      if (!stack.empty()) {
        Frame& f = stack.back();
        if (f.object && f.want_key) {
          if (pos_ >= n_) return fail("truncated: object not closed");
          if (d_[pos_] == '}') {
            ++pos_;
            stack.pop_back();
            if (!stack.empty() && stack.back().object) stack.back().want_key = true;
            continue;
          }
          int64_t len = 0;
          FUSEBOX_RETURN_IF_ERROR(length(&len, "object key"));
          pos_ += static_cast<size_t>(len);
          f.want_key = false;
          continue;
        }
        if (!f.object) {
          if (pos_ >= n_) return fail("truncated: array not closed");
          if (d_[pos_] == ']') {
            ++pos_;
            stack.pop_back();
            if (!stack.empty() && stack.back().object) stack.back().want_key = true;
            continue;
          }
        }
      }
      if (pos_ >= n_) return fail("truncated: value expected");
      const uint8_t marker = d_[pos_++];
      bool scalar = true;
      switch (marker) {
        case 'Z':
        case 'T':
        case 'F':
          break;
        case 'i':
        case 'U':
        case 'C':
          FUSEBOX_RETURN_IF_ERROR(skip(1));
          break;
        case 'I':
          FUSEBOX_RETURN_IF_ERROR(skip(2));
          break;
        case 'l':
        case 'd':
          FUSEBOX_RETURN_IF_ERROR(skip(4));
          break;
        case 'L':
        case 'D':
          FUSEBOX_RETURN_IF_ERROR(skip(8));
          break;
        case 'S': {
          int64_t len = 0;
          FUSEBOX_RETURN_IF_ERROR(length(&len, "string"));
          pos_ += static_cast<size_t>(len);
          break;
        }
        case 'H': {  // a number as decimal text (uint64 beyond int64)
          int64_t len = 0;
          const size_t at = pos_ - 1;
          FUSEBOX_RETURN_IF_ERROR(length(&len, "high-precision number"));
          if (len == 0 || len > 32)
            return fail_at(at, "high-precision number of " + std::to_string(len) + " digits");
          for (int64_t k = 0; k < len; ++k) {
            const char c = static_cast<char>(d_[pos_ + static_cast<size_t>(k)]);
            if (!(c >= '0' && c <= '9') && c != '-' && c != '+' && c != '.' && c != 'e' && c != 'E') {
              return fail_at(at, "high-precision number is not a decimal number");
            }
          }
          pos_ += static_cast<size_t>(len);
          break;
        }
        case '[':
        case '{': {
          scalar = false;
          if (static_cast<int>(stack.size()) >= Limits::kMaxDepth) {
            return fail_at(pos_ - 1,
                           "nested deeper than " + std::to_string(Limits::kMaxDepth) + " containers");
          }
          if (pos_ < n_ && (d_[pos_] == '$' || d_[pos_] == '#')) {
            return fail_at(pos_,
                           "optimized container ('$' type / '#' count): the cuDNN frontend never writes one");
          }
          stack.push_back({marker == '{', marker == '{'});
          break;
        }
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", marker);
          return fail_at(pos_ - 1, std::string("unexpected type marker ") + hex +
                                       " (accepted: Z T F i U I l L d D C S H [ ] { })");
        }
      }
      have_top = true;
      if (scalar && !stack.empty() && stack.back().object) stack.back().want_key = true;
    }
    if (pos_ != n_) return fail(std::to_string(n_ - pos_) + " trailing bytes after the value");
    return Status::Ok();
  }

 private:
  Status fail(const std::string& rule) const { return fail_at(pos_, rule); }
  Status fail_at(size_t at, const std::string& rule) const {
    return ParseError(where_ + ": plan payload (UBJSON) at byte " + std::to_string(at) + ": " + rule);
  }
  Status skip(size_t k) {
    if (n_ - pos_ < k) return fail("truncated: " + std::to_string(k) + " bytes expected");
    pos_ += k;
    return Status::Ok();
  }
  // A length (integer marker + big-endian value), then that many bytes must remain.
  Status length(int64_t* out, const char* what) {
    const size_t at = pos_;
    if (pos_ >= n_) return fail(std::string("truncated: ") + what + " length expected");
    const uint8_t m = d_[pos_++];
    size_t width = 0;
    switch (m) {
      case 'i':
      case 'U':
        width = 1;
        break;
      case 'I':
        width = 2;
        break;
      case 'l':
        width = 4;
        break;
      case 'L':
        width = 8;
        break;
      default:
        return fail_at(at, std::string(what) + " length has no integer type marker");
    }
    FUSEBOX_RETURN_IF_ERROR(skip(width));
    uint64_t u = 0;
    for (size_t k = 0; k < width; ++k) u = (u << 8) | d_[pos_ - width + k];
    int64_t v = 0;
    switch (m) {
      case 'i':
        v = static_cast<int8_t>(u);
        break;
      case 'U':
        v = static_cast<int64_t>(u);
        break;
      case 'I':
        v = static_cast<int16_t>(u);
        break;
      case 'l':
        v = static_cast<int32_t>(u);
        break;
      default:
        v = static_cast<int64_t>(u);
        break;
    }
    if (v < 0) return fail_at(at, std::string(what) + " length " + std::to_string(v) + " is negative");
    if (static_cast<uint64_t>(v) > Limits::kMaxStringBytes) {
      return fail_at(at, std::string(what) + " length " + std::to_string(v) + " exceeds the limit of " +
                             std::to_string(Limits::kMaxStringBytes) + " bytes");
    }
    if (static_cast<uint64_t>(v) > n_ - pos_) {
      return fail_at(
          at, std::string(what) + " length " + std::to_string(v) + " runs past the end of the payload");
    }
    *out = v;
    return Status::Ok();
  }

  const uint8_t* d_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& where_;
};

// ---------------------------------------------------------------- schema

// Every failure names the field path and the rule.
class Schema {
 public:
  explicit Schema(const std::string& where) : where_(where) {}
  const std::string& where() const { return where_; }

  Status bad(const std::string& field, const std::string& rule) const {
    return ParseError(where_ + ": plan payload field '" + field + "' " + rule);
  }

  Status integer(const json& v, const std::string& field, int64_t lo, int64_t hi,
                 int64_t* out = nullptr) const {
    if (!v.is_number_integer()) return bad(field, "must be an integer, is " + std::string(v.type_name()));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return bad(field, "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      return bad(field, "= " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    }
    if (out) *out = x;
    return Status::Ok();
  }

  Status string(const json& v, const std::string& field, size_t max_bytes, bool allow_null = false) const {
    if (allow_null && v.is_null()) return Status::Ok();
    if (!v.is_string()) return bad(field, "must be a string, is " + std::string(v.type_name()));
    const size_t len = v.get_ref<const std::string&>().size();
    if (len > max_bytes) {
      return bad(field, "is " + std::to_string(len) + " bytes long; at most " + std::to_string(max_bytes));
    }
    return Status::Ok();
  }

  Status boolean(const json& v, const std::string& field) const {
    return v.is_boolean() ? Status::Ok()
                          : bad(field, "must be true or false, is " + std::string(v.type_name()));
  }

  Status array(const json& v, const std::string& field, size_t max_size) const {
    if (!v.is_array()) return bad(field, "must be an array, is " + std::string(v.type_name()));
    if (v.size() > max_size) {
      return bad(field, "has " + std::to_string(v.size()) + " elements; at most " + std::to_string(max_size));
    }
    return Status::Ok();
  }

  Status object(const json& v, const std::string& field) const {
    return v.is_object() ? Status::Ok() : bad(field, "must be an object, is " + std::string(v.type_name()));
  }

  // The frontend's std::stoll(key): a decimal int64, nothing else.
  Status uid_key(const std::string& key, const std::string& field) const {
    int64_t x = 0;
    const char* end = key.data() + key.size();
    auto [p, ec] = std::from_chars(key.data(), end, x);
    if (key.empty() || ec != std::errc() || p != end) {
      return bad(field, "has key '" + key.substr(0, 40) + "', which is not a decimal tensor uid");
    }
    return Status::Ok();
  }

  // A float as the frontend writes it: 8 hex digits of its bits.
  Status hex_float(const json& v, const std::string& field, float* out = nullptr) const {
    if (!v.is_string() || v.get_ref<const std::string&>().size() != 8) {
      return bad(field, "must be a float as 8 hex digits (its bits)");
    }
    const std::string& s = v.get_ref<const std::string&>();
    uint32_t bits = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + 8, bits, 16);
    if (ec != std::errc() || p != s.data() + 8)
      return bad(field, "must be a float as 8 hex digits (its bits)");
    if (out) std::memcpy(out, &bits, sizeof bits);
    return Status::Ok();
  }

  // Tensor_attributes::pass_by_values_t as the frontend writes it: {index, value}.
  Status pass_by_value(const json& v, const std::string& field) const {
    FUSEBOX_RETURN_IF_ERROR(object(v, field));
    for (const auto& [k, _] : v.items()) {
      if (k != "index" && k != "value") return bad(field, "has unexpected key '" + k.substr(0, 40) + "'");
    }
    if (!v.contains("index") || !v.contains("value")) return bad(field, "must have 'index' and 'value'");
    int64_t index = 0;
    FUSEBOX_RETURN_IF_ERROR(integer(v["index"], field + ".index", 0, 5, &index));
    const json& x = v["value"];
    switch (index) {
      case 0:
        return integer(x, field + ".value", INT64_MIN, INT64_MAX);
      case 1:
        return integer(x, field + ".value", INT32_MIN, INT32_MAX);
      case 4:
        return x.is_number() ? Status::Ok() : bad(field + ".value", "must be a number (index 4: double)");
      default:
        return hex_float(x, field + ".value");  // half, float, bfloat16
    }
  }

  Status tensor(const json& t, const std::string& f) const {
    static const std::set<std::string> known = {"name",
                                                "data_type",
                                                "dim",
                                                "stride",
                                                "is_virtual",
                                                "pass_by_value",
                                                "is_pass_by_value",
                                                "reordering_type",
                                                "uid",
                                                "ragged_offset_uid",
                                                "ragged_offset_name",
                                                "ragged_offset_multiplier",
                                                "alignment"};
    FUSEBOX_RETURN_IF_ERROR(object(t, f));
    for (const auto& [k, _] : t.items()) {
      if (!known.count(k)) return bad(f, "has unexpected key '" + k.substr(0, 40) + "'");
    }
    for (const char* k :
         {"data_type", "dim", "stride", "is_virtual", "is_pass_by_value", "reordering_type", "uid"}) {
      if (!t.contains(k)) return bad(f + "." + k, "is missing");
    }
    if (t.contains("name"))
      FUSEBOX_RETURN_IF_ERROR(string(t["name"], f + ".name", Limits::kMaxNameBytes, true));
    FUSEBOX_RETURN_IF_ERROR(string(t["data_type"], f + ".data_type", 64, true));
    FUSEBOX_RETURN_IF_ERROR(string(t["reordering_type"], f + ".reordering_type", 64, true));
    FUSEBOX_RETURN_IF_ERROR(array(t["dim"], f + ".dim", Limits::kMaxDims));
    FUSEBOX_RETURN_IF_ERROR(array(t["stride"], f + ".stride", Limits::kMaxDims));
    if (t["dim"].size() != t["stride"].size()) {
      return bad(f + ".stride", "has " + std::to_string(t["stride"].size()) + " elements, dim has " +
                                    std::to_string(t["dim"].size()));
    }
    constexpr int64_t kMaxExtent = int64_t{1} << 48;
    for (size_t i = 0; i < t["dim"].size(); ++i) {
      FUSEBOX_RETURN_IF_ERROR(integer(t["dim"][i], f + ".dim[" + std::to_string(i) + "]", 0, kMaxExtent));
      FUSEBOX_RETURN_IF_ERROR(
          integer(t["stride"][i], f + ".stride[" + std::to_string(i) + "]", 0, kMaxExtent));
    }
    FUSEBOX_RETURN_IF_ERROR(boolean(t["is_virtual"], f + ".is_virtual"));
    FUSEBOX_RETURN_IF_ERROR(boolean(t["is_pass_by_value"], f + ".is_pass_by_value"));
    FUSEBOX_RETURN_IF_ERROR(integer(t["uid"], f + ".uid", INT64_MIN, INT64_MAX));
    if (t["is_pass_by_value"].get<bool>()) {
      // The frontend reads this key unchecked when is_pass_by_value is true.
      if (!t.contains("pass_by_value"))
        return bad(f + ".pass_by_value", "is missing (is_pass_by_value is true)");
      if (!t["pass_by_value"].is_null())
        FUSEBOX_RETURN_IF_ERROR(pass_by_value(t["pass_by_value"], f + ".pass_by_value"));
    } else if (t.contains("pass_by_value") && !t["pass_by_value"].is_null()) {
      FUSEBOX_RETURN_IF_ERROR(pass_by_value(t["pass_by_value"], f + ".pass_by_value"));
    }
    if (t.contains("ragged_offset_uid")) {
      FUSEBOX_RETURN_IF_ERROR(
          integer(t["ragged_offset_uid"], f + ".ragged_offset_uid", INT64_MIN, INT64_MAX));
    }
    if (t.contains("ragged_offset_name")) {
      FUSEBOX_RETURN_IF_ERROR(
          string(t["ragged_offset_name"], f + ".ragged_offset_name", Limits::kMaxNameBytes));
    }
    if (t.contains("ragged_offset_multiplier")) {
      FUSEBOX_RETURN_IF_ERROR(
          integer(t["ragged_offset_multiplier"], f + ".ragged_offset_multiplier", INT64_MIN, INT64_MAX));
    }
    if (t.contains("alignment"))
      FUSEBOX_RETURN_IF_ERROR(integer(t["alignment"], f + ".alignment", 0, 1 << 20));
    return Status::Ok();
  }

 private:
  const std::string& where_;
};

// cuDNN's execution-plan JSON (CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
// cuDNN 9.19: schemaVersion 4), parsed by cuDNN's own parser when the plan
// is rebuilt: bounded, valid JSON, the keys cuDNN writes with their types,
// tensors of at most CUDNN_DIM_MAX (8) dims, and a GPUProfile that passes
// the device-properties check.
Status check_backend_json(const std::string& text, const Schema& s) {
  const std::string f = "cudnn_backend_data";
  // A nested depth cuDNN's parser survives (nlohmann's text parser is iterative).
  if (!check_json_text_depth(text, Limits::kMaxDepth, f).ok()) {
    return s.bad(f, "is nested deeper than " + std::to_string(Limits::kMaxDepth) + " levels");
  }
  auto j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return s.bad(f, "is not valid JSON");
  FUSEBOX_RETURN_IF_ERROR(s.object(j, f));
  static const std::set<std::string> known = {"cudnnVersion", "schemaVersion", "operationGraph", "engine",
                                              "GPUProfile"};
  for (const auto& [k, _] : j.items()) {
    if (!known.count(k)) return s.bad(f + "." + k.substr(0, 60), "is not written by cuDNN 9.19");
  }
  for (const char* k : {"cudnnVersion", "schemaVersion", "operationGraph", "engine"}) {
    if (!j.contains(k)) return s.bad(f + "." + k, "is missing");
  }
  FUSEBOX_RETURN_IF_ERROR(s.integer(j["cudnnVersion"], f + ".cudnnVersion", 90000, 999999));
  FUSEBOX_RETURN_IF_ERROR(s.integer(j["schemaVersion"], f + ".schemaVersion", 1, 1000));

  const json& e = j["engine"];
  FUSEBOX_RETURN_IF_ERROR(s.object(e, f + ".engine"));
  if (!e.contains("engineId")) return s.bad(f + ".engine.engineId", "is missing");
  FUSEBOX_RETURN_IF_ERROR(s.integer(e["engineId"], f + ".engine.engineId", 0, 1 << 20));
  if (e.contains("smVersion"))
    FUSEBOX_RETURN_IF_ERROR(s.integer(e["smVersion"], f + ".engine.smVersion", 0, 9999));
  if (e.contains("knobChoices")) {
    const json& k = e["knobChoices"];
    FUSEBOX_RETURN_IF_ERROR(s.object(k, f + ".engine.knobChoices"));
    if (k.size() > 256) return s.bad(f + ".engine.knobChoices", "has more than 256 knobs");
    for (const auto& [name, v] : k.items()) {
      FUSEBOX_RETURN_IF_ERROR(
          s.integer(v, f + ".engine.knobChoices." + name.substr(0, 60), INT64_MIN, INT64_MAX));
    }
  }

  const json& og = j["operationGraph"];
  FUSEBOX_RETURN_IF_ERROR(s.object(og, f + ".operationGraph"));
  for (const char* k : {"tensors", "nodes"}) {
    if (!og.contains(k)) return s.bad(f + ".operationGraph." + k, "is missing");
    FUSEBOX_RETURN_IF_ERROR(s.array(og[k], f + ".operationGraph." + k, Limits::kMaxTensors));
  }
  const json& ts = og["tensors"];
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string tf = f + ".operationGraph.tensors[" + std::to_string(i) + "]";
    FUSEBOX_RETURN_IF_ERROR(s.object(ts[i], tf));
    for (const char* k : {"dim", "stride"}) {
      if (!ts[i].contains(k)) return s.bad(tf + "." + k, "is missing");
      const json& a = ts[i][k];
      FUSEBOX_RETURN_IF_ERROR(s.array(a, tf + "." + k, 8));  // CUDNN_DIM_MAX
      for (size_t d = 0; d < a.size(); ++d) {
        FUSEBOX_RETURN_IF_ERROR(
            s.integer(a[d], tf + "." + k + "[" + std::to_string(d) + "]", 0, int64_t{1} << 48));
      }
    }
    if (ts[i]["dim"].size() != ts[i]["stride"].size())
      return s.bad(tf + ".stride", "has a different rank from dim");
  }
  for (size_t i = 0; i < og["nodes"].size(); ++i) {
    FUSEBOX_RETURN_IF_ERROR(s.object(og["nodes"][i], f + ".operationGraph.nodes[" + std::to_string(i) + "]"));
  }

  if (j.contains("GPUProfile")) {
    FUSEBOX_RETURN_IF_ERROR(s.object(j["GPUProfile"], f + ".GPUProfile"));
    if (Status d = check_device_properties(json_dump(j["GPUProfile"]), f + ".GPUProfile"); !d.ok()) {
      return ParseError(s.where() + ": plan payload " + d.message());
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_json_text_depth(std::string_view text, int max_depth, const std::string& where) {
  const JsonTextLimit hit = scan_json_text(text, max_depth, static_cast<size_t>(-1), /*refuse_nul=*/false);
  if (hit.kind == JsonTextLimit::Kind::kDepth) {
    return ParseError(where + ": JSON nested deeper than " + std::to_string(max_depth) + " levels (at byte " +
                      std::to_string(hit.byte) + ")");
  }
  return Status::Ok();
}

Status check_ubjson_structure(const uint8_t* data, size_t n, const std::string& where) {
  return UbjsonScanner(data, n, where).run();
}

Status check_plan_payload(const uint8_t* data, size_t n, const std::string& where) {
  if (is_plan_parts(data, n)) {  // a partitioned plan: its container, then every part's payload
    auto parts = decode_plan_parts(data, n, -1, where);
    return parts.ok() ? Status::Ok() : parts.status();
  }
  FUSEBOX_RETURN_IF_ERROR(check_ubjson_structure(data, n, where));
  json j;
  try {
    j = json::from_ubjson(data, data + n);  // bounded by the scan above
  } catch (const std::exception& e) {
    return ParseError(where + ": plan payload is not valid UBJSON: " + e.what());
  }
  Schema s(where);
  try {
    FUSEBOX_RETURN_IF_ERROR(s.object(j, "(top level)"));
    static const std::set<std::string> known = {"json_version",
                                                "gid",
                                                "context",
                                                "cudnn_backend_version",
                                                "cudnn_frontend_version",
                                                "nodes",
                                                "tensors",
                                                "cudnn_backend_data",
                                                "variant_pack_uids",
                                                "behavior_notes",
                                                "pass_by_values",
                                                "workspace_modifications",
                                                "aligned_operands",
                                                "variant_pack_replacements",
                                                "fe_workspace_size",
                                                "tensors_to_dump"};
    for (const auto& [k, _] : j.items()) {
      if (!known.count(k)) return s.bad(k.substr(0, 60), "is not written by the cuDNN frontend 1.32");
    }
    // Keys Graph::deserialize() reads without checking that they exist.
    for (const char* k : {"json_version", "cudnn_backend_data", "behavior_notes", "variant_pack_uids",
                          "variant_pack_replacements", "fe_workspace_size"}) {
      if (!j.contains(k)) return s.bad(k, "is missing");
    }
    if (!j["json_version"].is_string() || j["json_version"].get<std::string>() != "2.0") {
      return s.bad("json_version", "must be \"2.0\" (the cuDNN frontend 1.32 graph format)");
    }
    if (j.contains("nodes") || j.contains("tensors")) {
      if (!j.contains("gid")) return s.bad("gid", "is missing (the payload has a graph structure)");
      if (!j["gid"].is_number_integer()) return s.bad("gid", "must be an integer");
      if (!j.contains("tensors")) return s.bad("tensors", "is missing (the payload has 'nodes')");
    }
    if (j.contains("context")) FUSEBOX_RETURN_IF_ERROR(s.object(j["context"], "context"));
    if (j.contains("nodes")) FUSEBOX_RETURN_IF_ERROR(s.array(j["nodes"], "nodes", Limits::kMaxTensors));
    for (const char* k : {"cudnn_backend_version", "cudnn_frontend_version"}) {
      if (j.contains(k) && !j[k].is_number_integer()) FUSEBOX_RETURN_IF_ERROR(s.string(j[k], k, 64));
    }
    if (j.contains("tensors")) {
      const json& ts = j["tensors"];
      FUSEBOX_RETURN_IF_ERROR(s.array(ts, "tensors", Limits::kMaxTensors));
      for (size_t i = 0; i < ts.size(); ++i) {
        FUSEBOX_RETURN_IF_ERROR(s.tensor(ts[i], "tensors[" + std::to_string(i) + "]"));
      }
    }
    FUSEBOX_RETURN_IF_ERROR(s.string(j["cudnn_backend_data"], "cudnn_backend_data", Limits::kMaxStringBytes));
    FUSEBOX_RETURN_IF_ERROR(check_backend_json(j["cudnn_backend_data"].get<std::string>(), s));

    const json& notes = j["behavior_notes"];
    FUSEBOX_RETURN_IF_ERROR(s.array(notes, "behavior_notes", 1));
    for (size_t i = 0; i < notes.size(); ++i) {
      const std::string f = "behavior_notes[" + std::to_string(i) + "]";
      FUSEBOX_RETURN_IF_ERROR(s.array(notes[i], f, 64));
      for (size_t k = 0; k < notes[i].size(); ++k) {
        FUSEBOX_RETURN_IF_ERROR(s.string(notes[i][k], f + "[" + std::to_string(k) + "]", 64, true));
      }
    }

    const json& vp = j["variant_pack_uids"];
    FUSEBOX_RETURN_IF_ERROR(s.array(vp, "variant_pack_uids", Limits::kMaxTensors));
    for (size_t i = 0; i < vp.size(); ++i) {
      FUSEBOX_RETURN_IF_ERROR(
          s.integer(vp[i], "variant_pack_uids[" + std::to_string(i) + "]", INT64_MIN, INT64_MAX));
    }

    int64_t fe_ws = 0;
    FUSEBOX_RETURN_IF_ERROR(
        s.integer(j["fe_workspace_size"], "fe_workspace_size", 0, Limits::kMaxWorkspaceBytes, &fe_ws));

    // Offsets into the variant pack's device pointers (frontend Slice before
    // cuDNN 9.22); fusebox's ops make none, and a hostile one points anywhere.
    const json& rep = j["variant_pack_replacements"];
    if (!rep.is_null() && !(rep.is_array() && rep.empty()) && !(rep.is_object() && rep.empty())) {
      return s.bad("variant_pack_replacements",
                   "must be empty: no fusebox op makes device-pointer replacements");
    }

    if (j.contains("pass_by_values")) {
      const json& p = j["pass_by_values"];
      FUSEBOX_RETURN_IF_ERROR(s.object(p, "pass_by_values"));
      if (p.size() > Limits::kMaxTensors) return s.bad("pass_by_values", "has too many entries");
      for (const auto& [k, v] : p.items()) {
        FUSEBOX_RETURN_IF_ERROR(s.uid_key(k, "pass_by_values"));
        FUSEBOX_RETURN_IF_ERROR(s.pass_by_value(v, "pass_by_values." + k));
      }
    }

    // Executed as cudaMemcpy / cudaMemset into the workspace: inside fe_workspace_size.
    if (j.contains("workspace_modifications")) {
      const json& w = j["workspace_modifications"];
      FUSEBOX_RETURN_IF_ERROR(s.object(w, "workspace_modifications"));
      if (w.size() > Limits::kMaxTensors) return s.bad("workspace_modifications", "has too many entries");
      for (const auto& [k, v] : w.items()) {
        const std::string f = "workspace_modifications." + k;
        FUSEBOX_RETURN_IF_ERROR(s.uid_key(k, "workspace_modifications"));
        FUSEBOX_RETURN_IF_ERROR(s.array(v, f, 3));
        if (v.size() != 3) return s.bad(f, "must be [operation, offset, values]");
        int64_t op = 0, offset = 0;
        // 0: host-to-device copy, 1: memset, 2: space the engine only reserves (SDPA backward's
        // dQ accumulator and softmax sum; the frontend executes nothing for it).
        FUSEBOX_RETURN_IF_ERROR(s.integer(v[0], f + "[0] (operation)", 0, 2, &op));
        FUSEBOX_RETURN_IF_ERROR(s.integer(v[1], f + "[1] (offset)", 0, fe_ws, &offset));
        FUSEBOX_RETURN_IF_ERROR(s.array(v[2], f + "[2] (values)", static_cast<size_t>(fe_ws / 4) + 1));
        std::vector<float> values(v[2].size());
        for (size_t i = 0; i < v[2].size(); ++i) {
          FUSEBOX_RETURN_IF_ERROR(s.hex_float(v[2][i], f + "[2][" + std::to_string(i) + "]", &values[i]));
        }
        int64_t bytes = 0;
        if (op == 2) {
          if (!values.empty()) return s.bad(f + "[2]", "must be empty (operation 2 writes nothing)");
        } else if (op == 0) {
          bytes = static_cast<int64_t>(values.size()) * 4;
        } else {
          if (values.empty()) return s.bad(f + "[2]", "must hold the memset size (operation 1)");
          const float sz = values[0];
          if (!(sz >= 0) || sz > static_cast<float>(fe_ws)) {
            return s.bad(f + "[2][0]",
                         "(memset size) must be within fe_workspace_size = " + std::to_string(fe_ws));
          }
          bytes = static_cast<int64_t>(sz);
        }
        if (offset + bytes > fe_ws) {
          return s.bad(f, "writes bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                              ") outside the frontend workspace of " + std::to_string(fe_ws) + " bytes");
        }
      }
    }

    if (j.contains("aligned_operands")) {
      const json& a = j["aligned_operands"];
      FUSEBOX_RETURN_IF_ERROR(s.object(a, "aligned_operands"));
      if (a.size() > Limits::kMaxTensors) return s.bad("aligned_operands", "has too many entries");
      for (const auto& [k, v] : a.items()) {
        const std::string f = "aligned_operands." + k;
        FUSEBOX_RETURN_IF_ERROR(s.uid_key(k, "aligned_operands"));
        FUSEBOX_RETURN_IF_ERROR(s.array(v, f, 2));
        if (v.size() != 2) return s.bad(f, "must be [alignment, bytes]");
        FUSEBOX_RETURN_IF_ERROR(s.integer(v[0], f + "[0] (alignment)", 0, 1 << 20));
        FUSEBOX_RETURN_IF_ERROR(s.integer(v[1], f + "[1] (bytes)", 0, INT64_MAX));
      }
    }

    if (j.contains("tensors_to_dump")) {
      const json& d = j["tensors_to_dump"];
      FUSEBOX_RETURN_IF_ERROR(s.array(d, "tensors_to_dump", Limits::kMaxTensors));
      for (size_t i = 0; i < d.size(); ++i) {
        const std::string f = "tensors_to_dump[" + std::to_string(i) + "]";
        FUSEBOX_RETURN_IF_ERROR(s.array(d[i], f, 2));
        if (d[i].size() != 2) return s.bad(f, "must be [uid, format]");
        FUSEBOX_RETURN_IF_ERROR(s.integer(d[i][0], f + "[0] (uid)", INT64_MIN, INT64_MAX));
        FUSEBOX_RETURN_IF_ERROR(s.integer(d[i][1], f + "[1] (format)", -128, 255));
      }
    }
  } catch (const std::exception& e) {
    // Defensive: every access above is type-checked first.
    return ParseError(where + ": plan payload: " + e.what());
  }
  return Status::Ok();
}

}  // namespace fusebox::common
