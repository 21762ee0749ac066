// cuDNN 9.2x links its runtime-compiled engine library against libcuda.so.1
// and will not load at all without it: on a machine with no GPU driver (CI,
// this project's build machine) even deviceless plan builds fail with
// CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED. cuDNN 9.19 did not need it.
//
// When the process cannot load libcuda.so.1, fusebox loads the CUDA toolkit's
// stub driver (stubs/libcuda.so, whose SONAME is libcuda.so.1) globally before
// anything calls cuDNN; cuDNN's libraries then resolve against it. Every driver
// call through the stub fails (cudaErrorStubLibrary), so no GPU is ever
// reported, and deviceless builds need none. Where a driver exists it is
// loaded as usual and the stub is never touched.
#include <dlfcn.h>

#include <string>

#include "internal.h"

#ifndef FUSEBOX_CUDA_DRIVER_STUB
#define FUSEBOX_CUDA_DRIVER_STUB ""
#endif

namespace fusebox::cudnn {
namespace {

DriverLoad load_driver_or_stub() {
  if (dlopen("libcuda.so.1", RTLD_LAZY | RTLD_GLOBAL)) return DriverLoad::kDriver;
  const std::string stub = FUSEBOX_CUDA_DRIVER_STUB;
  if (!stub.empty() && dlopen(stub.c_str(), RTLD_LAZY | RTLD_GLOBAL)) return DriverLoad::kStub;
  return DriverLoad::kNone;
}

// When fusebox's code is loaded (before main, or when a host program loads
// libfusebox.so): the one place the choice is made, before any cuDNN call.
// Lazy binding: nothing of the driver is resolved until cudart or cuDNN calls it.
[[gnu::constructor]] void load_at_startup() { (void)driver_load(); }

}  // namespace

DriverLoad driver_load() {
  static const DriverLoad load = load_driver_or_stub();
  return load;
}

}  // namespace fusebox::cudnn
