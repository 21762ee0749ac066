// The one place cudnn_frontend.h is included (precompiled for src/cudnn/ only).
// Nothing here may be included from include/fusebox/.
#pragma once

#include <cudnn_frontend.h>

namespace fusebox::cudnn {
namespace fe = cudnn_frontend;
}  // namespace fusebox::cudnn
