// fusebox: what verifying sdpa ops needs besides the references: backward
// inputs consistent with the forward, and masking the values cuDNN leaves
// undefined.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <variant>

#include "fusebox/reference.h"
#include "ops/cpu_context.h"
#include "ops/sdpa_fp8_bwd.h"
#include "ops/sdpa_mask.h"
#include "ops/sdpa_paged.h"
#include "tensor_util.h"

namespace fusebox {

using reference_detail::dims_string;
using reference_detail::for_each_element;
using reference_detail::op_where;
using reference_detail::sdpa_kept_keys;
using reference_detail::sdpa_mask_params;

namespace {

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
  const int64_t Skv = sdpa_kv_length(o, k->dims);
  Lengths l{std::vector<int64_t>(B, q->dims[2]), std::vector<int64_t>(B, Skv)};
  if (!o.padding) return l;
  for (auto [role, len, full] :
       {std::tuple{"seq_len_q", &l.q, q->dims[2]}, std::tuple{"seq_len_kv", &l.kv, Skv}}) {
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, op_tensor(g, op, op.inputs, role));
    auto it = inputs.find(t->name);
    if (it == inputs.end())
      return InvalidArgument(op_where(op) + "input '" + role + "': no values for tensor '" + t->name + "'");
    if (it->second.element_count() != B)
      return InvalidArgument(op_where(op) + "input '" + role + "' (tensor '" + t->name + "') has " +
                             std::to_string(it->second.element_count()) +
                             " values for B=" + std::to_string(B));
    const std::vector<float> v = it->second.to_float_logical();
    for (int64_t b = 0; b < B; ++b) {
      if (!(v[b] >= 0 && v[b] <= static_cast<float>(full) && v[b] == std::floor(v[b])))
        return InvalidArgument(op_where(op) + "input '" + role + "' (tensor '" + t->name + "') holds " +
                               std::to_string(v[b]) + " for batch " + std::to_string(b) +
                               ": each length must be an integer in [0, " + std::to_string(full) + "]" +
                               (o.paged && std::string_view(role) == "seq_len_kv"
                                    ? " (max_seq_len_kv: a longer sequence would read past its pages)"
                                    : ""));
      (*len)[b] = static_cast<int64_t>(v[b]);
    }
  }
  return l;
}

// A block mask's bytes (SdpaOptions::block_mask) as the verification reads
// them; empty without one.
struct BlockBytes {
  std::vector<float> bytes;
  int64_t Hq = 0, tile_rows = 0, row_bytes = 0;
};

// Whether row i of head h of batch b keeps no key (padded rows included): its
// band is empty, or the block mask drops every tile of it.
bool row_is_empty(const reference_detail::SdpaMaskParams& m, const Lengths& l, const BlockBytes& block,
                  int64_t b, int64_t h, int64_t i) {
  int64_t lo = 0, hi = -1;
  sdpa_kept_keys(m, i, l.q[b], l.kv[b], &lo, &hi);
  if (lo > hi || block.bytes.empty()) return lo > hi;
  const int64_t base = ((b * block.Hq + h) * block.tile_rows + i / kSdpaBlockTile) * block.row_bytes;
  for (int64_t tile = lo / kSdpaBlockTile; tile <= hi / kSdpaBlockTile; ++tile) {
    const int64_t j = tile * kSdpaBlockTile;
    if (sdpa_block_keeps(static_cast<unsigned>(block.bytes[static_cast<size_t>(base + tile / 8)]), j))
      return false;
  }
  return true;
}

// The forward of sdpa_bwd op `op` (same q, k, v, mask inputs and options,
// generate_stats) as a graph of its own whose o and stats are the bwd's o and
// stats tensors, so the forward's outputs land under the names bwd reads.
// Without dropout: its mask is cuDNN's, unknown before cuDNN runs (stats do
// not depend on it; o is the dropout-free one, see reference.h).
Result<ResolvedGraph> forward_of(const ResolvedGraph& g, const ResolvedOp& op, const SdpaBwdAttrs& bwd) {
  ResolvedGraph f;
  f.name = g.name + "/" + op.name + ".forward";
  ResolvedOp fop;
  fop.name = op.name;
  SdpaFwdAttrs attrs;
  static_cast<SdpaOptions&>(attrs) = bwd;
  attrs.dropout.reset();
  attrs.dump_dropout_mask = false;
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
    const auto* bwd_only = std::get_if<SdpaBwdAttrs>(&op.attrs);
    const SdpaOptions* bwd = sdpa_options(op.attrs);
    if (!bwd_only && !std::holds_alternative<SdpaFp8BwdAttrs>(op.attrs)) continue;
    // sdpa_fp8_bwd: o and stats from the FP8 forward, scale_o = 1 / descale_o (sdpa_fp8_bwd.h).
    FUSEBOX_ASSIGN_OR_RETURN(
        const ResolvedGraph fwd,
        bwd_only ? forward_of(g, op, *bwd_only) : reference_detail::sdpa_fp8_bwd_forward_of(g, op, inputs));
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
        const bool empty = row_is_empty(mask, lengths, BlockBytes{}, b, 0, row % S);  // no block mask in bwd
        const double v = empty ? (is_stats ? INFINITY : 0.0) : values->second[i];
        store_element(h.data.data() + off * esize, h.dtype, v);
      });
      inputs[t.name] = std::move(h);
    }
  }
  return Status::Ok();
}

namespace reference_detail {

Status check_page_table(const ResolvedOp& op, const char* role, const std::string& tensor,
                        const std::vector<float>& values, int64_t B, int64_t max_pages, int64_t num_pages) {
  if (static_cast<int64_t>(values.size()) != B * max_pages)
    return InvalidArgument(
        op_where(op) + "input '" + role + "' ('" + tensor + "') has " + std::to_string(values.size()) +
        " entries: a page table [B, 1, max_pages, 1] has " + std::to_string(B * max_pages));
  for (int64_t e = 0; e < B * max_pages; ++e) {
    const float x = values[static_cast<size_t>(e)];
    if (x >= 0 && x < static_cast<float>(num_pages) && x == std::floor(x)) continue;
    char text[64];
    std::snprintf(text, sizeof text, "%.9g", static_cast<double>(x));
    return InvalidArgument(op_where(op) + "input '" + role + "' ('" + tensor + "') holds page " + text +
                           " for batch entry " + std::to_string(e / max_pages) + " (slot " +
                           std::to_string(e % max_pages) + "): its pool has " + std::to_string(num_pages) +
                           " pages, so every entry (unused slots too) must be an integer in [0, " +
                           std::to_string(num_pages) + ")");
  }
  return Status::Ok();
}

}  // namespace reference_detail

Status check_sdpa_paged_inputs(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  for (const ResolvedOp& op : g.ops) {
    const SdpaOptions* o = sdpa_options(op.attrs);
    if (!o || !o->paged) continue;
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* q, op_tensor(g, op, op.inputs, "q"));
    const int64_t B = q->dims.at(0);
    for (auto [table_role, pool_role] : {std::pair{"page_table_k", "k"}, std::pair{"page_table_v", "v"}}) {
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* table, op_tensor(g, op, op.inputs, table_role));
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* pool, op_tensor(g, op, op.inputs, pool_role));
      auto it = inputs.find(table->name);
      if (it == inputs.end())
        return InvalidArgument(op_where(op) + "input '" + table_role + "': no values for tensor '" +
                               table->name + "'");
      FUSEBOX_RETURN_IF_ERROR(reference_detail::check_page_table(op, table_role, table->name,
                                                                 it->second.to_float_logical(), B,
                                                                 table->dims.at(2), pool->dims.at(0)));
    }
    // Lengths within [0, Sq] and [0, max_seq_len_kv]: longer than its pages, a
    // sequence would send cuDNN past the end of its table row.
    FUSEBOX_ASSIGN_OR_RETURN(const Lengths lengths, sequence_lengths(g, op, *o, inputs));
    (void)lengths;
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
    BlockBytes block;
    if (o->block_mask) {
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* q, op_tensor(g, op, op.inputs, "q"));
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* k, op_tensor(g, op, op.inputs, "k"));
      FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* m, op_tensor(g, op, op.inputs, "block_mask"));
      const std::vector<int64_t> dims =
          sdpa_block_mask_dims(q->dims.at(0), q->dims.at(1), q->dims.at(2), sdpa_kv_length(*o, k->dims));
      auto it = inputs.find(m->name);
      if (it == inputs.end() || it->second.dims != dims)
        return InvalidArgument(op_where(op) + "input 'block_mask' (tensor '" + m->name +
                               "'): no values of dims " + dims_string(dims));
      block = {it->second.to_float_logical(), dims[1], dims[2], dims[3]};
    }
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
                               std::to_string(v.size()) + " values; its dims " + dims_string(t.dims) +
                               " need " + std::to_string(t.element_count()));
      const int64_t H = t.dims[1], S = t.dims[2], row_len = t.dims[3];
      for (int64_t row = 0; row < t.dims[0] * H * S; ++row) {
        const int64_t b = row / (H * S), h = (row / S) % H, i = row % S;
        const bool dont_care = query_rows ? row_is_empty(mask, lengths, block, b, h, i) : i >= lengths.kv[b];
        if (dont_care) std::fill(v.begin() + row * row_len, v.begin() + (row + 1) * row_len, 0.0f);
      }
    }
  }
  return Status::Ok();
}

Comparison check_dropout_mask(const std::string& tensor, const std::vector<float>& mask, double p,
                              const std::vector<uint8_t>* counted) {
  Comparison c;
  c.tensor = tensor;
  if (!(p >= 0 && p < 1)) {
    c.error = "dropout probability " + std::to_string(p) + " outside [0, 1)";
    return c;
  }
  if (counted && counted->size() != mask.size()) {
    c.error = "size mismatch: the mask has " + std::to_string(mask.size()) +
              " values, the positions to count " + std::to_string(counted->size());
    return c;
  }
  int64_t n = 0, kept = 0, not_binary = 0, first_bad = -1;
  double worst = 0;  // the largest distance of a value from {0, 1}
  for (size_t i = 0; i < mask.size(); ++i) {
    if (counted && !(*counted)[i]) continue;
    ++n;
    const float v = mask[i];
    if (v == 1.0f) {
      ++kept;
    } else if (v != 0.0f) {
      if (!std::isfinite(v)) ++c.non_finite;
      const double x = v, d = std::isfinite(x) ? std::min(std::fabs(x), std::fabs(x - 1.0)) : INFINITY;
      if (not_binary++ == 0) first_bad = static_cast<int64_t>(i);
      if (d > worst || c.worst_index < 0) worst = d, c.worst_index = static_cast<int64_t>(i);
    }
  }
  c.elements = n;
  const double expected = 1.0 - p;
  const double allowed =
      n > 0 ? std::max(6.0 * std::sqrt(p * (1.0 - p) / static_cast<double>(n)), 1e-3) : 0.0;
  const double observed = n > 0 ? static_cast<double>(kept) / static_cast<double>(n) : expected;
  c.rel_l2 = std::fabs(observed - expected);
  c.max_abs = worst;
  c.max_abs_rel = worst;
  c.tolerance = {allowed, 0.0};
  if (c.non_finite > 0) c.worst_index = first_bad;
  c.pass = not_binary == 0 && c.rel_l2 <= allowed;
  if (not_binary > 0) {
    c.error = std::to_string(not_binary) + " of " + std::to_string(n) +
              " values are neither 0 nor 1 (first at index " + std::to_string(first_bad) + ": " +
              std::to_string(mask[static_cast<size_t>(first_bad)]) + "): not a keep-mask";
  } else if (!c.pass) {
    char buf[256];
    std::snprintf(
        buf, sizeof buf,
        "kept fraction %.5f over %lld values, expected 1 - dropout = %.5f +- %.1e: not a Bernoulli(%.4g) "
        "keep-mask",
        observed, static_cast<long long>(n), expected, allowed, expected);
    c.error = buf;
  }
  return c;
}

Result<std::vector<Comparison>> check_dropout_masks(
    const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
    const std::map<std::string, std::vector<float>>& outputs) {
  std::vector<Comparison> out;
  for (const ResolvedOp& op : g.ops) {
    const SdpaOptions* o = sdpa_options(op.attrs);
    if (!o || !o->dropout || !(*o->dropout > 0)) continue;  // dropout 0: cuDNN draws no mask
    auto role = op.outputs.find("dropout_mask");
    if (role == op.outputs.end()) continue;
    FUSEBOX_ASSIGN_OR_RETURN(const ResolvedTensor* t, op_tensor(g, op, op.outputs, "dropout_mask"));
    auto it = outputs.find(t->name);
    if (it == outputs.end()) continue;
    if (t->dims.size() != 4 || static_cast<int64_t>(it->second.size()) != t->element_count())
      return InvalidArgument(op_where(op) + "output 'dropout_mask' (tensor '" + t->name + "') has " +
                             std::to_string(it->second.size()) + " values; its dims " + dims_string(t->dims) +
                             " need " + std::to_string(t->element_count()));
    FUSEBOX_ASSIGN_OR_RETURN(const Lengths lengths, sequence_lengths(g, op, *o, inputs));
    const reference_detail::SdpaMaskParams mask = sdpa_mask_params(*o);
    const int64_t H = t->dims[1], Sq = t->dims[2], Skv = t->dims[3];
    std::vector<uint8_t> counted(it->second.size(), 0);
    for (int64_t row = 0; row < t->dims[0] * H * Sq; ++row) {
      const int64_t b = row / (H * Sq), i = row % Sq;
      int64_t lo = 0, hi = -1;
      sdpa_kept_keys(mask, i, lengths.q[b], lengths.kv[b], &lo, &hi);
      for (int64_t j = std::max<int64_t>(lo, 0); j <= std::min(hi, Skv - 1); ++j) counted[row * Skv + j] = 1;
    }
    out.push_back(check_dropout_mask(t->name, it->second, *o->dropout, &counted));
  }
  return out;
}

Result<std::vector<Comparison>> check_fp8_amax(const ResolvedGraph& g,
                                               const std::map<std::string, HostTensor>& inputs,
                                               const std::map<std::string, std::vector<float>>& outputs) {
  std::vector<Comparison> out;
  for (const ResolvedOp& op : g.ops) {
    for (const auto& [role, amax_idx] : op.outputs) {
      if (role.rfind("amax_", 0) != 0) continue;
      const std::string of = role.substr(5);
      auto x_role = op.outputs.find(of);
      auto scale_role = op.inputs.find("scale_" + of);
      if (x_role == op.outputs.end() || scale_role == op.inputs.end()) continue;  // amax_s, amax_dp
      const ResolvedTensor& x = g.tensors[x_role->second];
      const DType dt = x.dtype;
      if (dt != DType::kFP8E4M3 && dt != DType::kFP8E5M2) continue;
      const std::string& amax_name = g.tensors[amax_idx].name;
      auto a = outputs.find(amax_name);
      auto v = outputs.find(x.name);
      auto sc = inputs.find(g.tensors[scale_role->second].name);
      if (a == outputs.end() || v == outputs.end() || sc == inputs.end()) continue;
      Comparison c;
      c.tensor = amax_name + " of " + x.name;
      c.elements = 1;
      const std::vector<float> scale = sc->second.to_float_logical();
      if (a->second.size() != 1 || scale.size() != 1) {
        c.error = "'" + amax_name + "' and its scale must be one value each";
        out.push_back(c);
        continue;
      }
      double written = 0;  // max|X| as written
      bool finite = true;
      for (float f : v->second) {
        finite = finite && std::isfinite(f);
        written = std::max(written, static_cast<double>(std::fabs(f)));
      }
      const double scaled = static_cast<double>(a->second[0]) * scale[0];
      if (!finite || !std::isfinite(scaled)) {
        c.non_finite = 1;
        c.error = "'" + x.name + "' or '" + amax_name + "' times '" + g.tensors[scale_role->second].name +
                  "' is not finite";
        out.push_back(c);
        continue;
      }
      const double expected =
          fp8_bits_to_float(float_to_fp8_bits(static_cast<float>(std::fabs(scaled)), dt), dt);
      const double step = fp8_spacing(dt, expected);  // one step of X's format there
      c.max_abs = std::fabs(written - expected);
      c.rel_l2 = c.max_abs_rel = expected > 0 ? c.max_abs / expected : c.max_abs;
      c.tolerance = {expected > 0 ? step / expected : 0.0, expected > 0 ? step / expected : 0.0};
      c.worst_index = 0;
      c.pass = c.max_abs <= step;
      if (!c.pass) {
        char b[320];
        std::snprintf(b, sizeof b,
                      "%s * %s = %.6g casts to %.6g, but the largest |%s| written is %.6g (more than one fp8 "
                      "step, %.3g, apart): the amax does not describe the output",
                      amax_name.c_str(), g.tensors[scale_role->second].name.c_str(), scaled, expected,
                      x.name.c_str(), written, step);
        c.error = b;
      }
      out.push_back(c);
    }
  }
  return out;
}

Result<std::map<std::string, TieMoves>> move_reference_within_fp8_ties(
    const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs,
    const std::map<std::string, std::vector<float>>& actual, const std::set<std::string>& outputs,
    std::map<std::string, std::vector<float>>& reference, double cpu_max_flops) {
  std::map<std::string, TieMoves> moved;
  for (const ResolvedOp& op : g.ops) {
    const auto* attrs = std::get_if<SdpaFp8BwdAttrs>(&op.attrs);
    if (!attrs) continue;
    std::vector<std::pair<std::string, std::string>> grads;  // (role, tensor) among `outputs`
    for (const char* role : {"dq", "dk", "dv"}) {
      auto it = op.outputs.find(role);
      if (it == op.outputs.end() || it->second < 0 || it->second >= static_cast<int>(g.tensors.size()))
        continue;
      const std::string& name = g.tensors[it->second].name;
      if (outputs.count(name) && actual.count(name) && reference.count(name)) grads.emplace_back(role, name);
    }
    if (grads.empty()) continue;
    // The op's inputs as the CPU reference reads them (CpuOpContext: dims checked, scalars
    // filled); the keep-mask, with dropout, is cuDNN's own output.
    std::vector<std::optional<reference_detail::Values>> read(g.tensors.size());
    reference_detail::CpuOpContext ctx(g, inputs, read, op);
    std::map<std::string, reference_detail::SdpaFp8BwdValues> in;
    for (std::string_view r : op_input_roles(op.attrs)) {
      const std::string role(r);
      FUSEBOX_ASSIGN_OR_RETURN(const reference_detail::Values* v, ctx.in(role));
      in[role] = {&v->dims, &v->data};
    }
    std::vector<int64_t> mask_dims;
    auto mask = op.outputs.find("dropout_mask");
    if (mask != op.outputs.end() && mask->second >= 0 && mask->second < static_cast<int>(g.tensors.size())) {
      const ResolvedTensor& t = g.tensors[mask->second];
      auto it = actual.find(t.name);
      if (it != actual.end()) mask_dims = t.dims, in["dropout_mask"] = {&mask_dims, &it->second};
    }
    FUSEBOX_ASSIGN_OR_RETURN(const reference_detail::SdpaFp8BwdCpuArgs args,
                             reference_detail::sdpa_fp8_bwd_cpu_args(g, op, *attrs, in));
    const reference_detail::SdpaFp8BwdShape& sh = args.sh;
    const double flops = 2.0 * static_cast<double>(sh.B * sh.Hq * sh.Sq) * static_cast<double>(sh.Skv) *
                         static_cast<double>(2 * sh.D + sh.Dv);
    if (flops > cpu_max_flops) {
      for (const auto& [role, name] : grads) moved[name].ties = -1;
      continue;
    }
    const reference_detail::SdpaFp8BwdTies ties =
        reference_detail::sdpa_fp8_bwd_ties(args, reference_detail::kFp8TieRel);
    const reference_detail::SdpaFp8BwdScales& sc = args.sc;
    for (const auto& [role, name] : grads) {
      // dq: row (b, h, i), ties over keys, moves step * k[key]; dk and dv: row (b, hk, j), ties over
      // query rows, moves step * q[row] or step * do[row].
      const bool dq = role == "dq", dk = role == "dk";
      const auto& lists = dq ? ties.by_row : dk ? ties.ds_by_key : ties.p_by_key;
      const float* along = dq ? args.k : dk ? args.q : args.dout;
      const int64_t len = role == "dv" ? sh.Dv : sh.D;
      const double factor = dq   ? sc.descale_dp * sc.descale_k * sc.scale_dq
                            : dk ? sc.descale_dp * sc.descale_q * sc.scale_dk
                                 : sc.descale_s * sc.descale_do * sc.scale_dv;
      const std::vector<float>& a = actual.at(name);
      std::vector<float>& ref = reference.at(name);
      if (static_cast<int64_t>(a.size()) != static_cast<int64_t>(lists.size()) * len ||
          a.size() != ref.size())
        return InvalidArgument(op_where(op) + "output '" + role + "' (tensor '" + name + "') has " +
                               std::to_string(a.size()) + " values; its dims need " +
                               std::to_string(static_cast<int64_t>(lists.size()) * len));
      const double sat = tolerance_for(g, name).saturate_at;
      auto stored = [sat](double x) { return sat > 0 ? std::clamp(x, -sat, sat) : x; };
      TieMoves& n = moved[name];
      std::vector<double> row(static_cast<size_t>(len)), cand(static_cast<size_t>(len));
      for (size_t r = 0; r < lists.size(); ++r) {
        if (lists[r].empty()) continue;
        const int64_t base = static_cast<int64_t>(r) * len;
        auto cost = [&](const std::vector<double>& x) {
          double c = 0;
          for (int64_t d = 0; d < len; ++d) {
            const double e = static_cast<double>(a[base + d]) - stored(x[d]);
            c += std::isfinite(e) ? e * e : 0;
          }
          return c;
        };
        for (int64_t d = 0; d < len; ++d) row[d] = ref[base + d];
        double now = cost(row);
        // Greedy, largest steps first: a tie is taken where casting it the other way brings the
        // row closer to the output by at least half its own move (a row moved by that tie and
        // the output's rounding: nearly all of it; a tie unrelated to the difference: less than
        // nothing, unless the difference happens to point its way); other rows stay as they were.
        std::vector<reference_detail::SdpaFp8BwdTie> order = lists[r];
        std::sort(order.begin(), order.end(),
                  [](const auto& x, const auto& y) { return std::fabs(x.step) > std::fabs(y.step); });
        for (const auto& t : order) {
          const float* v = along + t.other * len;
          for (int64_t d = 0; d < len; ++d) cand[d] = row[d] + t.step * v[d] * factor;
          double move = 0;  // the tie's own move of the row as stored
          for (int64_t d = 0; d < len; ++d)
            move += (stored(cand[d]) - stored(row[d])) * (stored(cand[d]) - stored(row[d]));
          const double c = cost(cand);
          if (!(move > 0 && now - c >= 0.5 * move)) continue;
          now = c;
          row.swap(cand);
          ++n.ties;
          n.largest = std::max(n.largest, std::fabs(t.step * factor));
        }
        for (int64_t d = 0; d < len; ++d) ref[base + d] = static_cast<float>(row[d]);
      }
    }
  }
  return moved;
}

}  // namespace fusebox
