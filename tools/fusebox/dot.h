// Graphviz (DOT) pictures of a resolved graph: `fusebox check --dot` and
// `fusebox build --dot`, `fusebox pipeline check --dot` (docs/cli.md, "Pictures of graphs").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/pipeline.h"

namespace fusebox::cli {

// What a build adds to the picture: the plan cuDNN chose for the whole graph.
struct DotPlan {
  std::string engine;
  int64_t workspace_bytes = 0;
  std::string source;  // "built now", "plan cache hit", ...
  std::string device;  // device name, or the devprop file when deviceless
  // A partitioned plan (no engine runs the whole graph): one cluster per part,
  // ops [first_op, first_op + op_count) of the graph's topological order.
  struct Part {
    int first_op = 0;
    int op_count = 0;
    std::string engine;
    int64_t workspace_bytes = 0;
  };
  std::vector<Part> parts;
};

// `s` as the inside of a DOT double-quoted string: '"' and '\' escaped (so no
// graph name can end the string or start a Graphviz escape such as \N), line
// breaks and control bytes shown as text, invalid UTF-8 as \xNN.
std::string dot_escape(std::string_view s);

// A digraph: one node per tensor (label: name, dims, dtype, kind; virtual
// tensors dashed, scalars as plain text), one per op (name, type, resolved
// attributes), edges tensor -> op and op -> tensor labelled by role. With
// `plan`, the ops sit in one cluster labelled with the engine and workspace:
// cuDNN runs the whole graph as one engine per plan.
std::string graph_dot(const ResolvedGraph& g, const DotPlan* plan = nullptr);

// A pipeline: one node per buffer (name, dims, dtype, kind: input, constant
// with its file, intermediate, output) and one cluster per stage holding its
// graph's ops (name and type), in the stage order; edges buffer -> op and
// op -> buffer labelled with the graph tensor, so a reader follows each
// buffer from the stage that writes it to the ones that read it.
std::string pipeline_dot(const Pipeline& p);

// Writes `text` to `path` ("-" or empty: stdout).
Status write_dot(const std::string& path, const std::string& text);

}  // namespace fusebox::cli
