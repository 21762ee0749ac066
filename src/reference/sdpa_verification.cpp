// fusebox: what verifying sdpa ops needs besides the references: backward
// inputs consistent with the forward, and masking the values cuDNN leaves
// undefined.
#include <cmath>
#include <tuple>
#include <variant>

#include "fusebox/reference.h"
#include "reference/sdpa_mask.h"
#include "reference/tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::for_each_element;
using reference_detail::sdpa_kept_keys;
using reference_detail::sdpa_mask_params;

namespace {

std::string op_where(const ResolvedOp& op) {
  std::string s = "[";  // appended piecewise: GCC 12 flags "[" + std::string(...) with a false -Wrestrict
  s.append(op_type_name(op.attrs)).append(" '").append(op.name).append("'] ");
  return s;
}

Result<const ResolvedTensor*> op_tensor(const ResolvedGraph& g, const ResolvedOp& op,
                                        const std::map<std::string, int>& roles, const char* role) {
  auto it = roles.find(role);
  if (it == roles.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size()))
    return InvalidArgument(op_where(op) + "has no tensor '" + role + "'");
  return &g.tensors[it->second];
}

// Each sequence's lengths (lq, lkv) for sdpa op `op`: its seq_len inputs with
// padding, else Sq and Skv.
struct Lengths {
  std::vector<int64_t> q, kv;
};

Result<Lengths> sequence_lengths(const ResolvedGraph& g, const ResolvedOp& op, const SdpaOptions& o,
                                 const std::map<std::string, HostTensor>& inputs) {
  FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* q, op_tensor(g, op, op.inputs, "q"));
  FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* k, op_tensor(g, op, op.inputs, "k"));
  if (q->dims.size() != 4 || k->dims.size() != 4)
    return InvalidArgument(op_where(op) + "q and k must have rank 4");
  const int64_t B = q->dims[0];
  Lengths l{std::vector<int64_t>(B, q->dims[2]), std::vector<int64_t>(B, k->dims[2])};
  if (!o.padding) return l;
  for (auto [role, len, full] : {std::tuple{"seq_len_q", &l.q, q->dims[2]}, std::tuple{"seq_len_kv", &l.kv, k->dims[2]}}) {
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, op_tensor(g, op, op.inputs, role));
    auto it = inputs.find(t->name);
    if (it == inputs.end())
      return InvalidArgument(op_where(op) + "input '" + role + "': no values for tensor '" + t->name + "'");
    if (it->second.element_count() != B)
      return InvalidArgument(op_where(op) + "input '" + role + "' (tensor '" + t->name + "') has " +
                             std::to_string(it->second.element_count()) + " values for B=" + std::to_string(B));
    const std::vector<float> v = it->second.to_float_logical();
    for (int64_t b = 0; b < B; ++b) {
      if (!(v[b] >= 0 && v[b] <= static_cast<float>(full) && v[b] == std::floor(v[b])))
        return InvalidArgument(op_where(op) + "input '" + role + "' (tensor '" + t->name + "') holds " +
                               std::to_string(v[b]) + " for batch " + std::to_string(b) +
                               ": each length must be an integer in [0, " + std::to_string(full) + "]");
      (*len)[b] = static_cast<int64_t>(v[b]);
    }
  }
  return l;
}

// Whether row i of batch b keeps no key (padded rows included).
bool row_is_empty(const reference_detail::SdpaMaskParams& m, const Lengths& l, int64_t b, int64_t i) {
  int64_t lo = 0, hi = -1;
  sdpa_kept_keys(m, i, l.q[b], l.kv[b], &lo, &hi);
  return lo > hi;
}

// The forward of sdpa_bwd op `op` (same q, k, v, mask inputs and options,
// generate_stats) as a graph of its own whose o and stats are the bwd's o and
// stats tensors, so the forward's outputs land under the names bwd reads.
Result<ResolvedGraph> forward_of(const ResolvedGraph& g, const ResolvedOp& op, const SdpaBwdAttrs& bwd) {
  ResolvedGraph f;
  f.name = g.name + "/" + op.name + ".forward";
  ResolvedOp fop;
  fop.name = op.name;
  SdpaFwdAttrs attrs;
  static_cast<SdpaOptions&>(attrs) = bwd;
  attrs.generate_stats = true;
  fop.attrs = attrs;
  for (std::string_view r : op_input_roles(fop.attrs)) {
    const std::string role(r);
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, op_tensor(g, op, op.inputs, role.c_str()));
    fop.inputs[role] = static_cast<int>(f.tensors.size());
    f.tensors.push_back(*t);
  }
  for (const char* role : {"o", "stats"}) {
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, op_tensor(g, op, op.inputs, role));
    ResolvedTensor out = *t;
    out.is_input = false;
    out.is_output = true;
    fop.outputs[role] = static_cast<int>(f.tensors.size());
    f.tensors.push_back(std::move(out));
  }
  f.ops.push_back(std::move(fop));
  return f;
}

}  // namespace

Status derive_sdpa_bwd_inputs(const ResolvedGraph& g, std::map<std::string, HostTensor>& inputs,
                              double cpu_max_flops) {
  for (const ResolvedOp& op : g.ops) {
    const auto* bwd = std::get_if<SdpaBwdAttrs>(&op.attrs);
    if (!bwd) continue;
    if (bwd->dropout && *bwd->dropout > 0)
      return NotSupported(op_where(op) + "cannot derive inputs 'o' and 'stats': no reference for dropout");
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedGraph fwd, forward_of(g, op, *bwd));
    FUSEBOX_ASSIGN_OR_RETURN(const Lengths lengths, sequence_lengths(g, op, *bwd, inputs));
    Result<ReferenceOutputs> ref = Status(StatusCode::kNoDevice, "");
    if (fwd.flops() > cpu_max_flops && gpu_reference_available()) ref = reference_gpu_host(fwd, inputs);
    if (!ref.ok() && ref.status().code() == StatusCode::kNoDevice) ref = reference_cpu(fwd, inputs);
    if (!ref.ok()) return ref.status().WithContext(op_where(op) + "deriving inputs 'o' and 'stats'");

    const reference_detail::SdpaMaskParams mask = sdpa_mask_params(*bwd);
    for (const char* role : {"o", "stats"}) {
      const ResolvedTensor& t = fwd.tensors[fwd.ops[0].outputs.at(role)];
      auto values = ref->find(t.name);
      if (values == ref->end() || static_cast<int64_t>(values->second.size()) != t.element_count())
        return Internal(op_where(op) + "the forward reference gave no '" + role + "'");
      const int64_t H = t.dims[1], S = t.dims[2], row_len = t.dims[3];
      HostTensor h = HostTensor::like(t);
      const size_t esize = dtype_size_bytes(h.dtype);
      const bool is_stats = std::string_view(role) == "stats";
      for_each_element(h.dims, h.strides, [&](int64_t i, int64_t off) {
        const int64_t row = i / row_len, b = row / (H * S);
        const bool empty = row_is_empty(mask, lengths, b, row % S);
        const double v = empty ? (is_stats ? INFINITY : 0.0) : values->second[i];
        store_element(h.data.data() + off * esize, h.dtype, v);
      });
      inputs[t.name] = std::move(h);
    }
  }
  return Status::Ok();
}

Status mask_dont_care(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
                      std::map<std::string, std::vector<float>>& outputs) {
  for (const ResolvedOp& op : g.ops) {
    const SdpaOptions* o = sdpa_options(op.attrs);
    if (!o) continue;
    // Only what could be undefined: nothing to do without padding or rows that keep no key.
    FUSEBOX_ASSIGN_OR_RETURN(const Lengths lengths, sequence_lengths(g, op, *o, inputs));
    const reference_detail::SdpaMaskParams mask = sdpa_mask_params(*o);
    for (const auto& [role, idx] : op.outputs) {
      const bool query_rows = role == "o" || role == "stats" || role == "dq";
      const bool key_rows = role == "dk" || role == "dv";
      if (!query_rows && !key_rows) continue;  // amax_s, amax_o: one value
      const ResolvedTensor& t = g.tensors[idx];
      auto it = outputs.find(t.name);
      if (it == outputs.end()) continue;
      std::vector<float>& v = it->second;
      if (t.dims.size() != 4 || static_cast<int64_t>(v.size()) != t.element_count())
        return InvalidArgument(op_where(op) + "output '" + role + "' (tensor '" + t.name + "') has " +
                               std::to_string(v.size()) + " values; its dims " + dims_string(t.dims) + " need " +
                               std::to_string(t.element_count()));
      const int64_t H = t.dims[1], S = t.dims[2], row_len = t.dims[3];
      for (int64_t row = 0; row < t.dims[0] * H * S; ++row) {
        const int64_t b = row / (H * S), i = row % S;
        const bool dont_care = query_rows ? row_is_empty(mask, lengths, b, i) : i >= lengths.kv[b];
        if (dont_care) std::fill(v.begin() + row * row_len, v.begin() + (row + 1) * row_len, 0.0f);
      }
    }
  }
  return Status::Ok();
}

}  // namespace fusebox
