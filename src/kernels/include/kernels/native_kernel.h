// fusebox kernels layer: the ops fusebox runs with CUDA kernels of its own,
// where cuDNN 9.19 has no op (docs/architecture.md, "Native ops"). The cuDNN
// layer wraps one in a Plan (engine "fusebox_<op>"), so sessions, bound
// plans, CUDA graphs and pipelines run it like any plan. No cuDNN here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::kernels {

class NativeKernel {
 public:
  virtual ~NativeKernel() = default;
  // The engine name plans report: "fusebox_embedding".
  virtual const std::string& name() const = 0;
  // The graph tensors it reads and writes, in the order launch() takes them.
  virtual const std::vector<std::string>& tensors() const = 0;
  // Enqueues the kernel on `stream` (a cudaStream_t) with the tensors'
  // device pointers in tensors() order. Asynchronous.
  virtual Status launch(void* const* ptrs, void* stream) const = 0;
  // Device scratch a launch needs (the plan's workspace, from the session's arena), and the launch
  // with it; kernels that need none keep these defaults.
  virtual int64_t workspace_bytes() const { return 0; }
  virtual Status launch_with_workspace(void* const* ptrs, void* workspace, void* stream) const {
    (void)workspace;
    return launch(ptrs, stream);
  }
};

// Whether `g` has an op only fusebox's own kernels run (embedding).
bool has_native_op(const ResolvedGraph& g);

// The kernel for a graph whose only op is a native one. A native op with
// other ops in its graph is InvalidArgument naming them (a graph is one
// cuDNN plan or one fusebox kernel: put the op in a pipeline stage of its own).
Result<std::shared_ptr<const NativeKernel>> make_native_kernel(const ResolvedGraph& g);

// A graph cuDNN runs, but much slower than a kernel of fusebox's own: a
// global average pool alone, or a layernorm or rmsnorm forward alone with
// 16-bit x and fp32 scale (the mixed-precision form), a bf16 pool, a sum over
// outer dims, paged decode attention, or a matmul of at most 8 rows with its
// pointwise epilogue (the serving engine's decode GEMMs). `kernel` is null when
// `g` is none of them; `why` names the cuDNN shortfall, with the measurement
// (native_kernel.cpp). A build takes the kernel unless a cuDNN engine is
// pinned (BuildOptions::engine), so cuDNN's engines stay one flag away.
// `by_default` false: a kernel measured slower than cuDNN's engine for its graphs, built only
// when pinned by name (paged decode attention: its rows do not depend on the batch).
struct FasterKernel {
  std::shared_ptr<const NativeKernel> kernel;
  std::string why;
  bool by_default = true;
};
// `pinned`: the engine a build pins, where it names a kernel of fusebox's that is never a graph's
// default (fusebox_skinny_gemm): then that kernel, where it takes the graph.
FasterKernel faster_native_kernel(const ResolvedGraph& g, const std::string& pinned = "");

// The few-row matmul on tensor cores (9 to 64 rows), pinned only.
inline constexpr const char* kSkinnyGemmName = "fusebox_skinny_gemm";

// The engine name of the reference kernel below.
inline constexpr const char* kReferenceKernelName = "fusebox_reference";

// The last resort (issue 29, "every valid graph runs"): a kernel that runs any graph on
// fusebox's naive GPU reference (fusebox/reference.h), fp32 throughout, then stores each output
// in its graph dtype and strides. Slow; correct by construction. NotSupported for a graph the
// reference cannot run on its own (a dropout mask cuDNN draws, rank > 8). Its launch
// synchronizes the stream and refuses CUDA graph capture.
Result<std::shared_ptr<const NativeKernel>> make_reference_kernel(const ResolvedGraph& g);

}  // namespace fusebox::kernels
