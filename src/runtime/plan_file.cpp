#include "fusebox/plan_file.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "common/json_util.h"
#include "common/kernels_revision.h"
#include "common/plan_info_json.h"
#include "common/plan_payload_check.h"

namespace fusebox {
namespace {

constexpr const char* kMagic = "FUSEBOX-PLAN";
constexpr int64_t kMaxPayloadBytes = int64_t{256} << 20;
constexpr size_t kMaxHeaderBytes = 65536;
using plan_info_json::payload_xxh3;

}  // namespace

PlanFileInfo make_plan_info(const ResolvedGraph& g, const Plan& plan, const DeviceTarget& target) {
  SystemInfo s = system_info(/*enumerate_gpus=*/false);
  PlanFileInfo info;
  info.graph_fingerprint = graph_fingerprint(g);
  info.engine = plan.engine_name();
  info.workspace_bytes = plan.workspace_bytes();
  info.device_name = target.device_name;
  info.sm_version = target.sm_version;
  info.sm_count = target.sm_count;
  info.built_deviceless = target.deviceless();
  info.cudnn_version = s.cudnn_runtime_version;
  info.frontend_version = s.frontend_version;
  info.fusebox_version = s.fusebox_version;
  info.fusebox_kernels = common::kernels_revision();
  return info;
}

Status write_plan_file(const std::string& path, const PlanFileInfo& info,
                       const std::vector<uint8_t>& payload) {
  nlohmann::json h = {{"magic", kMagic},
                      {"format", info.format},
                      {"payload_bytes", static_cast<int64_t>(payload.size())},
                      {"xxh3", payload_xxh3(payload.data(), payload.size())}};
  plan_info_json::write(info, h);
  std::string bytes = common::json_dump(h) + '\n';
  bytes.append(reinterpret_cast<const char*>(payload.data()), payload.size());
  return common::write_file_atomic(path, bytes, "plan file");
}

Result<PlanFile> read_plan_file(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(
      const std::string bytes,
      common::read_file_bounded(path, kMaxHeaderBytes + 1 + kMaxPayloadBytes, "plan file"));
  const size_t eol = bytes.find('\n');
  if (eol == std::string::npos || eol > kMaxHeaderBytes) {
    return ParseError(path + ": not a fusebox plan file (no header line)");
  }
  auto h =
      nlohmann::json::parse(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(eol), nullptr, false);
  if (h.is_discarded() || !h.is_object() || !h.contains("magic") || !h["magic"].is_string() ||
      h["magic"].get<std::string>() != kMagic) {
    return ParseError(path + ": not a fusebox plan file (bad header)");
  }
  PlanFile pf;
  try {
    pf.info.format = static_cast<int>(common::json_int_at(h, "format", 0, std::numeric_limits<int>::max()));
    if (pf.info.format != 1) {
      return ParseError(path + ": plan file format " + std::to_string(pf.info.format) +
                        " is not supported (expected 1)");
    }
    plan_info_json::read(h, &pf.info);
    const int64_t n = common::json_int_at(h, "payload_bytes");
    if (n <= 0 || n > kMaxPayloadBytes)
      return ParseError(path + ": implausible payload length " + std::to_string(n));
    const size_t have = bytes.size() - eol - 1;
    if (have < static_cast<uint64_t>(n)) {
      return ParseError(path + ": truncated: header promises " + std::to_string(n) +
                        " payload bytes, file has " + std::to_string(have));
    }
    if (have > static_cast<uint64_t>(n)) return ParseError(path + ": trailing bytes after the payload");
    pf.payload.assign(bytes.begin() + static_cast<std::ptrdiff_t>(eol + 1), bytes.end());
    if (payload_xxh3(pf.payload.data(), pf.payload.size()) != h.at("xxh3").get<std::string>()) {
      return ParseError(path + ": checksum mismatch: the plan file is corrupt");
    }
    FUSEBOX_RETURN_IF_ERROR(common::check_plan_payload(pf.payload.data(), pf.payload.size(), path));
  } catch (const std::bad_alloc&) {
    return common::out_of_host_memory("reading plan file '" + path + "'");
  } catch (const std::exception& e) {
    return ParseError(path + ": bad plan file header: " + e.what());
  }
  return pf;
}

Status check_plan_compatible(const PlanFileInfo& file, const ResolvedGraph& g, const DeviceTarget& target) {
  SystemInfo s = system_info(/*enumerate_gpus=*/false);
  if (file.graph_fingerprint != graph_fingerprint(g)) {
    return InvalidArgument("plan was built for a different graph (fingerprint " + file.graph_fingerprint +
                           ", this graph " + graph_fingerprint(g) + ")");
  }
  if (file.sm_version != target.sm_version || file.sm_count != target.sm_count) {
    return InvalidArgument("plan was built for " + file.device_name + " (sm_" +
                           std::to_string(file.sm_version) + ", " + std::to_string(file.sm_count) +
                           " SMs), not " + target.device_name + " (sm_" + std::to_string(target.sm_version) +
                           ", " + std::to_string(target.sm_count) + " SMs)");
  }
  if (file.cudnn_version != s.cudnn_runtime_version || file.frontend_version != s.frontend_version) {
    return InvalidArgument("plan was built with cuDNN " + std::to_string(file.cudnn_version) +
                           " / frontend " + file.frontend_version + "; this process has cuDNN " +
                           std::to_string(s.cudnn_runtime_version) + " / frontend " + s.frontend_version);
  }
  return Status::Ok();
}

}  // namespace fusebox
