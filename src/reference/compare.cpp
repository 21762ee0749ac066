// fusebox: comparison of an output with its reference.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <variant>

#include "fusebox/reference.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox {

// Tolerances are relative to the reference's scale (rel_l2 over the whole
// tensor, max_abs_rel against max|ref|), so they do not depend on the data's
// magnitude. The reference is unrounded fp32/fp64, so the output's own
// rounding (half an ulp: bf16 2^-9 = 2e-3, fp16 2^-12 = 2.4e-4, e4m3 2^-4 =
// 6e-2, e5m2 2^-3 = 1.25e-1) plus cuDNN's accumulation-order and
// reduced-precision differences must fit:
//   bf16: rel_l2 1e-2 (about 5x the rounding), max 4e-2 (a few ulps at the peak).
//   fp16: rel_l2 3e-3, max 1e-2: output rounding is small, but cuDNN may keep
//         fused intermediates in fp16/bf16-ish precision.
//   fp32: cuDNN may use TF32 tensor cores (10-bit mantissa, 2^-11 = 4.9e-4 per
//         product), so the same as fp16 rather than fp32's 1e-6.
//   fp8:  the quantization step itself: e4m3 7e-2/2.5e-1, e5m2 1.4e-1/5e-1.
//   int:  exact.
Tolerance default_tolerance(DType output_dtype) {
  switch (output_dtype) {
    case DType::kBF16:
      return {1e-2, 4e-2};
    case DType::kFP16:
      return {3e-3, 1e-2};
    case DType::kFP32:
      return {3e-3, 1e-2};
    case DType::kFP8E4M3:
      return {7e-2, 2.5e-1};
    case DType::kFP8E5M2:
      return {1.4e-1, 5e-1};
    case DType::kInt32:
    case DType::kInt64:
    case DType::kUInt8:
      return {0, 0};
  }
  return {1e-2, 4e-2};
}

// The producing op's tolerance (ops/ops.h: each family's tolerance()
// overloads, with their rationale), with the output dtype's saturation.
Tolerance tolerance_for(const ResolvedGraph& g, const std::string& output) {
  const int idx = g.find_tensor(output);
  if (idx < 0) return default_tolerance(DType::kBF16);
  const DType dtype = g.tensors[idx].dtype;
  Tolerance tol = default_tolerance(dtype);
  for (const ResolvedOp& op : g.ops) {
    auto it =
        std::find_if(op.outputs.begin(), op.outputs.end(), [&](const auto& r) { return r.second == idx; });
    if (it == op.outputs.end()) continue;
    tol = std::visit([&](const auto& attrs) { return reference_detail::tolerance(attrs, it->first, dtype); },
                     op.attrs);
    break;  // one producer per tensor
  }
  tol.saturate_at = dtype_saturation(dtype);  // cuDNN's casts to fp8 saturate, as the references assume
  return tol;
}

namespace {

// One stretch of a comparison: compare() sums these in order, so its result depends on the
// element count alone, not on how many threads ran.
struct Partial {
  double diff2 = 0, ref2 = 0, max_ref = 0, max_abs = 0;
  int64_t worst_index = -1, first_non_finite = -1, non_finite = 0, saturated = 0;
};

// `at(i)`: the actual value of logical element i, as float.
template <class At>
Partial compare_range(const float* reference, const At& at, int64_t begin, int64_t end,
                      const Tolerance& tol) {
  Partial c;
  for (int64_t i = begin; i < end; ++i) {
    const double a = at(i);
    double r = reference[i];
    if (tol.saturate_at > 0 && std::fabs(r) > tol.saturate_at) {  // the output's saturating cast
      r = std::copysign(tol.saturate_at, r);
      ++c.saturated;
    }
    if (!std::isfinite(a)) {
      if (c.non_finite++ == 0) c.first_non_finite = i;
      continue;
    }
    if (std::isfinite(r)) {
      c.ref2 += r * r;
      c.max_ref = std::max(c.max_ref, std::fabs(r));
    }
    const double d = std::fabs(a - r);
    if (!std::isfinite(d)) {
      // A non-finite reference (overflow in the reference itself) cannot match a finite output.
      if (c.non_finite++ == 0) c.first_non_finite = i;
      continue;
    }
    c.diff2 += d * d;
    if (d > c.max_abs || c.worst_index < 0) {
      c.max_abs = std::max(c.max_abs, d);
      c.worst_index = i;
    }
  }
  return c;
}

// compare()'s body for n elements read by `at`.
template <class At>
Comparison compare_with(const std::string& tensor, const std::vector<float>& reference, int64_t n,
                        const At& at, const Tolerance& tol) {
  Comparison c;
  c.tensor = tensor;
  c.tolerance = tol;
  c.elements = n;
  if (static_cast<int64_t>(reference.size()) != n) {
    c.error = "size mismatch: actual has " + std::to_string(n) + " elements, reference " +
              std::to_string(reference.size());
    c.pass = false;
    return c;
  }
  // Stretches of 2^20 elements, on several threads for large outputs, combined in order: the
  // first worst element and the first non-finite one, as one pass would find them.
  constexpr int64_t kStretch = int64_t{1} << 20;
  const int64_t stretches = (n + kStretch - 1) / kStretch;
  std::vector<Partial> parts(static_cast<size_t>(stretches));
  reference_detail::parallel_for(stretches, 4.0 * kStretch, [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k)
      parts[static_cast<size_t>(k)] =
          compare_range(reference.data(), at, k * kStretch, std::min(n, (k + 1) * kStretch), tol);
  });
  double diff2 = 0, ref2 = 0, max_ref = 0;
  int64_t first_non_finite = -1;
  for (const Partial& p : parts) {
    diff2 += p.diff2;
    ref2 += p.ref2;
    max_ref = std::max(max_ref, p.max_ref);
    c.saturated += p.saturated;
    c.non_finite += p.non_finite;
    if (first_non_finite < 0) first_non_finite = p.first_non_finite;
    if (p.worst_index >= 0 && (c.worst_index < 0 || p.max_abs > c.max_abs)) {
      c.max_abs = p.max_abs;
      c.worst_index = p.worst_index;
    }
  }
  // An all-zero reference has no scale: the errors are taken as absolute
  // (inputs are drawn in [-1, 1], so unit scale is the natural one).
  const double ref_norm = std::sqrt(ref2);
  c.rel_l2 = ref_norm > 0 ? std::sqrt(diff2) / ref_norm : std::sqrt(diff2);
  c.max_abs_rel = max_ref > 0 ? c.max_abs / max_ref : c.max_abs;
  if (first_non_finite >= 0) c.worst_index = first_non_finite;
  c.pass = c.non_finite == 0 && c.rel_l2 <= tol.rel_l2 && c.max_abs_rel <= tol.max_abs_rel;
  return c;
}

}  // namespace

Comparison compare(const std::string& tensor, const std::vector<float>& reference,
                   const std::vector<float>& actual, Tolerance tol) {
  const float* a = actual.data();
  return compare_with(
      tensor, reference, static_cast<int64_t>(actual.size()), [a](int64_t i) { return a[i]; }, tol);
}

Comparison compare(const std::string& tensor, const std::vector<float>& reference, const HostTensor& actual,
                   Tolerance tol) {
  const int64_t n = std::max<int64_t>(actual.element_count(), 0);
  const uint8_t* base = actual.data.data();
  const bool in_place = common::logical_is_storage_order(actual.dims, actual.strides) &&
                        actual.data.size() >= static_cast<size_t>(n) * dtype_size_bytes(actual.dtype);
  if (in_place && actual.dtype == DType::kFP32) {
    return compare_with(
        tensor, reference, n,
        [base](int64_t i) {
          float v;
          std::memcpy(&v, base + i * 4, 4);
          return v;
        },
        tol);
  }
  if (in_place && (actual.dtype == DType::kBF16 || actual.dtype == DType::kFP16)) {
    const bool bf16 = actual.dtype == DType::kBF16;
    return compare_with(
        tensor, reference, n,
        [base, bf16](int64_t i) {
          uint16_t b;
          std::memcpy(&b, base + i * 2, 2);
          return bf16 ? bf16_bits_to_float(b) : fp16_bits_to_float(b);  // NaN stays NaN either way
        },
        tol);
  }
  return compare(tensor, reference, actual.to_float_logical(), tol);
}

namespace {
// "1e-02" when one digit is exact, else "2.5e-01".
std::string tol_string(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0e", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}
}  // namespace

std::string Comparison::ToString() const {
  char buf[512];
  if (!error.empty()) return tensor + ": " + error + ": FAIL";
  std::snprintf(
      buf, sizeof buf,
      "%s: rel_l2=%.1e max_abs=%.1e (max_abs/max|ref|=%.1e) over %lld elements: %s (tol rel_l2<=%s, "
      "max<=%s)",
      tensor.c_str(), rel_l2, max_abs, max_abs_rel, static_cast<long long>(elements), pass ? "PASS" : "FAIL",
      tol_string(tolerance.rel_l2).c_str(), tol_string(tolerance.max_abs_rel).c_str());
  std::string s = buf;
  if (saturated > 0) {
    char sat[32];
    std::snprintf(sat, sizeof sat, "%g", tolerance.saturate_at);
    s += "; " + std::to_string(saturated) + " reference values beyond +-" + sat + " compared as +-" + sat +
         " (the output's saturating fp8 cast)";
  }
  if (ties_taken > 0) {
    char moved[160];
    std::snprintf(
        moved, sizeof moved,
        " internal fp8 rounding ties taken as cast the other way (the reference moved by up to %.2g)",
        tie_largest_move);
    s += "; " + std::to_string(ties_taken) + moved;
  } else if (ties_taken < 0) {
    s += "; internal fp8 rounding ties not searched (too large for the CPU)";
  }
  if (!tie_search_error.empty()) s += "; internal fp8 rounding ties not searched: " + tie_search_error;
  if (non_finite > 0)
    s += "; " + std::to_string(non_finite) + " non-finite values, first at index " +
         std::to_string(worst_index);
  else if (!pass && worst_index >= 0)
    s += "; worst at index " + std::to_string(worst_index);
  return s;
}

}  // namespace fusebox
