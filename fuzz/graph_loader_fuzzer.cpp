// libFuzzer target: arbitrary bytes as a graph file, through the public graph
// API the CLI uses: parse_graph_json -> resolve -> describe, and
// graph_to_json -> parse_graph_json again. See fuzz/README.md.
//
// Properties: never crash, hang, leak or throw; no error is Internal (a bad
// file is the caller's problem, not a fusebox bug); a graph that parsed once
// must parse again from its own graph_to_json text, and resolve the same way.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fusebox/graph.h"

namespace {

void check(bool ok, const char* what, const std::string& detail) {
  if (!ok) {
    fprintf(stderr, "graph_loader_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
    abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = fusebox::parse_graph_json(text, "fuzz.json");
  if (!spec.ok()) {
    check(spec.status().code() != fusebox::StatusCode::kInternal, "parse error reported as Internal",
          spec.status().ToString());
    return 0;
  }

  auto resolved = fusebox::resolve(*spec);
  check(resolved.ok() || resolved.status().code() != fusebox::StatusCode::kInternal,
        "resolve error reported as Internal", resolved.status().ToString());
  if (resolved.ok()) {
    const std::string listing = fusebox::describe(*resolved);
    check(!listing.empty(), "describe() of a resolved graph is empty", "");
  }

  const std::string written = fusebox::graph_to_json(*spec);
  auto again = fusebox::parse_graph_json(written, "fuzz.json (written)");
  check(again.ok(), "graph_to_json output does not parse", again.status().ToString() + "\n" + written);
  check(fusebox::graph_to_json(*again) == written, "graph_to_json is not stable over a re-parse", written);
  auto resolved_again = fusebox::resolve(*again);
  check(resolved_again.ok() == resolved.ok(), "re-parsed graph resolves differently",
        (resolved.ok() ? std::string("first ok") : resolved.status().ToString()) + "\n" +
            (resolved_again.ok() ? std::string("second ok") : resolved_again.status().ToString()));
  return 0;
}
