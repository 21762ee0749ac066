// fusebox: the backward graph of a forward graph, derived by gradient rules
// kept with each op family's definition (src/graph/ops/<family>.cpp, the
// `grad` overloads; docs/training.md). The user declares the forward; fusebox
// writes the backward as an ordinary graph that validates, builds, partitions
// and runs like any other.
//
// The backward graph's inputs are:
//   - the gradients of the forward outputs it starts from ("<y>.grad", like y);
//   - the forward tensors the rules read ("saved": forward inputs and outputs,
//     under their forward names), some as a transposed view ("<t>.T": the same
//     memory with the last two dims and strides swapped, no copy);
// its outputs are the gradients of the forward inputs asked for ("<x>.grad",
// like x: same dims, strides and dtype). A virtual forward intermediate a rule
// needs (the input of an activation fused after a matmul) is recomputed in the
// backward graph from saved tensors, by a copy of the forward ops that make it:
// `recomputed` lists them, and `saved_bytes` says what the saved tensors cost.
// Nothing here touches a GPU or mentions cuDNN.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox {

struct BackwardOptions {
  // Forward inputs to differentiate with respect to. Empty: every floating-point
  // input tensor (not by-value scalars, not integer ids or labels, not fixed-value
  // inputs such as sequence lengths).
  std::vector<std::string> wrt;
  // Forward outputs whose gradients the backward takes as inputs. Empty: every
  // graph output that is an op's primary output (y, o, loss) and that no op of
  // the graph reads (a saved activation is not a seed; statistics such as mean,
  // inv_variance, stats and lse carry no gradient).
  std::vector<std::string> seeds;
  // A wrt input that gets no gradient (it reaches no seed, or only through roles
  // that carry none) is left out instead of being an error. For callers that
  // pass every input that might need one (a pipeline's stages).
  bool only_reachable = false;
  // Backward ops without atomics where a rule has the choice (embedding_bwd's per-column sum):
  // the same inputs give the same bits (a training run that resumes exactly).
  bool deterministic = false;
};

// Where a backward graph input gets its values.
struct BackwardInput {
  enum class Kind { kGradient, kSaved };
  Kind kind = Kind::kSaved;
  std::string forward_tensor;  // kGradient: the forward output it is the gradient of
  bool transposed = false;     // kSaved: the forward tensor with its last two dims swapped
};

struct BackwardGraph {
  GraphSpec spec;                                // resolve() it like any graph
  std::map<std::string, BackwardInput> inputs;   // every input of `spec`, by name
  std::map<std::string, std::string> gradients;  // forward input -> its gradient (an output of `spec`)
  std::vector<std::string> seeds;                // the forward outputs the backward starts from
  std::vector<std::string> recomputed;           // forward ops copied into the backward
  std::vector<std::string> saved;                // forward tensors the backward reads
  int64_t saved_bytes = 0;                       // their storage, once each
};

// Derives the backward of `fwd`. InvalidArgument for a wrt or seed name that is
// not a forward input / output, or a wrt input no seed depends on; NotSupported
// naming the op and saying what would be accepted where an op on the path has no
// gradient rule (a backward op, pooling, batchnorm inference, FP8 attention) or
// lacks what its rule needs (a norm in the inference phase: declare its
// statistics; an sdpa_fwd without stats).
Result<BackwardGraph> derive_backward(const ResolvedGraph& fwd, const BackwardOptions& options = {});

// How the backward graph binds to the forward, as JSON (the file `fusebox
// backward` writes beside the graph; docs/training.md): "inputs" (each input's
// kind, forward tensor, transposed), "gradients", "seeds", "saved",
// "saved_bytes", "recomputed".
std::string backward_bindings_json(const BackwardGraph& b);

}  // namespace fusebox
