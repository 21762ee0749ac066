// fusebox_common: checks a serialized cuDNN plan (what Graph::serialize()
// writes: UBJSON, with cuDNN's own execution-plan JSON as a string inside)
// before the frontend's deserializer or cuDNN's parser sees it. Both crash
// or misbehave on well-formed but hostile input (a missing key is an
// out-of-bounds read in the frontend; `[$Z#L<2^40>` is 12 bytes that
// nlohmann expands into 2^40 nulls; offsets in the payload become device
// pointer arithmetic at execution). docs/architecture.md, "File safety".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fusebox/status.h"

namespace fusebox::common {

struct PlanPayloadLimits {
  static constexpr int kMaxDepth = 32;  // UBJSON containers, and cuDNN's JSON
  // One UBJSON string; the longest is cudnn_backend_data (~1 KB an op).
  static constexpr size_t kMaxStringBytes = size_t{64} << 20;
  static constexpr size_t kMaxNameBytes = 4096;  // a tensor name
  static constexpr size_t kMaxTensors = 100000;
  static constexpr size_t kMaxDims = 12;
  static constexpr int64_t kMaxWorkspaceBytes = int64_t{1} << 40;
};

// Structure only: the bytes are exactly one UBJSON value as nlohmann's
// to_ubjson() writes it (no optimized `$`/`#` containers, no no-op), nested
// at most kMaxDepth deep, every length within the remaining bytes. Runs
// without recursion, in time linear in the size. Errors are ParseError
// naming `where`, the byte offset and the rule.
Status check_ubjson_structure(const uint8_t* data, size_t n, const std::string& where);

// Structure, then the schema the cuDNN frontend 1.32 reads in
// Graph::deserialize(): every key it reads present with the right type,
// tensors with sane dims and strides, workspace writes inside the workspace,
// no variant-pack pointer offsets, and `cudnn_backend_data` a JSON object
// within the limits. `where` names the file or cache entry.
Status check_plan_payload(const uint8_t* data, size_t n, const std::string& where);

// JSON text nested at most max_depth deep (strings skipped), checked without
// parsing: for text handed to a recursive parser.
Status check_json_text_depth(std::string_view text, int max_depth, const std::string& where);

}  // namespace fusebox::common
