// fusebox kernels layer: a graph of pointwise ops only, as one kernel (pointwise.h).
//
// Why: cuDNN 9.19 builds one output per pointwise plan, so a pointwise graph of two outputs runs
// as a partitioned plan that reads its inputs once per part. The SwiGLU backward of the training
// step (da = dy * b * silu'(a), db = dy * silu(a): 3 bf16 tensors in, 2 out) took 0.76 ms per
// layer that way on an H100 (cuDNN 9.19, 2026-12-06, `train lm --profile`), where moving its
// 640 MB takes about 0.2 ms.
//
// Only when pinned so far (kernels::faster_native_kernel says why).
//
// How: the graph becomes a short program (one instruction per op, registers in SSA form: the
// tensors read, then one per op). A thread runs it for one element at a time, in fp32, through
// the graph's dense, common layout (every full tensor laid out alike, so element e sits at
// offset e of each), and stores each output in its dtype. The formulas are the GPU reference's and
// the other kernels' epilogues' (common/pointwise_math.cuh).
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "common/cuda_status.h"
#include "common/pointwise_math.cuh"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "pointwise.h"

namespace fusebox::kernels {

namespace {

constexpr int kMaxTensors = 8;  // tensors in memory (each read or written through a pointer)
constexpr int kMaxOps = 16;
constexpr int kMaxRegs = 2 * kMaxTensors + kMaxOps;  // tensors read, by-value scalars, ops

struct PwInstr {
  uint8_t mode = 0, dst = 0, a = 0, b = 0;
};

// Registers 0..n_in-1 hold the tensors read (loaded per element, or once where `single`),
// n_in..n_in+n_const-1 the by-value scalars, then one per op.
struct PwProgram {
  int n_in = 0, n_const = 0, n_ops = 0, n_out = 0;
  int in_dtype[kMaxTensors] = {};
  bool in_single[kMaxTensors] = {};
  float konst[kMaxTensors] = {};
  PwInstr ops[kMaxOps];
  int out_dtype[kMaxTensors] = {};
  uint8_t out_reg[kMaxTensors] = {};
};

struct PwPointers {
  const void* in[kMaxTensors] = {};
  void* out[kMaxTensors] = {};
};

constexpr int kThreads = 256;

// The program and the pointers in shared memory (read alike by every thread: broadcasts), and each
// thread's registers in a shared column (regs[reg][thread]: no bank conflicts), so nothing is
// indexed at run time in local memory. (The first version kept them in local memory, each thread a
// copy: 130-180 GB/s on an H100.)
template <typename I>
__global__ void __launch_bounds__(kThreads) pointwise_graph_kernel(PwProgram prog, PwPointers ptrs, I n) {
  __shared__ PwProgram p;
  __shared__ PwPointers q;
  __shared__ float regs[kMaxRegs][kThreads];
  if (threadIdx.x == 0) {
    p = prog;
    q = ptrs;
  }
  __syncthreads();
  float* r = &regs[0][threadIdx.x];  // register k of this thread: r[k * kThreads]
  for (int i = 0; i < p.n_in; ++i)
    if (p.in_single[i]) r[i * kThreads] = load_as_float(q.in[i], p.in_dtype[i], 0);
  for (int i = 0; i < p.n_const; ++i) r[(p.n_in + i) * kThreads] = p.konst[i];
  for (I e = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<I>(gridDim.x) * blockDim.x) {
    for (int i = 0; i < p.n_in; ++i)
      if (!p.in_single[i]) r[i * kThreads] = load_as_float(q.in[i], p.in_dtype[i], e);
    for (int k = 0; k < p.n_ops; ++k) {
      const PwInstr o = p.ops[k];
      r[o.dst * kThreads] =
          common::pointwise_apply(static_cast<PointwiseMode>(o.mode), r[o.a * kThreads], r[o.b * kThreads]);
    }
    for (int k = 0; k < p.n_out; ++k)
      store_from_float(q.out[k], p.out_dtype[k], e, r[p.out_reg[k] * kThreads]);
  }
}

class PointwiseGraphKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    if (n_ == 0) return Status::Ok();
    PwPointers q;
    for (int i = 0; i < program_.n_in; ++i) q.in[i] = ptrs[i];
    for (int i = 0; i < program_.n_out; ++i) q.out[i] = ptrs[program_.n_in + i];
    const int blocks = grid_stride_blocks(n_, kThreads);
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (n_ + static_cast<int64_t>(blocks) * kThreads < (int64_t{1} << 31))
      pointwise_graph_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(program_, q, static_cast<int32_t>(n_));
    else
      pointwise_graph_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(program_, q, n_);
    return common::cuda_status(cudaGetLastError(), where_, " pointwise graph kernel launch");
  }

  PwProgram program_;
  int64_t n_ = 0;
};

// The mode of a pointwise op; nullopt for an op of another family (by overload: the variant's
// alternatives are checked by the compiler through std::visit).
std::optional<PointwiseMode> mode_of(const PointwiseAttrs& a) { return a.mode; }
template <typename A>
std::optional<PointwiseMode> mode_of(const A&) {
  return std::nullopt;
}

bool dense(const ResolvedTensor& t) { return t.storage_elements() == t.element_count(); }

}  // namespace

std::shared_ptr<const NativeKernel> make_pointwise_graph_kernel(const ResolvedGraph& g) {
  if (g.ops.empty() || g.ops.size() > static_cast<size_t>(kMaxOps) || g.intermediate_dtype != DType::kFP32)
    return nullptr;
  std::set<int> read_by_op;  // tensors some op reads
  for (const ResolvedOp& op : g.ops) {
    if (!std::visit([](const auto& a) { return mode_of(a).has_value(); }, op.attrs)) return nullptr;
    for (const auto& [role, t] : op.inputs) read_by_op.insert(t);
  }
  auto k =
      std::make_shared<PointwiseGraphKernel>();  // (every graph built asks: only pointwise ones get here)
  PwProgram& p = k->program_;
  // The layout every full tensor shares: the first op's output's dims; the first full tensor in
  // memory's strides.
  const std::vector<int64_t>& dims = g.tensors[static_cast<size_t>(g.ops[0].outputs.at("y"))].dims;
  const std::vector<int64_t>* strides = nullptr;
  std::map<int, int> reg_of;  // tensor index -> register
  std::vector<int> in_tensors, scalars;
  auto full_ok = [&](const ResolvedTensor& t) {
    if (t.dims != dims) return false;
    if (t.is_virtual) return true;
    if (!dense(t) || t.dims.empty()) return false;
    if (!strides) strides = &t.strides;
    return t.strides == *strides;
  };
  // The tensors read: in memory (full or single), or by-value scalars.
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const ResolvedTensor& t = g.tensors[i];
    if (t.is_virtual || t.is_output || !read_by_op.count(static_cast<int>(i))) continue;
    if (!t.values.empty()) return nullptr;
    if (t.scalar_value) {
      scalars.push_back(static_cast<int>(i));
      continue;
    }
    if (t.dtype != DType::kBF16 && t.dtype != DType::kFP16 && t.dtype != DType::kFP32) return nullptr;
    const bool single = t.element_count() == 1;
    if (!single && !full_ok(t)) return nullptr;
    if (p.n_in == kMaxTensors) return nullptr;
    p.in_dtype[p.n_in] = static_cast<int>(t.dtype);
    p.in_single[p.n_in] = single;
    reg_of[static_cast<int>(i)] = p.n_in++;
    in_tensors.push_back(static_cast<int>(i));
  }
  if (scalars.size() > static_cast<size_t>(kMaxTensors)) return nullptr;
  for (int t : scalars) {
    reg_of[t] = p.n_in + p.n_const;
    p.konst[p.n_const++] = static_cast<float>(*g.tensors[static_cast<size_t>(t)].scalar_value);
  }
  int next = p.n_in + p.n_const;
  std::vector<int> out_tensors;
  for (const ResolvedOp& op : g.ops) {
    const PointwiseMode mode = *std::visit([](const auto& a) { return mode_of(a); }, op.attrs);
    const int y = op.outputs.at("y");
    const ResolvedTensor& yt = g.tensors[static_cast<size_t>(y)];
    if (!full_ok(yt)) return nullptr;
    PwInstr& ins = p.ops[p.n_ops++];
    ins.mode = static_cast<uint8_t>(mode);
    const auto roles = op_input_roles(op.attrs);
    if (roles.empty() || roles.size() > 2) return nullptr;
    for (size_t r = 0; r < roles.size(); ++r) {
      auto it = op.inputs.find(std::string(roles[r]));
      if (it == op.inputs.end()) return nullptr;
      auto reg = reg_of.find(it->second);
      if (reg == reg_of.end()) return nullptr;  // an op's output read before it is written
      (r == 0 ? ins.a : ins.b) = static_cast<uint8_t>(reg->second);
    }
    if (roles.size() == 1) ins.b = ins.a;
    ins.dst = static_cast<uint8_t>(next);
    reg_of[y] = next++;
    if (!yt.is_virtual) {
      // An output another op reads would be read at fp32 here and at its own dtype by the reference.
      if (read_by_op.count(y) || p.n_out == kMaxTensors) return nullptr;
      if (yt.dtype != DType::kBF16 && yt.dtype != DType::kFP16 && yt.dtype != DType::kFP32) return nullptr;
      p.out_dtype[p.n_out] = static_cast<int>(yt.dtype);
      p.out_reg[p.n_out++] = static_cast<uint8_t>(reg_of[y]);
      out_tensors.push_back(y);
    }
  }
  if (p.n_out == 0 || p.n_in + p.n_out > kMaxTensors || !strides) return nullptr;
  k->name_ = "fusebox_pointwise";
  k->where_ = "[graph '" + g.name + "']";
  k->n_ = g.tensors[static_cast<size_t>(out_tensors[0])].element_count();
  for (int t : in_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  for (int t : out_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  return k;
}

}  // namespace fusebox::kernels
