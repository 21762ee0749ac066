// fusebox: the CPU reference of matmul (batch dims broadcast), and its
// verification tolerance.
#include <algorithm>
#include <vector>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

Status matmul(const ResolvedOp& op, const Values& a, const Values& b, Values* y) {
  const size_t rank = y->dims.size();
  if (rank < 2 || a.dims.size() < 2 || b.dims.size() < 2 || a.dims.size() > rank || b.dims.size() > rank)
    return InvalidArgument(op_where(op) + "matmul needs rank >= 2 with a, b no larger than y; got a " +
                           dims_string(a.dims) + ", b " + dims_string(b.dims) + ", y " +
                           dims_string(y->dims));
  const std::vector<int64_t> ad = left_pad(a.dims, rank), bd = left_pad(b.dims, rank);
  const int64_t M = ad[rank - 2], K = ad[rank - 1], N = bd[rank - 1];
  if (bd[rank - 2] != K || y->dims[rank - 2] != M || y->dims[rank - 1] != N)
    return InvalidArgument(op_where(op) + "shapes do not chain: a " + dims_string(a.dims) + " x b " +
                           dims_string(b.dims) + " -> y " + dims_string(y->dims));
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < rank; ++i) {
    if ((ad[i] != 1 && ad[i] != y->dims[i]) || (bd[i] != 1 && bd[i] != y->dims[i]))
      return InvalidArgument(op_where(op) + "batch dims do not broadcast: a " + dims_string(a.dims) + ", b " +
                             dims_string(b.dims) + " -> y " + dims_string(y->dims));
    batch *= y->dims[i];
  }
  parallel_for(batch * M, static_cast<double>(K) * N, [&](int64_t begin, int64_t end) {
    std::vector<double> acc(N);
    for (int64_t bm = begin; bm < end; ++bm) {
      const int64_t bi = bm / M, m = bm % M;
      // Offsets of this batch in a and b (dims of size 1 broadcast).
      int64_t rem = bi, aoff = 0, boff = 0, astride = M * K, bstride = K * N;
      for (int d = static_cast<int>(rank) - 3; d >= 0; --d) {
        const int64_t c = rem % y->dims[d];
        rem /= y->dims[d];
        if (ad[d] != 1) aoff += c * astride;
        if (bd[d] != 1) boff += c * bstride;
        astride *= ad[d];
        bstride *= bd[d];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      const float* arow = a.data.data() + aoff + m * K;
      for (int64_t k = 0; k < K; ++k) {
        const double av = arow[k];
        const float* brow = b.data.data() + boff + k * N;
        for (int64_t n = 0; n < N; ++n) acc[n] += av * brow[n];
      }
      float* yrow = y->data.data() + bm * N;
      for (int64_t n = 0; n < N; ++n) yrow[n] = static_cast<float>(acc[n]);
    }
  });
  return Status::Ok();
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const MatmulAttrs&) {
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* a, ctx.in("a"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* b, ctx.in("b"));
  return matmul(op, *a, *b, y);
}

Tolerance tolerance(const MatmulAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
