// make_inputs: what fusebox feeds a graph when the caller gives no files.
#include <string>

#include "common/op_where.h"
#include "common/strided.h"
#include "fusebox/op_traits.h"
#include "fusebox/reference.h"
#include "fusebox/runtime.h"

namespace fusebox {

HostTensor make_input(const ResolvedTensor& t, uint64_t seed) {
  if (t.values.empty()) return random_tensor(t, seed, t.random_lo, t.random_hi);
  HostTensor h = HostTensor::like(t);
  const size_t esize = dtype_size_bytes(h.dtype);
  common::for_each_element(h.dims, h.strides, [&](int64_t i, int64_t off) {
    store_element(h.data.data() + off * static_cast<int64_t>(esize), h.dtype,
                  t.values[static_cast<size_t>(i)]);
  });
  return h;
}

Result<std::map<std::string, HostTensor>> make_inputs(const ResolvedGraph& g, uint64_t seed,
                                                      const std::map<std::string, HostTensor>& given,
                                                      double cpu_reference_max_flops) {
  std::map<std::string, HostTensor> inputs;
  for (int i : g.input_tensors()) {
    const ResolvedTensor& t = g.tensors[i];
    if (t.scalar_value) continue;
    auto it = given.find(t.name);
    inputs[t.name] = it != given.end() ? it->second : make_input(t, seed);
  }
  for (const auto& [name, _] : given) {
    if (!inputs.count(name)) {
      return InvalidArgument("input '" + name + "' is not an input tensor of graph '" + g.name + "'");
    }
  }
  // Paged K/V: page tables without given or fixed values are shuffled valid
  // ones (random_tensor's would repeat pages and sit in no useful order); then
  // every table and length is checked before anything reads through them.
  for (const auto& op : g.ops) {
    const SdpaOptions* o = sdpa_options(op.attrs);
    if (!o || !o->paged) continue;
    for (auto [table_role, pool_role] : {std::pair{"page_table_k", "k"}, std::pair{"page_table_v", "v"}}) {
      const ResolvedTensor& table = g.tensors[op.inputs.at(table_role)];
      if (given.count(table.name) || !table.values.empty()) continue;
      inputs[table.name] = random_page_table(table, seed, g.tensors[op.inputs.at(pool_role)].dims.at(0));
    }
  }
  FUSEBOX_RETURN_IF_ERROR(check_sdpa_paged_inputs(g, inputs));
  FUSEBOX_RETURN_IF_ERROR(check_embedding_ids(g, inputs));
  // A backward graph runs on a real forward: o and stats from q, k and v,
  // unless the caller gave them.
  bool derive = false;
  for (const auto& op : g.ops) {
    if (!op_traits(op.attrs).reads_forward_outputs) continue;
    const bool given_o = given.count(g.tensors[op.inputs.at("o")].name) > 0;
    const bool given_stats = given.count(g.tensors[op.inputs.at("stats")].name) > 0;
    if (given_o != given_stats) {
      std::string msg = common::op_where(op_type_name(op.attrs), op.name);
      msg.append(
          " the inputs give only one of 'o' and 'stats': give both (from the same forward pass) "
          "or neither (fusebox computes them from q, k and v)");
      return InvalidArgument(msg);
    }
    derive = derive || !given_o;
  }
  if (derive) FUSEBOX_RETURN_IF_ERROR(derive_sdpa_bwd_inputs(g, inputs, cpu_reference_max_flops));
  return inputs;
}

std::map<std::string, std::vector<double>> input_values_for_flops(
    const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& op : g.ops) {
    const SdpaOptions* o = sdpa_options(op.attrs);
    if (!o || !o->padding) continue;
    for (const char* role : {"seq_len_q", "seq_len_kv"}) {
      const std::string& name = g.tensors[op.inputs.at(role)].name;
      auto it = inputs.find(name);
      if (it == inputs.end()) continue;
      const std::vector<float> v = it->second.to_float_logical();
      out[name] = std::vector<double>(v.begin(), v.end());
    }
  }
  return out;
}

}  // namespace fusebox
