#include "fusebox/plan_file.h"

#include <xxhash.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace fusebox {
namespace {

constexpr const char* kMagic = "FUSEBOX-PLAN";
constexpr int64_t kMaxPayloadBytes = int64_t{256} << 20;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string graph_fingerprint(const ResolvedGraph& g) {
  const std::string canonical = describe(g);
  return hex64(XXH3_64bits(canonical.data(), canonical.size()));
}

PlanFileInfo make_plan_info(const ResolvedGraph& g, const Plan& plan, const DeviceTarget& target) {
  SystemInfo s = system_info();
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
  return info;
}

Status write_plan_file(const std::string& path, const PlanFileInfo& info, const std::vector<uint8_t>& payload) {
  nlohmann::json h = {{"magic", kMagic},
                      {"format", info.format},
                      {"graph", info.graph_fingerprint},
                      {"engine", info.engine},
                      {"workspace_bytes", info.workspace_bytes},
                      {"device", info.device_name},
                      {"sm_version", info.sm_version},
                      {"sm_count", info.sm_count},
                      {"deviceless", info.built_deviceless},
                      {"cudnn", info.cudnn_version},
                      {"frontend", info.frontend_version},
                      {"fusebox", info.fusebox_version},
                      {"payload_bytes", static_cast<int64_t>(payload.size())},
                      {"xxh3", hex64(XXH3_64bits(payload.data(), payload.size()))}};
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return IoError(tmp + ": cannot open for writing");
    f << h.dump() << '\n';
    f.write(reinterpret_cast<const char*>(payload.data()), static_cast<std::streamsize>(payload.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      return IoError(tmp + ": write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return IoError(path + ": cannot rename the new plan file into place");
  }
  return Status::Ok();
}

Result<PlanFile> read_plan_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError(path + ": cannot open plan file");
  std::string header;
  if (!std::getline(f, header) || header.size() > 65536) {
    return ParseError(path + ": not a fusebox plan file (no header line)");
  }
  auto h = nlohmann::json::parse(header, nullptr, false);
  if (h.is_discarded() || !h.is_object() || h.value("magic", "") != kMagic) {
    return ParseError(path + ": not a fusebox plan file (bad header)");
  }
  PlanFile pf;
  try {
    pf.info.format = h.at("format").get<int>();
    if (pf.info.format != 1) {
      return ParseError(path + ": plan file format " + std::to_string(pf.info.format) + " is not supported (expected 1)");
    }
    pf.info.graph_fingerprint = h.at("graph").get<std::string>();
    pf.info.engine = h.at("engine").get<std::string>();
    pf.info.workspace_bytes = h.at("workspace_bytes").get<int64_t>();
    pf.info.device_name = h.at("device").get<std::string>();
    pf.info.sm_version = h.at("sm_version").get<int>();
    pf.info.sm_count = h.at("sm_count").get<int>();
    pf.info.built_deviceless = h.at("deviceless").get<bool>();
    pf.info.cudnn_version = h.at("cudnn").get<int64_t>();
    pf.info.frontend_version = h.at("frontend").get<std::string>();
    pf.info.fusebox_version = h.at("fusebox").get<std::string>();
    const int64_t n = h.at("payload_bytes").get<int64_t>();
    if (n <= 0 || n > kMaxPayloadBytes) return ParseError(path + ": implausible payload length " + std::to_string(n));
    pf.payload.resize(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(pf.payload.data()), n);
    if (f.gcount() != n) {
      return ParseError(path + ": truncated: header promises " + std::to_string(n) + " payload bytes, file has " +
                        std::to_string(f.gcount()));
    }
    if (f.peek() != std::char_traits<char>::eof()) return ParseError(path + ": trailing bytes after the payload");
    if (hex64(XXH3_64bits(pf.payload.data(), pf.payload.size())) != h.at("xxh3").get<std::string>()) {
      return ParseError(path + ": checksum mismatch: the plan file is corrupt");
    }
  } catch (const std::exception& e) {
    return ParseError(path + ": bad plan file header: " + e.what());
  }
  return pf;
}

Status check_plan_compatible(const PlanFileInfo& file, const ResolvedGraph& g, const DeviceTarget& target) {
  SystemInfo s = system_info();
  if (file.graph_fingerprint != graph_fingerprint(g)) {
    return InvalidArgument("plan was built for a different graph (fingerprint " + file.graph_fingerprint +
                           ", this graph " + graph_fingerprint(g) + ")");
  }
  if (file.sm_version != target.sm_version || file.sm_count != target.sm_count) {
    return InvalidArgument("plan was built for " + file.device_name + " (sm_" + std::to_string(file.sm_version) + ", " +
                           std::to_string(file.sm_count) + " SMs), not " + target.device_name + " (sm_" +
                           std::to_string(target.sm_version) + ", " + std::to_string(target.sm_count) + " SMs)");
  }
  if (file.cudnn_version != s.cudnn_runtime_version || file.frontend_version != s.frontend_version) {
    return InvalidArgument("plan was built with cuDNN " + std::to_string(file.cudnn_version) + " / frontend " +
                           file.frontend_version + "; this process has cuDNN " +
                           std::to_string(s.cudnn_runtime_version) + " / frontend " + s.frontend_version);
  }
  return Status::Ok();
}

}  // namespace fusebox
