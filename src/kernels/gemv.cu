// fusebox kernels layer: a matmul of a few rows (gemv.h). It is bound by reading the weights once:
// each load takes 16 bytes (8 columns of one row of w). A block of 256 threads takes 8 x CT
// columns: CT column threads by 256 / CT row slices, slice s summing every (256 / CT)-th chunk of
// 8 rows of K from chunk s on, 8 weight rows in flight a thread. The slices' sums meet by warp
// shuffles, then in shared memory in a fixed order (the result does not depend on timing), where
// the epilogue runs once per output value, in fp32, before the one rounding to y's dtype. With an
// RMSNorm before the matmul (the prologue), each value of a is multiplied by its gain as it is
// loaded, and the sums of squares of a's rows travel with the products: y = inv_rms(a) x
// ((a * scale) w), the normalized a never stored (fp32, as the graph's virtual tensor).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/cuda_status.h"
#include "common/op_where.h"
#include "common/pointwise_math.cuh"
#include "dtype_access.cuh"
#include "gemv.h"
#include "kernel_base.h"
#include "packed16.cuh"

namespace fusebox::kernels {

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32, kMaxRows = 8;
constexpr int kSmemFloats = 8192;  // kWarps x rows x 8 CT: rows x CT <= 128
constexpr int64_t kMinWeights = int64_t{1} << 20;
// At most 2^26 weights (128 MB in bf16): where cuDNN was measured slow. Its engines read the 1B
// model's 2048 x 128256 LM head (525 MB) at one row in 124 us on the H200, near the copy peak.
constexpr int64_t kMaxWeights = int64_t{1} << 26;
constexpr int64_t kMinColumns = 256;  // 16 blocks at least: the kernel does not split K across blocks
// Pinned (the serving engine's deterministic mode): up to 256 rows, in block rows of 8, and weights
// of any size: slower than cuDNN there, but a row's values do not depend on the other rows.
constexpr int64_t kMaxPinnedRows = 256;

using EpiKind = GemvEpi;

struct GemvArgs : FewRowShape {
  const void* a = nullptr;
  const void* w = nullptr;
  const void* w2 = nullptr;     // the gated epilogue's second weight (w's shape and strides), else null
  const void* e = nullptr;      // the epilogue's tensor (add, sub, mul), else null
  const void* scale = nullptr;  // the RMSNorm prologue's gain [K], else null
  void* y = nullptr;
  int ct = 2;  // column threads a block, 8 columns each: a power of two, 2 to 16
  int scale_dtype = 0;
  float epsilon = 0.f;  // the prologue's
};

// kM rows at most a block (the real count is p.m; block row blockIdx.y takes rows from
// blockIdx.y x kM on, where more than 8 rows run pinned), a and w fp16 (kHalf) or bf16, kVec:
// 16-byte loads, kGate: the gated epilogue (two products, kM <= 4: their sums share `sm`). A row's
// values do not depend on kM or on its block row: each is summed in the same order whatever the
// other rows.
template <int kM, bool kHalf, bool kVec, bool kGate>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs p) {
  static_assert(!kGate || kM <= 4, "the gated form's two sets of sums fill sm at 4 rows");
  __shared__ float sm[kSmemFloats];
  __shared__ float sm_sq[kWarps][kM];  // the prologue's sums of squares, per warp and row
  const bool norm = p.scale != nullptr;
  const int ct_n = p.ct, slices = kThreads / ct_n;
  const int tid = threadIdx.x, ct = tid % ct_n, slice = tid / ct_n;
  const int64_t col0 = (static_cast<int64_t>(blockIdx.x) * ct_n + ct) * 8;
  const int64_t cols_in = col0 < p.n ? (p.n - col0 < 8 ? p.n - col0 : 8) : 0;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kM;
  const int64_t rows = p.m - row0 < kM ? p.m - row0 : kM;
  const auto* a = static_cast<const uint16_t*>(p.a) + row0 * p.lda;
  const auto* w = static_cast<const uint16_t*>(p.w);
  const auto* w2 = static_cast<const uint16_t*>(p.w2);
  constexpr int kM2 = kGate ? kM : 1;  // the second product's rows (none without the gate)
  float acc[kM][8], acc2[kM2][8], sq[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    sq[m] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
  }
#pragma unroll
  for (int m = 0; m < kM2; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc2[m][j] = 0.f;

  // kU chunks of 8 rows in flight a thread (two where the registers allow: 1 or 2 rows and one
  // weight). Chunk q is summed before chunk q + slices whatever kU, so a row's sums do not depend
  // on kM, and the gated form's first product is summed as the plain form sums it.
  constexpr int kU = kM <= 2 && !kGate ? 2 : 1;
  const int64_t chunks = (p.k + 7) / 8;
  for (int64_t q0 = slice; q0 < chunks; q0 += kU * slices) {
    uint4 wv[kU][8], wv2[kU][kGate ? 8 : 1], av[kU][kM];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t q = q0 + u * slices, k0 = q * 8;
      const int64_t rows_in = q < chunks ? (p.k - k0 < 8 ? p.k - k0 : 8) : 0;
#pragma unroll
      for (int r = 0; r < 8; ++r)
        wv[u][r] = cols_in > 0 && r < rows_in ? load8<kVec>(w + (k0 + r) * p.ldw + col0, cols_in)
                                              : make_uint4(0, 0, 0, 0);
      if constexpr (kGate) {
#pragma unroll
        for (int r = 0; r < 8; ++r)
          wv2[u][r] = cols_in > 0 && r < rows_in ? load8<kVec>(w2 + (k0 + r) * p.ldw + col0, cols_in)
                                                 : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int m = 0; m < kM; ++m)
        av[u][m] =
            m < rows && rows_in > 0 ? load8<kVec>(a + m * p.lda + k0, rows_in) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t q = q0 + u * slices, k0 = q * 8;
      if (q >= chunks) break;
      const int64_t rows_in = p.k - k0 < 8 ? p.k - k0 : 8;
      float gain[8];
#pragma unroll
      for (int r = 0; r < 8; ++r)
        gain[r] = norm && r < rows_in ? load_as_float(p.scale, p.scale_dtype, k0 + r) : 1.f;
#pragma unroll
      for (int r = 0; r < 8; ++r) {
        float wr[8], wr2[kGate ? 8 : 1];
#pragma unroll
        for (int j = 0; j < 8; ++j) wr[j] = value<kHalf>(wv[u][r], j);
        if constexpr (kGate) {
#pragma unroll
          for (int j = 0; j < 8; ++j) wr2[j] = value<kHalf>(wv2[u][r], j);
        }
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          float x = value<kHalf>(av[u][m], r);
          if (norm) sq[m] = fmaf(x, x, sq[m]);
          x *= gain[r];
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[m][j] = fmaf(x, wr[j], acc[m][j]);
          if constexpr (kGate) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc2[m][j] = fmaf(x, wr2[j], acc2[m][j]);
          }
        }
      }
    }
  }

  // The slices of one warp (lanes ct, ct + CT, ...), then the warps, in a fixed order.
  const int lane = tid % 32, warp = tid / 32, cols = ct_n * 8;
  for (int o = ct_n; o < 32; o *= 2)
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (norm) sq[m] += __shfl_xor_sync(0xffffffffu, sq[m], o);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[m][j] += __shfl_xor_sync(0xffffffffu, acc[m][j], o);
      if constexpr (kGate) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc2[m][j] += __shfl_xor_sync(0xffffffffu, acc2[m][j], o);
      }
    }
  constexpr int kSecond = kSmemFloats / 2;  // where the gated form's second sums start
  if (lane < ct_n) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (lane == 0) sm_sq[warp][m] = sq[m];  // every slice's rows once: the warp's column thread 0
#pragma unroll
      for (int j = 0; j < 8; ++j) sm[(warp * kM + m) * cols + ct * 8 + j] = acc[m][j];
      if constexpr (kGate) {
#pragma unroll
        for (int j = 0; j < 8; ++j) sm[kSecond + (warp * kM + m) * cols + ct * 8 + j] = acc2[m][j];
      }
    }
  }
  __syncthreads();
  for (int idx = tid; idx < kM * cols; idx += kThreads) {
    const int m = idx / cols, cc = idx % cols;
    const int64_t col = static_cast<int64_t>(blockIdx.x) * cols + cc;
    if (m >= rows || col >= p.n) continue;
    float z = 0.f, z2 = 0.f, ss = 0.f;
    for (int v = 0; v < kWarps; ++v) {
      z += sm[(v * kM + m) * cols + cc];
      if constexpr (kGate) z2 += sm[kSecond + (v * kM + m) * cols + cc];
      ss += sm_sq[v][m];
    }
    if (norm) {
      const float inv = 1.f / sqrtf(ss / static_cast<float>(p.k) + p.epsilon);
      z *= inv;
      z2 *= inv;
    }
    if (kGate) {
      z = common::pointwise_apply(p.mode, z, 0.f) * z2;
    } else if (p.epi == EpiKind::kUnary) {
      z = common::pointwise_apply(p.mode, z, 0.f);
    } else if (p.epi == EpiKind::kBinary) {
      const float e = load_as_float(p.e, p.e_dtype, (row0 + m) * p.lde + col);
      z = p.product_second ? common::pointwise_apply(p.mode, e, z) : common::pointwise_apply(p.mode, z, e);
    }
    store_from_float(p.y, p.y_dtype, (row0 + m) * p.ldy + col, z);
  }
}

template <int kM, bool kHalf, bool kGate>
void launch_rows(bool vec, dim3 grid, cudaStream_t st, const GemvArgs& p) {
  if (vec) {
    gemv_kernel<kM, kHalf, true, kGate><<<grid, kThreads, 0, st>>>(p);
  } else {
    gemv_kernel<kM, kHalf, false, kGate><<<grid, kThreads, 0, st>>>(p);
  }
}

template <bool kHalf, bool kGate>
void launch_dtype(int rows, bool vec, dim3 grid, cudaStream_t st, const GemvArgs& p) {
  switch (rows) {  // the builder rounds M up to 1, 2, 4 or 8 (4 gated; more rows: block rows)
    case 1:
      launch_rows<1, kHalf, kGate>(vec, grid, st, p);
      break;
    case 2:
      launch_rows<2, kHalf, kGate>(vec, grid, st, p);
      break;
    case 4:
      launch_rows<4, kHalf, kGate>(vec, grid, st, p);
      break;
    default:
      if constexpr (!kGate) launch_rows<8, kHalf, false>(vec, grid, st, p);
      break;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

class GemvKernel final : public KernelBase {
 public:
  Status launch(void* const* ptrs, void* stream) const override {
    GemvArgs p = args_;
    size_t i = 0;
    p.a = ptrs[i++];
    if (norm_) p.scale = ptrs[i++];
    p.w = ptrs[i++];
    if (p.epi == EpiKind::kGated) p.w2 = ptrs[i++];
    if (p.epi == EpiKind::kBinary) p.e = ptrs[i++];
    p.y = ptrs[i];
    const auto st = static_cast<cudaStream_t>(stream);
    const bool vec = vec_shapes_ && aligned16(p.a) && aligned16(p.w) && (!p.w2 || aligned16(p.w2));
    const dim3 grid(grid_, row_blocks_);
    const bool gated = p.epi == EpiKind::kGated;
    if (half_ && gated) {
      launch_dtype<true, true>(rows_, vec, grid, st, p);
    } else if (half_) {
      launch_dtype<true, false>(rows_, vec, grid, st, p);
    } else if (gated) {
      launch_dtype<false, true>(rows_, vec, grid, st, p);
    } else {
      launch_dtype<false, false>(rows_, vec, grid, st, p);
    }
    return common::cuda_status(cudaGetLastError(), where_, " few-row matmul kernel launch");
  }

  GemvArgs args_;
  int rows_ = 1;  // M rounded up to a power of two, at most kMaxRows
  unsigned grid_ = 1, row_blocks_ = 1;
  bool half_ = false, vec_shapes_ = false, norm_ = false;
};

// The epilogue a pointwise op makes, by overload: none for any other op.
struct Epilogue {
  EpiKind kind = EpiKind::kNone;
  PointwiseMode mode = PointwiseMode::kAdd;
};
template <typename A>
std::optional<Epilogue> epilogue_of(const A&) {
  return std::nullopt;
}
std::optional<Epilogue> epilogue_of(const PointwiseAttrs& a) {
  switch (a.mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
      return Epilogue{EpiKind::kBinary, a.mode};
    case PointwiseMode::kRelu:
    case PointwiseMode::kSilu:
    case PointwiseMode::kSigmoid:
    case PointwiseMode::kTanh:
    case PointwiseMode::kGeluTanh:
    case PointwiseMode::kGeluErf:
      return Epilogue{EpiKind::kUnary, a.mode};
    default:
      return std::nullopt;
  }
}

// The op of a graph's first two, by overload.
template <typename A>
const RmsNormAttrs* as_rmsnorm(const A&) {
  return nullptr;
}
const RmsNormAttrs* as_rmsnorm(const RmsNormAttrs& a) { return &a; }
template <typename A>
bool is_matmul(const A&) {
  return false;
}
bool is_matmul(const MatmulAttrs&) { return true; }

// The gated form's ops after the prologue, in whatever order the graph keeps them: two matmuls of
// the same a, a unary op of the first one's product (the gate) and a mul of that with the second
// one's product (the up projection), every intermediate virtual. Null when `g` is not that form.
struct GatedOps {
  size_t gate = 0, up = 0, mul = 0;
  PointwiseMode mode = PointwiseMode::kSilu;
};
std::optional<GatedOps> gated_ops(const ResolvedGraph& g, size_t from) {
  if (g.ops.size() != from + 4) return std::nullopt;
  std::vector<size_t> mms;
  std::optional<size_t> act, mul;
  GatedOps r;
  for (size_t i = from; i < g.ops.size(); ++i) {
    const auto& attrs = g.ops[i].attrs;
    if (std::visit([](const auto& x) { return is_matmul(x); }, attrs)) {
      mms.push_back(i);
      continue;
    }
    const auto e = std::visit([](const auto& x) { return epilogue_of(x); }, attrs);
    if (e && e->kind == EpiKind::kUnary && !act) {
      act = i;
      r.mode = e->mode;
    } else if (e && e->kind == EpiKind::kBinary && e->mode == PointwiseMode::kMul && !mul) {
      mul = i;
    } else {
      return std::nullopt;
    }
  }
  if (mms.size() != 2 || !act || !mul) return std::nullopt;
  const ResolvedOp &A = g.ops[*act], &M = g.ops[*mul];
  if (A.inputs.size() != 1 || A.outputs.size() != 1 || M.inputs.size() != 2 || M.outputs.size() != 1 ||
      A.compute_dtype != DType::kFP32 || M.compute_dtype != DType::kFP32)
    return std::nullopt;
  auto product = [&](size_t i) {
    const auto it = g.ops[i].outputs.find("y");
    return it == g.ops[i].outputs.end() || g.ops[i].outputs.size() != 1 ? -1 : it->second;
  };
  const int act_in = A.inputs.begin()->second, act_out = A.outputs.begin()->second;
  if (product(mms[0]) == act_in) {
    r.gate = mms[0];
    r.up = mms[1];
  } else if (product(mms[1]) == act_in) {
    r.gate = mms[1];
    r.up = mms[0];
  } else {
    return std::nullopt;
  }
  const int z2 = product(r.up);
  const auto ia = M.inputs.find("a"), ib = M.inputs.find("b");
  if (z2 < 0 || ia == M.inputs.end() || ib == M.inputs.end() ||
      !((ia->second == act_out && ib->second == z2) || (ia->second == z2 && ib->second == act_out)))
    return std::nullopt;
  const auto ga = g.ops[r.gate].inputs.find("a"), ua = g.ops[r.up].inputs.find("a");
  if (ga == g.ops[r.gate].inputs.end() || ua == g.ops[r.up].inputs.end() || ga->second != ua->second)
    return std::nullopt;
  for (int t : {act_in, act_out, z2})
    if (!g.tensors[static_cast<size_t>(t)].is_virtual) return std::nullopt;
  r.mul = *mul;
  return r;
}

bool is_16bit(DType t) { return t == DType::kBF16 || t == DType::kFP16; }
bool is_float_io(DType t) { return is_16bit(t) || t == DType::kFP32; }

// [1..., rows, cols] with the last dim of stride 1: its row stride, or 0 when it is not that form.
int64_t row_stride(const ResolvedTensor& t, int64_t rows, int64_t cols) {
  const size_t r = t.dims.size();
  if (r < 3 || t.dims[r - 2] != rows || t.dims[r - 1] != cols || t.strides[r - 1] != 1) return 0;
  for (size_t i = 0; i + 2 < r; ++i)
    if (t.dims[i] != 1) return 0;
  return rows == 1 ? std::max<int64_t>(t.strides[r - 2], cols) : t.strides[r - 2];
}

}  // namespace

std::optional<GemvForm> match_gemv_form(const ResolvedGraph& g) {
  if (g.ops.empty() || g.ops.size() > 5 || g.compute_dtype != DType::kFP32 ||
      g.intermediate_dtype != DType::kFP32)
    return std::nullopt;
  auto tensor = [&](const std::map<std::string, int>& m, const char* role) {
    return role_tensor(g, m, role);
  };
  // The prologue: an inference RMSNorm over a's last dim, without bias, whose y (virtual) is a.
  const RmsNormAttrs* rms = std::visit([](const auto& attrs) { return as_rmsnorm(attrs); }, g.ops[0].attrs);
  const ResolvedTensor *x = nullptr, *scale = nullptr;
  const size_t mm_at = rms ? 1 : 0;
  if (rms) {
    const ResolvedOp& n = g.ops[0];
    x = tensor(n.inputs, "x");
    scale = tensor(n.inputs, "scale");
    const ResolvedTensor* xn = tensor(n.outputs, "y");
    if (rms->bias || rms->phase != NormPhase::kInference || !x || !scale || !xn || !xn->is_virtual ||
        n.inputs.size() != 2 || n.outputs.size() != 1 || n.compute_dtype != DType::kFP32 || g.ops.size() < 2)
      return std::nullopt;
  }
  const std::optional<GatedOps> gated = gated_ops(g, mm_at);
  const ResolvedOp& mm = g.ops[gated ? gated->gate : mm_at];
  if (!std::visit([](const auto& attrs) { return is_matmul(attrs); }, mm.attrs)) return std::nullopt;
  const ResolvedTensor *a = tensor(mm.inputs, "a"), *w = tensor(mm.inputs, "b"), *z = tensor(mm.outputs, "y");
  if (!a || !w || !z || mm.inputs.size() != 2 || mm.compute_dtype != DType::kFP32) return std::nullopt;
  if (rms) {
    if (mm.inputs.at("a") != g.ops[0].outputs.at("y")) return std::nullopt;
    a = x;  // the kernel reads x and normalizes it on the way
  }
  const ResolvedTensor* y = z;
  const ResolvedTensor *e = nullptr, *w2 = nullptr;
  Epilogue epi;
  bool product_second = false;
  if (gated) {
    const ResolvedOp& up = g.ops[gated->up];
    w2 = tensor(up.inputs, "b");
    if (!w2 || up.inputs.size() != 2 || up.compute_dtype != DType::kFP32) return std::nullopt;
    epi = Epilogue{EpiKind::kGated, gated->mode};
    y = &g.tensors[static_cast<size_t>(g.ops[gated->mul].outputs.begin()->second)];
  } else if (g.ops.size() == mm_at + 2) {
    const ResolvedOp& pw = g.ops[mm_at + 1];
    auto found = std::visit([](const auto& attrs) { return epilogue_of(attrs); }, pw.attrs);
    if (!found || !z->is_virtual || pw.outputs.size() != 1 || pw.compute_dtype != DType::kFP32)
      return std::nullopt;
    epi = *found;
    y = &g.tensors[static_cast<size_t>(pw.outputs.begin()->second)];
    const int zi = mm.outputs.at("y");
    if (epi.kind == EpiKind::kUnary) {
      if (pw.inputs.size() != 1 || pw.inputs.begin()->second != zi) return std::nullopt;
    } else {
      auto ia = pw.inputs.find("a"), ib = pw.inputs.find("b");
      if (pw.inputs.size() != 2 || ia == pw.inputs.end() || ib == pw.inputs.end() ||
          (ia->second == zi) == (ib->second == zi))
        return std::nullopt;  // z exactly once
      product_second = ib->second == zi;
      e = &g.tensors[static_cast<size_t>(ia->second == zi ? ib->second : ia->second)];
    }
  } else if (g.ops.size() != mm_at + 1) {
    return std::nullopt;
  }
  if (y->is_virtual || a->is_virtual) return std::nullopt;
  for (const ResolvedTensor* t : {a, w, y, e, w2})
    if (t && (t->scalar_value || t->dims.size() != a->dims.size())) return std::nullopt;
  if (!is_16bit(a->dtype) || w->dtype != a->dtype || !is_float_io(y->dtype) || (e && !is_float_io(e->dtype)))
    return std::nullopt;
  if (w2 && (w2->is_virtual || w2->dtype != w->dtype || w2->dims != w->dims || w2->strides != w->strides))
    return std::nullopt;  // the second weight is read with the first one's offsets
  const size_t r = a->dims.size();
  const int64_t M = a->dims[r - 2], K = a->dims[r - 1], N = w->dims[r - 1];
  if (M < 1 || M > kMaxPinnedRows || K < 1 || N < 1) return std::nullopt;
  const int64_t lda = row_stride(*a, M, K), ldw = row_stride(*w, K, N), ldy = row_stride(*y, M, N),
                lde = e ? row_stride(*e, M, N) : 0;
  if (!lda || !ldw || !ldy || (e && !lde)) return std::nullopt;
  if (scale) {  // [1, ..., 1, K]: the gain of each of a row's K values
    if (scale->is_virtual || scale->scalar_value || scale->dims.size() != r || !is_float_io(scale->dtype) ||
        scale->dims.back() != K || scale->strides.back() != 1)
      return std::nullopt;
    for (size_t i = 0; i + 1 < r; ++i)
      if (scale->dims[i] != 1) return std::nullopt;
  }

  GemvForm f;
  f.a = a;
  f.w = w;
  f.w2 = w2;
  f.e = e;
  f.scale = scale;
  f.y = y;
  f.mm = &mm;
  f.epsilon = rms ? rms->epsilon : 0.0;
  f.epi = epi.kind;
  f.mode = epi.mode;
  f.product_second = product_second;
  f.m = M;
  f.k = K;
  f.n = N;
  f.lda = lda;
  f.ldw = ldw;
  f.lde = lde;
  f.ldy = ldy;
  return f;
}

std::shared_ptr<const NativeKernel> make_gemv_kernel(const GemvForm& f, bool* by_default) {
  const int64_t M = f.m, K = f.k, N = f.n;
  const bool faster = M <= kMaxRows && gemv_weights_in_range(K, N);
  auto kern = std::make_shared<GemvKernel>();
  kern->name_ = "fusebox_gemv";
  kern->where_ = common::op_where("matmul", f.mm->name);
  // Rows a block: the gated form's two sets of sums fit shared memory at 4 (8 rows: two block rows).
  const int max_rows = f.epi == EpiKind::kGated ? 4 : kMaxRows;
  while (kern->rows_ < M && kern->rows_ < max_rows) kern->rows_ *= 2;
  kern->row_blocks_ = static_cast<unsigned>((M + kern->rows_ - 1) / kern->rows_);
  GemvArgs& p = kern->args_;
  static_cast<FewRowShape&>(p) = few_row_shape(f);
  if (f.scale) {
    kern->norm_ = true;
    p.scale_dtype = static_cast<int>(f.scale->dtype);
    p.epsilon = static_cast<float>(f.epsilon);
  }
  // Column threads: enough blocks to fill a large GPU (about 256), at least 2 (32-byte row segments),
  // at most 16 (the shared-memory sums of 8 rows). Chosen from N alone, so a row's sums are added in
  // the same order whatever the row count: a request's logits do not depend on its batch.
  p.ct = 2;
  while (p.ct < 16 && N / (8 * p.ct * 2) >= 256) p.ct *= 2;
  kern->grid_ = static_cast<unsigned>((N + 8 * p.ct - 1) / (8 * p.ct));
  kern->half_ = f.a->dtype == DType::kFP16;
  kern->vec_shapes_ = K % 8 == 0 && N % 8 == 0 && f.lda % 8 == 0 && f.ldw % 8 == 0;
  kern->tensors_ = gemv_tensor_names(f);
  if (by_default) *by_default = faster;
  return kern;
}

FewRowShape few_row_shape(const GemvForm& f) {
  FewRowShape s;
  s.m = f.m;
  s.k = f.k;
  s.n = f.n;
  s.lda = f.lda;
  s.ldw = f.ldw;
  s.lde = f.lde;
  s.ldy = f.ldy;
  s.y_dtype = static_cast<int>(f.y->dtype);
  s.e_dtype = f.e ? static_cast<int>(f.e->dtype) : 0;
  s.epi = f.epi;
  s.mode = f.mode;
  s.product_second = f.product_second ? 1 : 0;
  return s;
}

bool gemv_weights_in_range(int64_t k, int64_t n) {
  return n >= kMinColumns && k * n >= kMinWeights && k * n <= kMaxWeights;
}

std::vector<std::string> gemv_tensor_names(const GemvForm& f) {
  std::vector<std::string> names = {f.a->name};
  if (f.scale) names.push_back(f.scale->name);
  names.push_back(f.w->name);
  if (f.w2) names.push_back(f.w2->name);
  if (f.e) names.push_back(f.e->name);
  names.push_back(f.y->name);
  return names;
}

std::shared_ptr<const NativeKernel> make_gemv_kernel(const ResolvedGraph& g, bool* by_default) {
  if (by_default) *by_default = false;
  const auto f = match_gemv_form(g);
  return f ? make_gemv_kernel(*f, by_default) : nullptr;
}

}  // namespace fusebox::kernels
