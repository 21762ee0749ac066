// fusebox: the JSON graph format (docs/graph-format.md).
// Never converts JSON to or from `float`: the cuDNN frontend specializes
// nlohmann::adl_serializer<float> in other translation units (ODR), so only
// double and integers are used here.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "fusebox/graph.h"
#include "graph/limits.h"

namespace fusebox {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::uintmax_t kMaxGraphFileBytes = 64ull << 20;

namespace limits = graph_limits;

// "300 bytes exceed the limit of 256 bytes per name"
std::string over_limit(size_t n, size_t limit, const char* unit, const char* per) {
  return std::to_string(n) + " " + unit + " exceed the limit of " + std::to_string(limit) + " " + unit + " " +
         per;
}

std::string type_and_value(const json& v) {
  std::string dump = v.dump();
  if (dump.size() > 40) dump = dump.substr(0, 37) + "...";
  if (v.is_string()) return dump;  // already quoted
  const char* t = v.is_null() ? "null" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
                  : v.is_array() ? "an array" : "an object";
  if (v.is_number() || v.is_boolean() || v.is_null()) return dump;
  return std::string(t) + " " + dump;
}

class Parser {
 public:
  explicit Parser(std::string_view origin) : origin_(origin) {}

  Status err(const std::string& path, const std::string& msg) const {
    return InvalidArgument(origin_ + ": " + path + ": " + msg);
  }
  Status expected(const std::string& path, const char* what, const json& v) const {
    return err(path, std::string("expected ") + what + ", got " + type_and_value(v));
  }

  Status check_fields(const std::string& path, const json& obj, std::initializer_list<const char*> accepted) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      bool ok = false;
      for (const char* a : accepted) ok = ok || it.key() == a;
      if (!ok) {
        std::string list;
        for (const char* a : accepted) {
          if (!list.empty()) list += ", ";
          list += a;
        }
        return err(path, "unknown field '" + it.key() + "': accepted fields are " + list);
      }
    }
    return Status::Ok();
  }

  Result<std::string> get_string(const std::string& path, const json& v) const {
    if (!v.is_string()) return expected(path, "a string", v);
    return v.get<std::string>();
  }

  Result<int64_t> get_int(const std::string& path, const json& v) const {
    if (v.is_number_unsigned()) {
      auto u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return err(path, "integer " + v.dump() + " is out of range");
      return static_cast<int64_t>(u);
    }
    if (!v.is_number_integer()) return expected(path, "an integer", v);
    return v.get<int64_t>();
  }

  Result<std::vector<int64_t>> get_int_list(const std::string& path, const json& v) const {
    if (!v.is_array()) return expected(path, "an array of integers", v);
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) {
      FUSEBOX_ASSIGN_OR_RETURN(int64_t x, get_int(path + "[" + std::to_string(i) + "]", v[i]));
      out.push_back(x);
    }
    return out;
  }

  Result<DType> get_dtype(const std::string& path, const json& v) const {
    FUSEBOX_ASSIGN_OR_RETURN(std::string s, get_string(path, v));
    auto t = parse_dtype(s);
    if (!t) return err(path, "unknown dtype \"" + s + "\": accepted dtypes are " + std::string(dtype_accepted_names()));
    return *t;
  }

  // The "name" of a tensor or op object, checked before it goes into error paths.
  Status check_name_length(const std::string& path, const json& obj) const {
    auto it = obj.find("name");
    if (it == obj.end() || !it->is_string()) return Status::Ok();
    const size_t n = it->get_ref<const std::string&>().size();
    if (n <= limits::kMaxNameBytes) return Status::Ok();
    return err(path + ".name", over_limit(n, limits::kMaxNameBytes, "bytes", "per name"));
  }

  // Product of dims, saturated just past the per-graph limit; 0 when there are
  // none or resolve() rejects them anyway (a dim < 1).
  static int64_t declared_elements(const std::vector<int64_t>& dims) {
    if (dims.empty()) return 0;
    int64_t n = 1;
    for (int64_t d : dims) {
      if (d < 1) return 0;
      if (__builtin_mul_overflow(n, d, &n) || n > limits::kMaxTotalElements) {
        return limits::kMaxTotalElements + 1;
      }
    }
    return n;
  }

  Result<TensorSpec> tensor(const std::string& base, const json& v) const {
    if (!v.is_object()) return expected(base, "an object", v);
    FUSEBOX_RETURN_IF_ERROR(check_name_length(base, v));
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
      if (t.layout.size() > limits::kMaxNameBytes) {
        return err(path + ".layout",
                   over_limit(t.layout.size(), limits::kMaxNameBytes, "bytes", "per layout"));
      }
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
      if (vals.size() > limits::kMaxValues) {
        return err(path + ".values", over_limit(vals.size(), limits::kMaxValues, "entries", "per tensor"));
      }
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
    bool conv = false, sdpa = false;
    if (type == "conv_fprop") {
      o.attrs = ConvFpropAttrs{};
      conv = true;
    } else if (type == "sdpa_fwd") {
      o.attrs = SdpaFwdAttrs{};
      sdpa = true;
    } else if (type == "sdpa_bwd") {
      o.attrs = SdpaBwdAttrs{};
      sdpa = true;
    } else if (type == "sdpa_fp8_fwd") {
      o.attrs = SdpaFp8FwdAttrs{};
      sdpa = true;
    } else if (type == "sdpa_fp8_bwd") {
      o.attrs = SdpaFp8BwdAttrs{};
      sdpa = true;
    } else if (type == "matmul") {
      o.attrs = MatmulAttrs{};
    } else if (auto m = parse_pointwise_mode(type)) {
      o.attrs = PointwiseAttrs{*m};
    } else {
      return err(path + ".op", "unknown op \"" + type +
                                   "\": accepted ops are conv_fprop, matmul, sdpa_fwd, sdpa_bwd, sdpa_fp8_fwd, sdpa_fp8_bwd, add, sub, mul, bias_add, scale, "
                                   "relu, gelu_tanh, gelu_erf, silu, sigmoid, tanh");
    }
    if (conv) {
      FUSEBOX_RETURN_IF_ERROR(check_fields(path, v, {"op", "name", "inputs", "outputs", "compute_dtype", "padding",
                                                     "stride", "dilation"}));
    } else if (sdpa) {
      FUSEBOX_RETURN_IF_ERROR(
          check_fields(path, v, {"op", "name", "inputs", "outputs", "compute_dtype", "attn_scale", "causal", "alignment",
                                 "left_bound", "right_bound", "alibi", "dropout", "deterministic"}));
    } else {
      FUSEBOX_RETURN_IF_ERROR(check_fields(path, v, {"op", "name", "inputs", "outputs", "compute_dtype"}));
    }
    if (!v.contains("name")) return err(path, "missing field 'name' (every op needs a unique name)");
    FUSEBOX_ASSIGN_OR_RETURN(o.name, get_string(path + ".name", v["name"]));
    if (!v.contains("inputs")) return err(path, "missing field 'inputs' (an object: role -> tensor name)");
    FUSEBOX_ASSIGN_OR_RETURN(o.inputs, role_map(path + ".inputs", v["inputs"]));
    if (v.contains("outputs")) {
      FUSEBOX_ASSIGN_OR_RETURN(o.outputs, role_map(path + ".outputs", v["outputs"]));
    } else {
      const std::string primary(op_primary_output_role(o.attrs));
      o.outputs[primary] = o.name + "." + primary;
    }
    if (v.contains("compute_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(o.compute_dtype, get_dtype(path + ".compute_dtype", v["compute_dtype"]));
    }
    if (conv) {
      auto& a = std::get<ConvFpropAttrs>(o.attrs);
      if (v.contains("padding")) {
      FUSEBOX_ASSIGN_OR_RETURN(a.padding, get_int_list(path + ".padding", v["padding"]));
    }
      if (v.contains("stride")) {
      FUSEBOX_ASSIGN_OR_RETURN(a.stride, get_int_list(path + ".stride", v["stride"]));
    }
      if (v.contains("dilation")) {
        FUSEBOX_ASSIGN_OR_RETURN(a.dilation, get_int_list(path + ".dilation", v["dilation"]));
      }
    }
    if (sdpa) {
      SdpaOptions& a = *sdpa_options(o.attrs);
      auto get_bool = [&](const char* key, bool& out) -> Status {
        if (!v.contains(key)) return Status::Ok();
        if (!v[key].is_boolean()) return expected(path + "." + key, "true or false", v[key]);
        out = v[key].get<bool>();
        return Status::Ok();
      };
      auto get_number = [&](const char* key, std::optional<double>& out) -> Status {
        if (!v.contains(key)) return Status::Ok();
        if (!v[key].is_number()) return expected(path + "." + key, "a number", v[key]);
        out = v[key].get<double>();
        return Status::Ok();
      };
      auto get_opt_int = [&](const char* key, std::optional<int64_t>& out) -> Status {
        if (!v.contains(key)) return Status::Ok();
        FUSEBOX_ASSIGN_OR_RETURN(out, get_int(path + "." + key, v[key]));
        return Status::Ok();
      };
      FUSEBOX_RETURN_IF_ERROR(get_number("attn_scale", a.attn_scale));
      FUSEBOX_RETURN_IF_ERROR(get_bool("causal", a.causal));
      FUSEBOX_RETURN_IF_ERROR(get_bool("alibi", a.alibi));
      FUSEBOX_RETURN_IF_ERROR(get_opt_int("left_bound", a.left_bound));
      FUSEBOX_RETURN_IF_ERROR(get_opt_int("right_bound", a.right_bound));
      FUSEBOX_RETURN_IF_ERROR(get_number("dropout", a.dropout));
      if (v.contains("alignment")) {
        FUSEBOX_ASSIGN_OR_RETURN(std::string al, get_string(path + ".alignment", v["alignment"]));
        if (al == "top_left") {
          a.alignment = SdpaAlignment::kTopLeft;
        } else if (al == "bottom_right") {
          a.alignment = SdpaAlignment::kBottomRight;
        } else {
          return err(path + ".alignment", "unknown alignment \"" + al + "\": accepted are \"top_left\" (query row i "
                                          "sees keys j <= i) and \"bottom_right\" (the diagonal ends at the last key)");
        }
      }
      // Optional inputs switch their feature on: seq_len_q/seq_len_kv -> padding, bias -> bias.
      a.padding = o.inputs.count("seq_len_q") > 0 || o.inputs.count("seq_len_kv") > 0;
      a.bias = o.inputs.count("bias") > 0;
      a.dump_dropout_mask = o.outputs.count("dropout_mask") > 0;
      if (v.contains("deterministic")) {
        auto* bwd = std::get_if<SdpaBwdAttrs>(&o.attrs);
        if (!bwd) return err(path + ".deterministic", "only sdpa_bwd has a deterministic variant");
        FUSEBOX_RETURN_IF_ERROR(get_bool("deterministic", bwd->deterministic));
      }
      // Stats are generated exactly when a "stats" output is named.
      if (auto* f = std::get_if<SdpaFwdAttrs>(&o.attrs)) f->generate_stats = o.outputs.count("stats") > 0;
      if (auto* f = std::get_if<SdpaFp8FwdAttrs>(&o.attrs)) f->generate_stats = o.outputs.count("stats") > 0;
    }
    return o;
  }

  Result<std::map<std::string, std::string>> role_map(const std::string& path, const json& v) const {
    if (!v.is_object()) return expected(path, "an object (role -> tensor name)", v);
    std::map<std::string, std::string> m;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (it.key().size() > limits::kMaxNameBytes) {
        return err(path, "a role name of " +
                             over_limit(it.key().size(), limits::kMaxNameBytes, "bytes", "per name"));
      }
      const std::string where = path + "." + it.key();
      FUSEBOX_ASSIGN_OR_RETURN(std::string name, get_string(where, it.value()));
      if (name.size() > limits::kMaxNameBytes) {
        return err(where,
                   "a tensor name of " + over_limit(name.size(), limits::kMaxNameBytes, "bytes", "per name"));
      }
      m[it.key()] = std::move(name);
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
      if (g.name.size() > limits::kMaxNameBytes) {
        return err("name", over_limit(g.name.size(), limits::kMaxNameBytes, "bytes", "per name"));
      }
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
    const json& tensors = root["tensors"];
    if (!tensors.is_array()) return expected("tensors", "an array", tensors);
    if (tensors.size() > limits::kMaxTensors) {
      return err("tensors", over_limit(tensors.size(), limits::kMaxTensors, "tensors", "per graph"));
    }
    int64_t total_elements = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string where = "tensors[" + std::to_string(i) + "]";
      FUSEBOX_ASSIGN_OR_RETURN(TensorSpec t, tensor(where, tensors[i]));
      const int64_t n = declared_elements(t.dims);
      if (n > limits::kMaxTotalElements - total_elements) {
        const std::string held = n > limits::kMaxTotalElements
                                     ? "alone holds more than " + std::to_string(limits::kMaxTotalElements)
                                     : "brings the tensors so far to " + std::to_string(total_elements + n);
        return err(where + " ('" + t.name + "').dims", "this tensor " + held + " elements: the limit is " +
                                                           std::to_string(limits::kMaxTotalElements) +
                                                           " (2^40) elements per graph");
      }
      total_elements += n;
      g.tensors.push_back(std::move(t));
    }
    if (!root.contains("ops")) return err("graph", "missing field 'ops' (an array of op objects)");
    const json& ops = root["ops"];
    if (!ops.is_array()) return expected("ops", "an array", ops);
    if (ops.size() > limits::kMaxOps) {
      return err("ops", over_limit(ops.size(), limits::kMaxOps, "ops", "per graph"));
    }
    for (size_t i = 0; i < ops.size(); ++i) {
      const std::string where = "ops[" + std::to_string(i) + "]";
      if (ops[i].is_object()) FUSEBOX_RETURN_IF_ERROR(check_name_length(where, ops[i]));
      FUSEBOX_ASSIGN_OR_RETURN(OpSpec o, op(where, ops[i]));
      g.ops.push_back(std::move(o));
    }
    return g;
  }

 private:
  std::string origin_;
};

// The first place where the shape of `text` exceeds a limit, as a message; empty
// if none. A linear scan before parsing: nlohmann::json prints (in messages) and
// compares recursively, and its DOM takes up to ~40 times a file's size.
std::string json_shape_error(std::string_view text) {
  int depth = 0;
  size_t items = 1;  // an upper bound on the values: one per '[', '{' or ','
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limits::kMaxJsonDepth) {
        return "at byte " + std::to_string(i + 1) +
               ": JSON arrays and objects nest deeper than the limit of " +
               std::to_string(limits::kMaxJsonDepth) + " levels (a graph file needs 4)";
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
    if ((c == '[' || c == '{' || c == ',') && ++items > limits::kMaxJsonValues) {
      return "at byte " + std::to_string(i + 1) + ": more than " + std::to_string(limits::kMaxJsonValues) +
             " JSON values (numbers, strings, arrays, objects), the limit per graph file";
    }
  }
  return "";
}

}  // namespace

Result<GraphSpec> parse_graph_json(std::string_view text, std::string_view origin) {
  try {
    if (std::string e = json_shape_error(text); !e.empty()) {
      return InvalidArgument(std::string(origin) + ": " + e);
    }
    json root;
    // what(): "[json.exception.parse_error.101] parse error at line 3, column 5: ..."
    const auto without_id = [](const std::string& what) {
      auto p = what.find("] ");
      return p == std::string::npos ? what : what.substr(p + 2);
    };
    try {
      root = json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
      return ParseError(std::string(origin) + ": invalid JSON at byte " + std::to_string(e.byte) + ": " +
                        without_id(e.what()));
    } catch (const json::out_of_range& e) {  // a number too large for a double: 1e999
      return ParseError(std::string(origin) + ": invalid JSON: " + without_id(e.what()));
    }
    return Parser(origin).graph(root);
  } catch (const std::exception& e) {
    return Internal(std::string(origin) + ": unexpected error while reading the graph: " + e.what());
  }
}

Result<GraphSpec> load_graph_file(const std::string& path) {
  try {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return IoError("cannot read graph file '" + path + "': it is a directory");
    }
    auto size = std::filesystem::file_size(path, ec);
    if (ec) return IoError("cannot read graph file '" + path + "': " + ec.message());
    if (size > kMaxGraphFileBytes) {
      return IoError("graph file '" + path + "' is " + std::to_string(size) +
                     " bytes: graph files are limited to 64 MiB");
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return IoError("cannot read graph file '" + path + "': open failed");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return IoError("cannot read graph file '" + path + "': read failed");
    return parse_graph_json(ss.str(), path);
  } catch (const std::exception& e) {
    return IoError("cannot read graph file '" + path + "': " + e.what());
  }
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
    if (auto* c = std::get_if<ConvFpropAttrs>(&o.attrs)) {
      if (!c->padding.empty()) j["padding"] = c->padding;
      if (!c->stride.empty()) j["stride"] = c->stride;
      if (!c->dilation.empty()) j["dilation"] = c->dilation;
    }
    if (const SdpaOptions* a = sdpa_options(o.attrs)) {
      if (a->attn_scale) j["attn_scale"] = static_cast<double>(*a->attn_scale);
      if (a->causal) j["causal"] = true;
      if (a->alignment != SdpaAlignment::kTopLeft) j["alignment"] = std::string(sdpa_alignment_name(a->alignment));
      if (a->left_bound) j["left_bound"] = *a->left_bound;
      if (a->right_bound) j["right_bound"] = *a->right_bound;
      if (a->alibi) j["alibi"] = true;
      if (a->dropout) j["dropout"] = static_cast<double>(*a->dropout);
    }
    if (auto* b = std::get_if<SdpaBwdAttrs>(&o.attrs); b && b->deterministic) j["deterministic"] = true;
    ops.push_back(std::move(j));
  }
  root["ops"] = std::move(ops);
  return root.dump(indent);
}

}  // namespace fusebox
