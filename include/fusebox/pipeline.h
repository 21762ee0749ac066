// fusebox: pipelines of graphs (docs/pipeline-format.md).
//
// A pipeline names several graph files (its stages) and the buffers that
// connect them: a stage's graph output feeds a later stage's graph input.
// load_pipeline_file() parses the file, loads and resolves every stage's
// graph and checks the wiring before anything is built: every memory tensor
// bound exactly once, one shape (dims, strides, dtype) per buffer, one writer
// per buffer, no cycles, no unused inputs, constants' files present.
// Nothing here touches a GPU or mentions cuDNN.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusebox/dtype.h"
#include "fusebox/graph.h"
#include "fusebox/status.h"

namespace fusebox {

enum class BufferKind { kInput, kOutput, kConstant, kIntermediate };
// "input", "output", "constant", "intermediate": the names in the file.
std::string_view buffer_kind_name(BufferKind kind);

// One stage's graph tensor bound to a buffer.
struct BufferUse {
  int stage = -1;      // index into Pipeline::stages
  std::string tensor;  // the graph tensor's name
};

struct Pipeline;

struct PipelineBuffer {
  std::string name;
  BufferKind kind = BufferKind::kIntermediate;
  // Constants: the weights file as written and resolved against the
  // pipeline file's folder (checked to exist; read when the pipeline runs).
  std::string file;
  std::string file_path;
  // A `.safetensors` file: the tensor's name in it ("key"; the buffer's
  // name when the pipeline gives none). Empty for a .npy file.
  std::string key;
  // "reshape": true: stages may see the buffer with different dims and strides,
  // views of one dense block (same dtype and element count, no gaps). Its dims
  // and strides below are then its writer's (inputs, constants: the first
  // reader's in file order); each stage's own are its graph tensor's.
  bool reshape = false;
  // "view": {"of": PARENT, "part": k, "parts": n}: no memory of its own but part k of n equal,
  // contiguous parts of buffer PARENT (a dense intermediate or output a stage writes): elements
  // [k*c, (k+1)*c) of its memory, c = PARENT's element count / n. Read only; each reader sees it
  // as a dense tensor of c elements and PARENT's dtype (like a reshape view). Lets one stage write
  // what several graph inputs read (one Q/K/V GEMM feeding an attention's q, k and v).
  int view_of = -1;  // index into Pipeline::buffers, -1: not a view
  int64_t view_part = 0, view_parts = 0;
  bool is_view() const { return view_of >= 0; }
  // A view's first element in its parent's memory (elements); 0 for other buffers.
  int64_t view_offset_elements(const Pipeline& p) const;
  // From the graph tensors bound to it (all agree, unless `reshape`).
  DType dtype = DType::kBF16;
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  std::optional<BufferUse> writer;  // the stage that writes it (none for inputs and constants)
  std::vector<BufferUse> readers;   // in stage order
};

struct PipelineStage {
  std::string name;
  std::string graph_file;  // as written in the pipeline file
  std::string graph_path;  // resolved against the pipeline file's folder
  ResolvedGraph graph;
  // Graph tensor name -> index into Pipeline::buffers, one per memory input
  // and output of the graph.
  std::map<std::string, int> bind;
};

struct Pipeline {
  std::string name;
  std::string path;                     // the pipeline file
  std::vector<PipelineStage> stages;    // in file order
  std::vector<PipelineBuffer> buffers;  // in file order
  // Stage indices in an order where every buffer is written before it is
  // read (ties: file order).
  std::vector<int> order;
  // The symbols of the stages' symbolic graphs at the values they were
  // resolved with (the `shape` given to the loader, defaults for the rest);
  // empty when no stage is symbolic.
  ShapeValues shape;

  int find_stage(std::string_view name) const;   // -1 if absent
  int find_buffer(std::string_view name) const;  // -1 if absent
  // Sum of the stages' flops() (sequence lengths at full length).
  double flops() const;
};

// Limits on what one pipeline may make fusebox read, checked (from the file
// sizes) before any graph or weights file is read: its stages' graph files
// summed over the stages (a file named by n stages counts n times), and those
// plus its weights files. Each file also has its own limit (a graph file 64
// MiB; a .npy file its tensor's size).
inline constexpr uint64_t kMaxPipelineGraphBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxPipelineTotalFileBytes = uint64_t{64} << 30;

// Parses and checks a pipeline. Graph and weights paths are relative to
// `base_dir` (empty: the working directory); `origin` names the file in
// messages. Errors are InvalidArgument (ParseError for malformed JSON,
// IoError for unreadable files) and start with "origin: pipeline 'NAME'".
// `shape`: values for the symbols of the stages' symbolic graphs (docs/graph-format.md,
// "Symbolic dims"), shared by name across stages, so a symbol "N" means the same batch in
// every graph that declares it; symbols not given take each graph's default. A symbol no
// stage declares, a value outside a graph's range, or a shape for a pipeline without
// symbolic graphs is InvalidArgument naming the pipeline (and the stage and symbol).
Result<Pipeline> parse_pipeline_json(std::string_view text, std::string_view origin,
                                     const std::string& base_dir, const ShapeValues& shape = {});
Result<Pipeline> load_pipeline_file(const std::string& path, const ShapeValues& shape = {});

}  // namespace fusebox
