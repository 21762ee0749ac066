// fusebox: the CPU reference of the reductions (include/fusebox/ops/reduction.h),
// and their verification tolerance. Every element of x adds into the output
// element with its reduced dims set to 0; sums in double.
#include <cmath>
#include <limits>
#include <vector>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const ReductionAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* x, ctx.in("x"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  const size_t rank = x->dims.size();
  if (y->dims.size() != rank)
    return InvalidArgument(op_where(op) + "y " + dims_string(y->dims) + " does not have x's rank " +
                           dims_string(x->dims));
  // Strides of y seen from x: 0 along the reduced dims (y's dim is 1).
  const std::vector<int64_t> ys = dense_row_major(y->dims);
  std::vector<int64_t> step(rank, 0);
  for (size_t d = 0; d < rank; ++d) {
    if (y->dims[d] != 1 && y->dims[d] != x->dims[d])
      return InvalidArgument(op_where(op) + "y " + dims_string(y->dims) + " is not x " +
                             dims_string(x->dims) + " with 1 on the reduced dims");
    if (y->dims[d] != 1) step[d] = ys[d];
  }
  const int64_t ny = product(y->dims);
  const int64_t nx = product(x->dims);
  double init = 0.0;
  if (a.mode == ReductionMode::kMax) init = -std::numeric_limits<double>::infinity();
  if (a.mode == ReductionMode::kMin) init = std::numeric_limits<double>::infinity();
  std::vector<double> acc(static_cast<size_t>(ny), init);
  std::vector<int64_t> idx(rank, 0);
  int64_t yoff = 0;
  for (int64_t i = 0; i < nx; ++i) {
    const double v = x->data[static_cast<size_t>(i)];
    double& r = acc[static_cast<size_t>(yoff)];
    switch (a.mode) {
      case ReductionMode::kSum:
      case ReductionMode::kMean:
        r += v;
        break;
      case ReductionMode::kMax:
        r = std::max(r, v);
        break;
      case ReductionMode::kMin:
        r = std::min(r, v);
        break;
      case ReductionMode::kAmax:
        r = std::max(r, std::fabs(v));
        break;
    }
    // Next logical index of x, carrying yoff along.
    for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
      if (++idx[d] < x->dims[d]) {
        yoff += step[d];
        break;
      }
      yoff -= step[d] * (x->dims[d] - 1);
      idx[d] = 0;
    }
  }
  const double count = ny > 0 ? static_cast<double>(nx) / static_cast<double>(ny) : 1.0;
  for (int64_t j = 0; j < ny; ++j) {
    const double r = acc[static_cast<size_t>(j)];
    y->data[static_cast<size_t>(j)] = static_cast<float>(a.mode == ReductionMode::kMean ? r / count : r);
  }
  return Status::Ok();
}

// The default tolerance of y's dtype: the reference sums in double, cuDNN in
// fp32 (max, min and amax pick an element: exact up to the output rounding).
Tolerance tolerance(const ReductionAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
