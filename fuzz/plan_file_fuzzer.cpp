// libFuzzer target: arbitrary bytes as a plan file, through read_plan_file()
// (src/runtime/plan_file.cpp: header, checksum, then the payload check of
// common/plan_payload_check.h), then, when it is accepted, the payload into
// the cuDNN frontend's handle-less Graph::deserialize() against the H200
// device properties (no GPU needed), as deserialize_plan() does without a
// GpuContext. See fuzz/README.md.
//
// The checksum would stop almost every mutation at the header, so the first
// input byte picks a mode: 0 takes the bytes as the file; 1 takes them as the
// payload and writes a matching header (with this payload's length and XXH3),
// which is what a hostile file would do.
//
// Properties: nothing crashes; read_plan_file's errors are ParseError or IoError.
#include <cudnn_frontend.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "common/device_properties_check.h"
#include "fusebox/plan_file.h"

#ifndef FUSEBOX_DEVPROP
#define FUSEBOX_DEVPROP "devices/h200-cudnn-9.27.devprop"
#endif

namespace fusebox {
// plan_file.cpp's writers and compatibility check use these; the reader under
// test does not. Stubs keep the target free of the CUDA/cuDNN layers.
SystemInfo system_info(bool) { return SystemInfo{}; }
const std::string& Plan::engine_name() const {
  static const std::string s;
  return s;
}
int64_t Plan::workspace_bytes() const { return 0; }
}  // namespace fusebox

namespace {

namespace fe = cudnn_frontend;

void check(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "plan_file_fuzzer: property violated: %s\n", what);
    abort();
  }
}

const std::string& scratch_path() {
  static const std::string p = [] {
    char tmpl[] = "/tmp/plan_file_fuzzer.XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    return std::string(tmpl);
  }();
  return p;
}

std::shared_ptr<fe::DeviceProperties> h200() {
  static std::shared_ptr<fe::DeviceProperties> props = [] {
    std::ifstream in(FUSEBOX_DEVPROP);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string canonical;
    check(fusebox::common::check_device_properties(ss.str(), FUSEBOX_DEVPROP, &canonical).ok(),
          "the H200 device file does not pass its check");
    auto p = std::make_shared<fe::DeviceProperties>();
    std::vector<uint8_t> bytes(canonical.begin(), canonical.end());
    check(p->deserialize(bytes).is_good(), "cuDNN rejected the H200 device file");
    return p;
  }();
  return props;
}

void write_file(const std::string& bytes) {
  FILE* f = fopen(scratch_path().c_str(), "wb");
  if (!f) abort();
  fwrite(bytes.data(), 1, bytes.size(), f);
  fclose(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    if (rest.empty()) return 0;
    fusebox::PlanFileInfo info;
    info.frontend_version = "1.32.0";
    const std::vector<uint8_t> payload(rest.begin(), rest.end());
    if (!fusebox::write_plan_file(scratch_path(), info, payload).ok()) abort();
  } else {
    write_file(rest);
  }
  auto pf = fusebox::read_plan_file(scratch_path());
  if (!pf.ok()) {
    const auto c = pf.status().code();
    check(c == fusebox::StatusCode::kParseError || c == fusebox::StatusCode::kIoError,
          "unexpected error class");
    return 0;
  }
  try {
    fe::graph::Graph graph;
    graph.set_device_properties(h200());
    (void)graph.deserialize(pf->payload);
  } catch (const std::exception&) {
    // deserialize_plan() turns exceptions into a Status (FUSEBOX_CATCH_ALL)
  }
  return 0;
}
