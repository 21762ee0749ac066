// fusebox runtime layer: derive_pipeline_backward() (fusebox/pipeline_backward.h).
#include "fusebox/pipeline_backward.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "common/file_io.h"
#include "fusebox/op_traits.h"
#include "fusebox/pipeline_run.h"

namespace fusebox {
namespace {

std::string q(const std::string& s) { return "'" + s + "'"; }

// A file name (no folder) for a pipeline or stage name, which the forward's file
// chose: every byte outside [A-Za-z0-9._-] becomes '_', so no name reaches
// outside the output folder ("../x", "/etc/x").
std::string file_name_for(const std::string& name) {
  std::string f = name;
  for (char& c : f)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  if (f.empty() || f == "." || f == "..") f = "_" + f;
  return f + ".json";
}

using View = std::pair<std::vector<int64_t>, std::vector<int64_t>>;  // dims, strides

struct BufferOut {
  std::string kind;  // "input", "intermediate", "output"
  std::set<View> views;
  int readers = 0;
};

class PipelineDeriver {
 public:
  explicit PipelineDeriver(const Pipeline& p) : p_(p) {}
  Result<PipelineBackward> run(const BackwardOptions& opt);

 private:
  std::string where() const { return "backward of pipeline " + q(p_.name); }
  // dL/d(buffer b), summing its parts in a stage of its own when there are several; "" if none.
  // own_buffer: a buffer of b's own, never one that is also another buffer's gradient (pass_through):
  // for the gradients the pipeline hands out.
  Result<std::string> finalize(int b, bool own_buffer = false);
  void pass_through(const PipelineStage& st, BackwardGraph& bw);
  BufferOut& declare(const std::string& name, const std::string& kind) {
    auto [it, fresh] = buffers_.try_emplace(name);
    if (fresh) {
      order_.push_back(name);
      it->second.kind = kind;
    }
    return it->second;
  }
  void bind(const std::string& stage, const std::string& tensor, const std::string& buffer, const View& view,
            bool reads) {
    bind_[stage][tensor] = buffer;
    BufferOut& b = buffers_.at(buffer);
    b.views.insert(view);
    if (reads) ++b.readers;
  }
  void add_stage(const std::string& name, const std::string& graph_json) {
    stages_.push_back(name);
    out_.graph_files[file_name_for(name)] = graph_json;
  }
  std::string taken_free(const std::string& base) {
    std::string n = base;
    for (int k = 2; p_.find_buffer(n) >= 0 || buffers_.count(n); ++k) n = base + "_" + std::to_string(k);
    return n;
  }

  const Pipeline& p_;
  PipelineBackward out_;
  std::map<int, std::vector<std::string>> parts_;  // forward buffer -> its gradient parts (buffer names)
  std::map<int, std::string> grad_;                // forward buffer -> dL/db (buffer name), once summed
  std::set<std::string> passed_;  // gradient buffers that are also another buffer's part (pass_through)
  std::map<std::string, BufferOut> buffers_;
  std::vector<std::string> order_;  // buffers in declaration order
  std::vector<std::string> stages_;
  std::map<std::string, std::map<std::string, std::string>> bind_;
};

// When `grad` (a gradient output of a backward graph) comes straight out of a matmul: the matmul
// now writes a virtual product, and `parts` adds of new inputs "<grad>.acc<k>" (in grad's layout
// and dtype) make `grad` from it. False, and `spec` unchanged, otherwise.
bool add_in_epilogue(GraphSpec& spec, const std::string& grad, size_t parts) {
  auto producer = std::find_if(spec.ops.begin(), spec.ops.end(), [&](const OpSpec& op) {
    return std::any_of(op.outputs.begin(), op.outputs.end(), [&](const auto& r) { return r.second == grad; });
  });
  auto out = std::find_if(spec.tensors.begin(), spec.tensors.end(),
                          [&](const TensorSpec& t) { return t.name == grad; });
  if (producer == spec.ops.end() || out == spec.tensors.end() ||
      op_traits(producer->attrs).family != "matmul")
    return false;
  // An op of the graph that reads the gradient would read the sum instead of this stage's part.
  for (const OpSpec& op : spec.ops)
    for (const auto& [role, t] : op.inputs)
      if (t == grad) return false;
  auto used = [&](const std::string& n) {
    return std::any_of(spec.tensors.begin(), spec.tensors.end(),
                       [&](const TensorSpec& t) { return t.name == n; }) ||
           std::any_of(spec.ops.begin(), spec.ops.end(), [&](const OpSpec& op) {
             return op.name == n || std::any_of(op.outputs.begin(), op.outputs.end(),
                                                [&](const auto& r) { return r.second == n; });
           });
  };
  const std::string product = grad + ".mm";
  for (size_t k = 0; k < parts; ++k)
    if (used(grad + ".acc" + std::to_string(k)) || used(grad + ".acc_add" + std::to_string(k))) return false;
  if (used(product)) return false;
  for (auto& [role, t] : producer->outputs)
    if (t == grad) t = product;  // now virtual: fp32 into the adds
  const TensorSpec like = *out;
  std::string acc = product;
  for (size_t k = 0; k < parts; ++k) {
    TensorSpec in = like;
    in.name = grad + ".acc" + std::to_string(k);
    spec.tensors.push_back(in);
    acc = spec.pointwise(grad + ".acc_add" + std::to_string(k), PointwiseMode::kAdd, acc, in.name);
  }
  for (auto& [role, t] : spec.ops.back().outputs)
    if (t == acc) t = grad;
  return true;
}

// A stage's gradient that is an incoming one passed through unchanged (a residual add's: y = f(x) + r
// gives dr = dy) is written by derive_backward as a copy, a scale by 1. The copy is dropped and dy's
// buffer becomes dr's part itself, where the two buffers agree in dims, strides and dtype: one pass
// over memory fewer per residual add (the 125M language model's step made 24 such copies of
// [32768, 768] bf16). dy stays as it is: no stage writes a buffer another has written.
void PipelineDeriver::pass_through(const PipelineStage& st, BackwardGraph& bw) {
  GraphSpec& spec = bw.spec;
  auto tensor = [&](const std::string& n) {
    return std::find_if(spec.tensors.begin(), spec.tensors.end(),
                        [&](const TensorSpec& t) { return t.name == n; });
  };
  auto read_by_an_op = [&](const std::string& n) {
    return std::any_of(spec.ops.begin(), spec.ops.end(), [&](const OpSpec& op) {
      return std::any_of(op.inputs.begin(), op.inputs.end(), [&](const auto& r) { return r.second == n; });
    });
  };
  for (auto it = bw.gradients.begin(); it != bw.gradients.end();) {
    const std::string& gname = it->second;
    auto op = std::find_if(spec.ops.begin(), spec.ops.end(), [&](const OpSpec& o) {
      return std::any_of(o.outputs.begin(), o.outputs.end(),
                         [&](const auto& r) { return r.second == gname; });
    });
    bool passed = op != spec.ops.end() && op_type_name(op->attrs) == "scale" && op->inputs.count("x") &&
                  op->inputs.count("scale") && !read_by_an_op(gname);
    std::string from, factor;
    if (passed) {
      from = op->inputs.at("x");
      factor = op->inputs.at("scale");
      auto in = bw.inputs.find(from);
      auto f = tensor(factor);
      passed = in != bw.inputs.end() && in->second.kind == BackwardInput::Kind::kGradient &&
               f != spec.tensors.end() && f->scalar_value && *f->scalar_value == 1.0;
    }
    int b_in = -1, b_out = -1;
    if (passed) {
      b_in = st.bind.at(bw.inputs.at(from).forward_tensor);
      b_out = st.bind.at(it->first);
      const PipelineBuffer& a = p_.buffers[static_cast<size_t>(b_in)];
      const PipelineBuffer& c = p_.buffers[static_cast<size_t>(b_out)];
      const auto ft = tensor(from), gt = tensor(gname);
      // The same layout everywhere: the two buffers', and the stage's view of each (a copy between
      // two layouts would move elements).
      passed = grad_.count(b_in) && a.dims == c.dims && a.strides == c.strides && a.dtype == c.dtype &&
               ft != spec.tensors.end() && gt != spec.tensors.end() && ft->dtype == gt->dtype &&
               ft->dims == a.dims && ft->strides == a.strides && gt->dims == c.dims &&
               gt->strides == c.strides;
    }
    if (!passed) {
      ++it;
      continue;
    }
    spec.ops.erase(op);
    spec.tensors.erase(tensor(gname));
    if (!read_by_an_op(factor)) spec.tensors.erase(tensor(factor));
    if (!read_by_an_op(from)) {
      spec.tensors.erase(tensor(from));
      bw.inputs.erase(from);
    }
    parts_[b_out].push_back(grad_.at(b_in));
    passed_.insert(grad_.at(b_in));
    it = bw.gradients.erase(it);
  }
}

Result<std::string> PipelineDeriver::finalize(int b, bool own_buffer) {
  if (auto it = grad_.find(b); it != grad_.end() && !(own_buffer && passed_.count(it->second)))
    return it->second;
  const std::vector<std::string>& parts = parts_[b];
  if (parts.empty()) return std::string();
  if (parts.size() == 1 && !(own_buffer && passed_.count(parts[0]))) return grad_[b] = parts[0];
  // An accumulation stage: the parts in b's own layout, added in fp32, one output (one part: a copy,
  // a scale by 1).
  const PipelineBuffer& buf = p_.buffers[static_cast<size_t>(b)];
  const std::string stage = taken_free(buf.name + (parts.size() == 1 ? ".grad_copy" : ".grad_sum"));
  GraphSpec g;
  g.name = stage;
  g.io_dtype = buf.dtype;
  const View view{buf.dims, buf.strides};
  auto in_b_layout = [&](std::string name) {
    TensorSpec t;
    t.name = std::move(name);
    t.dims = buf.dims;
    t.strides = buf.strides;
    t.dtype = buf.dtype;
    return t;
  };
  std::string acc;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorSpec t = in_b_layout("part" + std::to_string(i));
    g.tensors.push_back(t);
    if (i == 0) {
      acc = t.name;
      if (parts.size() == 1) {
        g.scalar("one", 1.0, DType::kFP32);
        acc = g.pointwise("copy", PointwiseMode::kScale, acc, "one");
      }
    } else {
      acc = g.pointwise("add" + std::to_string(i), PointwiseMode::kAdd, acc, t.name);
    }
  }
  g.tensors.push_back(in_b_layout(acc));
  const std::string total = taken_free(buf.name + ".grad");
  declare(total, "intermediate");
  add_stage(stage, graph_to_json(g));
  for (size_t i = 0; i < parts.size(); ++i) bind(stage, "part" + std::to_string(i), parts[i], view, true);
  bind(stage, acc, total, view, false);
  return grad_[b] = total;
}

Result<PipelineBackward> PipelineDeriver::run(const BackwardOptions& opt) {
  const int nb = static_cast<int>(p_.buffers.size());
  auto is_float = [&](int b) { return dtype_is_float(p_.buffers[static_cast<size_t>(b)].dtype); };
  // wrt: buffers to differentiate.
  std::vector<bool> wrt(nb, false);
  if (opt.wrt.empty()) {
    for (int b = 0; b < nb; ++b) {
      const BufferKind k = p_.buffers[static_cast<size_t>(b)].kind;
      wrt[b] = (k == BufferKind::kInput || k == BufferKind::kConstant) && is_float(b) &&
               !p_.buffers[static_cast<size_t>(b)].is_view();
    }
  } else {
    for (const std::string& n : opt.wrt) {
      const int b = p_.find_buffer(n);
      if (b < 0 || (p_.buffers[b].kind != BufferKind::kInput && p_.buffers[b].kind != BufferKind::kConstant))
        return InvalidArgument(where() + ": wrt " + q(n) +
                               " is not an input or constant buffer of the pipeline");
      if (!is_float(b)) return InvalidArgument(where() + ": wrt " + q(n) + " is not a floating-point buffer");
      wrt[b] = true;
    }
  }
  // needs: buffers on a path from a wrt buffer.
  std::vector<bool> needs = wrt;
  for (int s : p_.order) {
    const PipelineStage& st = p_.stages[static_cast<size_t>(s)];
    bool any = false;
    for (const auto& [t, b] : st.bind) {
      const int ti = st.graph.find_tensor(t);
      if (ti >= 0 && st.graph.tensors[ti].is_input && needs[b]) any = true;
    }
    if (!any) continue;
    for (const auto& [t, b] : st.bind) {
      const int ti = st.graph.find_tensor(t);
      if (ti >= 0 && st.graph.tensors[ti].is_output && is_float(b)) needs[b] = true;
    }
  }
  // Seeds: gradients that come in.
  std::vector<int> seeds;
  if (opt.seeds.empty()) {
    for (int b = 0; b < nb; ++b)
      if (p_.buffers[b].kind == BufferKind::kOutput && p_.buffers[b].readers.empty() && is_float(b) &&
          needs[b])
        seeds.push_back(b);
  } else {
    for (const std::string& n : opt.seeds) {
      const int b = p_.find_buffer(n);
      if (b < 0 || !p_.buffers[b].writer)
        return InvalidArgument(where() + ": seed " + q(n) + " is not a buffer a stage writes");
      seeds.push_back(b);
    }
  }
  if (seeds.empty())
    return InvalidArgument(where() + ": no output buffer depends on a buffer to differentiate");
  for (int b : seeds) {
    const PipelineBuffer& buf = p_.buffers[b];
    const std::string g = taken_free(buf.name + ".grad");
    declare(g, "input");
    out_.inputs[g] = BackwardInput{BackwardInput::Kind::kGradient, buf.name, false};
    out_.seeds.push_back(buf.name);
    parts_[b].push_back(g);
  }
  // Each stage's backward, in reverse order.
  for (auto it = p_.order.rbegin(); it != p_.order.rend(); ++it) {
    const PipelineStage& st = p_.stages[static_cast<size_t>(*it)];
    const ResolvedGraph& g = st.graph;
    BackwardOptions so;
    so.only_reachable = true;
    so.deterministic = opt.deterministic;
    for (const auto& [t, b] : st.bind) {
      const int ti = g.find_tensor(t);
      if (ti < 0) continue;
      const ResolvedTensor& ft = g.tensors[ti];
      if (ft.is_output) {
        FUSEBOX_ASSIGN_OR_RETURN(std::string gb, finalize(b));
        if (!gb.empty()) so.seeds.push_back(t);
      } else if (ft.is_input && needs[b] && dtype_is_float(ft.dtype) && ft.values.empty() &&
                 !ft.scalar_value) {
        so.wrt.push_back(t);
      }
    }
    if (so.seeds.empty() || so.wrt.empty()) continue;
    auto bw = derive_backward(g, so);
    if (!bw.ok()) return bw.status().WithContext(where() + ", stage " + q(st.name));
    if (bw->gradients.empty()) continue;
    pass_through(st, *bw);
    if (bw->spec.ops.empty()) continue;  // every gradient passed through: no stage
    // A buffer whose gradient already has parts (from stages later in the forward) and whose part
    // here comes straight out of a matmul: the earlier parts are added in that matmul's epilogue,
    // in fp32 before the one rounding, instead of in an accumulation stage of their own (one pass
    // over memory fewer: at the 125M language model those passes took 1.6 of 74 ms a step).
    // Parts made otherwise (a norm's or a native kernel's backward) are summed by finalize().
    std::map<std::string, std::vector<std::string>> added;  // gradient tensor -> the parts it adds
    for (const auto& [x, gname] : bw->gradients) {
      std::vector<std::string>& earlier = parts_[st.bind.at(x)];
      if (!earlier.empty() && add_in_epilogue(bw->spec, gname, earlier.size())) {
        added[gname] = earlier;
        earlier.clear();
      }
    }
    const std::string stage = taken_free(st.name + ".bwd");
    add_stage(stage, graph_to_json(bw->spec));
    for (const std::string& r : bw->recomputed) out_.recomputed.push_back(st.name + ": " + r);
    auto spec_view = [&](const std::string& name) {
      for (const TensorSpec& t : bw->spec.tensors)
        if (t.name == name) return View{t.dims, t.strides};
      return View{};
    };
    for (const auto& [name, in] : bw->inputs) {
      const int b = st.bind.at(in.forward_tensor);
      if (in.kind == BackwardInput::Kind::kGradient) {
        bind(stage, name, grad_.at(b), spec_view(name), true);
      } else {
        const std::string& bn = p_.buffers[b].name;
        declare(bn, "input");
        out_.inputs[bn] = BackwardInput{BackwardInput::Kind::kSaved, bn, false};
        bind(stage, name, bn, spec_view(name), true);
      }
    }
    // The earlier parts the epilogues add, read in each gradient's own layout.
    for (const auto& [gname, parts] : added)
      for (size_t k = 0; k < parts.size(); ++k)
        bind(stage, gname + ".acc" + std::to_string(k), parts[k], spec_view(gname), true);
    // The gradients this stage gives its inputs' buffers, and any other output its
    // backward ops write to memory (kept in a buffer of its own, unread).
    std::set<std::string> grads;
    for (const auto& [x, gname] : bw->gradients) {
      const int b = st.bind.at(x);
      const std::string part = taken_free(p_.buffers[b].name + ".grad." + st.name);
      declare(part, "intermediate");
      bind(stage, gname, part, spec_view(gname), false);
      parts_[b].push_back(part);
      grads.insert(gname);
    }
    FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph rb, resolve(bw->spec));
    for (const ResolvedTensor& t : rb.tensors) {
      if (!t.is_output || grads.count(t.name)) continue;
      const std::string extra = taken_free(stage + "." + t.name);
      declare(extra, "output");
      bind(stage, t.name, extra, View{t.dims, t.strides}, false);
    }
  }
  // The gradients asked for.
  for (int b = 0; b < nb; ++b) {
    if (!wrt[b]) continue;
    FUSEBOX_ASSIGN_OR_RETURN(std::string gb, finalize(b, true));
    if (gb.empty()) {
      if (!opt.wrt.empty())
        return InvalidArgument(where() + ": buffer " + q(p_.buffers[b].name) +
                               " reaches no seed, so it has no gradient");
      continue;
    }
    out_.gradients[p_.buffers[b].name] = gb;
    buffers_.at(gb).kind = "output";
  }
  if (out_.gradients.empty()) return InvalidArgument(where() + ": no buffer to differentiate reaches a seed");
  // A gradient made by one stage alone is called "<b>.grad", like a summed one.
  for (auto& [x, gb] : out_.gradients) {
    const std::string want = x + ".grad";
    if (gb == want || p_.find_buffer(want) >= 0 || buffers_.count(want)) continue;
    auto node = buffers_.extract(gb);
    node.key() = want;
    buffers_.insert(std::move(node));
    std::replace(order_.begin(), order_.end(), gb, want);
    for (auto& [stage, m] : bind_)
      for (auto& [t, buf] : m)
        if (buf == gb) buf = want;
    gb = want;
  }
  // The JSON: gradient buffers nobody reads are outputs; views differ -> "reshape".
  nlohmann::ordered_json j;
  j["name"] = p_.name + "_bwd";
  nlohmann::ordered_json graphs = nlohmann::ordered_json::object(), bufs = nlohmann::ordered_json::object(),
                         binds = nlohmann::ordered_json::object();
  for (const std::string& s : stages_) graphs[s] = file_name_for(s);
  for (const std::string& n : order_) {
    BufferOut& b = buffers_.at(n);
    if (b.kind == "intermediate" && b.readers == 0) b.kind = "output";
    nlohmann::ordered_json e;
    e["kind"] = b.kind;
    if (b.views.size() > 1) e["reshape"] = true;
    bufs[n] = e;
  }
  for (const std::string& s : stages_) binds[s] = bind_.at(s);
  j["graphs"] = graphs;
  j["buffers"] = bufs;
  j["bind"] = binds;
  out_.pipeline_json = j.dump(2) + "\n";
  return std::move(out_);
}

}  // namespace

Result<PipelineBackward> derive_pipeline_backward(const Pipeline& fwd, const BackwardOptions& options) {
  PipelineDeriver d(fwd);
  return d.run(options);
}

Result<std::string> write_pipeline_backward(const Pipeline& fwd, const PipelineBackward& b,
                                            const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return IoError("cannot create folder " + q(dir) + ": " + ec.message());
  // Never replace a file of the forward pipeline (its file, graphs, weights), nor write one file twice.
  std::vector<common::NamedPath> inputs{{"forward pipeline file", fwd.path}};
  for (const PipelineStage& s : fwd.stages)
    inputs.push_back({"graph file of stage '" + s.name + "'", s.graph_path});
  for (const PipelineBuffer& buf : fwd.buffers)
    if (!buf.file_path.empty())
      inputs.push_back({"weights file of buffer '" + buf.name + "'", buf.file_path});
  const nlohmann::json pj = nlohmann::json::parse(b.pipeline_json);
  const std::string pipeline_path =
      (fs::path(dir) / file_name_for(pj.at("name").get<std::string>())).string();
  std::vector<std::pair<std::string, const std::string*>> files{{pipeline_path, &b.pipeline_json}};
  for (const auto& [name, text] : b.graph_files) files.push_back({(fs::path(dir) / name).string(), &text});
  std::vector<common::NamedPath> outputs;
  for (const auto& [path, text] : files) outputs.push_back({"backward pipeline file", path});
  FUSEBOX_RETURN_IF_ERROR(common::check_outputs_spare_inputs(outputs, inputs));
  for (const auto& [path, text] : files)
    FUSEBOX_RETURN_IF_ERROR(common::write_file_atomic(path, *text, "backward pipeline file"));
  return pipeline_path;
}

Result<PipelineHostData> pipeline_host_data(const Pipeline& p, const GradientInputs& values) {
  PipelineHostData d;
  for (int i = 0; i < static_cast<int>(p.buffers.size()); ++i) {
    const PipelineBuffer& b = p.buffers[static_cast<size_t>(i)];
    if (b.kind != BufferKind::kInput && b.kind != BufferKind::kConstant) continue;
    auto it = values.find(b.name);
    if (it == values.end())
      return InvalidArgument("pipeline '" + p.name + "': no value for " +
                             std::string(buffer_kind_name(b.kind)) + " buffer '" + b.name + "'");
    d.emplace(i, host_tensor_of(buffer_tensor(p, i), it->second));
  }
  return d;
}

Result<PipelineHostData> backward_pipeline_data(
    const Pipeline& fwd, const PipelineBackward& b, const Pipeline& bwd,
    const std::map<std::string, std::vector<double>>& forward_inputs,
    const std::map<std::string, std::vector<float>>& chain,
    const std::map<std::string, std::vector<double>>& seeds,
    const std::map<std::string, std::vector<double>>& extra_inputs) {
  // The seeds, and saved forward buffers (the same bytes, whatever view the backward's
  // first reader takes).
  PipelineHostData bdata;
  for (int i = 0; i < static_cast<int>(bwd.buffers.size()); ++i) {
    const PipelineBuffer& buf = bwd.buffers[i];
    if (buf.kind != BufferKind::kInput) continue;
    auto bi = b.inputs.find(buf.name);
    if (bi == b.inputs.end()) {
      auto x = extra_inputs.find(buf.name);
      if (x == extra_inputs.end()) return Internal("backward input buffer '" + buf.name + "' has no binding");
      bdata.emplace(i, host_tensor_of(buffer_tensor(bwd, i), x->second));
      continue;
    }
    const std::string& from = bi->second.forward_tensor;
    if (bi->second.kind == BackwardInput::Kind::kGradient) {
      auto g = seeds.find(from);
      if (g == seeds.end()) return InvalidArgument("no seed gradient for forward buffer '" + from + "'");
      bdata.emplace(i, host_tensor_of(buffer_tensor(bwd, i), g->second));
      continue;
    }
    const int fb = fwd.find_buffer(from);
    std::vector<double> v;
    if (auto it = forward_inputs.find(from); it != forward_inputs.end()) {
      v = it->second;
    } else if (auto c = chain.find(from); c != chain.end()) {
      v.assign(c->second.begin(), c->second.end());
    } else {
      return InvalidArgument("no value for the saved forward buffer '" + from + "'");
    }
    HostTensor f = host_tensor_of(buffer_tensor(fwd, fb), v);
    HostTensor t = HostTensor::like(buffer_tensor(bwd, i));
    if (t.data.size() != f.data.size())
      return Internal("backward buffer '" + buf.name + "' spans other bytes than the forward's");
    t.data = std::move(f.data);
    bdata.emplace(i, std::move(t));
  }
  return bdata;
}

namespace {

// The pipeline with its 16-bit buffers and graph tensors in fp32 (the rules' math is checked).
Pipeline pipeline_in_fp32(const Pipeline& p) {
  Pipeline w = p;
  auto widen = [](DType& d) {
    if (d == DType::kBF16 || d == DType::kFP16) d = DType::kFP32;
  };
  for (PipelineBuffer& b : w.buffers) widen(b.dtype);
  for (PipelineStage& s : w.stages) {
    widen(s.graph.io_dtype);
    for (ResolvedTensor& t : s.graph.tensors) widen(t.dtype);
  }
  return w;
}

}  // namespace

Result<GradientCheck> check_pipeline_gradients(const Pipeline& given_fwd, const PipelineBackward& b,
                                               const Pipeline& given_bwd, uint32_t seed, double tol,
                                               const GradientInputs& fixed, double step) {
  const Pipeline fwd = pipeline_in_fp32(given_fwd), bwd = pipeline_in_fp32(given_bwd);
  FUSEBOX_RETURN_IF_ERROR(check_gradient_check_size(fwd.name, fwd.flops(), bwd.flops(), b.gradients.size()));
  if (tol <= 0) tol = 2e-3;
  constexpr double kMaxFlops = 1e12;  // the CPU reference for every stage
  std::mt19937 rng(seed);
  using Values = GradientInputs;
  Values in;
  for (int i = 0; i < static_cast<int>(fwd.buffers.size()); ++i) {
    const PipelineBuffer& buf = fwd.buffers[i];
    if (buf.kind != BufferKind::kInput && buf.kind != BufferKind::kConstant) continue;
    const ResolvedTensor t = buffer_tensor(fwd, i);
    std::vector<double> v(static_cast<size_t>(t.element_count()));
    if (auto f = fixed.find(buf.name); f != fixed.end()) {
      if (f->second.size() != v.size())
        return InvalidArgument("check_pipeline_gradients: " + std::to_string(f->second.size()) +
                               " values given for buffer '" + buf.name + "' of " + std::to_string(v.size()) +
                               " elements");
      v = f->second;
    } else if (!t.values.empty()) {
      v = t.values;
    } else if (!dtype_is_float(t.dtype)) {
      std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(t.random_lo),
                                               static_cast<int64_t>(t.random_hi));
      for (auto& x : v) x = static_cast<double>(d(rng));
    } else {
      v = gradient_check_values(t.element_count(), rng);
    }
    in[buf.name] = std::move(v);
  }
  Values seeds;
  for (const std::string& s : b.seeds) {
    const ResolvedTensor t = buffer_tensor(fwd, fwd.find_buffer(s));
    seeds[s] = gradient_check_values(t.element_count(), rng);
  }
  auto loss = [&](const Values& values) -> Result<double> {
    FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData data, pipeline_host_data(fwd, values));
    FUSEBOX_ASSIGN_OR_RETURN(auto chain, reference_chain(fwd, data, kMaxFlops));
    double l = 0;
    for (const auto& [name, g] : seeds) {
      const auto& y = chain.at(name);
      for (size_t i = 0; i < g.size(); ++i) l += g[i] * y[i];
    }
    return l;
  };
  FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData data, pipeline_host_data(fwd, in));
  FUSEBOX_ASSIGN_OR_RETURN(auto chain, reference_chain(fwd, data, kMaxFlops));
  FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData bdata, backward_pipeline_data(fwd, b, bwd, in, chain, seeds));
  FUSEBOX_ASSIGN_OR_RETURN(auto grads, reference_chain(bwd, bdata, kMaxFlops));
  return gradient_check_rows(b.gradients, grads, in, loss, rng, tol, step);
}

}  // namespace fusebox
