// fusebox_runtime (private): how the pipeline code names a pipeline and its
// parts in messages ("p.json: pipeline 'p': stage 'conv1'").
#pragma once

#include <string>
#include <string_view>

#include "fusebox/pipeline.h"

namespace fusebox::runtime {

inline std::string sq(std::string_view s) {
  std::string out = "'";
  out += s;
  out += '\'';
  return out;
}
inline std::string where(const Pipeline& p) { return p.path + ": pipeline " + sq(p.name); }
inline std::string stage_where(const Pipeline& p, int s) {
  return where(p) + ": stage " + sq(p.stages[static_cast<size_t>(s)].name);
}

}  // namespace fusebox::runtime
