// fusebox: the JSON graph format (docs/graph-format.md).
// Never converts JSON to or from `float`: the cuDNN frontend specializes
// nlohmann::adl_serializer<float> in other translation units (ODR), so only
// double and integers are used here.
#include <cctype>
#include <iterator>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "common/file_io.h"
#include "common/json_text.h"
#include "common/json_util.h"
#include "common/text.h"
#include "fusebox/graph.h"
#include "graph_limits.h"
#include "json_reader.h"
#include "ops/ops.h"
#include "symbols.h"

namespace fusebox {

namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxGraphFileBytes = 64ull << 20;

namespace limits = graph_limits;

// "300 bytes exceed the limit of 256 bytes per name"
std::string over_limit(size_t n, size_t limit, const char* unit, const char* per) {
  return std::to_string(n) + " " + unit + " exceed the limit of " + std::to_string(limit) + " " + unit + " " +
         per;
}

class Parser : public JsonReader {
 public:
  explicit Parser(std::string_view origin) : JsonReader(origin) {}

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
      FUSEBOX_RETURN_IF_ERROR(dims(path + ".dims", v["dims"], t));
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
        if (!vals[i].is_number())
          return expected(path + ".values[" + std::to_string(i) + "]", "a number", vals[i]);
        t.values.push_back(vals[i].get<double>());
      }
    }
    return t;
  }

  // Dims are integers or declared symbols' names (set to the symbol's default).
  Status dims(const std::string& path, const json& v, TensorSpec& t) const {
    if (!v.is_array()) return expected(path, "an array of integers and symbol names", v);
    bool symbolic = false;
    for (const auto& d : v) symbolic = symbolic || d.is_string();
    // Without declared symbols a string is a type error, as it always was.
    if (!symbolic || symbols_.empty()) {
      FUSEBOX_ASSIGN_OR_RETURN(t.dims, get_int_list(path, v));
      return Status::Ok();
    }
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string where = path + "[" + std::to_string(i) + "]";
      if (v[i].is_string()) {
        const std::string& name = v[i].get_ref<const std::string&>();
        auto it = symbols_.find(name);
        if (it == symbols_.end()) {
          std::string names;
          for (const auto& [n, r] : symbols_) names += (names.empty() ? "" : ", ") + n;
          return err(where, "unknown symbol \"" + name.substr(0, limits::kMaxNameBytes) +
                                "\": declare it in the graph's \"symbols\" (declared: " +
                                (names.empty() ? "none" : names) + ")");
        }
        t.dims.push_back(it->second.value);
        t.dim_symbols.push_back(name);
      } else {
        FUSEBOX_ASSIGN_OR_RETURN(int64_t d, get_int(where, v[i]));
        t.dims.push_back(d);
        t.dim_symbols.emplace_back();
      }
    }
    return Status::Ok();
  }

  // "symbols": {"B": [1, 64], "S": {"min": 16, "max": 512, "default": 128}}
  Status symbols(const json& v) {
    if (!v.is_object())
      return expected("symbols", "an object (symbol name -> [min, max] or {min, max, default})", v);
    if (v.size() > limits::kMaxTensors) {
      return err("symbols", over_limit(v.size(), limits::kMaxTensors, "symbols", "per graph"));
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string& name = it.key();
      if (name.size() > limits::kMaxNameBytes) {
        return err("symbols",
                   "a symbol name of " + over_limit(name.size(), limits::kMaxNameBytes, "bytes", "per name"));
      }
      const std::string path = "symbols." + name;
      if (!graph_symbols::is_symbol_name(name)) {
        return err("symbols", "symbol name \"" + common::printable(name) +
                                  "\" is not a name: letters, digits and '_', not starting with a digit");
      }
      SymbolRange r;
      const json& d = it.value();
      if (d.is_array()) {
        if (d.size() != 2) return expected(path, "[min, max] or {\"min\", \"max\", \"default\"}", d);
        FUSEBOX_ASSIGN_OR_RETURN(r.min, get_int(path + "[0]", d[0]));
        FUSEBOX_ASSIGN_OR_RETURN(r.max, get_int(path + "[1]", d[1]));
        r.default_value = r.max;
      } else if (d.is_object()) {
        FUSEBOX_RETURN_IF_ERROR(check_fields(path, d, {"min", "max", "default"}));
        if (!d.contains("min") || !d.contains("max")) return err(path, "needs \"min\" and \"max\"");
        FUSEBOX_ASSIGN_OR_RETURN(r.min, get_int(path + ".min", d["min"]));
        FUSEBOX_ASSIGN_OR_RETURN(r.max, get_int(path + ".max", d["max"]));
        r.default_value = r.max;
        if (d.contains("default")) {
          FUSEBOX_ASSIGN_OR_RETURN(r.default_value, get_int(path + ".default", d["default"]));
        }
      } else {
        return expected(path, "[min, max] or {\"min\", \"max\", \"default\"}", d);
      }
      if (r.min < 1 || r.max < r.min || r.max > graph_ops::kMaxDim) {
        return err(path, "[" + std::to_string(r.min) + ", " + std::to_string(r.max) +
                             "] is not a range of dims: it needs 1 <= min <= max <= " +
                             std::to_string(graph_ops::kMaxDim));
      }
      if (r.default_value < r.min || r.default_value > r.max) {
        return err(path + ".default", std::to_string(r.default_value) + " is outside the range [" +
                                          std::to_string(r.min) + ", " + std::to_string(r.max) + "]");
      }
      r.value = r.default_value;
      symbols_[name] = r;
    }
    return Status::Ok();
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
      return err(path + ".op",
                 "unknown op \"" + type + "\": accepted ops are " + graph_ops::accepted_type_names());
    }
    o.attrs = std::move(*attrs);
    std::vector<std::string_view> fields = {"op", "name", "inputs", "outputs", "compute_dtype"};
    for (std::string_view f :
         std::visit([](const auto& a) { return graph_ops::traits_info(a).json_fields; }, o.attrs)) {
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

  Result<GraphSpec> graph(const json& root) {
    if (!root.is_object()) return expected("graph", "an object", root);
    FUSEBOX_RETURN_IF_ERROR(check_fields(
        "graph", root,
        {"name", "io_dtype", "intermediate_dtype", "compute_dtype", "symbols", "tensors", "ops"}));
    GraphSpec g;
    if (root.contains("symbols")) {
      FUSEBOX_RETURN_IF_ERROR(symbols(root["symbols"]));
      g.symbols = symbols_;
    }
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
      FUSEBOX_ASSIGN_OR_RETURN(g.intermediate_dtype,
                               get_dtype("intermediate_dtype", root["intermediate_dtype"]));
    }
    if (root.contains("compute_dtype")) {
      FUSEBOX_ASSIGN_OR_RETURN(g.compute_dtype, get_dtype("compute_dtype", root["compute_dtype"]));
    }
    if (!root.contains("tensors"))
      return err("graph", "missing field 'tensors' (an array of tensor objects)");
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
  std::map<std::string, SymbolRange> symbols_;
};

// nlohmann's DOM builder that stops at a key repeated within one object (the
// DOM would keep the last one). A parse callback could find it too, but makes
// nlohmann's parser quadratic in an array's length (end_object scans the
// parent array), which a 100,000-op graph cannot afford.
class DomWithoutDuplicateKeys {
 public:
  explicit DomWithoutDuplicateKeys(json& root) : dom_(root, /*allow_exceptions=*/true) {}
  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second) {
      duplicate_ = k;
      return false;  // stops the parse
    }
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);  // throws e
  }
  const std::string& duplicate() const { return duplicate_; }

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<std::set<std::string>> keys_;  // of the objects open now
  std::string duplicate_;
};

// Frees a DOM after a bad_alloc. nlohmann's destructor (noexcept) reserves a
// vector as long as an array to free it without recursion: out of memory,
// that reservation fails and the process terminates. Here containers are
// emptied from their last element, depth first, so that every element
// destroyed is a leaf or an empty container (which allocates nothing); the
// path is a fixed array (depth is bounded by the pre-scan).
void release_without_allocating(json& root) noexcept {
  constexpr int kMaxPath = 2 * limits::kMaxJsonDepth + 2;
  json* path[kMaxPath];
  int top = 0;
  path[0] = &root;
  while (top >= 0) {
    json& cur = *path[top];
    if (cur.is_array() && !cur.empty()) {
      json& last = cur.back();
      if (last.is_structured() && !last.empty() && top + 1 < kMaxPath) {
        path[++top] = &last;
      } else {
        cur.erase(cur.end() - 1);
      }
    } else if (cur.is_object() && !cur.empty()) {
      auto last = std::prev(cur.end());
      if (last->is_structured() && !last->empty() && top + 1 < kMaxPath) {
        path[++top] = &*last;
      } else {
        cur.erase(last);
      }
    } else {
      --top;
    }
  }
}

// The first place where the shape of `text` exceeds a limit, as a message; empty
// if none. A linear scan before parsing: nlohmann::json prints (in messages) and
// compares recursively, and its DOM takes up to ~40 times a file's size.
std::string json_shape_error(std::string_view text) {
  const common::JsonTextLimit hit =
      common::scan_json_text(text, limits::kMaxJsonDepth, limits::kMaxJsonValues);
  const std::string at = "at byte " + std::to_string(hit.byte + 1);
  switch (hit.kind) {
    case common::JsonTextLimit::Kind::kNone:
      return "";
    case common::JsonTextLimit::Kind::kDepth:
      return at + ": JSON arrays and objects nest deeper than the limit of " +
             std::to_string(limits::kMaxJsonDepth) + " levels (a graph file needs 4)";
    case common::JsonTextLimit::Kind::kValues:
      return at + ": more than " + std::to_string(limits::kMaxJsonValues) +
             " JSON values (numbers, strings, arrays, objects), the limit per graph file";
    case common::JsonTextLimit::Kind::kNul:
      return at + ": a NUL byte, which JSON text never holds (outside strings or in them: write \\u0000)";
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
      // A repeated key would silently replace the first (the last one won):
      // refused, as pipeline files refuse it.
      DomWithoutDuplicateKeys dom(root);
      if (!json::sax_parse(text.begin(), text.end(), &dom)) {
        if (dom.duplicate().empty()) return ParseError(std::string(origin) + ": invalid JSON");
        return InvalidArgument(std::string(origin) + ": key '" + dom.duplicate() +
                               "' appears twice in one object: each key (field, tensor, op attribute) once");
      }
    } catch (const json::parse_error& e) {
      return ParseError(std::string(origin) + ": invalid JSON at byte " + std::to_string(e.byte) + ": " +
                        without_id(e.what()));
    } catch (const json::out_of_range& e) {  // a number too large for a double: 1e999
      return ParseError(std::string(origin) + ": invalid JSON: " + without_id(e.what()));
    } catch (const std::bad_alloc&) {
      release_without_allocating(root);
      return common::out_of_host_memory("reading the graph " + std::string(origin));
    }
    try {
      Parser parser(origin);
      return parser.graph(root);
    } catch (const std::bad_alloc&) {
      release_without_allocating(root);
      return common::out_of_host_memory("reading the graph " + std::string(origin));
    }
  } catch (const std::bad_alloc&) {
    return common::out_of_host_memory("reading the graph " + std::string(origin));
  } catch (const std::exception& e) {
    return Internal(std::string(origin) + ": unexpected error while reading the graph: " + e.what());
  }
}

Result<GraphSpec> load_graph_file(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text,
                           common::read_file_bounded(path, kMaxGraphFileBytes, "graph file"));
  return parse_graph_json(text, path);
}

std::string graph_to_json(const GraphSpec& spec, int indent) {
  ordered_json root;
  root["name"] = spec.name;
  root["io_dtype"] = std::string(dtype_name(spec.io_dtype));
  root["intermediate_dtype"] = std::string(dtype_name(spec.intermediate_dtype));
  root["compute_dtype"] = std::string(dtype_name(spec.compute_dtype));
  if (!spec.symbols.empty()) {
    ordered_json syms = ordered_json::object();
    for (const auto& [name, r] : spec.symbols) {
      syms[name] = ordered_json{{"min", r.min}, {"max", r.max}, {"default", r.default_value}};
    }
    root["symbols"] = std::move(syms);
  }
  ordered_json tensors = ordered_json::array();
  for (const auto& t : spec.tensors) {
    ordered_json j;
    j["name"] = t.name;
    if (!t.dim_symbols.empty() && t.dim_symbols.size() == t.dims.size()) {
      ordered_json d = ordered_json::array();
      for (size_t i = 0; i < t.dims.size(); ++i) {
        if (t.dim_symbols[i].empty()) {
          d.push_back(t.dims[i]);
        } else {
          d.push_back(t.dim_symbols[i]);
        }
      }
      j["dims"] = std::move(d);
    } else if (!t.dims.empty()) {
      j["dims"] = t.dims;
    }
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
