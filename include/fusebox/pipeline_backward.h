// fusebox: the backward pipeline of a forward pipeline (docs/training.md). Each
// forward stage's backward is derived by the gradient rules (fusebox/autodiff.h),
// in reverse stage order; the gradients of a buffer that several stages read are
// summed by an accumulation stage of its own. The result is a pipeline file and
// its graph files, which load_pipeline_file() reads like any other.
//
// Buffers of the backward pipeline:
//   - "<b>" (input): the forward buffer b, saved (a forward input, constant or
//     intermediate a backward rule reads); its readers may view it transposed
//     ("reshape": the same memory);
//   - "<b>.grad" (input): dL/db for a forward output b no stage reads (a seed);
//   - "<b>.grad.<stage>" (intermediate): one stage's part of dL/db, when several
//     stages read b; "<b>.grad" (output or intermediate): dL/db.
// Gradient buffers are "reshape" buffers: each holds dL/db in b's memory layout,
// whichever view a stage reads it through.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "fusebox/autodiff.h"
#include "fusebox/gradient_check.h"
#include "fusebox/pipeline.h"
#include "fusebox/pipeline_run.h"
#include "fusebox/status.h"

namespace fusebox {

struct PipelineBackward {
  std::string pipeline_json;                       // the backward pipeline file
  std::map<std::string, std::string> graph_files;  // file name (beside the pipeline file) -> graph JSON
  // Every input buffer of the backward pipeline: the forward buffer it is (kSaved)
  // or the forward output it is the gradient of (kGradient).
  std::map<std::string, BackwardInput> inputs;
  std::map<std::string, std::string> gradients;  // forward buffer -> its gradient buffer (an output)
  std::vector<std::string> seeds;                // forward buffers whose gradients come in
  std::vector<std::string> recomputed;           // "<stage>: <op>" re-run in the backward
};

// `options.wrt` and `.seeds` name forward buffers (empty: every floating-point input
// and constant buffer; every output buffer no stage reads). Errors name the stage.
Result<PipelineBackward> derive_pipeline_backward(const Pipeline& fwd, const BackwardOptions& options = {});

// Writes the backward pipeline as `dir`/NAME.json and its graph files beside it
// (atomically, each), refusing to replace any file of the forward pipeline.
// Returns the pipeline file's path.
Result<std::string> write_pipeline_backward(const Pipeline& fwd, const PipelineBackward& b,
                                            const std::string& dir);

// Host data for every input and constant buffer of `p` from logical values by buffer name, each
// laid out (and rounded) as its buffer; a buffer without a value is InvalidArgument naming it.
Result<PipelineHostData> pipeline_host_data(const Pipeline& p, const GradientInputs& values);

// The backward pipeline's input data after a forward run: each seed's gradient from `seeds`
// (forward buffer name -> logical values), each saved buffer from `forward_inputs` (the
// forward's inputs and constants by name, logical values) or from `chain` (reference_chain()'s
// values), rounded to the forward buffer's dtype as the forward stored it. `extra_inputs`: values of
// backward inputs that are no forward buffer (FP8 training's scales, fusebox/fp8_training.h), by
// buffer name.
Result<PipelineHostData> backward_pipeline_data(
    const Pipeline& fwd, const PipelineBackward& b, const Pipeline& bwd,
    const std::map<std::string, std::vector<double>>& forward_inputs,
    const std::map<std::string, std::vector<float>>& chain,
    const std::map<std::string, std::vector<double>>& seeds,
    const std::map<std::string, std::vector<double>>& extra_inputs = {});

// check_gradients() for pipelines: `bwd` is the backward pipeline `b` loaded from the
// files write_pipeline_backward() wrote. Both run through the reference chain with
// their bf16 and fp16 buffers in fp32; each gradient buffer against central finite
// differences of the forward chain along a random direction. Small pipelines only.
// `fixed`: values for some input buffers (by name, logical order; e.g. a model's own weights,
// where random ones in (-1, 1) would saturate its softmaxes); the others are random.
Result<GradientCheck> check_pipeline_gradients(const Pipeline& fwd, const PipelineBackward& b,
                                               const Pipeline& bwd, uint32_t seed = 1, double tol = 0,
                                               const GradientInputs& fixed = {},
                                               double step = kGradientCheckStep);

}  // namespace fusebox
