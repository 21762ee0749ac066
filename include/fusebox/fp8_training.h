// fusebox: FP8 training's GEMMs (issue 33, "FP8 training"; docs/training.md). The user declares the
// forward in bf16 and fusebox derives the backward; then each pipeline's matmuls whose two operands
// come from memory are rewritten to read FP8 copies of them, Transformer Engine's recipe:
//
//   forward   y = a @ w        a, w quantized to e4m3
//   backward  da = dy @ w^T    dy (an incoming gradient) to e5m2, w^T to e4m3
//             dw = a^T @ dy    a^T to e4m3, dy to e5m2
//
// Each quantized operand gets a `quantize` stage (include/fusebox/ops/quantize.h) that writes its
// FP8 copy in the layout Hopper's FP8 GEMMs read (K contiguous in both operands: a row-major, b
// column-major; a transposed view is a transposed copy; a gradient read by a dgrad and a wgrad GEMM
// gets both its copies from one stage, one read), and the matmul's fp32 product is
// multiplied by the two inverse scales before its epilogue (the residual add, the gradient parts
// summed in it) and its one rounding. Scales are per buffer, the same for every copy of it, forward
// and backward: buffers `fp8.scale.<b>` and `fp8.scale_inv.<b>` (inputs the trainer fills from its
// delayed scaling, fusebox/fp8_scaling.h) and `fp8.amax.<b>` (an output: max |b| of this step).
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/status.h"

namespace fusebox {

// An FP8 copy of a buffer: which bytes it holds (`order`: its elements' offsets in the buffer, in
// the copy's memory order, as canonical (extent, stride) runs), in which format, under which name.
struct Fp8Copy {
  std::string buffer;
  std::string copy;
  std::string order;
  DType format = DType::kFP8E4M3;
};

struct Fp8RewriteOptions {
  // Buffers quantized to e5m2 (gradients); every other operand goes to e4m3.
  std::set<std::string> gradients;
  // Record the amax of e4m3 operands too. The forward: yes; the backward, whose e4m3 operands are
  // the forward's saved buffers and weights (recorded there): no.
  bool amax_of_e4m3 = true;
  // Buffers whose matmuls stay in bf16: a matmul with an operand bound to one of them (the language
  // model's output projection and its backward, by its weight and input: Transformer Engine's
  // recipe keeps the LM head in higher precision).
  std::set<std::string> keep_buffers;
  // The forward: buffers (the ones the backward reads as saved) whose copies are listed in
  // `exported`, for the backward to take instead of casting the buffer again. A cast stage of one
  // with a single copy also writes the other layout (row-major <-> column-major) from the same
  // read, unless the buffer is in `skip_transposed`.
  std::set<std::string> export_copies;
  std::set<std::string> skip_transposed;
  // The backward: FP8 copies the forward wrote (its `exported`, with `buffer` named as in this
  // pipeline). A copy this pipeline needs that holds the same bytes (buffer, format and element
  // order) is read from there, an input buffer of the same name, instead of cast again; a bf16
  // input buffer that no stage reads after that leaves the pipeline.
  std::vector<Fp8Copy> provided;
  // A cast whose buffer one stage of pointwise ops writes (the gated MLP's product and its
  // backward, a gradient sum) goes into that stage as its quantize op, after its ops: one pass
  // over memory (fusebox's pointwise-quantize kernel) instead of the buffer written and read again.
  // The bf16 buffer then leaves the pipeline (the stage's tensor turns virtual) where no other stage
  // binds it and it is an intermediate; where another pipeline reads such a buffer
  // (`read_elsewhere`: the backward, the forward's saved buffers) the cast stays a stage of its own.
  bool fuse_casts = true;
  std::set<std::string> read_elsewhere;
};

struct Fp8PipelineRewrite {
  std::string pipeline_path;               // the rewritten pipeline file
  std::map<std::string, DType> quantized;  // buffer -> its FP8 format (its scale buffers exist)
  std::vector<std::string> amax;           // buffers whose fp8.amax.<b> this pipeline writes
  int gemms = 0;                           // matmuls rewritten
  int casts = 0;  // quantize stages added: one per buffer and view, writing at most two layouts
  std::vector<std::string> kept;  // "<stage>: matmul '<op>': why" left in bf16
  // The forward: every copy of an export_copies buffer (the backward may read each), and which of
  // them were added for the backward alone (its transposed copies).
  std::vector<Fp8Copy> exported;
  std::vector<std::string> added;
  std::vector<std::string> taken;    // the backward: provided copies it reads (their names)
  std::vector<std::string> dropped;  // the backward: input buffers no stage reads any more
  // Stages split into one per independent op group (a dgrad and a wgrad GEMM: "<stage>.<k>").
  std::vector<std::string> split;
  // Casts fused into the stage that writes their buffer (fuse_casts), and the buffers that left
  // the pipeline with them.
  int fused = 0;
  std::vector<std::string> virtualized;
};

std::string fp8_scale_buffer(const std::string& buffer);      // "fp8.scale.<buffer>"
std::string fp8_scale_inv_buffer(const std::string& buffer);  // "fp8.scale_inv.<buffer>"
std::string fp8_amax_buffer(const std::string& buffer);       // "fp8.amax.<buffer>"

// Reads the pipeline file (and its graph files: load_pipeline_file() checks them all first, so a
// hostile file is that loader's one error) and writes the rewritten pipeline as
// `out_dir`/NAME.json with every stage's graph in `out_dir`/graphs/ (atomically, each; `out_dir`
// must not be the input's folder). A matmul is rewritten when both operands are bf16 or fp16 graph
// inputs bound to buffers; one with an operand computed in its graph (a recomputed GEMM's input)
// stays as it is, listed in `kept`.
Result<Fp8PipelineRewrite> fp8_rewrite_pipeline(const std::string& pipeline_path, const std::string& out_dir,
                                                const Fp8RewriteOptions& options);

}  // namespace fusebox
