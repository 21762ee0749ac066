// fusebox common layer: the revision of fusebox's own GPU kernels. A plan that runs one of them
// (engine "fusebox_...", alone or as a part of a partition) is serialized as the kernel's name
// only, so its plan-check verdict holds for the code that was checked: plan files and cache
// entries record this revision, and a verdict recorded under another one is checked again.
#pragma once

#include <string>

namespace fusebox::common {

// 16 hex digits of a hash over the kernels' and the reference kernels' sources, fixed at build time.
const char* kernels_revision();

// Whether a plan's engine name names a kernel of fusebox's own (a part of a partition included).
bool uses_fusebox_kernels(const std::string& engine);

}  // namespace fusebox::common
