// fusebox: the JSON graph format (docs/graph-format.md).
// Never converts JSON to or from `float`: the cuDNN frontend specializes
// nlohmann::adl_serializer<float> in other translation units (ODR), so only
// double and integers are used here.
#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "common/json_util.h"
#include "fusebox/graph.h"
#include "graph/json_reader.h"
#include "graph/ops/ops.h"

namespace fusebox {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxGraphFileBytes = 64ull << 20;

class Parser : public JsonReader {
 public:
  explicit Parser(std::string_view origin) : JsonReader(origin) {}

  Result<TensorSpec> tensor(const std::string& base, const json& v) const {
    if (!v.is_object()) return expected(base, "an object", v);
    std::string path = base;
    if (v.contains("name") && v["name"].is_string()) path += " ('" + v["name"].get<std::string>() + "')";
    FUSEBOX_RETURN_IF_ERROR(
        check_fields(path, v, {"name", "dims", "strides", "layout", "dtype", "virtual", "scalar", "values"}));
    TensorSpec t;
    if (!v.contains("name")) return err(path, "missing field 'name'");
    FUSEBOX_ASSIGN_OR_RETURN(t.name, get_string(path + ".name", v["name"]));
    if (v.contains("dims")) {
      FUSEBOX_ASSIGN_OR_RETURN(t.dims, get_int_list(path + ".dims", v["dims"]));
    }
    if (v.contains("strides")) {
      FUSEBOX_ASSIGN_OR_RETURN(t.strides, get_int_list(path + ".strides", v["strides"]));
    }
    if (v.contains("layout")) {
      FUSEBOX_ASSIGN_OR_RETURN(t.layout, get_string(path + ".layout", v["layout"]));
    }
    if (v.contains("dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(t.dtype, get_dtype(path + ".dtype", v["dtype"]));
    }
    if (v.contains("virtual")) {
      if (!v["virtual"].is_boolean()) return expected(path + ".virtual", "true or false", v["virtual"]);
      t.is_virtual = v["virtual"].get<bool>();
    }
    if (v.contains("scalar")) {
      if (!v["scalar"].is_number()) return expected(path + ".scalar", "a number", v["scalar"]);
      t.scalar_value = v["scalar"].get<double>();
    }
    if (v.contains("values")) {
      const json& vals = v["values"];
      if (!vals.is_array()) return expected(path + ".values", "an array of numbers", vals);
      for (size_t i = 0; i < vals.size(); ++i) {
        if (!vals[i].is_number()) return expected(path + ".values[" + std::to_string(i) + "]", "a number", vals[i]);
        t.values.push_back(vals[i].get<double>());
      }
    }
    return t;
  }

  Result<OpSpec> op(const std::string& base, const json& v) const {
    if (!v.is_object()) return expected(base, "an object", v);
    std::string path = base;
    if (v.contains("name") && v["name"].is_string()) path += " ('" + v["name"].get<std::string>() + "')";
    OpSpec o;
    if (!v.contains("op")) return err(path, "missing field 'op' (the op type, e.g. \"conv_fprop\")");
    FUSEBOX_ASSIGN_OR_RETURN(std::string type, get_string(path + ".op", v["op"]));
    auto attrs = graph_ops::attrs_for_type_name(type);
    if (!attrs) {
      return err(path + ".op", "unknown op \"" + type + "\": accepted ops are " + graph_ops::accepted_type_names());
    }
    o.attrs = std::move(*attrs);
    std::vector<std::string_view> fields = {"op", "name", "inputs", "outputs", "compute_dtype"};
    for (std::string_view f : std::visit([](const auto& a) { return graph_ops::json_fields(a); }, o.attrs)) {
      fields.push_back(f);
    }
    FUSEBOX_RETURN_IF_ERROR(check_fields(path, v, fields));
    if (!v.contains("name")) return err(path, "missing field 'name' (every op needs a unique name)");
    FUSEBOX_ASSIGN_OR_RETURN(o.name, get_string(path + ".name", v["name"]));
    if (!v.contains("inputs")) return err(path, "missing field 'inputs' (an object: role -> tensor name)");
    FUSEBOX_ASSIGN_OR_RETURN(o.inputs, role_map(path + ".inputs", v["inputs"]));
    if (v.contains("outputs")) {
      FUSEBOX_ASSIGN_OR_RETURN(o.outputs, role_map(path + ".outputs", v["outputs"]));
    }
    if (v.contains("compute_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(o.compute_dtype, get_dtype(path + ".compute_dtype", v["compute_dtype"]));
    }
    // The family reads its own fields (and may switch features on from the roles given).
    FUSEBOX_RETURN_IF_ERROR(
        std::visit([&](auto& a) { return graph_ops::parse_json(*this, v, path, o, a); }, o.attrs));
    if (!v.contains("outputs")) {
      const std::string primary(op_primary_output_role(o.attrs));
      o.outputs[primary] = o.name + "." + primary;
    }
    return o;
  }

  Result<std::map<std::string, std::string>> role_map(const std::string& path, const json& v) const {
    if (!v.is_object()) return expected(path, "an object (role -> tensor name)", v);
    std::map<std::string, std::string> m;
    for (auto it = v.begin(); it != v.end(); ++it) {
      FUSEBOX_ASSIGN_OR_RETURN(m[it.key()], get_string(path + "." + it.key(), it.value()));
    }
    return m;
  }

  Result<GraphSpec> graph(const json& root) const {
    if (!root.is_object()) return expected("graph", "an object", root);
    FUSEBOX_RETURN_IF_ERROR(
        check_fields("graph", root, {"name", "io_dtype", "intermediate_dtype", "compute_dtype", "tensors", "ops"}));
    GraphSpec g;
    if (root.contains("name")) {
      FUSEBOX_ASSIGN_OR_RETURN(g.name, get_string("name", root["name"]));
    }
    if (root.contains("io_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(g.io_dtype, get_dtype("io_dtype", root["io_dtype"]));
    }
    if (root.contains("intermediate_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(g.intermediate_dtype, get_dtype("intermediate_dtype", root["intermediate_dtype"]));
    }
    if (root.contains("compute_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(g.compute_dtype, get_dtype("compute_dtype", root["compute_dtype"]));
    }
    if (!root.contains("tensors")) return err("graph", "missing field 'tensors' (an array of tensor objects)");
    if (!root["tensors"].is_array()) return expected("tensors", "an array", root["tensors"]);
    for (size_t i = 0; i < root["tensors"].size(); ++i) {
      FUSEBOX_ASSIGN_OR_RETURN(TensorSpec t, tensor("tensors[" + std::to_string(i) + "]", root["tensors"][i]));
      g.tensors.push_back(std::move(t));
    }
    if (!root.contains("ops")) return err("graph", "missing field 'ops' (an array of op objects)");
    if (!root["ops"].is_array()) return expected("ops", "an array", root["ops"]);
    for (size_t i = 0; i < root["ops"].size(); ++i) {
      FUSEBOX_ASSIGN_OR_RETURN(OpSpec o, op("ops[" + std::to_string(i) + "]", root["ops"][i]));
      g.ops.push_back(std::move(o));
    }
    return g;
  }

};

}  // namespace

Result<GraphSpec> parse_graph_json(std::string_view text, std::string_view origin) {
  try {
    json root;
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
      // e.what(): "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
      std::string what = e.what();
      auto p = what.find("] ");
      if (p != std::string::npos) what = what.substr(p + 2);
      return ParseError(std::string(origin) + ": invalid JSON at byte " + std::to_string(e.byte) + ": " + what);
    }
    return Parser(origin).graph(root);
  } catch (const std::exception& e) {
    return Internal(std::string(origin) + ": unexpected error while reading the graph: " + e.what());
  }
}

Result<GraphSpec> load_graph_file(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text, common::read_file_bounded(path, kMaxGraphFileBytes, "graph file"));
  return parse_graph_json(text, path);
}

std::string graph_to_json(const GraphSpec& spec, int indent) {
  ordered_json root;
  root["name"] = spec.name;
  root["io_dtype"] = std::string(dtype_name(spec.io_dtype));
  root["intermediate_dtype"] = std::string(dtype_name(spec.intermediate_dtype));
  root["compute_dtype"] = std::string(dtype_name(spec.compute_dtype));
  ordered_json tensors = ordered_json::array();
  for (const auto& t : spec.tensors) {
    ordered_json j;
    j["name"] = t.name;
    if (!t.dims.empty()) j["dims"] = t.dims;
    if (!t.strides.empty()) j["strides"] = t.strides;
    if (!t.layout.empty()) j["layout"] = t.layout;
    if (t.dtype) j["dtype"] = std::string(dtype_name(*t.dtype));
    if (t.is_virtual) j["virtual"] = true;
    if (t.scalar_value) j["scalar"] = static_cast<double>(*t.scalar_value);
    if (!t.values.empty()) j["values"] = t.values;
    tensors.push_back(std::move(j));
  }
  root["tensors"] = std::move(tensors);
  ordered_json ops = ordered_json::array();
  for (const auto& o : spec.ops) {
    ordered_json j;
    j["op"] = std::string(op_type_name(o.attrs));
    j["name"] = o.name;
    ordered_json in = ordered_json::object(), out = ordered_json::object();
    for (const auto& [role, name] : o.inputs) in[role] = name;
    for (const auto& [role, name] : o.outputs) out[role] = name;
    j["inputs"] = std::move(in);
    j["outputs"] = std::move(out);
    if (o.compute_dtype) j["compute_dtype"] = std::string(dtype_name(*o.compute_dtype));
    std::visit([&](const auto& a) { graph_ops::write_json(a, j); }, o.attrs);
    ops.push_back(std::move(j));
  }
  root["ops"] = std::move(ops);
  return common::json_dump(root, indent);
}

}  // namespace fusebox
