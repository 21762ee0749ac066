// fusebox_common: a CUDA runtime error as a Status (kCudaError). Header-only,
// for the layers that call CUDA (references, cuDNN, runtime): they link
// CUDA::cudart themselves; fusebox_common does not.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fusebox/status.h"

namespace fusebox::common {

// "<where>: cudaErrorX: <text>".
inline Status cuda_status(cudaError_t err, const std::string& where) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kCudaError,
                where + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// "<where><what> failed: cudaErrorX: <text>", `what` being the call (the
// references' `where` is "[op 'name'] ", ending in a space).
inline Status cuda_status(cudaError_t err, const std::string& where, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return cuda_status(err, where + what + " failed");
}

}  // namespace fusebox::common
