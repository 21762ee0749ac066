// fusebox: the CPU reference of the pointwise ops (numpy-style broadcast of
// the inputs to the output), and their verification tolerance.
#include <cmath>
#include <string>
#include <vector>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

// Row-major strides of `in_dims` broadcast to `out_dims` (0 where a dim is 1).
std::vector<int64_t> broadcast_strides(const std::vector<int64_t>& in_dims,
                                       const std::vector<int64_t>& out_dims) {
  const std::vector<int64_t> padded = left_pad(in_dims, out_dims.size());
  std::vector<int64_t> s = reference_detail::dense_row_major(padded);
  for (size_t i = 0; i < padded.size(); ++i)
    if (padded[i] == 1) s[i] = 0;
  return s;
}

Status check_broadcast(const ResolvedOp& op, const std::string& role, const std::vector<int64_t>& in_dims,
                       const std::vector<int64_t>& out_dims) {
  if (product(in_dims) == 1) return Status::Ok();  // a scalar broadcasts to anything
  if (in_dims.size() > out_dims.size())
    return InvalidArgument(op_where(op) + "input '" + role + "' dims " + dims_string(in_dims) +
                           " have more dims than output " + dims_string(out_dims));
  const std::vector<int64_t> p = left_pad(in_dims, out_dims.size());
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != 1 && p[i] != out_dims[i])
      return InvalidArgument(op_where(op) + "input '" + role + "' dims " + dims_string(in_dims) +
                             " do not broadcast to output dims " + dims_string(out_dims));
  return Status::Ok();
}

double apply_unary(PointwiseMode m, double x) {
  switch (m) {
    case PointwiseMode::kRelu:
      return x > 0 ? x : 0.0;
    case PointwiseMode::kGeluTanh: {
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
    }
    case PointwiseMode::kGeluErf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case PointwiseMode::kSilu:
      return x / (1.0 + std::exp(-x));
    case PointwiseMode::kSigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case PointwiseMode::kTanh:
      return std::tanh(x);
    default:
      return x;
  }
}

double apply_binary(PointwiseMode m, double a, double b) {
  switch (m) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kBiasAdd:
      return a + b;
    case PointwiseMode::kSub:
      return a - b;
    case PointwiseMode::kMul:
    case PointwiseMode::kScale:
      return a * b;
    case PointwiseMode::kReluBwd:
      return b > 0 ? a : 0.0;  // a = dy, b = x
    case PointwiseMode::kGeluTanhBwd: {
      const double k = std::sqrt(2.0 / M_PI), t = std::tanh(k * (b + 0.044715 * b * b * b));
      return a * (0.5 * (1.0 + t) + 0.5 * b * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * b * b));
    }
    case PointwiseMode::kGeluErfBwd:
      return a * (0.5 * (1.0 + std::erf(b / std::sqrt(2.0))) +
                  b * std::exp(-0.5 * b * b) / std::sqrt(2.0 * M_PI));
    case PointwiseMode::kSiluBwd: {
      const double s = 1.0 / (1.0 + std::exp(-b));
      return a * s * (1.0 + b * (1.0 - s));
    }
    case PointwiseMode::kSigmoidBwd: {
      const double s = 1.0 / (1.0 + std::exp(-b));
      return a * s * (1.0 - s);
    }
    case PointwiseMode::kTanhBwd: {
      const double t = std::tanh(b);
      return a * (1.0 - t * t);
    }
    default:
      return a;
  }
}

Status pointwise(const ResolvedOp& op, PointwiseMode mode, const std::vector<const Values*>& in,
                 const std::vector<std::string>& roles, Values* out) {
  const int64_t n = product(out->dims);
  for (size_t i = 0; i < in.size(); ++i)
    FUSEBOX_RETURN_IF_ERROR(check_broadcast(op, roles[i], in[i]->dims, out->dims));
  const size_t rank = out->dims.size();
  std::vector<std::vector<int64_t>> bstr;
  for (const Values* v : in)
    bstr.push_back(product(v->dims) == 1 ? std::vector<int64_t>(rank, 0)
                                         : broadcast_strides(v->dims, out->dims));
  const bool unary = in.size() == 1;
  parallel_for(n, 8, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> idx(rank);
    for (int64_t i = begin; i < end; ++i) {
      int64_t rem = i, off0 = 0, off1 = 0;
      for (int d = static_cast<int>(rank) - 1; d >= 0; --d) {
        const int64_t c = rem % out->dims[d];
        rem /= out->dims[d];
        off0 += c * bstr[0][d];
        if (!unary) off1 += c * bstr[1][d];
      }
      const double a = in[0]->data[off0];
      out->data[i] =
          static_cast<float>(unary ? apply_unary(mode, a) : apply_binary(mode, a, in[1]->data[off1]));
    }
  });
  return Status::Ok();
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const PointwiseAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  std::vector<std::string> roles;
  for (std::string_view r : op_input_roles(op.attrs)) roles.emplace_back(r);
  std::vector<const Values*> in;
  for (const std::string& role : roles) {
    FUSEBOX_ASSIGN_OR_RETURN(const Values* v, ctx.in(role));
    in.push_back(v);
  }
  switch (a.mode) {
    case PointwiseMode::kAdd:
    case PointwiseMode::kSub:
    case PointwiseMode::kMul:
    case PointwiseMode::kBiasAdd:
    case PointwiseMode::kScale:
    case PointwiseMode::kRelu:
    case PointwiseMode::kGeluTanh:
    case PointwiseMode::kGeluErf:
    case PointwiseMode::kSilu:
    case PointwiseMode::kSigmoid:
    case PointwiseMode::kTanh:
    case PointwiseMode::kReluBwd:
    case PointwiseMode::kGeluTanhBwd:
    case PointwiseMode::kGeluErfBwd:
    case PointwiseMode::kSiluBwd:
    case PointwiseMode::kSigmoidBwd:
    case PointwiseMode::kTanhBwd:
      if (in.size() != (pointwise_is_unary(a.mode) ? 1u : 2u))
        return Internal(op_where(op) + "unexpected input count");
      return pointwise(op, a.mode, in, roles, y);
  }
  return NotSupported(op_where(op) + "the CPU reference does not implement pointwise mode " +
                      std::to_string(static_cast<int>(a.mode)));
}

Tolerance tolerance(const PointwiseAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
