// fusebox backward: derive the backward graph of a forward graph by the op
// families' gradient rules (fusebox/autodiff.h, docs/training.md) and write it
// as a graph file, with its bindings to the forward beside it.
#include <cstdio>

#include "common.h"
#include "common/file_io.h"
#include "fusebox/autodiff.h"
#include "fusebox/gradient_check.h"
#include "fusebox/pipeline_backward.h"

namespace fusebox::cli {
namespace {

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size() && !s.empty()) {
    const size_t comma = s.find(',', start);
    const std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

struct BackwardArgs {
  std::string graph, out, bindings, wrt, seeds, shape;
  bool verify = false;
};

}  // namespace

Runner add_backward(CLI::App& app) {
  auto a = std::make_shared<BackwardArgs>();
  auto* cmd = app.add_subcommand(
      "backward",
      "Derive a forward graph's backward graph by the ops' gradient rules (docs/training.md) and write it");
  cmd->add_option("graph", a->graph, "Forward graph JSON file")->required();
  cmd->add_option("--out", a->out, "Backward graph JSON file to write (replaced atomically)")->required();
  cmd->add_option("--bindings", a->bindings,
                  "Where each backward input comes from, as JSON (default: OUT with .bindings.json)");
  cmd->add_option("--wrt", a->wrt,
                  "Forward inputs to differentiate, comma-separated (default: every one that can)");
  cmd->add_option("--seeds", a->seeds,
                  "Forward outputs whose gradients come in, comma-separated (default: the final outputs)");
  add_shape_flag(cmd, a->shape);
  cmd->add_flag(
      "--verify", a->verify,
      "Check every gradient against finite differences of the forward, both through the CPU reference "
      "(small graphs; exit 1 on a mismatch)");
  return [a]() {
    auto fail = [](const Status& st) {
      std::fprintf(stderr, "fusebox backward: %s\n", st.ToString().c_str());
      return exit_code_for(st);
    };
    auto fwd = load_resolved(a->graph, a->shape);
    if (!fwd.ok()) return fail(fwd.status());
    BackwardOptions opt;
    opt.wrt = split_names(a->wrt);
    opt.seeds = split_names(a->seeds);
    auto b = derive_backward(*fwd, opt);
    if (!b.ok()) return fail(b.status());
    std::string bindings = a->bindings;
    if (bindings.empty()) {
      const std::string& o = a->out;
      bindings = (o.size() > 5 && o.compare(o.size() - 5, 5, ".json") == 0 ? o.substr(0, o.size() - 5) : o) +
                 ".bindings.json";
    }
    if (Status st = common::check_outputs_spare_inputs({{"--out", a->out}, {"--bindings", bindings}},
                                                       {{"forward graph", a->graph}});
        !st.ok())
      return fail(st);
    if (Status st = common::write_file_atomic(a->out, graph_to_json(b->spec), "backward graph"); !st.ok())
      return fail(st);
    if (Status st = common::write_file_atomic(bindings, backward_bindings_json(*b), "backward bindings");
        !st.ok())
      return fail(st);
    std::printf("%s: backward of '%s' -> %s (%zu ops), bindings -> %s\n", a->graph.c_str(), fwd->name.c_str(),
                a->out.c_str(), b->spec.ops.size(), bindings.c_str());
    std::printf("  seeds: ");
    for (size_t i = 0; i < b->seeds.size(); ++i) std::printf("%s%s", i ? ", " : "", b->seeds[i].c_str());
    std::printf("\n  gradients:");
    for (const auto& [x, g] : b->gradients) std::printf(" %s -> %s;", x.c_str(), g.c_str());
    std::printf("\n  saved: %zu forward tensors, %lld bytes", b->saved.size(),
                static_cast<long long>(b->saved_bytes));
    std::printf("\n  recomputed in the backward: %s\n",
                b->recomputed.empty() ? "nothing" : [&] {
                  std::string s;
                  for (const auto& r : b->recomputed) s += (s.empty() ? "" : ", ") + r;
                  return s;
                }().c_str());
    if (!a->verify) return kExitOk;
    auto check = check_gradients(*fwd, *b);
    if (!check.ok()) return fail(check.status());
    for (const GradientCheckRow& r : check->rows) std::printf("  verify: %s\n", r.ToString().c_str());
    if (check->pass()) return kExitOk;
    std::fprintf(
        stderr,
        "fusebox backward: VerificationFailed: a derived gradient does not match finite differences\n");
    return kExitFailure;
  };
}

Runner add_pipeline_backward(CLI::App& pipeline) {
  auto a = std::make_shared<BackwardArgs>();
  auto* cmd = pipeline.add_subcommand("backward",
                                      "Derive a forward pipeline's backward pipeline (each stage's by the "
                                      "gradient rules, parts summed) and write "
                                      "it to a folder");
  cmd->add_option("pipeline", a->graph, "Forward pipeline JSON file")->required();
  cmd->add_option("--out-dir", a->out, "Folder for the backward pipeline file and its graph files")
      ->required();
  cmd->add_option("--wrt", a->wrt,
                  "Buffers to differentiate, comma-separated (default: every float input and constant)");
  cmd->add_option("--seeds", a->seeds,
                  "Buffers whose gradients come in (default: the outputs no stage reads)");
  cmd->add_flag("--verify", a->verify,
                "Check every gradient against finite differences of the forward chain, both through the CPU "
                "reference (small pipelines; exit 1 on a mismatch)");
  return [a]() {
    auto fail = [](const Status& st) {
      std::fprintf(stderr, "fusebox pipeline backward: %s\n", st.ToString().c_str());
      return exit_code_for(st);
    };
    auto fwd = load_pipeline_file(a->graph);
    if (!fwd.ok()) return fail(fwd.status());
    BackwardOptions opt;
    opt.wrt = split_names(a->wrt);
    opt.seeds = split_names(a->seeds);
    auto b = derive_pipeline_backward(*fwd, opt);
    if (!b.ok()) return fail(b.status());
    auto path = write_pipeline_backward(*fwd, *b, a->out);
    if (!path.ok()) return fail(path.status());
    std::printf("%s: backward of pipeline '%s' -> %s (%zu stages)\n", a->graph.c_str(), fwd->name.c_str(),
                path->c_str(), b->graph_files.size());
    std::printf("  seeds: ");
    for (size_t i = 0; i < b->seeds.size(); ++i) std::printf("%s%s", i ? ", " : "", b->seeds[i].c_str());
    std::printf("\n  gradients:");
    for (const auto& [x, g] : b->gradients) std::printf(" %s -> %s;", x.c_str(), g.c_str());
    std::printf("\n  recomputed in the backward: %zu ops\n", b->recomputed.size());
    if (!a->verify) return kExitOk;
    auto bwd = load_pipeline_file(*path);
    if (!bwd.ok()) return fail(bwd.status());
    auto check = check_pipeline_gradients(*fwd, *b, *bwd);
    if (!check.ok()) return fail(check.status());
    for (const GradientCheckRow& r : check->rows) std::printf("  verify: %s\n", r.ToString().c_str());
    if (check->pass()) return kExitOk;
    std::fprintf(stderr,
                 "fusebox pipeline backward: VerificationFailed: a derived gradient does not match finite "
                 "differences\n");
    return kExitFailure;
  };
}

}  // namespace fusebox::cli
