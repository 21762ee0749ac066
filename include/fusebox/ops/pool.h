// fusebox op family: pooling (max_pool, avg_pool, global_avg_pool), cuDNN's
// resample operation. One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/pool.cpp (docs/architecture.md, "Adding an op").
//
// x [N, C, (D,) H, W] -> y [N, C, (O,) P, Q], each spatial dim independently:
//   out = floor((in + 2*padding - window) / stride) + 1
// and y[n, c, p] over the window starting at p*stride - padding:
//   max_pool: the largest x in the window; padding counts as -infinity (never chosen)
//   avg_pool: the sum of x over the window divided by the window's size
//             (count_include_pad, padding counting as zeros) or by the number of
//             elements of x it covers (count_include_pad false)
//   global_avg_pool: avg_pool with the window the whole spatial extent of x
//             (y [N, C, 1, 1]): the mean over H and W (and D)
// Every window must cover at least one element of x: padding < window.
// There is no backward op: cuDNN 9.19 has a resample backward only in its
// backend API (CUDNN_BACKEND_OPERATION_RESAMPLE_BWD_DESCRIPTOR); the frontend
// 1.32 graph fusebox lowers to has no node for it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace fusebox {

enum class PoolMode { kMax, kAvg };
std::string_view pool_mode_name(PoolMode m);  // "max", "avg"

struct PoolAttrs {
  PoolMode mode = PoolMode::kMax;
  bool global = false;            // global_avg_pool: window = x's spatial dims (set by resolve)
  std::vector<int64_t> window;    // per spatial dim; required unless global
  std::vector<int64_t> stride;    // default: the window (as torch)
  std::vector<int64_t> padding;   // both sides of each spatial dim; default 0
  bool count_include_pad = true;  // avg only: divide by the whole window (torch's default)
};

}  // namespace fusebox
