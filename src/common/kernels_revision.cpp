// fusebox common layer: the revision of fusebox's own kernels (cmake/kernels_revision.cmake
// generates it at build time from their sources).
#include "common/kernels_revision.h"

#include FUSEBOX_KERNELS_REVISION_HEADER

namespace fusebox::common {

const char* kernels_revision() { return FUSEBOX_KERNELS_REVISION; }

bool uses_fusebox_kernels(const std::string& engine) { return engine.find("fusebox_") != std::string::npos; }

}  // namespace fusebox::common
