// fusebox_common: device or pinned host memory owned by one object (freed with it), for the
// layers that keep their own buffers (the training step, the serving engine). Header-only; the
// users link CUDA::cudart themselves.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "common/cuda_status.h"

namespace fusebox::common {

class CudaMem {
 public:
  CudaMem() = default;
  CudaMem(const CudaMem&) = delete;
  CudaMem& operator=(const CudaMem&) = delete;
  ~CudaMem() {
    if (p_) (pinned_ ? cudaFreeHost(p_) : cudaFree(p_));
  }
  // `what` and `who` name the buffer and its user in the error ("train: allocate ids (64 bytes)").
  Status alloc(size_t bytes, bool pinned, const std::string& what, const char* who = "train") {
    pinned_ = pinned;
    bytes_ = std::max<size_t>(bytes, 1);
    const cudaError_t e = pinned ? cudaMallocHost(&p_, bytes_) : cudaMalloc(&p_, bytes_);
    if (e != cudaSuccess) p_ = nullptr;
    return cuda_status(e,
                       std::string(who) + ": allocate " + what + " (" + std::to_string(bytes_) + " bytes)");
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_ = false;
};

}  // namespace fusebox::common
