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

// The GPU reference on host inputs (as reference_cpu takes them): uploads,
// runs on the default stream, downloads. NoDevice when no GPU is present.
Result<ReferenceOutputs> reference_gpu_host(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs);

// ---- SDPA verification helpers (the references cover sdpa_fwd, sdpa_bwd and
// sdpa_fp8_fwd with every SdpaOptions feature but dropout, which is NotSupported).

// Makes each sdpa_bwd op's "o" and "stats" inputs those of the forward of the
// same q, k, v (and seq_len, bias inputs and options), overwriting
// inputs[o] (rounded to o's dtype, in its strides) and inputs[stats]; random
// o and stats would make the gradients meaningless. Rows that keep no key
// (padded rows included) get o = 0 and stats = +inf, so that any P = exp(s -
// stats) cuDNN might form there is 0, never NaN. Computed on the GPU
// reference when the forward exceeds `cpu_max_flops` and a GPU is present,
// else on the CPU. Call it after filling q, k, v (and the mask inputs), before
// uploading. NotSupported with dropout.
Status derive_sdpa_bwd_inputs(const ResolvedGraph& g, std::map<std::string, HostTensor>& inputs,
                              double cpu_max_flops = 2e9);

// Zeroes the values of sdpa outputs that cuDNN does not define, in `outputs`
// (logical row-major fp32, keyed by tensor name; absent tensors are skipped),
// so that it can be applied to both cuDNN's outputs and the reference before
// compare(): o and stats (and dq) rows i >= seq_len_q[b] and rows whose mask
// keeps no key (e.g. bottom-right with Sq > Skv); dk and dv rows j >=
// seq_len_kv[b]. `inputs` supplies the seq_len tensors (padding). InvalidArgument
// when a length is missing or outside [0, S], or an output has the wrong size.
Status mask_dont_care(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
                      std::map<std::string, std::vector<float>>& outputs);

struct Tolerance {
  double rel_l2 = 0;       // ||a - r||_2 / ||r||_2
  double max_abs_rel = 0;  // max|a - r| / max|r|
};
// Per output dtype: bf16 and fp8 looser than fp16, fp16 looser than fp32.
// fp32 allows TF32 tensor-core math.
Tolerance default_tolerance(DType output_dtype);
// The tolerance for graph output `output`: default_tolerance(dtype) except
// where an op needs its own (sdpa_bwd gradients, sdpa_fp8_fwd o and amax; see
// compare.cpp). Unknown names get the bf16 default.
Tolerance tolerance_for(const ResolvedGraph& g, const std::string& output);

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
