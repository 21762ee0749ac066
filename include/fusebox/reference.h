// fusebox: reference implementations of every op, and result comparison.
//
// The references compute the whole graph op by op in fp32 (fp64 accumulation
// on the CPU, fp32 on the GPU), keeping intermediates in fp32 as cuDNN keeps
// virtual tensors in the intermediate dtype. They are deliberately naive.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

// Reference outputs: for each non-virtual output tensor, its values in fp32
// in logical row-major order (element_count() values).
using ReferenceOutputs = std::map<std::string, std::vector<float>>;

// CPU reference. `inputs` holds every graph input by name. Practical for up
// to about 1e9 multiply-adds.
//
// SDPA dropout (dropout > 0): the references do not reimplement cuDNN's
// Philox generator; they read the keep-mask cuDNN drew. The op must declare a
// "dropout_mask" output (SdpaOptions::dump_dropout_mask), and the caller puts
// cuDNN's dumped values of that output into the inputs under that output
// tensor's name: for reference_cpu a HostTensor like the graph tensor (fp32
// [B,Hq,Sq,Skv], dense row-major: HostTensor::like(tensor) then its bytes);
// for reference_gpu a device pointer to cuDNN's fp32 output buffer, laid out
// as the graph tensor (dense row-major). Values: 1 kept, 0 dropped; only the
// positions the attention mask keeps are read. Without the output or the
// values: NotSupported, naming the op. Semantics (cuDNN's composite SDPA):
//   forward:  P = softmax(s), stats = logsumexp(s) (before dropout),
//             P' = P * M / (1 - p), o = P' @ v; sdpa_fp8_fwd: amax_s = max P',
//             P8 = e4m3(P' * scale_s).
//   backward: dv = P'^T @ do, dP = (do @ v^T) * M / (1 - p),
//             Di = rowsum(do * o) from the given o, dS = P * (dP - Di),
//             dq, dk from dS as without dropout.
// The references never produce a value for "dropout_mask" (it is left out of
// ReferenceOutputs and of reference_gpu's outputs); check it with
// check_dropout_mask(s). Dropout exactly 0 is no dropout (cuDNN draws no mask).
Result<ReferenceOutputs> reference_cpu(const ResolvedGraph& g,
                                       const std::map<std::string, HostTensor>& inputs);

// Whether a GPU reference is compiled in (the CUDA kernels are built by nvcc).
bool gpu_reference_available();

// Naive GPU reference, for shapes too large for the CPU. `device_inputs` are
// device pointers laid out as the graph tensors (graph dtype and strides);
// outputs land in `device_outputs`: fp32 buffers of element_count() values,
// logical row-major. `stream` is a cudaStream_t (nullptr: default stream).
Status reference_gpu(const ResolvedGraph& g, const std::map<std::string, const void*>& device_inputs,
                     const std::map<std::string, float*>& device_outputs, void* stream = nullptr);

// The GPU reference on host inputs (as reference_cpu takes them): uploads,
// runs on the default stream, downloads. NoDevice when no GPU is present.
Result<ReferenceOutputs> reference_gpu_host(const ResolvedGraph& g,
                                            const std::map<std::string, HostTensor>& inputs);

// ---- SDPA verification helpers (the references cover sdpa_fwd, sdpa_bwd and
// sdpa_fp8_fwd with every SdpaOptions feature; dropout through the dumped mask,
// see above).

// Makes each sdpa_bwd (and sdpa_fp8_bwd: its FP8 forward with the bwd's
// descale_q/k/v, descale_s, scale_s and scale_o = 1 / descale_o, o rounded to
// e4m3; src/reference/ops/sdpa_fp8_bwd.h) op's "o" and "stats" inputs those of the forward of the
// same q, k, v (and seq_len, bias inputs and options), overwriting
// inputs[o] (rounded to o's dtype, in its strides) and inputs[stats]; random
// o and stats would make the gradients meaningless. Rows that keep no key
// (padded rows included) get o = 0 and stats = +inf, so that any P = exp(s -
// stats) cuDNN might form there is 0, never NaN. Computed on the GPU
// reference when the forward exceeds `cpu_max_flops` and a GPU is present,
// else on the CPU. Call it after filling q, k, v (and the mask inputs), before
// uploading.
// With dropout, the forward's mask is unknown before cuDNN runs, so o and
// stats come from the dropout-free forward: stats exactly (the logsumexp is
// taken before dropout), and o as the dropout-free attention output. The
// backward uses o only through Di = rowsum(do * o), so cuDNN and the
// reference still compute the same function of the same inputs (not the true
// gradient of the dropout forward, which would need the forward's own o).
Status derive_sdpa_bwd_inputs(const ResolvedGraph& g, std::map<std::string, HostTensor>& inputs,
                              double cpu_max_flops = 2e9);

// Zeroes the values of sdpa outputs that cuDNN does not define, in `outputs`
// (logical row-major fp32, keyed by tensor name; absent tensors are skipped),
// so that it can be applied to both cuDNN's outputs and the reference before
// compare(): o and stats (and dq) rows i >= seq_len_q[b] and rows whose mask
// keeps no key (e.g. bottom-right with Sq > Skv); dk and dv rows j >=
// seq_len_kv[b]. `inputs` supplies the seq_len tensors (padding). InvalidArgument
// when a length is missing or outside [0, S], or an output has the wrong size.
// "dropout_mask" outputs are left untouched (check_dropout_masks() counts only
// the kept positions instead).
Status mask_dont_care(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
                      std::map<std::string, std::vector<float>>& outputs);

// Checks the inputs of every paged sdpa op (SdpaOptions::paged) of `g`, by
// tensor name in `inputs`, before anything runs: every page-table entry an
// integer page of its pool, [0, num_pages) (unused slots too), seq_len_q in
// [0, Sq] and seq_len_kv in [0, max_seq_len_kv] (a longer sequence would read
// past its pages). InvalidArgument naming the op, the tensor and the batch entry.
Status check_sdpa_paged_inputs(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs);

// Checks the ids of every embedding op of `g` found in `inputs` (by tensor
// name; ids not given are skipped) before anything runs: each an integer row
// of its table, [0, V). InvalidArgument naming the op, the tensor, the first
// bad position and its value. (The kernel writes a NaN row for such an id,
// never reading outside the table, so ids made on the GPU are safe too.)
Status check_embedding_ids(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs);

struct Tolerance {
  double rel_l2 = 0;       // ||a - r||_2 / ||r||_2
  double max_abs_rel = 0;  // max|a - r| / max|r|
  // > 0: the output's dtype saturates there (fp8: e4m3 448, e5m2 57344, set by tolerance_for), and
  // a reference value beyond +-saturate_at is compared as +-saturate_at: the output's own cast, like
  // its rounding, is not the op's error. 0: no clamp.
  double saturate_at = 0;
};
// Per output dtype: bf16 and fp8 looser than fp16, fp16 looser than fp32.
// fp32 allows TF32 tensor-core math.
Tolerance default_tolerance(DType output_dtype);
// The tolerance for graph output `output`: default_tolerance(dtype) except
// where the producing op needs its own (sdpa_bwd gradients, sdpa_fp8_fwd o and
// amax; see each family's tolerance() in src/reference/ops/). Unknown names
// get the bf16 default.
Tolerance tolerance_for(const ResolvedGraph& g, const std::string& output);

struct Comparison {
  std::string tensor;
  int64_t elements = 0;
  double rel_l2 = 0;
  double max_abs = 0;        // max |a - r|
  double max_abs_rel = 0;    // max |a - r| / max |r|
  int64_t worst_index = -1;  // logical index of max |a - r|
  int64_t non_finite = 0;    // NaN/Inf in the actual output
  int64_t saturated = 0;     // reference values beyond +-tolerance.saturate_at, compared as the clamp
  // FP8 attention backward (move_reference_within_fp8_ties): how many of cuDNN's internal fp8
  // rounding ties the comparison took as cast the other way (the reference's rows moved by those
  // steps), and the largest such move of one value; -1: not computed (too large for the CPU).
  int64_t ties_taken = 0;
  double tie_largest_move = 0;
  std::string tie_search_error;  // why the tie search itself failed (the comparison stands as it was)
  Tolerance tolerance;
  bool pass = false;
  std::string error;             // why no comparison was possible (size mismatch); empty otherwise
  std::string ToString() const;  // one line
};

// Compares `actual` (logical row-major floats) with `reference`.
Comparison compare(const std::string& tensor, const std::vector<float>& reference,
                   const std::vector<float>& actual, Tolerance tol);
// The same for an output as stored: read in place where its logical order is its storage order
// and its dtype is bf16, fp16 or fp32 (a plan check's outputs of 10^9 elements need no float
// copy), else through to_float_logical(). The result is compare()'s on to_float_logical().
Comparison compare(const std::string& tensor, const std::vector<float>& reference, const HostTensor& actual,
                   Tolerance tol);

// Checks a dumped dropout keep-mask (logical row-major fp32) drawn with
// dropout probability `p`: every counted value is exactly 0 or 1, and the
// kept fraction is within 1 - p +- max(6 sigma, 1e-3), sigma = sqrt(p (1-p) / n)
// over the n counted values. `counted` (same size as mask, nonzero: count)
// restricts the check to some positions; nullptr counts all. Fills elements
// (n), rel_l2 (|kept fraction - (1 - p)|), tolerance.rel_l2 (the allowed
// deviation), max_abs (the largest distance of a value from {0, 1}),
// worst_index, non_finite, pass, and error (why it fails; empty on a pass).
Comparison check_dropout_mask(const std::string& tensor, const std::vector<float>& mask, double p,
                              const std::vector<uint8_t>* counted = nullptr);

// check_dropout_mask() for every sdpa op of `g` with dropout > 0 and a
// "dropout_mask" output found in `outputs` (by tensor name; absent ones are
// skipped), counting only the positions the attention mask keeps (padding,
// causal, windows; cuDNN may leave the others unwritten). `inputs` supplies the
// seq_len tensors. InvalidArgument when a mask has the wrong size.
Result<std::vector<Comparison>> check_dropout_masks(const ResolvedGraph& g,
                                                    const std::map<std::string, HostTensor>& inputs,
                                                    const std::map<std::string, std::vector<float>>& outputs);

// An op's fp8 output X with an "amax_X" output and a "scale_X" input (the FP8 attention ops):
// the amax must be X's own largest magnitude before its cast, so the cast of amax * scale
// (rounded and saturated as X is) lies within one fp8 step of max|X| as written (`outputs`,
// after mask_dont_care). A check of the amax against the output it describes, sharper than the
// comparison with the reference (whose bound is X's own). One comparison "amax_X of X" each.
Result<std::vector<Comparison>> check_fp8_amax(const ResolvedGraph& g,
                                               const std::map<std::string, HostTensor>& inputs,
                                               const std::map<std::string, std::vector<float>>& outputs);

// FP8 attention backward: cuDNN computes dS and P before their fp8 casts in its own precision, so a
// value within kFp8TieRel (2^-8, relative) of a rounding midpoint may be cast the other way than
// the reference (fp64) casts it. That moves one whole row of dq and of dk (a dS8 tie: the step times
// k or q) or of dv (a P8 tie: times do); an e5m2 step of a large dS is up to a quarter of it, enough to
// fail dq's check with no error in the op (src/reference/ops/sdpa_fp8_bwd.h, "Rounding ties").
// For every sdpa_fp8_bwd output among `outputs` (tensor names; the failing ones): per row of
// `reference`, the ties that row has in reach, largest first, each taken (its whole-row move
// applied) only where it brings the row closer to `actual` by at least half that move (both
// logical row-major fp32, the output's saturation applied). compare() again then sees only what no tie
// explains: a wrong scale, mask or value still fails. Returns per tensor the ties taken and the largest move;
// an op whose ties would take more than cpu_max_flops on the CPU is left alone (-1).
struct TieMoves {
  int64_t ties = 0;  // -1: not computed (too large for the CPU)
  double largest = 0;
};
Result<std::map<std::string, TieMoves>> move_reference_within_fp8_ties(
    const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
    const std::map<std::string, std::vector<float>>& actual, const std::set<std::string>& outputs,
    std::map<std::string, std::vector<float>>& reference, double cpu_max_flops = 4e10);

}  // namespace fusebox
