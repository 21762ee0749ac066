// fusebox train layer: FP8 training's pipeline rewrite (fusebox/fp8_training.h).
#include "fusebox/fp8_training.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <variant>

#include "common/file_io.h"
#include "fusebox/graph.h"
#include "fusebox/pipeline.h"

namespace fusebox {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr uint64_t kMaxFileBytes = 64u << 20;

Result<Json> read_json(const std::string& path, std::string_view what) {
  FUSEBOX_ASSIGN_OR_RETURN(std::string text, common::read_file_bounded(path, kMaxFileBytes, what));
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument(path + ": " + std::string(what) + " is not a JSON object");
  return j;
}

const char* fp8_name(DType t) { return t == DType::kFP8E5M2 ? "fp8_e5m2" : "fp8_e4m3"; }

Json ones(size_t rank) { return Json(std::vector<int64_t>(rank, 1)); }

// The declaration of graph tensor `name`, or null.
Json* find_tensor(Json& g, const std::string& name) {
  for (Json& t : g["tensors"])
    if (t.value("name", "") == name) return &t;
  return nullptr;
}

// The names op `op` binds to its inputs or outputs (`side`).
std::vector<std::string> bound(const Json& op, const char* side) {
  std::vector<std::string> out;
  if (!op.contains(side) || !op[side].is_object()) return out;
  for (const auto& [role, t] : op[side].items())
    if (t.is_string()) out.push_back(t.get<std::string>());
  return out;
}

bool produced_in(const Json& g, const std::string& name) {
  for (const Json& op : g["ops"])
    for (const std::string& t : bound(op, "outputs"))
      if (t == name) return true;
  return false;
}

int readers_in(const Json& g, const std::string& name) {
  int n = 0;
  for (const Json& op : g["ops"])
    for (const std::string& t : bound(op, "inputs"))
      if (t == name) ++n;
  return n;
}

bool name_taken(const Json& g, const std::string& name) {
  for (const Json& t : g["tensors"])
    if (t.value("name", "") == name) return true;
  for (const Json& op : g["ops"]) {
    if (op.value("name", "") == name) return true;
    for (const std::string& t : bound(op, "outputs"))
      if (t == name) return true;
  }
  return false;
}

std::string fresh(const Json& g, const std::string& base) {
  std::string n = base;
  for (int i = 2; name_taken(g, n); ++i) n = base + "_" + std::to_string(i);
  return n;
}

// Which bytes a copy of a buffer holds: its elements' offsets in the buffer (through `view`: dims
// with strides or a layout), in the copy's memory order (`copy`: the same dims in its own layout),
// as runs "extent:stride" with size-1 dims left out and contiguous runs merged. Two copies of one
// buffer with the same order hold the same bytes. "" where a layout does not resolve (never for a
// graph the loader accepted).
std::string element_order(const Json& view, const Json& copy) {
  const std::vector<int64_t> dims = view["dims"].get<std::vector<int64_t>>();
  std::vector<int64_t> in;
  if (view.contains("strides")) {
    in = view["strides"].get<std::vector<int64_t>>();
  } else {
    auto s = layout_strides(dims, view.value("layout", ""));
    if (!s.ok()) return "";
    in = *s;
  }
  auto out = layout_strides(dims, copy.value("layout", ""));
  if (!out.ok() || in.size() != dims.size()) return "";
  std::vector<size_t> order;
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d] != 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return (*out)[a] > (*out)[b]; });
  std::vector<std::pair<int64_t, int64_t>> runs;  // (extent, stride in the buffer), outermost first
  for (size_t d : order) {
    if (!runs.empty() && runs.back().second == dims[d] * in[d]) {
      runs.back() = {runs.back().first * dims[d], in[d]};
    } else {
      runs.emplace_back(dims[d], in[d]);
    }
  }
  std::string key;
  for (const auto& [e, st] : runs) key += std::to_string(e) + ":" + std::to_string(st) + " ";
  return key;
}

// The other of a matrix copy's two layouts: row-major <-> column-major (the last two dims).
Json other_layout(const Json& q8) {
  Json t = q8;
  if (t.value("layout", "") == "col_major") {
    t.erase("layout");
  } else {
    t["layout"] = "col_major";
  }
  return t;
}

// The tensor names an op's inputs or outputs name (a role's value: a name, or a list of names).
std::vector<std::string> names_of(const Json& roles) {
  std::vector<std::string> out;
  if (!roles.is_object()) return out;
  for (const auto& [role, v] : roles.items()) {
    if (v.is_string()) out.push_back(v.get<std::string>());
    if (v.is_array())
      for (const Json& e : v)
        if (e.is_string()) out.push_back(e.get<std::string>());
  }
  return out;
}

// Whether graph `g` (a file the pipeline loader checked) is pointwise ops, and the casts fused into
// it already.
bool all_pointwise(const Json& g) {
  auto spec = parse_graph_json(g.dump(), "fp8 rewrite");
  if (!spec.ok()) return false;
  int pointwise = 0;
  for (const OpSpec& op : spec->ops) {
    if (std::holds_alternative<PointwiseAttrs>(op.attrs)) {
      ++pointwise;
    } else if (!std::holds_alternative<QuantizeAttrs>(op.attrs)) {
      return false;
    }
  }
  return pointwise > 0;
}

// Graph `g` split into its independent op groups (ops joined by a tensor one writes and another
// reads; shared inputs join nothing), each a graph of its own with the tensors its ops name, in
// the graph's order: one entry when it is connected. A backward GEMM stage holds its dgrad and its
// wgrad, independent: cuDNN runs one connected graph, so the runtime would partition it into
// consecutive ops of its own topological order, which puts both FP8 matmuls first and leaves their
// descales as parts of their own (an fp32 product through memory, and on an H100 with cuDNN 9.19
// parts no engine took, run by the reference kernels). As stages of their own, each GEMM with its
// descales and epilogue is one plan, as a forward GEMM is.
std::vector<Json> independent_graphs(const Json& g) {
  const Json& ops = g["ops"];
  const size_t n = ops.size();
  std::vector<size_t> parent(n);
  for (size_t i = 0; i < n; ++i) parent[i] = i;
  auto root = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::map<std::string, size_t> writer;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& t : names_of(ops[i]["outputs"])) writer[t] = i;
  for (size_t i = 0; i < n; ++i)
    for (const std::string& t : names_of(ops[i]["inputs"]))
      if (auto w = writer.find(t); w != writer.end()) parent[root(i)] = root(w->second);
  std::vector<size_t> order;  // each group's root, in the order of its first op
  for (size_t i = 0; i < n; ++i)
    if (std::find(order.begin(), order.end(), root(i)) == order.end()) order.push_back(root(i));
  if (order.size() <= 1) return {g};
  std::vector<Json> out;
  for (size_t k = 0; k < order.size(); ++k) {
    Json part = g;
    part["name"] = g.value("name", "graph") + "_" + std::to_string(k);
    part["ops"] = Json::array();
    std::set<std::string> used;
    for (size_t i = 0; i < n; ++i) {
      if (root(i) != order[k]) continue;
      part["ops"].push_back(ops[i]);
      for (const char* side : {"inputs", "outputs"})
        for (const std::string& t : names_of(ops[i][side])) used.insert(t);
    }
    part["tensors"] = Json::array();
    for (const Json& t : g["tensors"])
      if (used.count(t.value("name", ""))) part["tensors"].push_back(t);
    out.push_back(std::move(part));
  }
  return out;
}

class Rewriter {
 public:
  Rewriter(Json pipeline, const Fp8RewriteOptions& o) : p_(std::move(pipeline)), o_(o) {}

  // Why matmul operand `role` of op `op` in stage `stage`'s graph `g` cannot be quantized ("": it can).
  std::string operand(const std::string& stage, Json& g, Json& op, const char* role) {
    const std::string t = op["inputs"].value(role, "");
    Json* decl = find_tensor(g, t);
    if (!decl || produced_in(g, t)) return std::string("operand '") + role + "' is computed in the graph";
    if (!decl->contains("dims") || decl->contains("values") || decl->contains("scalar"))
      return std::string("operand '") + role + "' is not a tensor in memory with declared dims";
    const std::string dtype = decl->value("dtype", g.value("io_dtype", "fp32"));
    if (dtype != "bf16" && dtype != "fp16")
      return std::string("operand '") + role + "' is " + dtype + " (bf16 or fp16 are quantized)";
    Json& bind = p_["bind"][stage];
    if (!bind.contains(t)) return std::string("operand '") + role + "' is bound to no buffer";
    return std::string();
  }

  // Rewrites matmul g["ops"][i] of stage `stage` (both operands checked by operand()): the scale
  // ops go in after it.
  void rewrite(const std::string& stage, Json& g, size_t i) {
    // p_["bind"] is an ordered map over a vector: cast() adds stages to it, so no reference into
    // it is held across a call.
    auto bind = [&]() -> Json& { return p_["bind"][stage]; };
    Json op = g["ops"][i];
    std::string descale[2];  // the inverse-scale tensors of a and b
    for (const char* role : {"a", "b"}) {
      const std::string t = op["inputs"][role];
      Json decl = *find_tensor(g, t);
      if (!decl.contains("dtype")) decl["dtype"] = g.value("io_dtype", "fp32");
      const std::string buffer = bind()[t].get<std::string>();
      const DType fmt = o_.gradients.count(buffer) ? DType::kFP8E5M2 : DType::kFP8E4M3;
      const DType use = r_.quantized.emplace(buffer, fmt).first->second;  // one format per buffer
      const size_t rank = decl["dims"].size();
      Json q8 = {{"dims", decl["dims"]}, {"dtype", fp8_name(use)}};
      if (std::string(role) == "b") q8["layout"] = "col_major";  // K contiguous
      const std::string copy = cast(buffer, decl, q8, use, rank);
      // The matmul reads the copy through a tensor of its own.
      const std::string t8 = fresh(g, t + "_fp8");
      Json d8 = q8;
      d8["name"] = t8;
      g["tensors"].push_back(d8);
      bind()[t8] = copy;
      op["inputs"][role] = t8;
      g["ops"][i] = op;  // readers_in() below counts the operand's other readers
      const std::string ds = fresh(g, t + "_descale");
      g["tensors"].push_back({{"name", ds}, {"dims", ones(rank)}, {"dtype", "fp32"}});
      bind()[ds] = fp8_scale_inv_buffer(buffer);
      declare_scale(fp8_scale_inv_buffer(buffer));
      descale[std::string(role) == "a" ? 0 : 1] = ds;
      if (readers_in(g, t) == 0) {  // no other op reads the bf16 operand: it leaves the graph
        auto& ts = g["tensors"];
        for (auto it = ts.begin(); it != ts.end(); ++it)
          if (it->value("name", "") == t) {
            ts.erase(it);
            break;
          }
        bind().erase(t);
      }
    }
    // y = (a8 @ b8) * descale_a * descale_b, in fp32, then the op's epilogue as before.
    const std::string y = op["outputs"]["y"];
    const std::string acc = fresh(g, y + "_fp8_acc"), mid = fresh(g, y + "_fp8_acc_a");
    const std::string name = op["name"];
    const std::string sa = fresh(g, name + "_descale_a"), sb = fresh(g, name + "_descale_b");
    op["outputs"]["y"] = acc;
    g["ops"][i] = op;
    Json& ops = g["ops"];
    ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(i) + 1,
               Json{{"op", "scale"},
                    {"name", sa},
                    {"inputs", {{"x", acc}, {"scale", descale[0]}}},
                    {"outputs", {{"y", mid}}}});
    ops.insert(ops.begin() + static_cast<std::ptrdiff_t>(i) + 2,
               Json{{"op", "scale"},
                    {"name", sb},
                    {"inputs", {{"x", mid}, {"scale", descale[1]}}},
                    {"outputs", {{"y", y}}}});
    ++r_.gemms;
  }

  // The FP8 copy of `buffer` as seen through `decl`, in the layout of `q8`: one per buffer, view
  // and layout, named now; the quantize stages that write them come from finish(), one per buffer
  // and view, with up to two copies each (y and y2: one read for a row-major and a transposed copy).
  std::string cast(const std::string& buffer, const Json& decl, const Json& q8, DType fmt, size_t rank) {
    Json view = {{"dims", decl["dims"]}};
    for (const char* k : {"layout", "strides"})
      if (decl.contains(k)) view[k] = decl[k];
    const std::string vkey = buffer + "|" + view.dump();
    const std::string key = vkey + "|" + q8.dump();
    if (auto it = casts_.find(key); it != casts_.end()) return it->second;
    // A copy the forward wrote with these bytes: read it, cast nothing.
    const std::string order = element_order(view, q8);
    for (const Fp8Copy& c : o_.provided)
      if (!order.empty() && c.buffer == buffer && c.order == order && c.format == fmt) {
        p_["buffers"][c.copy] = {{"kind", "input"}};
        r_.taken.push_back(c.copy);
        replaced_.insert(buffer);
        casts_[key] = c.copy;
        return c.copy;
      }
    const std::string copy = buffer + ".fp8." + std::to_string(++copies_[buffer]);
    auto [g, fresh_group] = groups_.try_emplace(vkey);
    if (fresh_group) {
      g->second.buffer = buffer;
      g->second.x = view;
      g->second.x["dtype"] = decl["dtype"];
      g->second.fmt = fmt;
      g->second.rank = rank;
      group_order_.push_back(vkey);
    }
    g->second.copies.push_back({q8, copy});
    p_["buffers"][copy] = {{"kind", "intermediate"}};
    declare_scale(fp8_scale_buffer(buffer));
    casts_[key] = copy;
    return copy;
  }

  // The quantize stages of every copy cast() named, in the order their views were first asked for.
  void finish() {
    for (const std::string& vkey : group_order_) {
      Group& gr = groups_.at(vkey);
      if (o_.export_copies.count(gr.buffer)) {
        if (gr.copies.size() == 1 && gr.rank >= 2 && !o_.skip_transposed.count(gr.buffer)) {
          // The same read also writes the other layout, for the backward alone.
          const Json t = other_layout(gr.copies[0].first);
          const std::string copy = gr.buffer + ".fp8.t" + std::to_string(++copies_[gr.buffer]);
          gr.copies.push_back({t, copy});
          p_["buffers"][copy] = {{"kind", "output"}};
          r_.added.push_back(copy);
        }
        for (const auto& [q8, copy] : gr.copies)  // the forward's own copies serve the backward too
          r_.exported.push_back({gr.buffer, copy, element_order(gr.x, q8), gr.fmt});
      }
      for (size_t c = 0; c < gr.copies.size(); c += 2) {
        const std::string& first = gr.copies[c].second;
        const std::string stage = first + ".cast";
        Json x = gr.x;
        x["name"] = "x";
        Json tensors = Json::array({x, {{"name", "scale"}, {"dims", ones(gr.rank)}, {"dtype", "fp32"}}});
        Json outputs = Json::object();
        Json bind = {{"x", gr.buffer}, {"scale", fp8_scale_buffer(gr.buffer)}};
        for (size_t k = c; k < std::min(c + 2, gr.copies.size()); ++k) {
          const std::string role = k == c ? "y" : "y2";
          Json y = gr.copies[k].first;
          y["name"] = role;
          tensors.push_back(y);
          outputs[role] = role;
          bind[role] = gr.copies[k].second;
        }
        const bool want_amax = gr.fmt == DType::kFP8E5M2 || o_.amax_of_e4m3;
        if (want_amax && amax_done_.insert(gr.buffer).second) {
          tensors.push_back({{"name", "amax"}, {"dims", ones(gr.rank)}, {"dtype", "fp32"}});
          outputs["amax"] = "amax";
          bind["amax"] = fp8_amax_buffer(gr.buffer);
          p_["buffers"][fp8_amax_buffer(gr.buffer)] = {{"kind", "output"}, {"reshape", true}};
          r_.amax.push_back(gr.buffer);
        }
        Json g = {{"name", stage},
                  {"io_dtype", "bf16"},
                  {"tensors", tensors},
                  {"ops", Json::array({{{"op", "quantize"},
                                        {"name", "cast"},
                                        {"inputs", {{"x", "x"}, {"scale", "scale"}}},
                                        {"outputs", outputs}}})}};
        new_graphs_.emplace_back(stage, g);
        p_["bind"][stage] = bind;
        ++r_.casts;
      }
    }
  }

  // Each cast stage whose buffer a stage of pointwise ops writes, merged into that stage
  // (Fp8RewriteOptions::fuse_casts); `graphs` are the pipeline's other stages.
  void fuse_casts(std::vector<std::pair<std::string, Json>>& graphs) {
    std::vector<std::pair<std::string, Json>> left;
    for (auto& [stage, g] : new_graphs_)
      if (!o_.fuse_casts || !fuse(graphs, stage, g)) left.emplace_back(stage, std::move(g));
    new_graphs_ = std::move(left);
  }

  bool fuse(std::vector<std::pair<std::string, Json>>& graphs, const std::string& cast_stage, Json& cg) {
    const Json cb = p_["bind"][cast_stage];
    const std::string buffer = cb["x"].get<std::string>();
    std::pair<std::string, Json>* writer = nullptr;
    std::string wt;  // the writer's tensor of the buffer
    for (auto& sg : graphs) {
      const Json& sb = p_["bind"][sg.first];
      for (const Json& op : sg.second["ops"])
        for (const std::string& t : names_of(op["outputs"]))
          if (sb.contains(t) && sb[t] == buffer) {
            if (writer) return false;  // (a buffer written twice: left as it is)
            writer = &sg;
            wt = t;
          }
    }
    if (!writer || !all_pointwise(writer->second)) return false;
    Json& wg = writer->second;
    for (const Json& op : wg["ops"])  // (one cast a tensor: the kernel takes no second one)
      if (op.value("op", "") == "quantize" && op["inputs"].value("x", "") == wt) return false;
    const Json* wdecl = find_tensor(wg, wt);
    const Json* xdecl = find_tensor(cg, "x");
    if (!wdecl || !xdecl || !wdecl->contains("dims") || (*wdecl)["dims"] != (*xdecl)["dims"]) return false;
    const Json row_major = {{"dims", (*xdecl)["dims"]}};
    const std::string order = element_order(*xdecl, row_major);
    if (order.empty() || element_order(*wdecl, row_major) != order) return false;  // another view
    const std::string ws = writer->first;
    // Whether another stage reads the buffer; an intermediate no stage would read any more must
    // leave the pipeline (the loader refuses an unread one), which it may not where another
    // pipeline reads it: that cast stays a stage of its own.
    bool read_here = false;
    for (const auto& [stage, bind] : p_["bind"].items())
      if (stage != ws && stage != cast_stage)
        for (const auto& [t, b] : bind.items()) read_here = read_here || b == buffer;
    const Json& decl = p_["buffers"].contains(buffer) ? p_["buffers"][buffer] : Json();
    const bool intermediate = decl.value("kind", "") == "intermediate";
    if (!read_here && intermediate && o_.read_elsewhere.count(buffer)) return false;
    // The cast's tensors other than x join the writer's graph under fresh names, bound as before.
    std::map<std::string, std::string> rename = {{"x", wt}};
    for (const Json& t : cg["tensors"]) {
      const std::string n = t.value("name", "");
      if (n == "x") continue;
      Json d = t;
      d["name"] = rename[n] = fresh(wg, wt + "_" + n);
      wg["tensors"].push_back(d);
      p_["bind"][ws][rename[n]] = cb[n];
    }
    Json op = cg["ops"][0];
    op["name"] = fresh(wg, wt + "_cast");
    for (const char* side : {"inputs", "outputs"})
      for (auto& [role, t] : op[side].items()) t = rename.at(t.get<std::string>());
    wg["ops"].push_back(op);
    p_["bind"].erase(cast_stage);
    ++r_.fused;
    // The bf16 buffer leaves the pipeline where nothing else reads it.
    if (read_here || !intermediate) return true;
    (*find_tensor(wg, wt))["virtual"] = true;
    p_["bind"][ws].erase(wt);
    p_["buffers"].erase(buffer);
    r_.virtualized.push_back(buffer);
    return true;
  }

  // Input buffers whose every reader now reads a provided copy: they leave the pipeline.
  void drop_unread() {
    std::set<std::string> bound;
    for (const auto& [stage, bind] : p_["bind"].items())
      for (const auto& [t, buf] : bind.items())
        if (buf.is_string()) bound.insert(buf.get<std::string>());
    for (const std::string& b : replaced_) {
      const Json& decl = p_["buffers"].contains(b) ? p_["buffers"][b] : Json();
      if (bound.count(b) || decl.value("kind", "") != "input") continue;  // (no view is of an input)
      p_["buffers"].erase(b);
      r_.dropped.push_back(b);
    }
  }

  struct Group {
    std::string buffer;
    Json x;  // the view the copies read the buffer through, with its dtype
    DType fmt = DType::kFP8E4M3;
    size_t rank = 0;
    std::vector<std::pair<Json, std::string>> copies;  // (layout declaration, copy buffer)
  };
  std::map<std::string, Group> groups_;
  std::vector<std::string> group_order_;

  void declare_scale(const std::string& b) { p_["buffers"][b] = {{"kind", "input"}, {"reshape", true}}; }

  Json p_;
  const Fp8RewriteOptions& o_;
  Fp8PipelineRewrite r_;
  std::map<std::string, std::string> casts_;
  std::map<std::string, int> copies_;
  std::set<std::string> amax_done_;
  std::set<std::string> replaced_;  // buffers with a provided copy read instead of a cast
  std::vector<std::pair<std::string, Json>> new_graphs_;
};

}  // namespace

std::string fp8_scale_buffer(const std::string& buffer) { return "fp8.scale." + buffer; }
std::string fp8_scale_inv_buffer(const std::string& buffer) { return "fp8.scale_inv." + buffer; }
std::string fp8_amax_buffer(const std::string& buffer) { return "fp8.amax." + buffer; }

Result<Fp8PipelineRewrite> fp8_rewrite_pipeline(const std::string& pipeline_path, const std::string& out_dir,
                                                const Fp8RewriteOptions& options) {
  // The pipeline loader checks the file and every graph file first (limits, structure, types), so
  // that the JSON below is walked as the formats define it, never as a hostile file shapes it.
  FUSEBOX_RETURN_IF_ERROR(load_pipeline_file(pipeline_path).status().WithContext("fp8 rewrite"));
  FUSEBOX_ASSIGN_OR_RETURN(Json p, read_json(pipeline_path, "pipeline file"));
  for (const char* k : {"name", "graphs", "buffers", "bind"})
    if (!p.contains(k)) return InvalidArgument(pipeline_path + ": pipeline file has no '" + k + "'");
  if (!p["graphs"].is_object() || !p["bind"].is_object() || !p["buffers"].is_object())
    return InvalidArgument(pipeline_path + ": pipeline file's graphs, buffers and bind must be objects");
  const fs::path in_dir = fs::absolute(fs::path(pipeline_path)).parent_path();
  std::error_code ec;
  if (fs::equivalent(in_dir, fs::path(out_dir), ec))
    return InvalidArgument(
        "fp8 rewrite: out_dir " + out_dir +
        " is the input pipeline's folder: give another, so that no file of it is replaced");
  Rewriter rw(p, options);
  std::vector<std::pair<std::string, Json>> graphs;
  for (const auto& [stage, file] : p["graphs"].items()) {
    if (!file.is_string())
      return InvalidArgument(pipeline_path + ": stage '" + stage + "' names no graph file");
    fs::path gp(file.get<std::string>());
    if (gp.is_relative()) gp = in_dir / gp;
    FUSEBOX_ASSIGN_OR_RETURN(Json g, read_json(gp.string(), "graph file"));
    if (!g.contains("tensors") || !g.contains("ops") || !rw.p_["bind"].contains(stage))
      return InvalidArgument(gp.string() + ": stage '" + stage + "' has no tensors, ops or bind entry");
    const int gemms_before = rw.r_.gemms;
    for (size_t i = 0; i < g["ops"].size(); ++i) {
      Json& op = g["ops"][i];
      if (op.value("op", "") != "matmul") continue;
      const std::string where = stage + ": matmul '" + op.value("name", "") + "'";
      const Json& sb = rw.p_["bind"][stage];
      std::string keep;
      for (const char* role : {"a", "b"}) {
        const std::string t = op["inputs"].value(role, "");
        if (sb.contains(t) && options.keep_buffers.count(sb[t].get<std::string>())) keep = sb[t];
      }
      if (!keep.empty()) {
        rw.r_.kept.push_back(where + ": it reads '" + keep + "', kept in bf16");
        continue;
      }
      std::string why;
      for (const char* role : {"a", "b"})
        if (why.empty()) why = rw.operand(stage, g, op, role);
      if (!why.empty()) {
        rw.r_.kept.push_back(where + ": " + why);
        continue;
      }
      rw.rewrite(stage, g, i);  // inserts the scale ops after i: the loop steps over them
      i += 2;
    }
    std::vector<Json> parts =
        rw.r_.gemms > gemms_before ? independent_graphs(g) : std::vector<Json>{std::move(g)};
    if (parts.size() == 1) {
      graphs.emplace_back(stage, std::move(parts[0]));
      continue;
    }
    // One stage per independent group, each binding the tensors its graph declares.
    const Json bind = rw.p_["bind"][stage];
    rw.p_["bind"].erase(stage);
    for (size_t k = 0; k < parts.size(); ++k) {
      const std::string name = stage + "." + std::to_string(k);
      if (rw.p_["bind"].contains(name) || p["graphs"].contains(name))
        return InvalidArgument(pipeline_path + ": stage '" + stage + "' splits into '" + name +
                               "', a stage that exists already");
      Json b = Json::object();
      for (const Json& t : parts[k]["tensors"])
        if (bind.contains(t.value("name", ""))) b[t.value("name", "")] = bind[t.value("name", "")];
      rw.p_["bind"][name] = b;
      graphs.emplace_back(name, std::move(parts[k]));
    }
    rw.r_.split.push_back(stage);
  }
  rw.finish();
  rw.fuse_casts(graphs);
  rw.drop_unread();
  for (auto& ng : rw.new_graphs_) graphs.push_back(std::move(ng));
  fs::create_directories(fs::path(out_dir) / "graphs", ec);
  if (ec) return IoError(out_dir + ": cannot create the folder: " + ec.message());
  Json files = Json::object();
  for (const auto& [stage, g] : graphs) {
    const std::string rel = "graphs/" + stage + ".json";
    FUSEBOX_RETURN_IF_ERROR(
        common::write_file_atomic((fs::path(out_dir) / rel).string(), g.dump(1), "FP8 stage graph file"));
    files[stage] = rel;
  }
  rw.p_["graphs"] = files;
  rw.p_["name"] = rw.p_["name"].get<std::string>() + "_fp8";
  const std::string out = (fs::path(out_dir) / (fs::path(pipeline_path).stem().string() + ".json")).string();
  FUSEBOX_RETURN_IF_ERROR(common::write_file_atomic(out, rw.p_.dump(1), "FP8 pipeline file"));
  rw.r_.pipeline_path = out;
  return rw.r_;
}

}  // namespace fusebox
