// fusebox_common: "[conv_fprop 'conv1']": how every layer's messages name an op.
#pragma once

#include <string>
#include <string_view>

namespace fusebox::common {

// `type_name` is the op's JSON type (op_type_name()), `op_name` its name in
// the graph. No trailing space: callers add their own separator.
inline std::string op_where(std::string_view type_name, std::string_view op_name) {
  std::string s = "[";  // appended piecewise: GCC 12 flags "[" + std::string(...) with a false -Wrestrict
  s.append(type_name).append(" '").append(op_name).append("']");
  return s;
}

}  // namespace fusebox::common
