// fusebox: the SDPA mask as index intervals, for code that cannot call
// sdpa_keeps() per element (private to the reference layer).
//
// sdpa_keeps() (graph.h) is the definition. Its conditions are bounds on j for
// a fixed row i (and on i for a fixed key j), so the kept set of a row, and of
// a column, is one interval. The GPU kernels loop over these intervals;
// tests/unit/reference_test_sdpa.cpp checks them against sdpa_keeps() for
// every small case. Compiles as host and device code.
#pragma once

#include <cstdint>

#include "fusebox/graph.h"

#ifdef __CUDACC__
#define FUSEBOX_HOST_DEVICE __host__ __device__
#else
#define FUSEBOX_HOST_DEVICE
#endif

namespace fusebox::reference_detail {

// The mask options of SdpaOptions in a form kernels can take by value.
struct SdpaMaskParams {
  int has_right = 0;
  int64_t right = 0;
  int has_left = 0;
  int64_t left = 0;
  int bottom_right = 0;
};

inline SdpaMaskParams sdpa_mask_params(const SdpaOptions& o) {
  SdpaMaskParams m;
  m.has_right = (o.right_bound || o.causal) ? 1 : 0;  // causal without resolve(): right_bound 0
  m.right = o.right_bound.value_or(0);
  m.has_left = o.left_bound ? 1 : 0;
  m.left = o.left_bound.value_or(0);
  m.bottom_right = o.alignment == SdpaAlignment::kBottomRight ? 1 : 0;
  return m;
}

// Lengths lq, lkv are the sequence's (seq_len_q/kv[b] with padding, else Sq and
// Skv), so "j < lkv" and "i < lq" hold for every index of an unpadded problem.
// Kept keys of row i: [*lo, *hi]; empty when *lo > *hi.
FUSEBOX_HOST_DEVICE inline void sdpa_kept_keys(const SdpaMaskParams& m, int64_t i, int64_t lq, int64_t lkv,
                                               int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = i < lq ? lkv - 1 : -1;
  const int64_t off = m.bottom_right ? lkv - lq : 0;
  if (m.has_right && i + off + m.right < *hi) *hi = i + off + m.right;       // j <= i + off + right
  if (m.has_left && i + off - m.left + 1 > *lo) *lo = i + off - m.left + 1;  // j > i + off - left
}

// Rows that keep key j: [*lo, *hi]; empty when *lo > *hi.
FUSEBOX_HOST_DEVICE inline void sdpa_kept_rows(const SdpaMaskParams& m, int64_t j, int64_t lq, int64_t lkv,
                                               int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = j < lkv ? lq - 1 : -1;
  const int64_t off = m.bottom_right ? lkv - lq : 0;
  if (m.has_right && j - off - m.right > *lo) *lo = j - off - m.right;       // i >= j - off - right
  if (m.has_left && j - off + m.left - 1 < *hi) *hi = j - off + m.left - 1;  // i < j - off + left
}

}  // namespace fusebox::reference_detail
