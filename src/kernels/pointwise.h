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
std::shared_ptr<const NativeKernel> make_pointwise_graph_kernel(const ResolvedGraph& g);

}  // namespace fusebox::kernels
