// fusebox devprop: capture cuDNN's description of a live GPU for deviceless builds.
#include <cstdio>

#include "common.h"

namespace fusebox::cli {

Runner add_devprop(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("devprop", "Capture the GPU's device-properties file (for deviceless builds)");
  auto out = std::make_shared<std::string>();
  auto device = std::make_shared<int>(0);
  cmd->add_option("--out", *out, "File to write")->required();
  cmd->add_option("--gpu", *device, "GPU ordinal")->check(CLI::NonNegativeNumber);
  return [out, device]() {
    auto props = capture_device_properties(*device);
    if (!props.ok()) return fail("devprop", props.status());
    // Check it loads back before writing, then write atomically.
    auto target = DeviceTarget::from_properties_json(*props, "captured properties");
    if (!target.ok()) return fail("devprop", target.status());
    Status st = common::write_file_atomic(*out, *props, "device-properties file");
    if (!st.ok()) return fail("devprop", st);
    std::printf("wrote %s: %s, sm_%d, %d SMs\n", safe(*out).c_str(), safe(target->device_name).c_str(),
                target->sm_version, target->sm_count);
    return kExitOk;
  };
}

}  // namespace fusebox::cli
