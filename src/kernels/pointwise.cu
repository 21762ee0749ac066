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
#include "fp8_pack.cuh"
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

// ---- A form whose outputs are quantized (the FP8 rewrite's casts fused into the stage that computes
// what they cast: fusebox/fp8_training.h). Output k of the form may be stored (its 16-bit tensor in
// memory) and may be quantized: y = fp8(v * scale) from the fp32 value v (as the reference reads an
// op's output inside a graph), in the form's layout (`flat`) and/or transposed against it (`tr`),
// with amax = max |v|. The elements go in 64 x 64 tiles over the layout's contiguous dim (x) and one
// other (y: the transposed copies' contiguous dim), 8 a thread both ways, as the quantize op's
// transposed kernel does; the other dims are batches.
constexpr int kTile8 = 64, kQRank = 8;

struct PqOut {
  bool on = false;  // output k is quantized
  unsigned char* flat = nullptr;
  unsigned char* tr = nullptr;
  const float* scale = nullptr;  // null: scale_value
  float scale_value = 1.f;
  unsigned* amax = nullptr;
  bool e5m2 = false;
};

struct PqShape {
  int rank = 0;
  int64_t dims[kQRank] = {};
  int64_t xs[kQRank] = {}, ts[kQRank] = {};  // the form's strides; the transposed copies'
  int inner_x = 0, inner_y = 0;
  int64_t batches = 1;
};

struct PqArgs {
  PwPointers q;  // the form's order; out[k] null: output k is not stored
  PqOut o[2];
  PqShape sh;
};

// 8 bytes at p: one 8-byte store (kVec: p 8-byte aligned), else byte by byte.
template <bool kVec>
__device__ __forceinline__ void store8_bytes(unsigned char* p, const uint2& b) {
  if constexpr (kVec) {
    *reinterpret_cast<uint2*>(p) = b;
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) p[k] = fp8_byte(b, k);
  }
}

template <class F, bool kHalf, bool kVec>
__global__ void __launch_bounds__(256) pointwise_quantize_kernel(PqArgs a) {
  static_assert(F::kOut <= 2, "PqArgs holds two quantized outputs");
  __shared__ unsigned char tile[F::kOut][kTile8][kTile8 + 1];
  float s[F::kOut], m[F::kOut];
#pragma unroll
  for (int k = 0; k < F::kOut; ++k) {
    s[k] = a.o[k].scale ? *a.o[k].scale : a.o[k].scale_value;
    m[k] = 0.f;
  }
  const PqShape& q = a.sh;
  const int64_t ny = q.dims[q.inner_y], nx = q.dims[q.inner_x];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile8,
                i0 = static_cast<int64_t>(blockIdx.y) * kTile8;
  const int64_t sxj = q.xs[q.inner_y], syi = q.ts[q.inner_x];
  for (int64_t b = blockIdx.z; b < q.batches; b += gridDim.z) {
    int64_t xo = 0, to = 0;
    for (int64_t k = q.rank - 1, rem = b; k >= 0; --k) {
      if (k == q.inner_x || k == q.inner_y) continue;
      const int64_t i = rem % q.dims[k];
      rem /= q.dims[k];
      xo += i * q.xs[k];
      to += i * q.ts[k];
    }
    // Read: tile row r is the form's row j0 + r, 8 chunks of 8 along its contiguous dim.
    for (int e = threadIdx.x; e < kTile8 * 8; e += blockDim.x) {
      const int r = e / 8, c = (e % 8) * 8;
      const int64_t j = j0 + r, i = i0 + c;
      uint2 bytes[F::kOut];
#pragma unroll
      for (int k = 0; k < F::kOut; ++k) bytes[k] = make_uint2(0, 0);
      if (j < ny && i < nx) {
        const int64_t at = xo + i + j * sxj;
        uint4 in[F::kIn];
#pragma unroll
        for (int t = 0; t < F::kIn; ++t) in[t] = load8<kVec>(static_cast<const uint16_t*>(a.q.in[t]) + at, 8);
        float v[F::kOut][8];
#pragma unroll
        for (int jj = 0; jj < 8; ++jj) {
          float reg[F::kRegs];
#pragma unroll
          for (int t = 0; t < F::kIn; ++t) reg[t] = value<kHalf>(in[t], jj);
          F::run(reg);
#pragma unroll
          for (int k = 0; k < F::kOut; ++k) v[k][jj] = reg[(F::kOuts >> (8 * k)) & 0xffu];
        }
#pragma unroll
        for (int k = 0; k < F::kOut; ++k) {
          if (a.q.out[k]) {
            uint32_t bits[8];
#pragma unroll
            for (int jj = 0; jj < 8; ++jj) bits[jj] = float_to_bits<kHalf>(v[k][jj]);
            auto* dst = static_cast<uint16_t*>(a.q.out[k]) + at;
            if constexpr (kVec) {
              *reinterpret_cast<uint4*>(dst) = pack8(bits);
            } else {
#pragma unroll
              for (int jj = 0; jj < 8; ++jj) dst[jj] = static_cast<uint16_t>(bits[jj]);
            }
          }
          if (!a.o[k].on) continue;
          bytes[k] = fp8x8(v[k], s[k], a.o[k].e5m2, m[k]);
          if (a.o[k].flat) store8_bytes<kVec>(a.o[k].flat + at, bytes[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < F::kOut; ++k)
#pragma unroll
        for (int t = 0; t < 8; ++t) tile[k][r][c + t] = fp8_byte(bytes[k], t);
    }
    __syncthreads();
    // Write: each transposed copy's row i0 + r (the form's column), 8 chunks of 8 along its
    // contiguous dim.
    for (int e = threadIdx.x; e < kTile8 * 8; e += blockDim.x) {
      const int r = e / 8, c = (e % 8) * 8;
      const int64_t i = i0 + r, j = j0 + c;
      if (i >= nx || j >= ny) continue;
#pragma unroll
      for (int k = 0; k < F::kOut; ++k) {
        if (!a.o[k].tr) continue;
        uint32_t lo = 0, hi = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          lo |= static_cast<uint32_t>(tile[k][c + t][r]) << (8 * t);
          hi |= static_cast<uint32_t>(tile[k][c + 4 + t][r]) << (8 * t);
        }
        store8_bytes<kVec>(a.o[k].tr + to + j + i * syi, make_uint2(lo, hi));
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < F::kOut; ++k) {
    if (a.o[k].amax) block_amax(m[k], a.o[k].amax);
    __syncthreads();
  }
}

using QuantLaunch = void (*)(const PqArgs&, dim3, bool, cudaStream_t);
template <class F, bool kHalf>
void launch_quantized(const PqArgs& a, dim3 grid, bool vec, cudaStream_t stream) {
  if (vec) {
    pointwise_quantize_kernel<F, kHalf, true><<<grid, 256, 0, stream>>>(a);
  } else {
    pointwise_quantize_kernel<F, kHalf, false><<<grid, 256, 0, stream>>>(a);
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
  QuantLaunch quantized_bf16, quantized_fp16;
  // Whether the form runs a graph without quantize ops too (a lone sum stays cuDNN's, as fast).
  bool plain;
};
template <class F>
constexpr FormEntry form_entry(const char* name, bool plain = true) {
  return {name,
          &F::program,
          &launch_form<F, false>,
          &launch_form<F, true>,
          &launch_quantized<F, false>,
          &launch_quantized<F, true>,
          plain};
}
const FormEntry kForms[] = {
    form_entry<GluForward<PM::kSilu>>("swiglu"),
    form_entry<GluBackward<PM::kSilu, PM::kSiluBwd>>("swiglu_bwd"),
    form_entry<GluForward<PM::kGeluTanh>>("geglu_tanh"),
    form_entry<GluBackward<PM::kGeluTanh, PM::kGeluTanhBwd>>("geglu_tanh_bwd"),
    form_entry<GluForward<PM::kGeluErf>>("geglu_erf"),
    form_entry<GluBackward<PM::kGeluErf, PM::kGeluErfBwd>>("geglu_erf_bwd"),
    // y = a + b: the backward's sum of a buffer's two gradients, quantized for the GEMMs after it.
    form_entry<Form<2, 1, 2, instr(PM::kAdd, 2, 0, 1)>>("add", false),
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
// `quantized`: for a graph whose outputs quantize ops cast (every form), else the plain forms.
int match_form(const PwProgram& p, uint8_t (&in_perm)[kMaxTensors], uint8_t (&out_perm)[kMaxTensors],
               bool quantized) {
  if (p.n_const != 0) return -1;
  for (int i = 0; i < p.n_in; ++i)
    if (p.in_single[i]) return -1;
  for (int fi = 0; fi < static_cast<int>(std::size(kForms)); ++fi) {
    if (!quantized && !kForms[fi].plain) continue;
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

}  // namespace

namespace {

// A program over the pointwise ops `ops` of `g` (at most 16), its tensors and their layout.
// `taps`: tensors written by those ops that another op of the graph reads (a quantize op's x); each
// is an output of the program, stored where it is in memory, kept in registers where virtual.
struct PwBuild {
  PwProgram p;
  int64_t n = 0;                                  // elements of the graph's full shape
  std::vector<int> in_tensors, out_tensors;       // by input, and by output, of the program
  const std::vector<int64_t>* dims = nullptr;     // the full shape
  const std::vector<int64_t>* strides = nullptr;  // the layout every full tensor in memory shares
};

bool build_program(const ResolvedGraph& g, const std::vector<const ResolvedOp*>& ops,
                   const std::set<int>& taps, PwBuild& b) {
  if (ops.empty() || ops.size() > static_cast<size_t>(kMaxOps) || g.intermediate_dtype != DType::kFP32)
    return false;
  std::set<int> read_by_op;  // tensors some op of the program reads
  for (const ResolvedOp* op : ops) {
    if (!std::visit([](const auto& a) { return mode_of(a).has_value(); }, op->attrs)) return false;
    for (const auto& [role, t] : op->inputs) read_by_op.insert(t);
  }
  PwProgram& p = b.p;
  // The layout every full tensor shares: the first op's output's dims; the first full tensor in
  // memory's strides.
  b.dims = &g.tensors[static_cast<size_t>(ops[0]->outputs.at("y"))].dims;
  const std::vector<int64_t>& dims = *b.dims;
  std::map<int, int> reg_of;  // tensor index -> register
  std::vector<int> scalars;
  auto full_ok = [&](const ResolvedTensor& t) {
    if (t.dims != dims) return false;
    if (t.is_virtual) return true;
    if (!dense(t) || t.dims.empty()) return false;
    if (!b.strides) b.strides = &t.strides;
    return t.strides == *b.strides;
  };
  std::set<int> written;
  for (const ResolvedOp* op : ops)
    for (const auto& [role, t] : op->outputs) written.insert(t);
  // The tensors read: in memory (full or single), or by-value scalars.
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    const ResolvedTensor& t = g.tensors[i];
    if (t.is_virtual || written.count(static_cast<int>(i)) || !read_by_op.count(static_cast<int>(i)))
      continue;
    if (!t.values.empty()) return false;
    if (t.scalar_value) {
      scalars.push_back(static_cast<int>(i));
      continue;
    }
    if (t.dtype != DType::kBF16 && t.dtype != DType::kFP16 && t.dtype != DType::kFP32) return false;
    const bool single = t.element_count() == 1;
    if (!single && !full_ok(t)) return false;
    if (p.n_in == kMaxTensors) return false;
    p.in_dtype[p.n_in] = static_cast<int>(t.dtype);
    p.in_single[p.n_in] = single;
    reg_of[static_cast<int>(i)] = p.n_in++;
    b.in_tensors.push_back(static_cast<int>(i));
  }
  if (scalars.size() > static_cast<size_t>(kMaxTensors)) return false;
  for (int t : scalars) {
    reg_of[t] = p.n_in + p.n_const;
    p.konst[p.n_const++] = static_cast<float>(*g.tensors[static_cast<size_t>(t)].scalar_value);
  }
  int next = p.n_in + p.n_const;
  for (const ResolvedOp* op : ops) {
    const PointwiseMode mode = *std::visit([](const auto& a) { return mode_of(a); }, op->attrs);
    const int y = op->outputs.at("y");
    const ResolvedTensor& yt = g.tensors[static_cast<size_t>(y)];
    if (!full_ok(yt)) return false;
    PwInstr& ins = p.ops[p.n_ops++];
    ins.mode = static_cast<uint8_t>(mode);
    const auto roles = op_input_roles(op->attrs);
    if (roles.empty() || roles.size() > 2) return false;
    for (size_t r = 0; r < roles.size(); ++r) {
      auto it = op->inputs.find(std::string(roles[r]));
      if (it == op->inputs.end()) return false;
      auto reg = reg_of.find(it->second);
      if (reg == reg_of.end()) return false;  // an op's output read before it is written
      (r == 0 ? ins.a : ins.b) = static_cast<uint8_t>(reg->second);
    }
    if (roles.size() == 1) ins.b = ins.a;
    ins.dst = static_cast<uint8_t>(next);
    reg_of[y] = next++;
    if (!yt.is_virtual || taps.count(y)) {
      // An output another op reads would be read at fp32 here and at its own dtype by the reference.
      if (read_by_op.count(y) || p.n_out == kMaxTensors) return false;
      if (yt.dtype != DType::kBF16 && yt.dtype != DType::kFP16 && yt.dtype != DType::kFP32) return false;
      p.out_dtype[p.n_out] = static_cast<int>(yt.dtype);
      p.out_reg[p.n_out++] = static_cast<uint8_t>(reg_of[y]);
      b.out_tensors.push_back(y);
    }
  }
  if (p.n_out == 0 || p.n_in + p.n_out > kMaxTensors || !b.strides) return false;
  b.n = g.tensors[static_cast<size_t>(b.out_tensors[0])].element_count();
  return true;
}

// Whether every tensor of the program in memory is of one 16-bit dtype (`half`: fp16) and the
// element count a multiple of 8: what a compiled form takes.
bool one_16bit(const ResolvedGraph& g, const PwBuild& b, bool* half) {
  const int dt = b.p.in_dtype[0];
  bool ok = dt == static_cast<int>(DType::kBF16) || dt == static_cast<int>(DType::kFP16);
  for (int i = 0; i < b.p.n_in; ++i) ok = ok && b.p.in_dtype[i] == dt;
  for (int k = 0; k < b.p.n_out; ++k)
    ok = ok && (g.tensors[static_cast<size_t>(b.out_tensors[static_cast<size_t>(k)])].is_virtual ||
                b.p.out_dtype[k] == dt);
  *half = dt == static_cast<int>(DType::kFP16);
  return ok && b.n % 8 == 0;
}

}  // namespace

std::shared_ptr<const NativeKernel> make_pointwise_graph_kernel(const ResolvedGraph& g) {
  std::vector<const ResolvedOp*> ops;
  for (const ResolvedOp& op : g.ops) ops.push_back(&op);
  PwBuild b;
  if (!build_program(g, ops, {}, b)) return nullptr;
  auto k = std::make_shared<PointwiseGraphKernel>();
  k->program_ = b.p;
  k->name_ = "fusebox_pointwise";
  k->where_ = "[graph '" + g.name + "']";
  k->n_ = b.n;
  // A compiled form: every tensor in memory of one 16-bit dtype, whole vectors of 8.
  if (one_16bit(g, b, &k->half_)) k->form_ = match_form(b.p, k->in_perm_, k->out_perm_, false);
  for (int t : b.in_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  for (int t : b.out_tensors) k->tensors_.push_back(g.tensors[static_cast<size_t>(t)].name);
  return k;
}

const char* pointwise_form_name(const NativeKernel& k) {
  const auto* pk = dynamic_cast<const PointwiseGraphKernel*>(&k);
  return pk && pk->form_ >= 0 ? kForms[pk->form_].name : nullptr;
}

}  // namespace fusebox::kernels

namespace fusebox::kernels {
namespace {

class PointwiseQuantizeKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream_ptr) const override {
    const auto stream = static_cast<cudaStream_t>(stream_ptr);
    PqArgs a = args_;
    int p = 0;
    bool aligned = true;
    auto at16 = [&](const void* q) { aligned = aligned && reinterpret_cast<uintptr_t>(q) % 16 == 0; };
    auto at8 = [&](const void* q) { aligned = aligned && reinterpret_cast<uintptr_t>(q) % 8 == 0; };
    for (int i = 0; i < n_in_; ++i) at16(a.q.in[in_perm_[i]] = ptrs[p++]);
    for (int k = 0; k < n_out_; ++k)
      if (stored_[k]) at16(a.q.out[out_perm_[k]] = ptrs[p++]);
    for (const Cast& c : casts_) {
      PqOut& o = a.o[c.out];
      if (!c.scale_by_value) o.scale = static_cast<const float*>(ptrs[p++]);
      for (int w = 0; w < 3; ++w) {  // y, amax, y2 as declared
        if (c.ptr_of[w] == Cast::kNone) continue;
        void* ptr = ptrs[p++];
        if (c.ptr_of[w] == Cast::kAmax) {
          o.amax = static_cast<unsigned*>(ptr);
          const cudaError_t e = cudaMemsetAsync(ptr, 0, sizeof(float), stream);
          if (e != cudaSuccess) return common::cuda_status(e, where_, " amax reset");
        } else {
          at8(ptr);
          (c.ptr_of[w] == Cast::kFlat ? o.flat : o.tr) = static_cast<unsigned char*>(ptr);
        }
      }
    }
    if (n_ == 0) return Status::Ok();
    const PqShape& q = a.sh;
    const dim3 grid(static_cast<unsigned>((q.dims[q.inner_y] + kTile8 - 1) / kTile8),
                    static_cast<unsigned>((q.dims[q.inner_x] + kTile8 - 1) / kTile8),
                    static_cast<unsigned>(std::min<int64_t>(q.batches, 65535)));
    const FormEntry& f = kForms[form_];
    (half_ ? f.quantized_fp16 : f.quantized_bf16)(a, grid, vec_shape_ && aligned, stream);
    return common::cuda_status(cudaGetLastError(), where_, " pointwise quantize kernel launch");
  }

  // A quantize op: the form's output it casts, and what each of its pointers (y, amax, y2, in the
  // launch order after its scale) is.
  struct Cast {
    enum Ptr { kNone, kFlat, kTr, kAmax };
    int out = 0;
    bool scale_by_value = false;
    Ptr ptr_of[3] = {kNone, kNone, kNone};
  };
  PqArgs args_;
  std::vector<Cast> casts_;
  int form_ = -1, n_in_ = 0, n_out_ = 0;
  bool half_ = false, vec_shape_ = false;
  bool stored_[kMaxTensors] = {};
  uint8_t in_perm_[kMaxTensors] = {}, out_perm_[kMaxTensors] = {};
  int64_t n_ = 0;
};

bool is_quantize(const ResolvedOp& op) { return std::holds_alternative<QuantizeAttrs>(op.attrs); }

}  // namespace

std::shared_ptr<const NativeKernel> make_pointwise_quantize_kernel(const ResolvedGraph& g) {
  std::vector<const ResolvedOp*> pw, qs;
  for (const ResolvedOp& op : g.ops) (is_quantize(op) ? qs : pw).push_back(&op);
  if (pw.empty() || qs.empty()) return nullptr;
  std::set<int> taps;
  for (const ResolvedOp* q : qs) taps.insert(q->inputs.at("x"));
  if (taps.size() != qs.size()) return nullptr;  // two casts of one output
  PwBuild b;
  if (!build_program(g, pw, taps, b)) return nullptr;
  auto k = std::make_shared<PointwiseQuantizeKernel>();
  if (!one_16bit(g, b, &k->half_)) return nullptr;
  k->form_ = match_form(b.p, k->in_perm_, k->out_perm_, true);
  if (k->form_ < 0) return nullptr;
  k->n_in_ = b.p.n_in;
  k->n_out_ = b.p.n_out;
  k->n_ = b.n;
  PqShape& sh = k->args_.sh;
  const std::vector<int64_t>& dims = *b.dims;
  if (dims.size() < 2 || dims.size() > static_cast<size_t>(kQRank)) return nullptr;
  sh.rank = static_cast<int>(dims.size());
  sh.inner_x = -1;
  for (int d = 0; d < sh.rank; ++d) {
    sh.dims[d] = dims[static_cast<size_t>(d)];
    sh.xs[d] = (*b.strides)[static_cast<size_t>(d)];
    if (sh.xs[d] == 1 && sh.dims[d] > 1 && sh.inner_x < 0) sh.inner_x = d;
  }
  if (sh.inner_x < 0) return nullptr;
  const std::vector<int64_t>* ts = nullptr;  // the transposed copies' strides (all alike)
  int inner_t = -1;
  std::vector<std::string> names;
  for (int t : b.in_tensors) names.push_back(g.tensors[static_cast<size_t>(t)].name);
  for (size_t i = 0; i < b.out_tensors.size(); ++i) {
    const ResolvedTensor& t = g.tensors[static_cast<size_t>(b.out_tensors[i])];
    k->stored_[i] = !t.is_virtual;
    if (!t.is_virtual) names.push_back(t.name);
  }
  bool used[kMaxTensors] = {};
  for (const ResolvedOp* q : qs) {
    using C = PointwiseQuantizeKernel::Cast;
    C c;
    const int x = q->inputs.at("x");
    const int kp =
        static_cast<int>(std::find(b.out_tensors.begin(), b.out_tensors.end(), x) - b.out_tensors.begin());
    if (kp >= b.p.n_out) return nullptr;
    c.out = k->out_perm_[kp];
    if (c.out >= 2 || used[c.out]) return nullptr;
    used[c.out] = true;
    PqOut& o = k->args_.o[c.out];
    o.on = true;
    const ResolvedTensor& s = g.tensors[static_cast<size_t>(q->inputs.at("scale"))];
    c.scale_by_value = s.scalar_value.has_value();
    if (c.scale_by_value) {
      o.scale_value = static_cast<float>(*s.scalar_value);
    } else {
      if (s.is_virtual || s.element_count() != 1 || s.dtype != DType::kFP32) return nullptr;
      names.push_back(s.name);
    }
    int w = 0;
    bool flat = false, tr = false;  // one copy of each layout a cast
    for (const char* role : {"y", "amax", "y2"}) {
      auto it = q->outputs.find(role);
      if (it == q->outputs.end()) continue;
      const ResolvedTensor& t = g.tensors[static_cast<size_t>(it->second)];
      if (t.is_virtual) return nullptr;
      names.push_back(t.name);
      if (std::string(role) == "amax") {
        c.ptr_of[w++] = C::kAmax;
        continue;
      }
      o.e5m2 = t.dtype == DType::kFP8E5M2;
      if (t.strides == *b.strides && !flat) {
        flat = true;
        c.ptr_of[w++] = C::kFlat;
        continue;
      }
      const int cy = contiguous_dim(t);
      if (tr || !dense(t) || cy < 0 || cy == sh.inner_x || (ts && t.strides != *ts)) return nullptr;
      tr = true;
      ts = &t.strides;
      inner_t = cy;
      c.ptr_of[w++] = C::kTr;
    }
    k->casts_.push_back(c);
  }
  // The tile's second dim: the transposed copies' contiguous one; without any, the form's dim of
  // extent > 1 with the next-smallest stride (or any other).
  sh.inner_y = inner_t;
  if (sh.inner_y < 0) {
    for (int d = 0; d < sh.rank; ++d)
      if (d != sh.inner_x && sh.dims[d] > 1 && (sh.inner_y < 0 || sh.xs[d] < sh.xs[sh.inner_y]))
        sh.inner_y = d;
    if (sh.inner_y < 0) sh.inner_y = sh.inner_x == 0 ? 1 : 0;
  }
  for (int d = 0; d < sh.rank; ++d) sh.ts[d] = ts ? (*ts)[static_cast<size_t>(d)] : sh.xs[d];
  // Chunks of 8 whole along the contiguous dims; 16- and 8-byte accesses where every other stride
  // is a multiple of 8 too (the launch checks the pointers).
  if (sh.dims[sh.inner_x] % 8 != 0 || (ts && sh.dims[sh.inner_y] % 8 != 0)) return nullptr;
  k->vec_shape_ = true;
  for (int d = 0; d < sh.rank; ++d) {
    if (d != sh.inner_x && sh.xs[d] % 8 != 0) k->vec_shape_ = false;
    if (ts && d != sh.inner_y && sh.ts[d] % 8 != 0) k->vec_shape_ = false;
  }
  sh.batches = b.n / (sh.dims[sh.inner_x] * sh.dims[sh.inner_y]);
  k->name_ = "fusebox_pointwise_quantize";
  k->where_ = "[graph '" + g.name + "']";
  k->tensors_ = std::move(names);
  return k;
}

}  // namespace fusebox::kernels
