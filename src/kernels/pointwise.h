// fusebox kernels layer (private): a graph of pointwise ops only, run as one kernel (pointwise.cu).
#pragma once

#include <memory>

#include "kernels/native_kernel.h"

namespace fusebox::kernels {

// The kernel for `g`, or null when it is not the form it serves: every op pointwise (at most 16),
// at most 8 tensors in memory, each either of the graph's full shape and laid out like the first
// of them, densely (any order of dims), or a single value (a tensor of one element, or a by-value
// scalar); no output read by another op; fp32 intermediates. Each element's ops run in fp32
// registers, so a graph of several outputs is one pass over memory where cuDNN, which builds one
// output per pointwise plan, runs one partitioned plan per output.
// Where the graph is one of the compiled forms (the SwiGLU or GeGLU forward or backward, pointwise.cu) with
// every tensor of one 16-bit dtype and a multiple of 8 elements, the kernel runs that form's
// compiled code instead of the interpreted program (at launch, where every pointer is 16-byte
// aligned).
std::shared_ptr<const NativeKernel> make_pointwise_graph_kernel(const ResolvedGraph& g);

// The compiled form a kernel of make_pointwise_graph_kernel runs ("swiglu", "swiglu_bwd", "geglu_tanh", ...);
// null for none, or another kernel.
const char* pointwise_form_name(const NativeKernel& k);

// A compiled form (above) whose outputs are cast to FP8 by quantize ops in the same graph: each
// quantize reads a different output of the form (stored in memory or virtual) and writes its FP8
// copies in the form's layout and/or transposed against it (the same transposed layout for every
// cast), with its amax; the form's tensors of one 16-bit dtype, dense in one layout, with a
// multiple of 8 elements along the contiguous dim (and along the transposed copies' contiguous
// dim). One pass over memory: FP8 training's casts fused into the stage that computes their
// input (fusebox/fp8_training.h). Null when the graph is not of that shape.
std::shared_ptr<const NativeKernel> make_pointwise_quantize_kernel(const ResolvedGraph& g);

}  // namespace fusebox::kernels
