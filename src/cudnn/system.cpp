// Versions, GPUs, device-properties files and the cuDNN runtime check.
#include <dlfcn.h>

#include <filesystem>
#include <limits>
#include <system_error>

#include "common/device_properties_check.h"
#include "common/file_io.h"
#include "common/json_util.h"
#include "fusebox/cudnn_features.h"
#include "internal.h"

#ifndef FUSEBOX_VERSION
#define FUSEBOX_VERSION "0.1.0"
#endif

namespace fusebox {
namespace {

constexpr uint64_t kMaxDevicePropertiesBytes = 1 << 20;

std::string version_string(int64_t v) {
  // cuDNN 9: major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

std::string loaded_cudnn_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cudnnGetVersion), &info) && info.dli_fname) return info.dli_fname;
  return "(unknown path)";
}

// Beside the loaded libcudnn (its wheel or package keeps them together). Not "loadable by name":
// the GPU machine's older system cuDNN (9.14, /usr/lib/x86_64-linux-gnu) would answer for the
// JIT set's missing precompiled engines, and cuDNN refuses another version's library.
bool engine_library_present(const std::string& directory, const char* name) {
  std::error_code ec;
  return !directory.empty() && std::filesystem::exists(directory + "/" + name, ec);
}

}  // namespace

CudnnEngineLibraries cudnn_engine_libraries() {
  CudnnEngineLibraries out;
  const std::string path = loaded_cudnn_path();
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) out.directory = path.substr(0, slash);
  out.precompiled = engine_library_present(out.directory, "libcudnn_engines_precompiled.so.9");
  out.runtime_compiled = engine_library_present(out.directory, "libcudnn_engines_runtime_compiled.so.9");
  return out;
}

std::string_view heuristic_mode_name(HeuristicMode m) {
  switch (m) {
    case HeuristicMode::kA:
      return "a";
    case HeuristicMode::kB:
      return "b";
    case HeuristicMode::kFallback:
      return "fallback";
  }
  return "?";
}

Result<std::vector<HeuristicMode>> parse_heuristic_modes(std::string_view csv) {
  std::vector<HeuristicMode> out;
  size_t start = 0;
  while (start <= csv.size()) {
    size_t end = csv.find(',', start);
    if (end == std::string_view::npos) end = csv.size();
    std::string_view item = csv.substr(start, end - start);
    if (item == "a" || item == "A") {
      out.push_back(HeuristicMode::kA);
    } else if (item == "b" || item == "B") {
      out.push_back(HeuristicMode::kB);
    } else if (item == "fallback") {
      out.push_back(HeuristicMode::kFallback);
    } else {
      return InvalidArgument("--heuristics: unknown mode '" + std::string(item) +
                             "': accepted are a, b, fallback (comma-separated, e.g. a,fallback)");
    }
    start = end + 1;
  }
  return out;
}

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Status check_cudnn_runtime() {
  const int64_t runtime = static_cast<int64_t>(cudnnGetVersion());
  if (runtime < kMinCudnnVersion) {
    return Status(StatusCode::kVersionMismatch,
                  "cuDNN runtime " + version_string(runtime) + " (loaded from " + loaded_cudnn_path() +
                      ") is older than " + version_string(kMinCudnnVersion) +
                      ", the oldest fusebox runs on (built against " + version_string(CUDNN_VERSION) +
                      "): put cuDNN >= " + version_string(kMinCudnnVersion) + " first on LD_LIBRARY_PATH");
  }
  if (runtime / 10000 != CUDNN_VERSION / 10000) {
    return Status(StatusCode::kVersionMismatch,
                  "cuDNN runtime " + version_string(runtime) + " (loaded from " + loaded_cudnn_path() +
                      ") is not cuDNN " + std::to_string(CUDNN_VERSION / 10000) +
                      ", the major version fusebox was built against");
  }
  return Status::Ok();
}

SystemInfo system_info(bool enumerate_gpus) {
  SystemInfo s;
  s.fusebox_version = FUSEBOX_VERSION;
  s.frontend_version = std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                       std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                       std::to_string(CUDNN_FRONTEND_PATCH_VERSION);
  s.cudnn_header_version = CUDNN_VERSION;
  s.cudnn_runtime_version = static_cast<int64_t>(cudnnGetVersion());
  s.cudnn_library_path = loaded_cudnn_path();
  s.cudnn_engines = cudnn_engine_libraries();
  switch (cudnn::driver_load()) {
    case cudnn::DriverLoad::kDriver:
      s.cuda_driver_library = "libcuda.so.1";
      break;
    case cudnn::DriverLoad::kStub:
      s.cuda_driver_library =
          "the CUDA toolkit's stub (no driver on this machine; cuDNN needs the library to load)";
      break;
    case cudnn::DriverLoad::kNone:
      s.cuda_driver_library = "none";
      break;
  }
  (void)cudaRuntimeGetVersion(&s.cuda_runtime_version);
  if (cudaDriverGetVersion(&s.cuda_driver_version) != cudaSuccess) s.cuda_driver_version = 0;
  if (!enumerate_gpus) return s;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    s.gpu_error = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    (void)cudaGetLastError();
    n = 0;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    s.gpus.push_back(
        {i, p.name, p.major * 10 + p.minor, p.multiProcessorCount, static_cast<int64_t>(p.totalGlobalMem)});
  }
  return s;
}

Result<std::string> capture_device_properties(int device_id) {
  using namespace cudnn;
  FUSEBOX_RETURN_IF_ERROR(check_cudnn_runtime());
  if (gpu_count() <= device_id) {
    return Status(StatusCode::kNoDevice, "devprop: no CUDA GPU with id " + std::to_string(device_id) +
                                             ": run this on the GPU the plans are for");
  }
  std::vector<uint8_t> bytes;
  try {
    fe::DeviceProperties props;
    props.set_device_id(device_id);
    FUSEBOX_RETURN_IF_ERROR(from_fe(props.build(), "devprop: build device properties"));
    FUSEBOX_RETURN_IF_ERROR(from_fe(props.serialize(bytes), "devprop: serialize device properties"));
  }
  FUSEBOX_CATCH_ALL("devprop")
  while (!bytes.empty() && bytes.back() == 0) bytes.pop_back();
  return std::string(bytes.begin(), bytes.end());
}

Result<DeviceTarget> DeviceTarget::from_properties_json(std::string text, const std::string& origin) {
  // Checked by fusebox first (common/device_properties_check.h); cuDNN is
  // given fusebox's own rewrite of the checked object, never the raw text.
  std::string canonical;
  FUSEBOX_RETURN_IF_ERROR(common::check_device_properties(text, origin, &canonical));
  const nlohmann::json j = nlohmann::json::parse(canonical);
  DeviceTarget t;
  const int device_ver = j["deviceVer"].get<int>();
  t.sm_count = j["multiProcessorCount"].get<int>();
  t.sm_version = device_ver / 10;
  t.device_name = j["deviceName"].get<std::string>();
  t.properties_json = std::move(canonical);
  // Let cuDNN itself accept it now rather than fail later in a build.
  auto props = cudnn::device_properties_for(t);
  if (!props.ok()) {
    std::string hint;
    const std::vector<std::string> missing = common::device_properties_missing_newer_keys(t.properties_json);
    if (!missing.empty() && cudnnGetVersion() >= 92700) {
      std::string keys;
      for (const std::string& k : missing) keys += (keys.empty() ? "" : ", ") + k;
      hint =
          ". The file lacks " + keys + ", which cuDNN " + version_string(cudnnGetVersion()) +
          " (loaded) requires: it was captured under an older cuDNN (9.19 writes none of them). Capture it "
          "again with `fusebox devprop` on that GPU under this cuDNN, or use "
          "devices/h200-cudnn-9.27.devprop for an H200";
    }
    return ParseError(origin + ": cuDNN rejected the device properties: " + props.status().message() + hint);
  }
  return t;
}

Result<DeviceTarget> DeviceTarget::from_file(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(
      std::string text, common::read_file_bounded(path, kMaxDevicePropertiesBytes, "device-properties file"));
  return from_properties_json(std::move(text), path);
}

Result<DeviceTarget> DeviceTarget::live_gpu(int device_id) {
  if (gpu_count() <= device_id) {
    return Status(StatusCode::kNoDevice, "no CUDA GPU with id " + std::to_string(device_id) +
                                             " is visible; build deviceless with --device FILE");
  }
  cudaDeviceProp p{};
  FUSEBOX_RETURN_IF_ERROR(
      cudnn::cuda_status(cudaGetDeviceProperties(&p, device_id), "cudaGetDeviceProperties"));
  DeviceTarget t;
  t.device_id = device_id;
  t.device_name = p.name;
  t.sm_version = p.major * 10 + p.minor;
  t.sm_count = p.multiProcessorCount;
  return t;
}

}  // namespace fusebox
