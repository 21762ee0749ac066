// fusebox pipeline check: load a pipeline file (docs/pipeline-format.md), check
// the wiring of its stages, print the stage order and buffers. Thin over
// fusebox/pipeline.h. build, tune and run come later (issue 11).
#include <cstdio>

#include "common.h"
#include "common/dims_string.h"
#include "dot.h"
#include "fusebox/pipeline.h"

namespace fusebox::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

// Bump when a key changes meaning or goes away (adding keys keeps the version).
constexpr int kPipelineCheckJsonVersion = 1;

std::string use_text(const Pipeline& p, const BufferUse& u) {
  return p.stages[u.stage].name + "." + u.tensor;
}

ordered_json use_json(const Pipeline& p, const BufferUse& u) {
  return ordered_json({{"stage", p.stages[u.stage].name}, {"tensor", u.tensor}});
}

ordered_json pipeline_json(const Pipeline& p) {
  ordered_json j;
  j["ok"] = true;
  j["version"] = kPipelineCheckJsonVersion;
  j["pipeline"] = p.name;
  ordered_json stages = ordered_json::array();
  for (int s : p.order) {
    const PipelineStage& st = p.stages[s];
    ordered_json bind = ordered_json::object();
    for (const auto& [tensor, bi] : st.bind) bind[tensor] = p.buffers[bi].name;
    stages.push_back({{"name", st.name},
                      {"graph", st.graph.name},
                      {"graph_file", st.graph_file},
                      {"fingerprint", graph_fingerprint(st.graph)},
                      {"flops", st.graph.flops()},
                      {"bind", std::move(bind)}});
  }
  j["stages"] = std::move(stages);
  ordered_json buffers = ordered_json::array();
  for (const auto& b : p.buffers) {
    ordered_json rd = ordered_json::array();
    for (const auto& r : b.readers) rd.push_back(use_json(p, r));
    ordered_json e;
    e["name"] = b.name;
    e["kind"] = std::string(buffer_kind_name(b.kind));
    e["dtype"] = std::string(dtype_name(b.dtype));
    e["dims"] = b.dims;
    e["strides"] = b.strides;
    e["file"] = b.file.empty() ? ordered_json(nullptr) : ordered_json(b.file);
    e["writer"] = b.writer ? use_json(p, *b.writer) : ordered_json(nullptr);
    e["readers"] = std::move(rd);
    buffers.push_back(std::move(e));
  }
  j["buffers"] = std::move(buffers);
  j["flops"] = p.flops();
  return j;
}

void print_pipeline(const Pipeline& p) {
  std::printf("%s: ok\npipeline %s: %zu stages, %zu buffers\nstage order:\n", safe(p.path).c_str(),
              safe(p.name).c_str(), p.stages.size(), p.buffers.size());
  for (size_t i = 0; i < p.order.size(); ++i) {
    const PipelineStage& st = p.stages[p.order[i]];
    std::printf("  %zu. %s  graph %s (%s)  %g flops\n", i + 1, safe(st.name).c_str(),
                safe(st.graph.name).c_str(), safe(st.graph_file).c_str(), st.graph.flops());
  }
  std::printf("buffers:\n");
  for (const auto& b : p.buffers) {
    std::string who = "written by " + (b.writer ? use_text(p, *b.writer) : std::string("-"));
    std::string rd;
    for (const auto& r : b.readers) rd += (rd.empty() ? "" : ", ") + use_text(p, r);
    who += ", read by " + (rd.empty() ? std::string("-") : rd);
    if (!b.file.empty()) who += ", file " + b.file;
    std::printf("  %-12s %-12s %s %s  %s\n", safe(b.name).c_str(),
                std::string(buffer_kind_name(b.kind)).c_str(), std::string(dtype_name(b.dtype)).c_str(),
                common::dims_string(b.dims).c_str(), safe(who).c_str());
  }
  std::printf("total flops %g\n", p.flops());
}

}  // namespace

Runner add_pipeline(CLI::App& app) {
  auto* cmd = app.add_subcommand("pipeline", "Pipelines of graphs (docs/pipeline-format.md)");
  struct Args {
    std::string path;
    bool json = false;
    std::string dot;
  };
  auto a = std::make_shared<Args>();
  auto* check = cmd->add_subcommand(
      "check",
      "Load a pipeline file, check how its stages connect; print the stage order and buffers (no GPU)");
  check->add_option("pipeline", a->path, "Pipeline JSON file")->required();
  check->add_flag("--json", a->json, "Write the checked pipeline as one JSON document to stdout");
  auto* dot = check->add_option("--dot", a->dot,
                                "Write a Graphviz picture of the pipeline (buffers, stages, their ops) to FILE (no "
                                "FILE or '-': stdout; write --dot=FILE, or put --dot after the pipeline)")
                  ->expected(0, 1);
  return [a, check, dot]() {
    if (!check->parsed())
      return fail(
          "pipeline",
          InvalidArgument(
              "a subcommand is needed: accepted subcommands are check (see fusebox pipeline --help)"));
    const bool want_dot = dot->count() > 0;
    const bool dot_stdout = want_dot && (a->dot.empty() || a->dot == "-");
    if (dot_stdout && a->json)
      return fail("pipeline check", InvalidArgument("--json and --dot both write to stdout: give --dot a FILE"));
    if (want_dot && !dot_stdout) {
      Status st = common::refuse_overwriting_input(a->dot, "--dot file", {{"pipeline file", a->path}});
      if (!st.ok()) return fail("pipeline check", st);
    }
    auto p = load_pipeline_file(a->path);
    if (!p.ok()) {
      if (a->json)
        std::printf("%s\n", common::json_dump(ordered_json({{"ok", false},
                                                            {"code", status_code_name(p.status().code())},
                                                            {"error", p.status().message()}}),
                                              2)
                                .c_str());
      return fail("pipeline check", p.status());
    }
    if (want_dot) {
      if (Status st = write_dot(a->dot, pipeline_dot(*p)); !st.ok()) return fail("pipeline check", st);
      if (dot_stdout) return kExitOk;  // stdout holds the picture alone, for `| dot -Tsvg`
    }
    if (a->json)
      std::printf("%s\n", common::json_dump(pipeline_json(*p), 2).c_str());
    else
      print_pipeline(*p);
    return kExitOk;
  };
}

}  // namespace fusebox::cli
