#include "common/plan_parts.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/plan_payload_check.h"

namespace fusebox::common {
namespace {

constexpr size_t kMaxHeaderBytes = 64 * 1024;

}  // namespace

bool is_plan_parts(const uint8_t* data, size_t n) {
  const size_t m = sizeof(kPlanPartsMagic) - 1;
  return n >= m && std::memcmp(data, kPlanPartsMagic, m) == 0;
}

std::vector<uint8_t> encode_plan_parts(const std::vector<SerializedPart>& parts,
                                       const TemporaryDtypes& temporaries) {
  nlohmann::json h = {{"parts", nlohmann::json::array()}, {"temporaries", nlohmann::json::array()}};
  for (const auto& [tensor, dtype] : temporaries)
    h["temporaries"].push_back({{"tensor", tensor}, {"dtype", dtype}});
  for (const auto& p : parts) {
    h["parts"].push_back({{"first_op", p.first_op},
                          {"op_count", p.op_count},
                          {"engine", p.engine},
                          {"bytes", static_cast<int64_t>(p.payload.size())}});
  }
  const std::string header = h.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace) + "\n";
  std::vector<uint8_t> out(kPlanPartsMagic, kPlanPartsMagic + sizeof(kPlanPartsMagic) - 1);
  out.insert(out.end(), header.begin(), header.end());
  for (const auto& p : parts) out.insert(out.end(), p.payload.begin(), p.payload.end());
  return out;
}

Result<std::vector<SerializedPart>> decode_plan_parts(const uint8_t* data, size_t n, int op_count,
                                                      const std::string& where,
                                                      TemporaryDtypes* temporaries) {
  auto bad = [&](const std::string& why) { return ParseError(where + ": partitioned plan: " + why); };
  if (!is_plan_parts(data, n)) return bad("no partitioned-plan magic");
  const size_t start = sizeof(kPlanPartsMagic) - 1;
  const uint8_t* nl =
      static_cast<const uint8_t*>(std::memchr(data + start, '\n', std::min(n - start, kMaxHeaderBytes)));
  if (!nl) return bad("header line missing or over " + std::to_string(kMaxHeaderBytes) + " bytes");
  const std::string_view header(reinterpret_cast<const char*>(data + start),
                                static_cast<size_t>(nl - (data + start)));
  FUSEBOX_RETURN_IF_ERROR(check_json_text_depth(header, 4, where));
  auto h = nlohmann::json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object() || !h.contains("parts") || !h["parts"].is_array()) {
    return bad("header is not {\"parts\": [...]}");
  }
  if (h.contains("temporaries")) {
    const auto& tl = h["temporaries"];
    if (!tl.is_array() || tl.size() > 4096) return bad("temporaries is not a list of at most 4096");
    for (const auto& t : tl) {
      if (!t.is_object() || !t.contains("tensor") || !t["tensor"].is_number_integer() ||
          !t.contains("dtype") || !t["dtype"].is_string() || t["tensor"].get<int64_t>() < 0 ||
          t["tensor"].get<int64_t>() > (1 << 20) || t["dtype"].get<std::string>().size() > 16) {
        return bad("a temporary is not {\"tensor\": index, \"dtype\": name}");
      }
      if (temporaries)
        temporaries->push_back({static_cast<int>(t["tensor"].get<int64_t>()), t["dtype"].get<std::string>()});
    }
  }
  const auto& list = h["parts"];
  const bool coverage_known = op_count >= 0;  // -1: the graph is not known here (file and cache readers)
  if (!coverage_known) op_count = 1 << 20;
  // One part: fusebox's own kernel over the whole graph, by name (Plan::serialize of a native plan).
  if (list.empty() || list.size() > kMaxPlanParts) {
    return bad(std::to_string(list.size()) + " parts (1 to " + std::to_string(kMaxPlanParts) + " accepted)");
  }
  std::vector<SerializedPart> out;
  size_t offset = static_cast<size_t>(nl - data) + 1;
  int next_op = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& p = list[i];
    auto int_at = [&](const char* key, int64_t lo, int64_t hi, int64_t* v) -> bool {
      if (!p.is_object() || !p.contains(key) || !p[key].is_number_integer()) return false;
      *v = p[key].get<int64_t>();
      return *v >= lo && *v <= hi;
    };
    int64_t first = 0, count = 0, bytes = 0;
    if (!int_at("first_op", 0, op_count, &first) || !int_at("op_count", 1, op_count, &count) ||
        !int_at("bytes", 0, static_cast<int64_t>(n), &bytes) || !p.contains("engine") ||
        !p["engine"].is_string()) {
      return bad("part " + std::to_string(i) +
                 ": first_op, op_count, bytes or engine missing or out of range");
    }
    if (first != next_op || first + count > op_count) {
      return bad("part " + std::to_string(i) + " covers ops " + std::to_string(first) + "-" +
                 std::to_string(first + count - 1) + ", expected to start at op " + std::to_string(next_op) +
                 " of " + std::to_string(op_count));
    }
    if (static_cast<size_t>(bytes) > n - offset)
      return bad("part " + std::to_string(i) + " runs past the end");
    SerializedPart s;
    s.first_op = static_cast<int>(first);
    s.op_count = static_cast<int>(count);
    s.engine = p["engine"].get<std::string>().substr(0, 256);
    s.payload.assign(data + offset, data + offset + bytes);
    if (is_plan_parts(s.payload.data(), s.payload.size())) return bad("a part is itself partitioned");
    if (s.payload.empty()) {
      // A part fusebox runs with its own kernel: no cuDNN plan, rebuilt by name.
      if (s.engine.rfind(kOwnKernelPrefix, 0) != 0)
        return bad("part " + std::to_string(i) + " has no plan bytes but engine '" + s.engine +
                   "' is not one of fusebox's own kernels (" + kOwnKernelPrefix + "*)");
    } else {
      FUSEBOX_RETURN_IF_ERROR(
          check_plan_payload(s.payload.data(), s.payload.size(), where + " part " + std::to_string(i)));
    }
    offset += static_cast<size_t>(bytes);
    next_op = static_cast<int>(first + count);
    out.push_back(std::move(s));
  }
  if (out.size() == 1 && !out[0].payload.empty())
    return bad("a single part with plan bytes (one part is only fusebox's own kernel, by name)");
  if (coverage_known && next_op != op_count)
    return bad("the parts cover " + std::to_string(next_op) + " of " + std::to_string(op_count) + " ops");
  if (offset != n) return bad(std::to_string(n - offset) + " bytes after the last part");
  return out;
}

}  // namespace fusebox::common
