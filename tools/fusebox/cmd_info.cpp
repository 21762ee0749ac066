// fusebox info: versions of everything, GPUs seen.
#include <cstdio>

#include "common.h"
#include "fusebox/cudnn_features.h"

namespace fusebox::cli {

Runner add_info(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("info", "Print fusebox, cuDNN Frontend, cuDNN and CUDA versions and the GPUs seen");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "Write one JSON document to stdout");
  return [json_out]() {
    SystemInfo s = system_info();
    Status runtime = check_cudnn_runtime();
    auto ver = [](int64_t v) {
      return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." +
             std::to_string(v % 100);
    };
    auto cuda_ver = [](int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); };
    const std::vector<CudnnFeatureState> features = cudnn_feature_states(s.cudnn_runtime_version);
    if (*json_out) {
      nlohmann::json feats = nlohmann::json::array();
      for (const auto& f : features) {
        feats.push_back({{"name", f.feature->name},
                         {"min_cudnn", ver(f.feature->min_version)},
                         {"compiled", f.compiled},
                         {"loaded", f.loaded},
                         {"active", f.active()},
                         {"what", f.feature->what},
                         {"fusebox", f.feature->fusebox},
                         {"fallback", f.feature->fallback}});
      }
      nlohmann::json gpus = nlohmann::json::array();
      for (const auto& g : s.gpus) {
        gpus.push_back({{"id", g.id},
                        {"name", g.name},
                        {"sm_version", g.sm_version},
                        {"sm_count", g.sm_count},
                        {"memory_bytes", g.memory_bytes}});
      }
      nlohmann::json j = {{"fusebox", s.fusebox_version},
                          {"cudnn_frontend", s.frontend_version},
                          {"cudnn_headers", ver(s.cudnn_header_version)},
                          {"cudnn_runtime", ver(s.cudnn_runtime_version)},
                          {"cudnn_library", s.cudnn_library_path},
                          {"cudnn_engine_libraries",
                           {{"precompiled", s.cudnn_engines.precompiled},
                            {"runtime_compiled", s.cudnn_engines.runtime_compiled}}},
                          {"cudnn_runtime_ok", runtime.ok()},
                          {"cudnn_runtime_error", runtime.message()},
                          {"cuda_runtime", cuda_ver(s.cuda_runtime_version)},
                          {"cuda_driver", s.cuda_driver_version ? cuda_ver(s.cuda_driver_version) : ""},
                          {"cuda_driver_library", s.cuda_driver_library},
                          {"cudnn_min_runtime", ver(kMinCudnnVersion)},
                          {"cudnn_features", feats},
                          {"gpus", gpus},
                          {"gpu_error", s.gpu_error}};
      std::printf("%s\n", dump(j).c_str());
    } else {
      std::printf("fusebox         %s\n", s.fusebox_version.c_str());
      std::printf("cuDNN Frontend  %s (headers)\n", s.frontend_version.c_str());
      std::printf("cuDNN           headers %s, runtime %s (%s)\n", ver(s.cudnn_header_version).c_str(),
                  ver(s.cudnn_runtime_version).c_str(), safe(s.cudnn_library_path).c_str());
      std::printf("cuDNN engines   precompiled %s, runtime-compiled %s%s\n",
                  s.cudnn_engines.precompiled ? "yes" : "no", s.cudnn_engines.runtime_compiled ? "yes" : "no",
                  s.cudnn_engines.precompiled
                      ? ""
                      : " (a runtime-compiled-only set: no deviceless-built plans, no precompiled engines)");
      std::printf("CUDA            runtime %s, driver %s (libcuda: %s)\n",
                  cuda_ver(s.cuda_runtime_version).c_str(),
                  s.cuda_driver_version ? cuda_ver(s.cuda_driver_version).c_str() : "none",
                  s.cuda_driver_library.c_str());
      std::printf(
          "cuDNN features  (runs on cuDNN >= %s; active = in the headers and in the loaded library)\n",
          ver(kMinCudnnVersion).c_str());
      for (const auto& f : features) {
        const char* state = f.active()  ? "active"
                            : !f.loaded ? "off: loaded cuDNN is older"
                                        : "off: not compiled in";
        std::printf("  %-26s >= %-7s %-27s %s\n", std::string(f.feature->name).c_str(),
                    ver(f.feature->min_version).c_str(), state,
                    std::string(f.active() ? f.feature->fusebox : f.feature->fallback).c_str());
      }
      if (s.gpus.empty()) std::printf("GPUs            none (%s)\n", safe(s.gpu_error).c_str());
      for (const auto& g : s.gpus) {
        std::printf("GPU %d           %s, sm_%d, %d SMs, %.1f GiB\n", g.id, safe(g.name).c_str(),
                    g.sm_version, g.sm_count, g.memory_bytes / (1024.0 * 1024 * 1024));
      }
    }
    if (!runtime.ok()) return fail("info", runtime);
    return kExitOk;
  };
}

}  // namespace fusebox::cli
