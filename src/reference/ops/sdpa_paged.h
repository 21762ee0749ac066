// fusebox: paged K/V caches in the references (private to the reference
// layer). The references read the pools through the page tables into the dense
// [B, Hk, Skv, D] cache each sequence sees, then attend as for a dense k and v.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox::reference_detail {

// Checks the values of page table `role` (tensor `tensor`) of op `op`: B rows
// of max_pages entries (logical row-major), each an integer page of a pool of
// num_pages pages. The error names the op, the tensor, the batch entry and the
// slot: a bad entry must never reach a kernel as an address.
Status check_page_table(const ResolvedOp& op, const char* role, const std::string& tensor,
                        const std::vector<float>& values, int64_t B, int64_t max_pages, int64_t num_pages);

// Row j % page_size of page table[b, j / page_size]: where key j of sequence b lives in the pool.
inline int64_t paged_row(const float* table_row, int64_t page_size, int64_t j, int64_t* page) {
  *page = static_cast<int64_t>(table_row[j / page_size]);
  return j % page_size;
}

}  // namespace fusebox::reference_detail
