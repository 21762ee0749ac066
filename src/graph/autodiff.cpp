// fusebox graph layer: derive_backward() (fusebox/autodiff.h). Walks the
// forward ops in reverse topological order and calls each op family's gradient
// rule (grad() in src/graph/ops/<family>.cpp) through the GradContext below.
#include "fusebox/autodiff.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/dims_string.h"
#include "fusebox/op_traits.h"
#include "ops/ops.h"

namespace fusebox {

using common::dims_string;
using graph_ops::squote;

namespace graph_ops {

Result<std::string> GradContext::pointwise(std::string_view what, PointwiseMode mode, const std::string& a,
                                           const std::string& b) {
  std::map<std::string, std::string> in;
  const auto roles = input_roles(PointwiseAttrs{mode});
  in[std::string(roles[0])] = a;
  if (!pointwise_is_unary(mode)) in[std::string(roles[1])] = b;
  FUSEBOX_ASSIGN_OR_RETURN(auto out, emit(what, PointwiseAttrs{mode}, std::move(in)));
  return out.at("y");
}

Status GradContext::hand(const std::map<std::string, std::string>& emitted,
                         std::initializer_list<std::pair<const char*, const char*>> input_output) {
  for (const auto& [input, output] : input_output)
    if (has_in(input) && wants(input)) FUSEBOX_RETURN_IF_ERROR(add_grad(input, emitted.at(output)));
  return Status::Ok();
}

Status GradContext::no_rule(std::string_view why) const {
  return NotSupported(where() + ": no gradient: " + std::string(why));
}

}  // namespace graph_ops

namespace {

using graph_ops::GradContext;

std::string op_label(const ResolvedOp& op) {
  return "[" + std::string(op_type_name(op.attrs)) + " " + squote(op.name) + "]";
}

// Whether input `role` of `op` can carry a gradient (its traits' no_grad_inputs).
bool grad_role(const ResolvedOp& op, const std::string& role) {
  const auto ng = op_traits(op.attrs).no_grad_inputs;
  return std::find(ng.begin(), ng.end(), role) == ng.end();
}

// A memory tensor of the backward graph named `name`, laid out as `like`.
TensorSpec spec_like(const ResolvedTensor& like, std::string name) {
  TensorSpec s;
  s.name = std::move(name);
  s.dims = like.dims;
  s.strides = like.strides;
  s.dtype = like.dtype;
  return s;
}

// Whether a forward tensor can carry a gradient at all.
bool differentiable(const ResolvedTensor& t) {
  return dtype_is_float(t.dtype) && !t.scalar_value && t.values.empty();
}

class Deriver final : public GradContext {
 public:
  explicit Deriver(const ResolvedGraph& fwd) : fwd_(fwd) {
    b_.spec.name = fwd.name + "_bwd";
    b_.spec.io_dtype = fwd.io_dtype;
    b_.spec.intermediate_dtype = fwd.intermediate_dtype;
    b_.spec.compute_dtype = fwd.compute_dtype;
    for (size_t i = 0; i < fwd.tensors.size(); ++i) taken_.insert(fwd.tensors[i].name);
    for (int i = 0; i < static_cast<int>(fwd.ops.size()); ++i)
      for (const auto& [role, t] : fwd.ops[i].outputs) producer_[t] = i;
  }

  Result<BackwardGraph> run(const BackwardOptions& opt);

  // ---- GradContext
  const ResolvedOp& op() const override { return fwd_.ops[cur_]; }
  const ResolvedGraph& forward() const override { return fwd_; }
  std::string where() const override { return op_label(op()); }
  std::string dy(std::string_view role) const override {
    auto it = op().outputs.find(std::string(role));
    if (it == op().outputs.end()) return "";
    auto g = grads_.find(fwd_.tensors[it->second].name);
    return g == grads_.end() ? "" : g->second;
  }
  bool deterministic() const override { return deterministic_; }
  bool wants(std::string_view role) const override {
    auto it = op().inputs.find(std::string(role));
    return it != op().inputs.end() && needs_[it->second] && grad_role(op(), it->first);
  }
  Result<std::string> in(std::string_view role) override {
    auto it = op().inputs.find(std::string(role));
    if (it == op().inputs.end())
      return Internal(where() + ": the rule reads input " + squote(std::string(role)) +
                      ", which the op lacks");
    return value(it->second);
  }
  Result<std::string> out(std::string_view role) override {
    auto it = op().outputs.find(std::string(role));
    if (it == op().outputs.end())
      return Internal(where() + ": the rule reads output " + squote(std::string(role)) +
                      ", which the op lacks");
    return value(it->second);
  }
  Result<std::string> in_transposed(std::string_view role) override;
  Result<std::map<std::string, std::string>> emit(std::string_view what, OpAttrs attrs,
                                                  std::map<std::string, std::string> inputs,
                                                  std::vector<std::string> output_roles) override;
  std::string scalar(double value) override {
    const std::string n = fresh("c" + std::to_string(scalars_++));
    b_.spec.scalar(n, value, DType::kFP32);
    return n;
  }
  Status add_grad(std::string_view role, const std::string& g) override;

 private:
  std::string fresh(const std::string& base) {
    std::string n = base;
    for (int k = 2; taken_.count(n); ++k) n = base + "_" + std::to_string(k);
    taken_.insert(n);
    return n;
  }
  // Counts forward tensor `f` among the saved ones, once (read as is or transposed).
  void note_saved(const ResolvedTensor& f) {
    if (std::find(b_.saved.begin(), b_.saved.end(), f.name) != b_.saved.end()) return;
    b_.saved.push_back(f.name);
    b_.saved_bytes += f.storage_bytes();
  }
  // Declares forward tensor `t` a backward input (saved), once.
  std::string save(int t);
  // The backward name of forward tensor t's value (saved or recomputed).
  Result<std::string> value(int t);
  // The op of `emit` (and of recomputation): a backward op with fresh output names.
  Result<std::map<std::string, std::string>> add_op(const std::string& name, OpAttrs attrs,
                                                    std::map<std::string, std::string> inputs,
                                                    std::vector<std::string> output_roles, bool virtual_out);
  // Dims of a backward tensor (forward-known, emitted ops' outputs resolved lazily).
  Result<std::vector<int64_t>> dims_of(const std::string& name);
  // The tensor `name` as a graph output called `want` with the forward tensor's layout.
  Status publish(const std::string& name, const std::string& want, const ResolvedTensor& like);

  const ResolvedGraph& fwd_;
  BackwardGraph b_;
  int cur_ = -1;
  bool deterministic_ = false;
  std::set<std::string> taken_;
  std::map<int, int> producer_;                       // forward tensor -> the op that makes it
  std::vector<bool> needs_;                           // forward tensor -> on a path from a wrt input
  std::map<std::string, std::string> grads_;          // forward tensor name -> backward gradient tensor
  std::map<int, std::string> values_;                 // forward tensor -> backward value
  std::map<int, std::string> transposed_;             // forward tensor -> its transposed view
  std::map<std::string, std::string> published_;      // backward tensor -> the output it was renamed to
  std::map<std::string, std::vector<int64_t>> dims_;  // backward tensor -> dims, where known
  int scalars_ = 0;
  int recompute_depth_ = 0;
};

std::string Deriver::save(int t) {
  auto it = values_.find(t);
  if (it != values_.end()) return it->second;
  const ResolvedTensor& f = fwd_.tensors[t];
  TensorSpec s = spec_like(f, f.name);
  s.scalar_value = f.scalar_value;
  s.values = f.values;
  b_.spec.tensors.push_back(s);
  if (!f.scalar_value) {
    b_.inputs[f.name] = BackwardInput{BackwardInput::Kind::kSaved, f.name, false};
    note_saved(f);
  }
  dims_[f.name] = f.dims;
  values_[t] = f.name;
  return f.name;
}

Result<std::string> Deriver::value(int t) {
  if (auto it = values_.find(t); it != values_.end()) return it->second;
  const ResolvedTensor& f = fwd_.tensors[t];
  if (!f.is_virtual) return save(t);
  // A virtual intermediate: recompute it by a copy of its producer, whose
  // inputs are themselves saved or recomputed.
  auto p = producer_.find(t);
  if (p == producer_.end()) return Internal("virtual tensor " + squote(f.name) + " has no producer");
  if (++recompute_depth_ > 64) return Internal("recomputation deeper than 64 ops at " + squote(f.name));
  const ResolvedOp& src = fwd_.ops[p->second];
  std::map<std::string, std::string> inputs;
  for (const auto& [role, ti] : src.inputs) {
    FUSEBOX_ASSIGN_OR_RETURN(std::string v, value(ti));
    inputs[role] = v;
  }
  std::vector<std::string> roles;
  for (const auto& [role, ti] : src.outputs) roles.push_back(role);
  FUSEBOX_ASSIGN_OR_RETURN(auto outs, add_op(fresh(src.name + ".recompute"), src.attrs, inputs, roles, true));
  --recompute_depth_;
  b_.recomputed.push_back(src.name);
  for (const auto& [role, ti] : src.outputs) {
    values_[ti] = outs.at(role);
    dims_[outs.at(role)] = fwd_.tensors[ti].dims;
  }
  return values_.at(t);
}

Result<std::string> Deriver::in_transposed(std::string_view role) {
  auto it = op().inputs.find(std::string(role));
  if (it == op().inputs.end()) return Internal(where() + ": no input " + squote(std::string(role)));
  const int t = it->second;
  if (auto v = transposed_.find(t); v != transposed_.end()) return v->second;
  const ResolvedTensor& f = fwd_.tensors[t];
  if (f.is_virtual) {
    return NotSupported(where() + " input " + squote(std::string(role)) + " (" + squote(f.name) +
                        ") is a virtual intermediate, but its gradient rule reads it transposed, which needs "
                        "memory to view: declare " +
                        squote(f.name) + " a graph output so it is saved");
  }
  const size_t r = f.dims.size();
  TensorSpec s = spec_like(f, fresh(f.name + ".T"));
  std::swap(s.dims[r - 1], s.dims[r - 2]);
  std::swap(s.strides[r - 1], s.strides[r - 2]);
  b_.spec.tensors.push_back(s);
  b_.inputs[s.name] = BackwardInput{BackwardInput::Kind::kSaved, f.name, true};
  note_saved(f);
  dims_[s.name] = s.dims;
  transposed_[t] = s.name;
  return s.name;
}

Result<std::map<std::string, std::string>> Deriver::add_op(const std::string& name, OpAttrs attrs,
                                                           std::map<std::string, std::string> inputs,
                                                           std::vector<std::string> output_roles,
                                                           bool virtual_out) {
  OpSpec op;
  op.name = name;
  op.attrs = std::move(attrs);
  op.inputs = std::move(inputs);
  if (output_roles.empty())
    for (auto r : op_output_roles(op.attrs)) output_roles.emplace_back(r);
  const OpTraitsInfo traits = op_traits(op.attrs);
  const bool in_memory = traits.outputs_in_memory || traits.native_only;
  std::map<std::string, std::string> out;
  for (const std::string& role : output_roles) {
    const std::string t = fresh(name + "." + role);
    op.outputs[role] = t;
    out[role] = t;
    if (in_memory || !virtual_out) b_.spec.output(t);
  }
  b_.spec.ops.push_back(std::move(op));
  return out;
}

Result<std::map<std::string, std::string>> Deriver::emit(std::string_view what, OpAttrs attrs,
                                                         std::map<std::string, std::string> inputs,
                                                         std::vector<std::string> output_roles) {
  return add_op(fresh(op().name + "." + std::string(what)), std::move(attrs), std::move(inputs),
                std::move(output_roles), true);
}

Result<std::vector<int64_t>> Deriver::dims_of(const std::string& name) {
  if (auto it = dims_.find(name); it != dims_.end()) return it->second;
  // Resolve the backward graph so far to learn the dims of emitted tensors
  // (every op output declared an output, so that the partial graph has one).
  GraphSpec partial = b_.spec;
  for (const OpSpec& op : b_.spec.ops)
    for (const auto& [role, t] : op.outputs) partial.output(t);
  FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph g, resolve(partial));
  for (const auto& t : g.tensors) dims_[t.name] = t.dims;
  if (auto it = dims_.find(name); it != dims_.end()) return it->second;
  return Internal("backward tensor " + squote(name) + " not found");
}

Status Deriver::add_grad(std::string_view role, const std::string& g) {
  auto it = op().inputs.find(std::string(role));
  if (it == op().inputs.end())
    return Internal(where() + ": gradient for missing input " + squote(std::string(role)));
  const int t = it->second;
  if (!needs_[t]) return Status::Ok();
  const ResolvedTensor& f = fwd_.tensors[t];
  FUSEBOX_ASSIGN_OR_RETURN(std::vector<int64_t> gd, dims_of(g));
  std::string part = g;
  if (gd != f.dims) {
    if (gd.size() != f.dims.size())
      return Internal(where() + ": gradient of " + squote(f.name) + " has dims " + dims_string(gd) +
                      ", the tensor " + dims_string(f.dims));
    std::vector<int64_t> reduce;
    for (size_t i = 0; i < gd.size(); ++i) {
      if (gd[i] == f.dims[i]) continue;
      if (f.dims[i] != 1)
        return Internal(where() + ": gradient of " + squote(f.name) + " has dims " + dims_string(gd) +
                        ", not a broadcast of " + dims_string(f.dims));
      reduce.push_back(static_cast<int64_t>(i));
    }
    FUSEBOX_ASSIGN_OR_RETURN(auto r, emit("d" + std::string(role) + "_sum",
                                          ReductionAttrs{ReductionMode::kSum, reduce}, {{"x", g}}, {}));
    part = r.at("y");
    dims_[part] = f.dims;
  }
  auto acc = grads_.find(f.name);
  if (acc == grads_.end()) {
    grads_[f.name] = part;
    return Status::Ok();
  }
  FUSEBOX_ASSIGN_OR_RETURN(std::string sum, GradContext::pointwise("d" + std::string(role) + "_acc",
                                                                   PointwiseMode::kAdd, acc->second, part));
  dims_[sum] = f.dims;
  acc->second = sum;
  return Status::Ok();
}

Status Deriver::publish(const std::string& name, const std::string& want, const ResolvedTensor& like) {
  // A backward input (the seed itself, a saved tensor) cannot be an output, nor can
  // one tensor be two outputs (two inputs with the same gradient, as the inputs of an
  // add): copy it through a scale by 1.
  std::string from = name;
  if (auto it = published_.find(name); it != published_.end()) from = it->second;
  if (b_.inputs.count(from) > 0 || from != name) {
    OpSpec op;
    op.name = fresh(want + ".copy");
    op.attrs = PointwiseAttrs{PointwiseMode::kScale};
    op.inputs = {{"x", from}, {"scale", scalar(1.0)}};
    op.outputs = {{"y", want}};
    b_.spec.ops.push_back(std::move(op));
  } else {
    published_[name] = want;
    // Rename the tensor everywhere it appears.
    for (auto& op : b_.spec.ops) {
      for (auto& [r, t] : op.inputs)
        if (t == name) t = want;
      for (auto& [r, t] : op.outputs)
        if (t == name) t = want;
    }
    b_.spec.tensors.erase(std::remove_if(b_.spec.tensors.begin(), b_.spec.tensors.end(),
                                         [&](const TensorSpec& s) { return s.name == name; }),
                          b_.spec.tensors.end());
  }
  b_.spec.tensors.push_back(spec_like(like, want));
  return Status::Ok();
}

Result<BackwardGraph> Deriver::run(const BackwardOptions& opt) {
  deterministic_ = opt.deterministic;
  const int nt = static_cast<int>(fwd_.tensors.size());
  // wrt: the inputs to differentiate.
  std::vector<int> wrt;
  if (opt.wrt.empty()) {
    // Inputs some op reads through a role that carries a gradient.
    std::set<int> used;
    for (const ResolvedOp& op : fwd_.ops)
      for (const auto& [r, t] : op.inputs)
        if (grad_role(op, r)) used.insert(t);
    for (int t : fwd_.input_tensors())
      if (differentiable(fwd_.tensors[t]) && used.count(t)) wrt.push_back(t);
  } else {
    for (const std::string& n : opt.wrt) {
      const int t = fwd_.find_tensor(n);
      if (t < 0 || !fwd_.tensors[t].is_input)
        return InvalidArgument("backward of graph " + squote(fwd_.name) + ": wrt " + squote(n) +
                               " is not an input of the forward graph");
      if (!differentiable(fwd_.tensors[t]))
        return InvalidArgument("backward of graph " + squote(fwd_.name) + ": wrt " + squote(n) + " is " +
                               std::string(dtype_name(fwd_.tensors[t].dtype)) +
                               (fwd_.tensors[t].values.empty() ? "" : " with fixed values") +
                               ": only floating-point tensors without fixed values have gradients");
      wrt.push_back(t);
    }
  }
  if (wrt.empty())
    return InvalidArgument("backward of graph " + squote(fwd_.name) +
                           ": no floating-point input to differentiate");
  // Seeds: the outputs whose gradients come in.
  std::vector<int> seeds;
  if (opt.seeds.empty()) {
    std::set<int> read;
    for (const ResolvedOp& op : fwd_.ops)
      for (const auto& [r, t] : op.inputs) read.insert(t);
    for (const ResolvedOp& op : fwd_.ops) {
      auto it = op.outputs.find(std::string(op_primary_output_role(op.attrs)));
      if (it != op.outputs.end() && fwd_.tensors[it->second].is_output && !read.count(it->second) &&
          dtype_is_float(fwd_.tensors[it->second].dtype))
        seeds.push_back(it->second);
    }
  } else {
    for (const std::string& n : opt.seeds) {
      const int t = fwd_.find_tensor(n);
      if (t < 0 || !fwd_.tensors[t].is_output)
        return InvalidArgument("backward of graph " + squote(fwd_.name) + ": seed " + squote(n) +
                               " is not an output of the forward graph");
      seeds.push_back(t);
    }
  }
  // needs: tensors on a path from a wrt input (forward order).
  needs_.assign(nt, false);
  for (int t : wrt) needs_[t] = true;
  for (const ResolvedOp& op : fwd_.ops) {
    bool any = false;
    for (const auto& [r, t] : op.inputs) any = any || (needs_[t] && grad_role(op, r));
    if (any)
      for (const auto& [r, t] : op.outputs) needs_[t] = needs_[t] || dtype_is_float(fwd_.tensors[t].dtype);
  }
  for (int t : seeds) {
    const ResolvedTensor& f = fwd_.tensors[t];
    const TensorSpec s = spec_like(f, fresh(f.name + ".grad"));
    b_.spec.tensors.push_back(s);
    b_.inputs[s.name] = BackwardInput{BackwardInput::Kind::kGradient, f.name, false};
    b_.seeds.push_back(f.name);
    dims_[s.name] = f.dims;
    grads_[f.name] = s.name;
  }
  // Reverse topological order.
  for (cur_ = static_cast<int>(fwd_.ops.size()) - 1; cur_ >= 0; --cur_) {
    const ResolvedOp& o = fwd_.ops[cur_];
    bool any_dy = false, any_want = false;
    for (const auto& [r, t] : o.outputs) any_dy = any_dy || grads_.count(fwd_.tensors[t].name);
    for (const auto& [r, t] : o.inputs) any_want = any_want || (needs_[t] && grad_role(o, r));
    if (!any_dy || !any_want) continue;
    FUSEBOX_RETURN_IF_ERROR(
        graph_ops::visit_op(o.attrs, [&](const auto& a) { return graph_ops::grad(*this, a); }));
  }
  cur_ = -1;
  // The gradients of the wrt inputs become the backward graph's outputs.
  for (int t : wrt) {
    const ResolvedTensor& f = fwd_.tensors[t];
    auto g = grads_.find(f.name);
    if (g == grads_.end() && opt.only_reachable) continue;
    if (g == grads_.end())
      return InvalidArgument("backward of graph " + squote(fwd_.name) + ": input " + squote(f.name) +
                             " reaches no seed output, so it has no gradient (seeds: " +
                             [&] {
                               std::string s;
                               for (int k : seeds)
                                 s += (s.empty() ? "" : ", ") + squote(fwd_.tensors[k].name);
                               return s.empty() ? std::string("none") : s;
                             }() +
                             ")");
    const std::string want = fresh(f.name + ".grad");
    FUSEBOX_RETURN_IF_ERROR(publish(g->second, want, f));
    b_.gradients[f.name] = want;
  }
  // Nothing to differentiate (only_reachable): an empty backward, no graph.
  if (b_.gradients.empty()) return std::move(b_);
  // Check that the result is a valid graph.
  if (auto r = resolve(b_.spec); !r.ok())
    return Status(r.status().code(), "backward of graph " + squote(fwd_.name) +
                                         " is not a valid graph: " + r.status().message());
  return std::move(b_);
}

}  // namespace

Result<BackwardGraph> derive_backward(const ResolvedGraph& fwd, const BackwardOptions& options) {
  Deriver d(fwd);
  return d.run(options);
}

std::string backward_bindings_json(const BackwardGraph& b) {
  nlohmann::ordered_json bw;
  nlohmann::ordered_json inputs = nlohmann::ordered_json::object();
  for (const auto& [name, in] : b.inputs) {
    nlohmann::ordered_json e;
    e["kind"] = in.kind == BackwardInput::Kind::kGradient ? "gradient" : "saved";
    e["forward_tensor"] = in.forward_tensor;
    if (in.transposed) e["transposed"] = true;
    inputs[name] = e;
  }
  bw["inputs"] = inputs;
  bw["gradients"] = b.gradients;
  bw["seeds"] = b.seeds;
  bw["saved"] = b.saved;
  bw["saved_bytes"] = b.saved_bytes;
  bw["recomputed"] = b.recomputed;
  return bw.dump(2) + "\n";
}

}  // namespace fusebox
