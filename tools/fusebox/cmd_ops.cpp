// fusebox ops: every op a graph file may name, with its roles and traits
// (include/fusebox/op_traits.h; the table is src/graph/ops/traits.h).
#include <cstdio>

#include "common.h"
#include "fusebox/op_traits.h"

namespace fusebox::cli {

nlohmann::ordered_json traits_json(const OpTraitsInfo& t) {
  auto strings = [](const std::vector<std::string_view>& v) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (std::string_view s : v) a.push_back(std::string(s));
    return a;
  };
  nlohmann::ordered_json j;
  j["family"] = std::string(t.family);
  j["bench_family"] = std::string(t.bench_family);
  j["json_fields"] = strings(t.json_fields);
  j["accepts_scalar_inputs"] = t.accepts_scalar_inputs;
  j["outputs_in_memory"] = t.outputs_in_memory;
  j["native_only"] = t.native_only;
  j["reads_forward_outputs"] = t.reads_forward_outputs;
  j["index_inputs"] = strings(t.index_inputs);
  j["sums_inputs"] = t.sums_inputs;
  return j;
}

Runner add_ops(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("ops", "List every op a graph file may name: family, roles, JSON fields, traits");
  auto json_out = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json_out, "Write one JSON document to stdout");
  return [json_out]() {
    const std::vector<OpCatalogEntry> ops = op_catalog();
    auto joined = [](const std::vector<std::string_view>& v) {
      std::string s;
      for (std::string_view x : v) s += (s.empty() ? "" : ", ") + std::string(x);
      return s;
    };
    if (*json_out) {
      nlohmann::ordered_json list = nlohmann::ordered_json::array();
      for (const OpCatalogEntry& e : ops) {
        nlohmann::ordered_json j;
        j["op"] = std::string(e.name);
        nlohmann::ordered_json in = nlohmann::ordered_json::array(), out = nlohmann::ordered_json::array();
        for (std::string_view r : e.input_roles) in.push_back(std::string(r));
        for (std::string_view r : e.output_roles) out.push_back(std::string(r));
        j["input_roles"] = std::move(in);
        j["output_roles"] = std::move(out);
        j["traits"] = traits_json(e.traits);
        list.push_back(std::move(j));
      }
      nlohmann::ordered_json doc;
      doc["ops"] = std::move(list);
      std::printf("%s\n", doc.dump(1).c_str());
      return kExitOk;
    }
    std::printf("%-22s %-10s %-22s %s\n", "op", "family", "inputs", "outputs");
    for (const OpCatalogEntry& e : ops) {
      std::printf("%-22s %-10s %-22s %s%s\n", std::string(e.name).c_str(),
                  std::string(e.traits.family).c_str(), joined(e.input_roles).c_str(),
                  joined(e.output_roles).c_str(), e.traits.native_only ? "  (fusebox's own kernel)" : "");
    }
    return kExitOk;
  };
}

}  // namespace fusebox::cli
