// fusebox cuDNN layer: the pointwise lowering's broadcast fold, apart from the frontend header so
// that the engine rules and the deviceless tests can use it (tests/deviceless/pointwise_fold_test.cpp).
// Defined in ops/pointwise_lowering.cpp.
#pragma once

#include <optional>
#include <string>

#include "fusebox/graph.h"

namespace fusebox::cudnn {

// Whether a graph of pointwise ops alone has an in-memory input that cuDNN 9.19's pointwise engine
// eng1 broadcasts wrongly: at rank 3 over two or more dims of size > 1 of its op's output, at rank
// 2 over any (H100, 2026-12-05: rule pointwise-broadcast-over-two-dims, engine_rules.cpp). Rank 4
// and up is not counted: eng1 broadcast [1,C,1,1] over NHWC right in every lowered
// batchnorm_inference of the sweeps. By-value scalars broadcast right and do not count.
bool pointwise_broadcast_eng1_gets_wrong(const ResolvedGraph& g);

// The same graph with its dims folded so that eng1 broadcasts right, when that is possible: dims of
// size 1 in every tensor dropped, adjacent dims that every tensor holds alike (both 1, or both full
// and contiguous across the pair) merged into one, and leading 1s added up to rank 3. The same
// memory, read with fewer dims: x [2, 8, 27] + b [1, 1, 27] is x [1, 16, 27] + b [1, 1, 27], which
// eng1 ran right on the H100 where the unfolded form was 49% off. nullopt unless the graph is one
// pointwise_broadcast_eng1_gets_wrong() is true of and the folded graph is not. `note` says what
// was folded.
std::optional<ResolvedGraph> fold_pointwise_broadcast_dims(const ResolvedGraph& g, std::string* note);

}  // namespace fusebox::cudnn
