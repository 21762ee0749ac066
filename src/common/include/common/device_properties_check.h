// fusebox_common: checks a device-properties file (the JSON object cuDNN's
// CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION writes, as `fusebox devprop`
// saves it) before cuDNN's own parser sees it: exactly the known keys, each
// an integer in a plausible range (cuDNN divides and sizes by several of
// them), the two 3-vectors, a short printable device name.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fusebox/status.h"

namespace fusebox::common {

// On success *canonical (if not null) is the checked object written out again
// by fusebox (no duplicate keys, no odd escapes): what cuDNN is given.
// Errors are ParseError naming `origin`, the field and the rule.
Status check_device_properties(std::string_view text, const std::string& origin,
                               std::string* canonical = nullptr);

// The keys of a checked file (`canonical`) that cuDNN 9.27 requires and an
// older cuDNN does not write: empty when the file has them all. A file
// captured under cuDNN 9.19 lacks all three.
std::vector<std::string> device_properties_missing_newer_keys(std::string_view canonical);

}  // namespace fusebox::common
