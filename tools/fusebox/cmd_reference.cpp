// fusebox reference: a graph's outputs from fusebox's CPU reference, no GPU. The inputs are the
// ones `fusebox run` makes for the same --seed and --inputs, so `run --save-outputs DIR` on the GPU
// and `reference --compare DIR` anywhere give `run --verify`'s verdict, with the worst element of
// each output and the reference's own values on disk for a closer look.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "common.h"
#include "common/dims_string.h"

namespace fusebox::cli {
namespace {

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

std::string index_text(int64_t flat, const std::vector<int64_t>& dims) {
  std::vector<int64_t> idx(dims.size(), 0);
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] > 0) {
      idx[i] = flat % dims[i];
      flat /= dims[i];
    }
  }
  return common::dims_string(idx);
}

}  // namespace

Runner add_reference(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "reference",
      "Compute a graph's outputs with fusebox's CPU reference (no GPU), from the inputs `run` makes for "
      "the same --seed and --inputs; --compare DIR checks the outputs `run --save-outputs DIR` wrote, "
      "as `run --verify` does");
  struct Args {
    std::string graph, shape, inputs, save_inputs, save_outputs, compare;
    uint64_t seed = 1;
    double max_flops = 2e10;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("graph", a->graph, "Graph JSON file")->required();
  add_shape_flag(cmd, a->shape);
  cmd->add_option("--inputs", a->inputs,
                  "Inputs as NAME=FILE.npy,... (others random from --seed, as `run` makes them)");
  cmd->add_option("--seed", a->seed, "Seed for random inputs (`run`'s --seed)")->capture_default_str();
  cmd->add_option("--save-inputs", a->save_inputs,
                  "Write each graph input, as made for --seed, to DIR/<tensor>.npy (floats as fp32, exact; "
                  "`run --inputs` and `--inputs` read them back)");
  cmd->add_option("--save-outputs", a->save_outputs,
                  "Write each reference output to DIR/<tensor>.npy (fp32, logical row-major)");
  cmd->add_option("--compare", a->compare,
                  "Compare DIR/<tensor>.npy (from `run --save-outputs DIR`) with the reference; a mismatch "
                  "exits 1. A dropout keep-mask output is read from there too (the references take cuDNN's)");
  cmd->add_option("--max-flops", a->max_flops,
                  "Refuse a graph whose work exceeds this many FLOPs (the naive CPU reference runs at about "
                  "1 GFLOP/s: 2e10 is tens of seconds)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Write one JSON document to stdout");
  return [a]() {
    auto g = load_resolved(a->graph, a->shape);
    if (!g.ok()) return fail("reference", g.status());
    // Before any file is read or input made (a hostile graph's tensors could be huge): the work at full
    // sequence lengths, an upper bound.
    const double flops = g->flops();
    if (flops > a->max_flops) {
      char b[200];
      std::snprintf(b, sizeof b, "%.3g FLOPs, over --max-flops %.3g: the CPU reference would take too long",
                    flops, a->max_flops);
      return fail("reference",
                  InvalidArgument("[graph '" + g->name + "']: " + b +
                                  " (raise --max-flops, or verify on a GPU with `run --verify`)"));
    }
    // And the host memory its inputs and outputs take (a zero-FLOP transpose can still be huge).
    constexpr double kMaxBytes = 8.0 * (1 << 30);
    if (g->bytes_moved() > kMaxBytes) {
      char b[200];
      std::snprintf(b, sizeof b, "its inputs and outputs take %.3g GiB, over the CPU reference's 8 GiB",
                    g->bytes_moved() / (1 << 30));
      return fail("reference", InvalidArgument("[graph '" + g->name + "']: " + b +
                                               " (verify on a GPU with `run --verify`)"));
    }
    auto input_files = parse_input_list(a->inputs);
    if (!input_files.ok()) return fail("reference", input_files.status());
    std::vector<common::NamedPath> read = {{"graph file", a->graph}};
    for (const auto& [name, file] : *input_files) read.push_back({"--inputs file for '" + name + "'", file});
    // The outputs to compare, each read as its graph tensor (shape checked).
    std::map<std::string, HostTensor> outputs;
    if (!a->compare.empty()) {
      for (const ResolvedTensor& t : g->tensors) {
        if (!t.is_output) continue;
        auto path = npy_output_path(t.name, a->compare, {}, "--compare");
        if (!path.ok()) return fail("reference", path.status());
        read.push_back({"--compare file for '" + t.name + "'", *path});
        auto h = read_npy_for(*path, t);
        if (!h.ok()) return fail("reference", h.status().WithContext("--compare: output '" + t.name + "'"));
        outputs[t.name] = std::move(h).value();
      }
    }
    std::map<std::string, std::string> save_paths;
    if (!a->save_outputs.empty()) {
      auto paths = npy_output_paths(*g, a->save_outputs, read, "--save-outputs");
      if (!paths.ok()) return fail("reference", paths.status());
      save_paths = std::move(paths).value();
    }
    std::map<std::string, std::string> input_paths;
    if (!a->save_inputs.empty()) {
      auto paths = npy_output_paths(*g, a->save_inputs, read, "--save-inputs", /*graph_inputs=*/true);
      if (!paths.ok()) return fail("reference", paths.status());
      input_paths = std::move(paths).value();
    }
    auto given = load_input_files(*g, a->inputs);
    if (!given.ok()) return fail("reference", given.status());
    auto inputs = make_inputs(*g, a->seed, *given, a->max_flops);
    if (!inputs.ok()) return fail("reference", inputs.status().WithContext("[graph '" + g->name + "']"));
    if (!input_paths.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(a->save_inputs, ec);  // a failure shows in the write
      for (const auto& [name, path] : input_paths) {
        auto it = inputs->find(name);
        if (it == inputs->end()) continue;
        const Status st = write_npy(path, it->second);
        if (!st.ok()) return fail("reference", st);
      }
    }
    const std::set<std::string> masks = dropout_mask_outputs(*g);
    std::map<std::string, HostTensor> ref_inputs = *inputs;
    for (const auto& name : masks) {
      auto it = outputs.find(name);
      if (it != outputs.end()) ref_inputs[name] = it->second;
    }
    auto ref = reference_cpu(*g, ref_inputs);
    if (!ref.ok()) return fail("reference", ref.status().WithContext("[graph '" + g->name + "']"));

    nlohmann::json outs = nlohmann::json::array();
    std::vector<std::string> lines;
    for (const ResolvedTensor& t : g->tensors) {
      auto it = ref->find(t.name);
      if (!t.is_output || it == ref->end()) continue;
      double max_abs = 0;
      for (float v : it->second) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
      std::string saved;
      if (!save_paths.empty()) {
        HostTensor h;
        h.dtype = DType::kFP32;
        h.dims = t.dims;
        h.strides = row_major_strides(t.dims);
        h.data.resize(it->second.size() * sizeof(float));
        std::memcpy(h.data.data(), it->second.data(), h.data.size());
        saved = save_paths.at(t.name);
        std::error_code ec;
        std::filesystem::create_directories(a->save_outputs, ec);  // a failure shows in the write
        const Status st = write_npy(saved, h);
        if (!st.ok()) return fail("reference", st);
      }
      outs.push_back({{"tensor", t.name},
                      {"dtype", std::string(dtype_name(t.dtype))},
                      {"dims", t.dims},
                      {"max_abs", max_abs},
                      {"saved", saved}});
      char b[160];
      std::snprintf(b, sizeof b, " %s %s: max |value| %.6g", std::string(dtype_name(t.dtype)).c_str(),
                    common::dims_string(t.dims).c_str(), max_abs);
      lines.push_back("  reference: " + safe(t.name) + b + (saved.empty() ? "" : ", saved " + safe(saved)));
    }

    std::vector<Comparison> comps;
    bool ok = true;
    if (!a->compare.empty()) {
      auto c = compare_with_reference(*g, *inputs, outputs, *ref);
      if (!c.ok()) return fail("reference", c.status());
      comps = std::move(c).value();
      for (const Comparison& x : comps) ok = ok && x.pass;
    }
    nlohmann::json verify = nlohmann::json::array();
    for (const Comparison& c : comps) {
      nlohmann::json j = to_json(c);
      const ResolvedTensor* t =
          g->find_tensor(c.tensor) >= 0 ? &g->tensors[g->find_tensor(c.tensor)] : nullptr;
      auto r = ref->find(c.tensor);
      if (t && c.worst_index >= 0 && r != ref->end() &&
          c.worst_index < static_cast<int64_t>(r->second.size())) {
        const std::vector<float> actual = outputs.at(c.tensor).to_float_logical();
        const size_t w = static_cast<size_t>(c.worst_index);
        j["worst"] = {{"index", c.worst_index}, {"actual", actual[w]}, {"reference", r->second[w]}};
        char b[200];
        std::snprintf(b, sizeof b, "    worst at %s: %.8g, the reference %.8g",
                      index_text(c.worst_index, t->dims).c_str(), actual[w], r->second[w]);
        lines.push_back("  verify (cpu reference): " + safe(c.ToString()));
        lines.push_back(b);
      } else {
        lines.push_back("  verify (cpu reference): " + safe(c.ToString()));
      }
      verify.push_back(std::move(j));
    }
    if (a->json) {
      std::printf("%s\n", dump({{"graph", g->name},
                                {"graph_file", a->graph},
                                {"seed", a->seed},
                                {"outputs", outs},
                                {"compared", a->compare},
                                {"verify", verify},
                                {"ok", ok}})
                              .c_str());
    } else {
      std::printf("%s (%s), inputs from seed %llu\n", safe(g->name).c_str(), safe(a->graph).c_str(),
                  static_cast<unsigned long long>(a->seed));
      for (const auto& l : lines) std::printf("%s\n", l.c_str());
    }
    if (!ok) {
      std::string msg = "the outputs in '" + a->compare + "' do not match the cpu reference:";
      for (const Comparison& c : comps)
        if (!c.pass) msg += "\n  " + c.ToString();
      return fail("reference", Status(StatusCode::kVerificationFailed, msg));
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
