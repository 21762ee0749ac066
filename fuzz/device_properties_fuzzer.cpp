// libFuzzer target: arbitrary bytes as a device-properties file, through the
// check every file gets (common::check_device_properties), then, when it
// passes, into cuDNN's own parser the way fusebox hands it over: the checked
// object rewritten by fusebox, given to a handle-less
// cudnn_frontend::DeviceProperties::deserialize() (no GPU needed). See
// fuzz/README.md.
//
// Properties: nothing crashes; an accepted file's canonical text is accepted
// again and rewrites to itself.
#include <cudnn_frontend.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/device_properties_check.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "device_properties_fuzzer: property violated: %s\n", what);
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string canonical;
  const auto st = fusebox::common::check_device_properties(text, "fuzz.devprop", &canonical);
  if (!st.ok()) {
    check(st.code() == fusebox::StatusCode::kParseError, "an error other than ParseError");
    return 0;
  }
  std::string again;
  check(fusebox::common::check_device_properties(canonical, "canonical", &again).ok(),
        "canonical text rejected");
  check(again == canonical, "canonical text not a fixed point");
  // cuDNN's parser, as src/cudnn/lowering.cpp device_properties_for() calls it.
  try {
    cudnn_frontend::DeviceProperties props;
    std::vector<uint8_t> bytes(canonical.begin(), canonical.end());
    (void)props.deserialize(bytes);
  } catch (const std::exception&) {
    // fusebox turns exceptions into a Status (FUSEBOX_CATCH_ALL)
  }
  return 0;
}
