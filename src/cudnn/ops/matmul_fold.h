// fusebox cuDNN layer: the matmul lowering's batch-dim fold, apart from the
// frontend header so that the deviceless tests can check it
// (tests/deviceless/matmul_fold_test.cpp). Defined in ops/matmul_lowering.cpp.
#pragma once

#include <optional>
#include <string>

#include "fusebox/graph.h"

namespace fusebox::cudnn {

// cuDNN 9.19's matmul engines take [batch, M, K] (rank 3): with two batch dims every
// one of six random graphs on the H200 had no engine ("matmul tensor B invalid
// dimensions", fusebox's sweep, 2026-12-05). For a graph of matmul and pointwise ops
// whose tensors all have rank r >= 4, each tensor's leading r - 2 dims either all 1
// or the graph's batch dims, contiguous in memory: the same graph with the leading
// dims folded into one (the same memory, read as rank 3). nullopt when any tensor
// or op does not allow it (a batch dim broadcast in one tensor and not another).
// `note` says what was folded.
std::optional<ResolvedGraph> fold_matmul_batch_dims(const ResolvedGraph& g, std::string* note);

}  // namespace fusebox::cudnn
