// The one place cudnn_frontend.h is included (precompiled for src/cudnn/ only).
// Nothing here may be included from include/fusebox/.
#pragma once

#include <cudnn.h>

// fusebox builds against the pinned cuDNN and runs on any cuDNN from 9.19
// (fusebox/cudnn_features.h). The frontend, compiled against newer headers,
// references entry points an older libcudnn.so.9 lacks; it calls them only
// after checking the loaded version. Declared weak, a missing one resolves
// to null instead of failing the link of libfusebox.so or of a program
// linked against it on a machine with cuDNN 9.19 (tests/cli/cudnn_versions.sh
// lists the symbols libfusebox.so needs and checks them against 9.19's).
#if CUDNN_VERSION >= 92300
extern "C" cudnnStatus_t CUDNNWINAPI cudnnGetExecutionPlanWorkspaceSize(
    cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan, cudnnBackendDescriptor_t variantPack,
    size_t* workspaceSizeInBytes) __attribute__((weak));
#endif

#include <cudnn_frontend.h>

namespace fusebox::cudnn {
namespace fe = cudnn_frontend;
}  // namespace fusebox::cudnn
