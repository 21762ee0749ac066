// fusebox op family: reductions (cuDNN's reduction operation).
// One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/reduction.cpp (docs/architecture.md, "Adding an op").
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace fusebox {

// y has x's rank with 1 on every reduced dim (cuDNN reads the reduced dims
// from y's dims), e.g. the bias gradient of an NCHW dy [N, K, H, W] is
// reduce_sum over dims [0, 2, 3] -> [1, K, 1, 1]; the amax of a matmul output
// [B, M, N] is reduce_amax over every dim -> [1, 1, 1].
enum class ReductionMode {
  kSum,   // reduce_sum:  sum of x               (cuDNN ADD)
  kMax,   // reduce_max:  max of x               (MAX)
  kMin,   // reduce_min:  min of x               (MIN)
  kAmax,  // reduce_amax: max of |x|             (AMAX; FP8 bookkeeping)
  kMean,  // reduce_mean: sum of x / count       (AVG)
};

// JSON "reduce_sum", "reduce_max", ...: input "x", output "y".
struct ReductionAttrs {
  ReductionMode mode = ReductionMode::kSum;
  // The dims of x that are reduced, ascending; empty: every dim (a scalar result).
  std::vector<int64_t> reduce_dims;
};

std::string_view reduction_mode_name(ReductionMode m);  // "reduce_sum", ...
std::optional<ReductionMode> parse_reduction_mode(std::string_view s);

}  // namespace fusebox
