// fusebox: pipeline files (docs/pipeline-format.md): parsing and the checks
// made before anything is built. Never converts JSON to or from `float`
// (docs/architecture.md): strings and objects only here.
#include "fusebox/pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>

#include "common/dims_string.h"
#include "common/file_io.h"
#include "common/json_text.h"
#include "pipeline_text.h"

namespace fusebox {

namespace {

using ordered_json = nlohmann::ordered_json;

constexpr uint64_t kMaxPipelineFileBytes = 4ull << 20;
constexpr int kMaxJsonDepth = 16;  // a pipeline file needs 3
constexpr size_t kMaxJsonValues = 1u << 20;
constexpr size_t kMaxStages = 4096;
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxPathBytes = 4096;

using runtime::sq;

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "(none)" : s;
}

std::string json_kind(const ordered_json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  return "a number";
}

std::string shape_string(DType dtype, const std::vector<int64_t>& dims, const std::vector<int64_t>& strides) {
  return std::string(dtype_name(dtype)) + " " + common::dims_string(dims) + " strides " +
         common::dims_string(strides);
}

// A memory tensor: one that a buffer backs (not virtual, not a by-value scalar).
bool is_memory(const ResolvedTensor& t) {
  return !t.is_virtual && !t.scalar_value && (t.is_input || t.is_output);
}

bool is_safetensors(const std::string& file) {
  static const std::string ext = ".safetensors";
  return file.size() >= ext.size() && file.compare(file.size() - ext.size(), ext.size(), ext) == 0;
}

std::string join_path(const std::string& base_dir, const std::string& p) {
  if (p.empty() || p[0] == '/' || base_dir.empty()) return p;
  return base_dir + "/" + p;
}

// A buffer's dtype, dims and strides as a tensor (element and byte counts).
ResolvedTensor tensor_of(const PipelineBuffer& b) {
  ResolvedTensor t;
  t.dtype = b.dtype;
  t.dims = b.dims;
  t.strides = b.strides;
  return t;
}

// No gaps between the elements: the storage holds exactly the elements.
bool dense(const ResolvedTensor& t) {
  return t.storage_bytes() == t.element_count() * static_cast<int64_t>(dtype_size_bytes(t.dtype));
}

class Loader {
 public:
  Loader(std::string_view origin, std::string base_dir, ShapeValues shape)
      : origin_(origin), base_dir_(std::move(base_dir)), shape_(std::move(shape)) {}

  Result<Pipeline> load(std::string_view text) {
    FUSEBOX_ASSIGN_OR_RETURN(ordered_json root, parse(text));
    FUSEBOX_RETURN_IF_ERROR(read_structure(root));
    FUSEBOX_RETURN_IF_ERROR(check_constants());
    FUSEBOX_RETURN_IF_ERROR(check_total_size());
    FUSEBOX_RETURN_IF_ERROR(load_graphs());
    FUSEBOX_RETURN_IF_ERROR(bind_stages());
    FUSEBOX_RETURN_IF_ERROR(check_buffers());
    FUSEBOX_RETURN_IF_ERROR(check_views());
    FUSEBOX_RETURN_IF_ERROR(order_stages());
    return std::move(p_);
  }

 private:
  // Where messages start: "p.json: pipeline 'two_convs'".
  std::string where() const {
    return std::string(origin_) + (p_.name.empty() ? "" : ": pipeline " + sq(p_.name));
  }
  Status bad(const std::string& msg) const { return InvalidArgument(where() + ": " + msg); }
  Status bad_stage(int s, const std::string& msg) const {
    return bad("stage " + sq(p_.stages[s].name) + ": " + msg);
  }

  Result<ordered_json> parse(std::string_view text) const {
    const common::JsonTextLimit hit = common::scan_json_text(text, kMaxJsonDepth, kMaxJsonValues);
    const std::string at = std::string(origin_) + ": at byte " + std::to_string(hit.byte + 1);
    if (hit.kind == common::JsonTextLimit::Kind::kDepth)
      return InvalidArgument(at + ": JSON arrays and objects nest deeper than the limit of " +
                             std::to_string(kMaxJsonDepth) + " levels (a pipeline file needs 3)");
    if (hit.kind == common::JsonTextLimit::Kind::kValues)
      return InvalidArgument(at + ": more than " + std::to_string(kMaxJsonValues) +
                             " JSON values, the limit per pipeline file");
    if (hit.kind == common::JsonTextLimit::Kind::kNul)
      return ParseError(at + ": a NUL byte, which JSON text never holds (in a string write \\u0000)");
    const auto without_id = [](const std::string& what) {
      auto p = what.find("] ");
      return p == std::string::npos ? what : what.substr(p + 2);
    };
    // A repeated key would silently replace the first (a tensor bound twice):
    // the parser callback finds it.
    std::vector<std::set<std::string>> keys;
    std::string duplicate;
    auto cb = [&](int, ordered_json::parse_event_t ev, ordered_json& parsed) {
      if (ev == ordered_json::parse_event_t::object_start) keys.emplace_back();
      if (ev == ordered_json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
      if (ev == ordered_json::parse_event_t::key && !keys.empty() && duplicate.empty() &&
          parsed.is_string() && !keys.back().insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      return true;
    };
    try {
      ordered_json root = ordered_json::parse(text.begin(), text.end(), cb);
      if (!duplicate.empty())
        return InvalidArgument(std::string(origin_) + ": key " + sq(duplicate) +
                               " appears twice in one object: each key (stage, buffer, graph tensor) once");
      return root;
    } catch (const ordered_json::parse_error& e) {
      return ParseError(std::string(origin_) + ": invalid JSON at byte " + std::to_string(e.byte) + ": " +
                        without_id(e.what()));
    } catch (const ordered_json::out_of_range& e) {
      return ParseError(std::string(origin_) + ": invalid JSON: " + without_id(e.what()));
    }
  }

  Status fields(const std::string& path, const ordered_json& obj,
                const std::vector<std::string>& accepted) const {
    for (auto it = obj.begin(); it != obj.end(); ++it) {
      if (std::find(accepted.begin(), accepted.end(), it.key()) == accepted.end())
        return bad(path + ": unknown field " + sq(it.key()) + ": accepted fields are " + join(accepted));
    }
    return Status::Ok();
  }

  Result<std::string> name_at(const std::string& path, const ordered_json& v, size_t limit) const {
    if (!v.is_string()) return bad(path + ": expected a string, got " + json_kind(v));
    std::string s = v.get<std::string>();
    if (s.empty()) return bad(path + ": must not be empty");
    if (s.size() > limit)
      return bad(path + ": " + std::to_string(s.size()) + " bytes exceed the limit of " +
                 std::to_string(limit));
    return s;
  }

  Status read_view(const std::string& path, const ordered_json& v, const std::string& kind,
                   PipelineBuffer* b) {
    const std::string vp = path + ".view";
    if (kind != "intermediate")
      return bad(vp + ": only an intermediate buffer can be a view (this one is " + kind + ")");
    if (b->reshape) return bad(vp + ": a view is read as a dense part already; drop \"reshape\"");
    if (!v.is_object())
      return bad(vp + ": expected {\"of\": BUFFER, \"part\": k, \"parts\": n}, got " + json_kind(v));
    FUSEBOX_RETURN_IF_ERROR(fields(vp, v, {"of", "part", "parts"}));
    for (const char* key : {"of", "part", "parts"})
      if (!v.contains(key))
        return bad(vp + ": missing field " + sq(key) + " ({\"of\": BUFFER, \"part\": k, \"parts\": n})");
    FUSEBOX_ASSIGN_OR_RETURN(view_parent_[b->name], name_at(vp + ".of", v["of"], kMaxNameBytes));
    if (!v["parts"].is_number_integer() || v["parts"].get<int64_t>() < 1 || v["parts"].get<int64_t>() > 4096)
      return bad(vp + ".parts: expected an integer from 1 to 4096, got " + v["parts"].dump());
    b->view_parts = v["parts"].get<int64_t>();
    if (!v["part"].is_number_integer() || v["part"].get<int64_t>() < 0 ||
        v["part"].get<int64_t>() >= b->view_parts)
      return bad(vp + ".part: expected an integer from 0 to " + std::to_string(b->view_parts - 1) +
                 " (parts - 1), got " + v["part"].dump());
    b->view_part = v["part"].get<int64_t>();
    return Status::Ok();
  }

  Status read_structure(const ordered_json& root) {
    if (!root.is_object()) return bad("expected an object, got " + json_kind(root));
    FUSEBOX_RETURN_IF_ERROR(fields("pipeline", root, {"name", "graphs", "buffers", "bind"}));
    for (const char* key : {"name", "graphs", "buffers", "bind"}) {
      if (!root.contains(key)) return bad(std::string("missing field ") + sq(key));
    }
    FUSEBOX_ASSIGN_OR_RETURN(p_.name, name_at("name", root["name"], kMaxNameBytes));

    const ordered_json& graphs = root["graphs"];
    if (!graphs.is_object() || graphs.empty())
      return bad("graphs: expected an object of stage name -> graph file, got " +
                 (graphs.is_object() ? std::string("an empty one") : json_kind(graphs)));
    if (graphs.size() > kMaxStages)
      return bad("graphs: " + std::to_string(graphs.size()) + " stages exceed the limit of " +
                 std::to_string(kMaxStages));
    for (auto it = graphs.begin(); it != graphs.end(); ++it) {
      if (it.key().empty() || it.key().size() > kMaxNameBytes)
        return bad("graphs: a stage name must have 1 to " + std::to_string(kMaxNameBytes) + " bytes");
      PipelineStage st;
      st.name = it.key();
      FUSEBOX_ASSIGN_OR_RETURN(st.graph_file, name_at("graphs." + it.key(), it.value(), kMaxPathBytes));
      st.graph_path = join_path(base_dir_, st.graph_file);
      stage_index_[st.name] = static_cast<int>(p_.stages.size());
      p_.stages.push_back(std::move(st));
    }

    const ordered_json& buffers = root["buffers"];
    if (!buffers.is_object() || buffers.empty())
      return bad("buffers: expected an object of buffer name -> {\"kind\": ...}, got " +
                 (buffers.is_object() ? std::string("an empty one") : json_kind(buffers)));
    for (auto it = buffers.begin(); it != buffers.end(); ++it) {
      const std::string path = "buffers." + it.key();
      if (it.key().empty() || it.key().size() > kMaxNameBytes)
        return bad("buffers: a buffer name must have 1 to " + std::to_string(kMaxNameBytes) + " bytes");
      const ordered_json& v = it.value();
      if (!v.is_object()) return bad(path + ": expected an object ({\"kind\": ...}), got " + json_kind(v));
      FUSEBOX_RETURN_IF_ERROR(fields(path, v, {"kind", "file", "key", "reshape", "view"}));
      if (!v.contains("kind"))
        return bad(path + ": missing field 'kind' (input, output, constant or intermediate)");
      PipelineBuffer b;
      b.name = it.key();
      FUSEBOX_ASSIGN_OR_RETURN(std::string kind, name_at(path + ".kind", v["kind"], kMaxNameBytes));
      if (kind == "input")
        b.kind = BufferKind::kInput;
      else if (kind == "output")
        b.kind = BufferKind::kOutput;
      else if (kind == "constant")
        b.kind = BufferKind::kConstant;
      else if (kind == "intermediate")
        b.kind = BufferKind::kIntermediate;
      else
        return bad(path + ".kind: unknown kind \"" + kind +
                   "\": accepted kinds are input, output, constant, intermediate");
      if (b.kind == BufferKind::kConstant) {
        if (!v.contains("file"))
          return bad(path + ": a constant needs 'file' (a .npy or .safetensors file with its values)");
        FUSEBOX_ASSIGN_OR_RETURN(b.file, name_at(path + ".file", v["file"], kMaxPathBytes));
        b.file_path = join_path(base_dir_, b.file);
        if (is_safetensors(b.file)) {
          b.key = b.name;
          if (v.contains("key")) {
            FUSEBOX_ASSIGN_OR_RETURN(b.key, name_at(path + ".key", v["key"], kMaxPathBytes));
          }
        } else if (v.contains("key")) {
          return bad(path + ": 'key' names a tensor in a .safetensors file, but 'file' is " + sq(b.file));
        }
      } else if (v.contains("file") || v.contains("key")) {
        return bad(path + ": only a constant takes 'file' and 'key' (this buffer is " + kind + ")");
      }
      if (v.contains("reshape")) {
        if (!v["reshape"].is_boolean())
          return bad(path + ".reshape: expected true or false, got " + json_kind(v["reshape"]));
        b.reshape = v["reshape"].get<bool>();
      }
      if (v.contains("view")) FUSEBOX_RETURN_IF_ERROR(read_view(path, v["view"], kind, &b));
      buffer_index_[b.name] = static_cast<int>(p_.buffers.size());
      p_.buffers.push_back(std::move(b));
    }
    for (auto& b : p_.buffers) {  // a view's parent, by name, once every buffer is known
      if (view_parent_.count(b.name) == 0) continue;
      const std::string& of = view_parent_[b.name];
      auto it = buffer_index_.find(of);
      if (it == buffer_index_.end())
        return bad("buffers." + b.name + ".view.of: " + sq(of) + " is not a buffer");
      const PipelineBuffer& parent = p_.buffers[static_cast<size_t>(it->second)];
      if (parent.name == b.name || view_parent_.count(parent.name))
        return bad("buffers." + b.name + ".view.of: " + sq(of) +
                   (parent.name == b.name ? " is the view itself" : " is a view itself") +
                   ": a view is part of a buffer with memory of its own");
      if (parent.kind == BufferKind::kConstant || parent.kind == BufferKind::kInput)
        return bad("buffers." + b.name + ".view.of: " + sq(of) + " is " +
                   (parent.kind == BufferKind::kInput ? "an input" : "a constant") +
                   ": a view is part of a buffer a stage writes (an intermediate or an output)");
      b.view_of = it->second;
    }

    const ordered_json& bind = root["bind"];
    if (!bind.is_object())
      return bad("bind: expected an object of stage name -> {graph tensor: buffer}, got " + json_kind(bind));
    std::vector<std::string> stage_names;
    for (const auto& s : p_.stages) stage_names.push_back(s.name);
    for (auto it = bind.begin(); it != bind.end(); ++it) {
      auto found = stage_index_.find(it.key());
      const int s = found == stage_index_.end() ? -1 : found->second;
      if (s < 0)
        return bad("bind: " + sq(it.key()) + " is not a stage: the stages (graphs) are " + join(stage_names));
      const ordered_json& v = it.value();
      const std::string path = "bind." + it.key();
      if (!v.is_object())
        return bad(path + ": expected an object of graph tensor -> buffer, got " + json_kind(v));
      for (auto t = v.begin(); t != v.end(); ++t) {
        FUSEBOX_ASSIGN_OR_RETURN(std::string buf, name_at(path + "." + t.key(), t.value(), kMaxNameBytes));
        auto b = buffer_index_.find(buf);
        if (b == buffer_index_.end())
          return bad_stage(s, "graph tensor " + sq(t.key()) + " is bound to buffer " + sq(buf) +
                                  ", which is not declared in 'buffers'");
        raw_bind_[s].emplace_back(t.key(), b->second);
      }
    }
    for (size_t s = 0; s < p_.stages.size(); ++s) {
      if (!bind.contains(p_.stages[s].name))
        return bad_stage(static_cast<int>(s),
                         "missing from 'bind': every stage binds its graph's memory inputs and outputs");
    }
    return Status::Ok();
  }

  Status check_constants() const {
    for (const auto& b : p_.buffers) {
      if (b.kind != BufferKind::kConstant) continue;
      Status st = common::require_regular_file(b.file_path, "weights file");
      if (!st.ok())
        return bad("constant buffer " + sq(b.name) + ": weights file '" + b.file +
                   "' cannot be used: " + st.message());
    }
    return Status::Ok();
  }

  // Before reading any graph or weights: what the files add up to (sizes as
  // stat reports them; each read is bounded again by its own per-file limit).
  Status check_total_size() const {
    uint64_t graphs = 0, total = 0;
    auto size_of = [](const std::string& path) -> uint64_t {
      struct stat st {};
      return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    };
    // Per stage, not per distinct file: each stage loads and resolves its graph.
    for (const auto& st : p_.stages) graphs += size_of(st.graph_path);
    if (graphs > kMaxPipelineGraphBytes)
      return bad("the stages' graph files add up to " + std::to_string(graphs) +
                 " bytes (each counted once per stage that names it), over the limit of " +
                 common::format_limit(kMaxPipelineGraphBytes) + " per pipeline");
    total = graphs;
    // A weights file shared by several constants (one safetensors file) counts once.
    std::set<std::string> files;
    for (const auto& b : p_.buffers)
      if (b.kind == BufferKind::kConstant && files.insert(b.file_path).second) total += size_of(b.file_path);
    if (total > kMaxPipelineTotalFileBytes)
      return bad("the graph and weights files add up to " + std::to_string(total) +
                 " bytes, over the limit of " + common::format_limit(kMaxPipelineTotalFileBytes) +
                 " per pipeline");
    return Status::Ok();
  }

  Status load_graphs() {
    std::set<std::string> declared;
    for (size_t s = 0; s < p_.stages.size(); ++s) {
      PipelineStage& st = p_.stages[s];
      auto spec = load_graph_file(st.graph_path);
      if (!spec.ok()) return spec.status().WithContext(where() + ": stage " + sq(st.name));
      if (!spec->symbols.empty()) {
        // The pipeline's shape, as far as this graph declares the symbols.
        ShapeValues mine;
        for (const auto& [sym, range] : spec->symbols) {
          declared.insert(sym);
          if (auto it = shape_.find(sym); it != shape_.end()) mine[sym] = it->second;
        }
        auto bound = bind_shape(*spec, mine);
        if (!bound.ok())
          return bound.status().WithContext(where() + ": stage " + sq(st.name) + " (" + st.graph_path + ")");
        spec = std::move(bound);
        for (const auto& [sym, value] : current_shape(*spec)) {
          auto [it, fresh] = p_.shape.emplace(sym, value);
          if (!fresh && it->second != value)  // defaults that differ between graphs, no value given
            return bad_stage(static_cast<int>(s), "symbol " + sq(sym) + " is " + std::to_string(value) +
                                                      " here but " + std::to_string(it->second) +
                                                      " in an earlier stage (their defaults differ): give it "
                                                      "with --shape " +
                                                      sym + "=VALUE");
        }
      }
      auto g = resolve(*spec);
      if (!g.ok())
        return g.status().WithContext(where() + ": stage " + sq(st.name) + " (" + st.graph_path + ")");
      st.graph = std::move(*g);
    }
    for (const auto& [sym, value] : shape_) {
      if (declared.count(sym)) continue;
      std::string names;
      for (const auto& d : declared) names += (names.empty() ? "" : ", ") + d;
      return bad(declared.empty() ? "--shape " + sym + "=" + std::to_string(value) +
                                        ": no stage's graph declares symbols (the pipeline is static)"
                                  : "unknown symbol " + sq(sym) + ": the stages' graphs declare " + names);
    }
    return Status::Ok();
  }

  // Every memory tensor bound once, to a buffer of one shape; one writer per buffer.
  Status bind_stages() {
    for (size_t si = 0; si < p_.stages.size(); ++si) {
      const int s = static_cast<int>(si);
      PipelineStage& st = p_.stages[si];
      const ResolvedGraph& g = st.graph;
      std::vector<std::string> memory;
      for (const auto& t : g.tensors)
        if (is_memory(t)) memory.push_back(sq(t.name));
      for (const auto& [tname, bi] : raw_bind_[s]) {
        const int ti = g.find_tensor(tname);
        if (ti < 0)
          return bad_stage(s, "binds " + sq(tname) + ", which is not a tensor of graph " + sq(g.name) + " (" +
                                  st.graph_path + "): its memory inputs and outputs are " + join(memory));
        const ResolvedTensor& t = g.tensors[ti];
        if (!is_memory(t)) {
          const std::string what = t.scalar_value ? "a by-value scalar" : "virtual (it never reaches memory)";
          return bad_stage(s, "graph tensor " + sq(tname) + " is " + what +
                                  " and takes no buffer: bind only memory inputs and outputs (" +
                                  join(memory) + ")");
        }
        st.bind[tname] = bi;
        FUSEBOX_RETURN_IF_ERROR(use_buffer(s, t, bi));
      }
      std::vector<std::string> unbound;
      for (const auto& t : g.tensors)
        if (is_memory(t) && !st.bind.count(t.name)) unbound.push_back(sq(t.name));
      if (!unbound.empty())
        return bad_stage(s, "graph " + std::string(unbound.size() == 1 ? "tensor " : "tensors ") +
                                join(unbound) + " of " + sq(g.name) +
                                " not bound to a buffer: bind every memory input and output");
    }
    return Status::Ok();
  }

  Status use_buffer(int s, const ResolvedTensor& t, int bi) {
    PipelineBuffer& b = p_.buffers[bi];
    const std::string buf = "buffer " + sq(b.name);
    if (b.is_view()) {  // checked against its parent once every stage is bound (check_views)
      if (!t.is_input)
        return bad_stage(s, "graph output " + sq(t.name) + " writes " + buf + ", a view of " +
                                sq(p_.buffers[static_cast<size_t>(b.view_of)].name) +
                                ": a view is only read; write its parent");
      if (b.readers.empty()) {
        b.dims = t.dims;
        b.strides = t.strides;
        b.dtype = t.dtype;
      }
      b.readers.push_back({s, t.name});
      return Status::Ok();
    }
    const BufferUse* first = b.writer ? &*b.writer : (b.readers.empty() ? nullptr : &b.readers.front());
    if (first) {
      const bool same = t.dims == b.dims && t.strides == b.strides && t.dtype == b.dtype;
      const std::string seen = " but " + buf + " is " + shape_string(b.dtype, b.dims, b.strides) +
                               " in stage " + sq(p_.stages[first->stage].name) + " (graph tensor " +
                               sq(first->tensor) + ")";
      if (!same && !b.reshape)
        return bad_stage(s, "graph tensor " + sq(t.name) + " is " + shape_string(t.dtype, t.dims, t.strides) +
                                seen +
                                ": every stage must see a buffer with the same dims, strides and dtype "
                                "(or mark the buffer \"reshape\": true to view the same dense memory "
                                "with other dims)");
      if (!same) FUSEBOX_RETURN_IF_ERROR(check_view(s, t, b, seen));
      // A reshape buffer takes its writer's dims and strides (what --save-outputs and
      // the references hold); before the writer is bound, its first reader's.
      if (!t.is_input && b.reshape) {
        b.dims = t.dims;
        b.strides = t.strides;
      }
    } else {
      b.dims = t.dims;
      b.strides = t.strides;
      b.dtype = t.dtype;
    }
    if (t.is_input) {
      b.readers.push_back({s, t.name});
      return Status::Ok();
    }
    if (b.kind == BufferKind::kInput || b.kind == BufferKind::kConstant)
      return bad_stage(s, "graph output " + sq(t.name) + " writes " + buf + ", a pipeline " +
                              std::string(buffer_kind_name(b.kind)) + ": " +
                              std::string(buffer_kind_name(b.kind)) + "s are only read");
    if (b.writer)
      return bad_stage(s, "graph output " + sq(t.name) + " writes " + buf + ", which stage " +
                              sq(p_.stages[b.writer->stage].name) + " already writes (as " +
                              sq(b.writer->tensor) + "): a buffer has one writer");
    b.writer = BufferUse{s, t.name};
    return Status::Ok();
  }

  // A reshape view: the same dtype and the same dense memory (no holes, as many
  // elements), so every view covers exactly the bytes the writer writes.
  Status check_view(int s, const ResolvedTensor& t, const PipelineBuffer& b, const std::string& seen) const {
    const ResolvedTensor bt = tensor_of(b);
    const bool ok = t.dtype == b.dtype && t.element_count() == bt.element_count() && dense(t) && dense(bt);
    if (ok) return Status::Ok();
    return bad_stage(s,
                     "graph tensor " + sq(t.name) + " is " + shape_string(t.dtype, t.dims, t.strides) + seen +
                         ": the views of a \"reshape\" buffer must have the same dtype and element count and "
                         "be dense (no gaps between elements), so that each covers the same memory");
  }

  // Each view: part `part` of `parts` equal parts of a dense parent, read as dense tensors of
  // that many elements and the parent's dtype.
  Status check_views() const {
    for (const auto& b : p_.buffers) {
      if (!b.is_view()) continue;
      const PipelineBuffer& parent = p_.buffers[static_cast<size_t>(b.view_of)];
      const std::string what = "view " + sq(b.name) + " (part " + std::to_string(b.view_part) + " of " +
                               std::to_string(b.view_parts) + " of buffer " + sq(parent.name) + ")";
      const ResolvedTensor pt = tensor_of(parent);
      const int64_t n = pt.element_count();
      if (!dense(pt))
        return bad(what + ": " + sq(parent.name) + " is " + shape_string(pt.dtype, pt.dims, pt.strides) +
                   ", not dense: a view's parent must have no gaps between its elements");
      if (n % b.view_parts != 0)
        return bad(what + ": " + sq(parent.name) + " has " + std::to_string(n) +
                   " elements, not a multiple of " + std::to_string(b.view_parts));
      const int64_t part = n / b.view_parts;
      for (const auto& r : b.readers) {
        const PipelineStage& st = p_.stages[static_cast<size_t>(r.stage)];
        const ResolvedTensor& t = st.graph.tensors[static_cast<size_t>(st.graph.find_tensor(r.tensor))];
        if (t.dtype != pt.dtype || t.element_count() != part || !dense(t))
          return bad_stage(r.stage, "graph tensor " + sq(t.name) + " is " +
                                        shape_string(t.dtype, t.dims, t.strides) + " but " + what +
                                        " holds " + std::to_string(part) + " " +
                                        std::string(dtype_name(pt.dtype)) +
                                        " elements: a view is read as a dense tensor of its part's elements "
                                        "and its parent's dtype");
      }
    }
    return Status::Ok();
  }

  Status check_buffers() const {
    std::set<int> viewed;  // buffers read through views
    for (const auto& b : p_.buffers)
      if (b.is_view() && !b.readers.empty()) viewed.insert(b.view_of);
    for (size_t bi = 0; bi < p_.buffers.size(); ++bi) {
      const PipelineBuffer& b = p_.buffers[bi];
      const std::string kind(buffer_kind_name(b.kind));
      if (b.is_view()) {
        if (b.readers.empty())
          return bad("view buffer " + sq(b.name) +
                     " is read by no stage: bind it to a graph input or remove it");
        continue;
      }
      const bool read = !b.readers.empty() || viewed.count(static_cast<int>(bi));
      switch (b.kind) {
        case BufferKind::kInput:
        case BufferKind::kConstant:
          if (!read)
            return bad(kind + " buffer " + sq(b.name) +
                       " is read by no stage: bind it to a graph input or remove it");
          break;
        case BufferKind::kOutput:
          if (!b.writer)
            return bad("output buffer " + sq(b.name) + " is written by no stage: bind it to a graph output");
          break;
        case BufferKind::kIntermediate:
          if (!b.writer)
            return bad("intermediate buffer " + sq(b.name) +
                       " is written by no stage: bind it to a graph output, or make it an input");
          if (!read)
            return bad("intermediate buffer " + sq(b.name) + " is written by stage " +
                       sq(p_.stages[b.writer->stage].name) +
                       " but read by no stage: bind it to a graph input, or make it an output");
          break;
      }
    }
    return Status::Ok();
  }

  // Kahn's algorithm with a heap on the file position: O((S + E) log S).
  Status order_stages() {
    const size_t n = p_.stages.size();
    std::vector<std::vector<int>> next(n);
    std::vector<int> indegree(n, 0);
    for (const auto& b : p_.buffers) {
      // A view's readers wait for its parent's writer.
      const auto& writer = b.is_view() ? p_.buffers[static_cast<size_t>(b.view_of)].writer : b.writer;
      if (!writer) continue;
      const int w = writer->stage;
      for (const auto& r : b.readers) {
        if (r.stage == w)
          return bad_stage(w, "reads buffer " + sq(b.name) + " (as " + sq(r.tensor) +
                                  ") that it writes itself (as " + sq(writer->tensor) +
                                  (b.is_view() ? ", through the view's parent" : "") +
                                  "): a stage cannot work in place");
        next[w].push_back(r.stage);
        ++indegree[r.stage];
      }
    }
    std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
    for (size_t s = 0; s < n; ++s)
      if (indegree[s] == 0) ready.push(static_cast<int>(s));
    std::vector<int> left = indegree;
    while (!ready.empty()) {
      const int s = ready.top();
      ready.pop();
      p_.order.push_back(s);
      for (int t : next[s])
        if (--left[t] == 0) ready.push(t);
    }
    if (p_.order.size() == n) return Status::Ok();
    // Walk back along writers among the stages left until one repeats.
    int s = 0;
    while (left[s] == 0) ++s;
    std::vector<int> seen(n, -1), path;
    std::vector<std::string> via;
    while (seen[s] < 0) {
      seen[s] = static_cast<int>(path.size());
      path.push_back(s);
      for (const auto& [tname, bi] : p_.stages[s].bind) {
        const PipelineBuffer& b = p_.buffers[p_.buffers[bi].is_view() ? p_.buffers[bi].view_of : bi];
        if (b.writer && b.writer->stage != s && left[b.writer->stage] > 0 &&
            p_.stages[s].graph.tensors[p_.stages[s].graph.find_tensor(tname)].is_input) {
          via.push_back(b.name);
          s = b.writer->stage;
          break;
        }
      }
    }
    // path[seen[s]..] read backwards is the cycle in data-flow order.
    std::string cycle = sq(p_.stages[s].name);
    for (size_t i = path.size(); i-- > static_cast<size_t>(seen[s]);)
      cycle += " -> (" + sq(via[i]) + ") -> " + sq(p_.stages[path[i]].name);
    return bad("the stages form a cycle: " + cycle + ": each buffer must be written before it is read");
  }

  std::string_view origin_;
  std::string base_dir_;
  ShapeValues shape_;
  Pipeline p_;
  std::map<std::string, int> buffer_index_, stage_index_;
  std::map<std::string, std::string> view_parent_;  // view buffer -> its parent's name, as written
  std::map<int, std::vector<std::pair<std::string, int>>> raw_bind_;
};

}  // namespace

std::string_view buffer_kind_name(BufferKind kind) {
  switch (kind) {
    case BufferKind::kInput:
      return "input";
    case BufferKind::kOutput:
      return "output";
    case BufferKind::kConstant:
      return "constant";
    case BufferKind::kIntermediate:
      return "intermediate";
  }
  return "?";
}

int64_t PipelineBuffer::view_offset_elements(const Pipeline& p) const {
  if (!is_view()) return 0;
  return tensor_of(p.buffers[static_cast<size_t>(view_of)]).element_count() / view_parts * view_part;
}

int Pipeline::find_stage(std::string_view n) const {
  for (size_t i = 0; i < stages.size(); ++i)
    if (stages[i].name == n) return static_cast<int>(i);
  return -1;
}

int Pipeline::find_buffer(std::string_view n) const {
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].name == n) return static_cast<int>(i);
  return -1;
}

double Pipeline::flops() const {
  double f = 0;
  for (const auto& s : stages) f += s.graph.flops();
  return f;
}

Result<Pipeline> parse_pipeline_json(std::string_view text, std::string_view origin,
                                     const std::string& base_dir, const ShapeValues& shape) {
  try {
    auto p = Loader(origin, base_dir, shape).load(text);
    if (p.ok()) p->path = std::string(origin);
    return p;
  } catch (const std::bad_alloc&) {
    return common::out_of_host_memory("reading the pipeline " + std::string(origin));
  } catch (const std::exception& e) {
    return Internal(std::string(origin) + ": unexpected error while reading the pipeline: " + e.what());
  }
}

Result<Pipeline> load_pipeline_file(const std::string& path, const ShapeValues& shape) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text,
                           common::read_file_bounded(path, kMaxPipelineFileBytes, "pipeline file"));
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? "" : path.substr(0, slash == 0 ? 1 : slash);
  return parse_pipeline_json(text, path, base, shape);
}

}  // namespace fusebox
