// fusebox: reference implementations of every op, and result comparison.
//
// The references compute the whole graph op by op in fp32 (fp64 accumulation
// on the CPU, fp32 on the GPU), keeping intermediates in fp32 as cuDNN keeps
// virtual tensors in the intermediate dtype. They are deliberately naive.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

// Reference outputs: for each non-virtual output tensor, its values in fp32
// in logical row-major order (element_count() values).
using ReferenceOutputs = std::map<std::string, std::vector<float>>;

// CPU reference. `inputs` holds every graph input by name. Practical for up
// to about 1e9 multiply-adds.
Result<ReferenceOutputs> reference_cpu(const ResolvedGraph& g,
                                       const std::map<std::string, HostTensor>& inputs);

// Whether a GPU reference is compiled in (the CUDA kernels are built by nvcc).
bool gpu_reference_available();

// Naive GPU reference, for shapes too large for the CPU. `device_inputs` are
// device pointers laid out as the graph tensors (graph dtype and strides);
// outputs land in `device_outputs`: fp32 buffers of element_count() values,
// logical row-major. `stream` is a cudaStream_t (nullptr: default stream).
Status reference_gpu(const ResolvedGraph& g, const std::map<std::string, const void*>& device_inputs,
                     const std::map<std::string, float*>& device_outputs, void* stream = nullptr);

struct Tolerance {
  double rel_l2 = 0;       // ||a - r||_2 / ||r||_2
  double max_abs_rel = 0;  // max|a - r| / max|r|
};
// Per output dtype: bf16 and fp8 looser than fp16, fp16 looser than fp32.
// fp32 allows TF32 tensor-core math.
Tolerance default_tolerance(DType output_dtype);

struct Comparison {
  std::string tensor;
  int64_t elements = 0;
  double rel_l2 = 0;
  double max_abs = 0;      // max |a - r|
  double max_abs_rel = 0;  // max |a - r| / max |r|
  int64_t worst_index = -1;  // logical index of max |a - r|
  int64_t non_finite = 0;    // NaN/Inf in the actual output
  Tolerance tolerance;
  bool pass = false;
  std::string error;  // why no comparison was possible (size mismatch); empty otherwise
  std::string ToString() const;  // one line
};

// Compares `actual` (logical row-major floats) with `reference`.
Comparison compare(const std::string& tensor, const std::vector<float>& reference,
                   const std::vector<float>& actual, Tolerance tol);

}  // namespace fusebox
