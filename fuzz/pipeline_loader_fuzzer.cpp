// libFuzzer target: arbitrary bytes as a pipeline file (docs/pipeline-format.md), through the
// loader the CLI's `pipeline check` uses, against the example pipelines' folder (so stage graph
// files and weights files resolve to real ones). See fuzz/README.md.
//
// Properties: never crash, hang or throw; no error is Internal; a pipeline that loads has a stage
// order that is a permutation of its stages with every buffer written before it is read, and every
// view buffer inside its parent.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "fusebox/pipeline.h"

#ifndef FUSEBOX_PIPELINE_DIR
#error "FUSEBOX_PIPELINE_DIR: the examples/pipelines folder"
#endif

namespace {

void check(bool ok, const char* what, const std::string& detail) {
  if (!ok) {
    fprintf(stderr, "pipeline_loader_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto p = fusebox::parse_pipeline_json(text, "fuzz.json", FUSEBOX_PIPELINE_DIR);
  if (!p.ok()) {
    check(p.status().code() != fusebox::StatusCode::kInternal, "load error reported as Internal",
          p.status().ToString());
    return 0;
  }
  std::set<int> seen(p->order.begin(), p->order.end());
  check(p->order.size() == p->stages.size() && seen.size() == p->stages.size(), "order is not a permutation",
        p->name);
  std::vector<int> position(p->stages.size());
  for (size_t i = 0; i < p->order.size(); ++i)
    position[static_cast<size_t>(p->order[i])] = static_cast<int>(i);
  for (const auto& b : p->buffers) {
    const auto& writer = b.is_view() ? p->buffers[static_cast<size_t>(b.view_of)].writer : b.writer;
    for (const auto& r : b.readers)
      check(!writer || position[static_cast<size_t>(writer->stage)] < position[static_cast<size_t>(r.stage)],
            "a buffer is read before it is written", b.name);
    if (b.is_view()) {
      int64_t n = 1, c = 1;
      for (int64_t d : p->buffers[static_cast<size_t>(b.view_of)].dims) n *= d;
      for (int64_t d : b.dims) c *= d;
      check(b.view_offset_elements(*p) + c <= n, "a view reaches past its parent", b.name);
    }
  }
  return 0;
}
