// fusebox kernels layer: a graph of pointwise ops only, as one kernel (pointwise.h).
//
// Why: cuDNN 9.19 builds one output per pointwise plan, so a pointwise graph of two outputs runs
// as a partitioned plan that reads its inputs once per part. The SwiGLU backward of the training
// step (da = dy * b * silu'(a), db = dy * silu(a): 3 bf16 tensors in, 2 out) took 0.76 ms per
// layer that way on an H100 (cuDNN 9.19, 2026-12-06, `train lm --profile`), where moving its
// 640 MB takes about 0.2 ms.
//
// How: the graph becomes a short program (one instruction per op, registers in SSA form: the
// tensors read, then one per op). A thread runs it for one element at a time, in fp32, through
// the graph's dense, common layout (every full tensor laid out alike, so element e sits at
// offset e of each), and stores each output in its dtype. The formulas are the GPU reference's and
// the other kernels' epilogues' (common/pointwise_math.cuh).
//
// That interpreted program is general but slow (about 0.55-0.6 TB/s on an H100, kernels::
// faster_native_kernel has the numbers), so it runs only when pinned. A program that is one of the
// forms below (the gated MLP's product and its backward) runs instead as that form's compiled kernel: the
// same ops in the same order on the same fp32 values, so the same bits, with the registers in
// registers and the 16-bit tensors read and written 8 values (16 bytes) at a time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <variant>

#include "common/cuda_status.h"
#include "common/pointwise_math.cuh"
#include "dtype_access.cuh"
#include "kernel_base.h"
#include "packed16.cuh"
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

// A form: a program written over registers as the interpreter's (the kIn tensors read, then one
// per op), compiled. Each instruction is packed as mode << 24 | dst << 16 | a << 8 | b, and output
// k is register byte k of kOuts.
constexpr uint32_t instr(PointwiseMode m, int dst, int a, int b) {
  return static_cast<uint32_t>(m) << 24 | static_cast<uint32_t>(dst) << 16 | static_cast<uint32_t>(a) << 8 |
         static_cast<uint32_t>(b);
}

template <int kIn_, int kOut_, uint32_t kOuts_, uint32_t... kInstr>
struct Form {
  static constexpr int kIn = kIn_, kOut = kOut_, kOps = sizeof...(kInstr), kRegs = kIn_ + kOps;
  static constexpr uint32_t kOuts = kOuts_;
  template <uint32_t I>
  __device__ static void step(float (&r)[kRegs]) {
    r[(I >> 16) & 0xffu] =
        common::pointwise_apply(static_cast<PointwiseMode>(I >> 24), r[(I >> 8) & 0xffu], r[I & 0xffu]);
  }
  __device__ static void run(float (&r)[kRegs]) { (step<kInstr>(r), ...); }
  static PwProgram program() {
    PwProgram p;
    p.n_in = kIn;
    p.n_out = kOut;
    for (uint32_t i : {kInstr...})
      p.ops[p.n_ops++] = {static_cast<uint8_t>(i >> 24), static_cast<uint8_t>(i >> 16),
                          static_cast<uint8_t>(i >> 8), static_cast<uint8_t>(i)};
    for (int k = 0; k < kOut; ++k) p.out_reg[k] = static_cast<uint8_t>(kOuts >> (8 * k));
    return p;
  }
};

using PM = PointwiseMode;
// y = act(a) * b (inputs a, b): the gated MLPs' product, SwiGLU (act silu: the training step's MLP
// with its GEMMs split, LmTrainConfig::swiglu) and GeGLU (either GELU).
template <PM kAct>
using GluForward = Form<2, 1, 3, instr(kAct, 2, 0, 0), instr(PM::kMul, 3, 2, 1)>;
// Its backward as `fusebox backward` derives it (inputs dy, a, b): da = act_bwd(dy * b, a),
// db = dy * act(a).
template <PM kAct, PM kActBwd>
using GluBackward = Form<3, 2, 4u | 6u << 8, instr(PM::kMul, 3, 0, 2), instr(kActBwd, 4, 3, 1),
                         instr(kAct, 5, 1, 1), instr(PM::kMul, 6, 0, 5)>;

// One thread per 8 elements: each tensor read (written) as one 16-byte load (store) of 16-bit
// values; `q` in the form's order of inputs and outputs.
template <class F, bool kHalf>
__global__ void __launch_bounds__(kThreads) pointwise_form_kernel(PwPointers q, int64_t n8) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n8;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint4 in[F::kIn];
#pragma unroll
    for (int i = 0; i < F::kIn; ++i) in[i] = load8<true>(static_cast<const uint4*>(q.in[i]) + v, 8);
    uint32_t bits[F::kOut][8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float r[F::kRegs];
#pragma unroll
      for (int i = 0; i < F::kIn; ++i) r[i] = value<kHalf>(in[i], j);
      F::run(r);
#pragma unroll
      for (int k = 0; k < F::kOut; ++k) bits[k][j] = float_to_bits<kHalf>(r[(F::kOuts >> (8 * k)) & 0xffu]);
    }
#pragma unroll
    for (int k = 0; k < F::kOut; ++k) static_cast<uint4*>(q.out[k])[v] = pack8(bits[k]);
  }
}

using FormLaunch = void (*)(const PwPointers&, int64_t, int, cudaStream_t);
template <class F, bool kHalf>
void launch_form(const PwPointers& q, int64_t n8, int blocks, cudaStream_t stream) {
  pointwise_form_kernel<F, kHalf><<<blocks, kThreads, 0, stream>>>(q, n8);
}

struct FormEntry {
  const char* name;
  PwProgram (*program)();
  FormLaunch bf16, fp16;
};
template <class F>
constexpr FormEntry form_entry(const char* name) {
  return {name, &F::program, &launch_form<F, false>, &launch_form<F, true>};
}
const FormEntry kForms[] = {
    form_entry<GluForward<PM::kSilu>>("swiglu"),
    form_entry<GluBackward<PM::kSilu, PM::kSiluBwd>>("swiglu_bwd"),
    form_entry<GluForward<PM::kGeluTanh>>("geglu_tanh"),
    form_entry<GluBackward<PM::kGeluTanh, PM::kGeluTanhBwd>>("geglu_tanh_bwd"),
    form_entry<GluForward<PM::kGeluErf>>("geglu_erf"),
    form_entry<GluBackward<PM::kGeluErf, PM::kGeluErfBwd>>("geglu_erf_bwd"),
};

bool commutes(uint8_t mode) {
  return mode == static_cast<uint8_t>(PM::kAdd) || mode == static_cast<uint8_t>(PM::kMul);
}

// Whether program `p` computes form `f`'s outputs: the same ops on the same operands, in any order,
// a commuting op's operands either way round, under a one-to-one map of p's registers to f's that
// takes p's inputs to f's by `in_perm` (p's input i is f's in_perm[i]). On success, out_perm[k] is the
// form's output that p's output k is.
struct FormMatch {
  const PwProgram& p;
  const PwProgram& f;
  int reg_map[kMaxRegs];  // p's register -> f's; -1 unmapped
  bool op_used[kMaxOps] = {};

  bool operands(const PwInstr& po, const PwInstr& fo, bool swap) const {
    return reg_map[po.a] == (swap ? fo.b : fo.a) && reg_map[po.b] == (swap ? fo.a : fo.b);
  }
  bool ops_from(int k) {
    if (k == p.n_ops) return true;
    const PwInstr& po = p.ops[k];
    for (int j = 0; j < f.n_ops; ++j) {
      const PwInstr& fo = f.ops[j];
      if (op_used[j] || fo.mode != po.mode) continue;
      if (!operands(po, fo, false) && !(commutes(po.mode) && operands(po, fo, true))) continue;
      op_used[j] = true;
      reg_map[po.dst] = fo.dst;
      if (ops_from(k + 1)) return true;
      op_used[j] = false;
      reg_map[po.dst] = -1;
    }
    return false;
  }
};

// The form program `p` is, with its maps of inputs and outputs; -1 for none.
int match_form(const PwProgram& p, uint8_t (&in_perm)[kMaxTensors], uint8_t (&out_perm)[kMaxTensors]) {
  if (p.n_const != 0) return -1;
  for (int i = 0; i < p.n_in; ++i)
    if (p.in_single[i]) return -1;
  for (int fi = 0; fi < static_cast<int>(std::size(kForms)); ++fi) {
    const PwProgram f = kForms[fi].program();
    if (f.n_in != p.n_in || f.n_out != p.n_out || f.n_ops != p.n_ops) continue;
    int perm[kMaxTensors];
    for (int i = 0; i < p.n_in; ++i) perm[i] = i;
    do {
      FormMatch m{p, f, {}};
      std::fill(std::begin(m.reg_map), std::end(m.reg_map), -1);
      for (int i = 0; i < p.n_in; ++i) m.reg_map[i] = perm[i];
      if (!m.ops_from(0)) continue;
      bool outs = true;
      // (f's outputs are distinct registers, and p's too, so a hit for each is one-to-one)
      for (int k = 0; k < p.n_out && outs; ++k) {
        const auto hit = std::find(f.out_reg, f.out_reg + f.n_out, m.reg_map[p.out_reg[k]]);
        outs = hit != f.out_reg + f.n_out;
        if (outs) out_perm[k] = static_cast<uint8_t>(hit - f.out_reg);
      }
      if (!outs) continue;
      for (int i = 0; i < p.n_in; ++i) in_perm[i] = static_cast<uint8_t>(perm[i]);
      return fi;
    } while (std::next_permutation(perm, perm + p.n_in));
  }
  return -1;
}

class PointwiseGraphKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    if (n_ == 0) return Status::Ok();
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    if (form_ >= 0) {
      bool aligned = true;
      for (int i = 0; i < program_.n_in + program_.n_out; ++i)
        aligned = aligned && reinterpret_cast<uintptr_t>(ptrs[i]) % 16 == 0;
      if (aligned) {
        PwPointers q;
        for (int i = 0; i < program_.n_in; ++i) q.in[in_perm_[i]] = ptrs[i];
        for (int k = 0; k < program_.n_out; ++k) q.out[out_perm_[k]] = ptrs[program_.n_in + k];
        const FormEntry& f = kForms[form_];
        (half_ ? f.fp16 : f.bf16)(q, n_ / 8, grid_stride_blocks(n_ / 8, kThreads), stream);
        return common::cuda_status(cudaGetLastError(), where_, " pointwise form kernel launch");
      }
    }
    PwPointers q;
    for (int i = 0; i < program_.n_in; ++i) q.in[i] = ptrs[i];
    for (int i = 0; i < program_.n_out; ++i) q.out[i] = ptrs[program_.n_in + i];
    const int blocks = grid_stride_blocks(n_, kThreads);
    if (n_ + static_cast<int64_t>(blocks) * kThreads < (int64_t{1} << 31))
      pointwise_graph_kernel<int32_t><<<blocks, kThreads, 0, stream>>>(program_, q, static_cast<int32_t>(n_));
    else
      pointwise_graph_kernel<int64_t><<<blocks, kThreads, 0, stream>>>(program_, q, n_);
    return common::cuda_status(cudaGetLastError(), where_, " pointwise graph kernel launch");
  }

  PwProgram program_;
  int64_t n_ = 0;
  // The compiled form (kForms) the program is, or -1; used where every tensor is 16-bit of one dtype
  // (half_: fp16), the element count a multiple of 8 and, at launch, every pointer 16-byte aligned.
  int form_ = -1;
  bool half_ = false;
  uint8_t in_perm_[kMaxTensors] = {}, out_perm_[kMaxTensors] = {};
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
  // A compiled form: every tensor in memory of one 16-bit dtype, whole vectors of 8.
  const int dt = p.in_dtype[0];
  bool one_16bit = dt == static_cast<int>(DType::kBF16) || dt == static_cast<int>(DType::kFP16);
  for (int i = 0; i < p.n_in; ++i) one_16bit = one_16bit && p.in_dtype[i] == dt;
  for (int i = 0; i < p.n_out; ++i) one_16bit = one_16bit && p.out_dtype[i] == dt;
  if (one_16bit && k->n_ % 8 == 0) {
    k->form_ = match_form(p, k->in_perm_, k->out_perm_);
    k->half_ = dt == static_cast<int>(DType::kFP16);
  }
  for (int t : in_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  for (int t : out_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  return k;
}

const char* pointwise_form_name(const NativeKernel& k) {
  const auto* pk = dynamic_cast<const PointwiseGraphKernel*>(&k);
  return pk && pk->form_ >= 0 ? kForms[pk->form_].name : nullptr;
}

}  // namespace fusebox::kernels
