// fusebox: the CPU reference's driver. Every op accumulates in double;
// tensors between ops are kept as fp32 in logical row-major order (cuDNN
// keeps virtual tensors in the fp32 intermediate dtype). Outputs are not
// rounded to their dtype: the comparison tolerances absorb that rounding.
// Each op family's reference is in ops/<family>_cpu.cpp (ops/ops.h).
#include <algorithm>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <variant>

#include "fusebox/reference.h"
#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox {

using reference_detail::CpuOpContext;
using reference_detail::dims_string;
using reference_detail::op_where;
using reference_detail::product;
using reference_detail::Values;

namespace reference_detail {

// The caller's data of tensor `idx`, checked against the graph's dims; null for a tensor an earlier
// op computed or a by-value scalar.
Result<const HostTensor*> CpuOpContext::host_tensor(const std::string& role, int idx) {
  if (idx < 0 || idx >= static_cast<int>(g_.tensors.size()))
    return InvalidArgument(op_where(op_) + "input '" + role + "' refers to tensor index " +
                           std::to_string(idx) + " outside the graph");
  const ResolvedTensor& t = g_.tensors[idx];
  if (values_[idx] || t.scalar_value) return nullptr;
  auto it = inputs_.find(t.name);
  if (it == inputs_.end())
    return InvalidArgument(op_where(op_) + "input '" + role + "': no values for tensor '" + t.name +
                           "' (neither supplied as an input nor produced by an earlier op)");
  const HostTensor& h = it->second;
  if (h.dims != t.dims)
    return InvalidArgument(op_where(op_) + "input tensor '" + t.name + "' has dims " + dims_string(h.dims) +
                           " but the graph says " + dims_string(t.dims));
  if (h.strides.size() != h.dims.size() ||
      h.data.size() < static_cast<size_t>(storage_span(h.dims, h.strides)) * dtype_size_bytes(h.dtype))
    return InvalidArgument(op_where(op_) + "input tensor '" + t.name +
                           "': its data is smaller than its dims " + "and strides span");
  return &h;
}

Result<const HostTensor*> CpuOpContext::host_in(const std::string& role) {
  auto it = op_.inputs.find(role);
  if (it == op_.inputs.end()) return InvalidArgument(op_where(op_) + "missing input '" + role + "'");
  return host_tensor(role, it->second);
}

// Computed earlier, a by-value scalar, or a caller input.
Result<const Values*> CpuOpContext::tensor(const std::string& role, int idx) {
  FUSEBOX_ASSIGN_OR_RETURN(const HostTensor* h, host_tensor(role, idx));
  if (values_[idx]) return &*values_[idx];
  const ResolvedTensor& t = g_.tensors[idx];
  Values v;
  v.dims = t.dims;
  if (t.scalar_value) {
    v.data.assign(static_cast<size_t>(product(t.dims)), static_cast<float>(*t.scalar_value));
  } else {
    v.data = h->to_float_logical();
  }
  values_[idx] = std::move(v);
  return &*values_[idx];
}

Result<const Values*> CpuOpContext::in(const std::string& role) {
  auto it = op_.inputs.find(role);
  if (it == op_.inputs.end()) return InvalidArgument(op_where(op_) + "missing input '" + role + "'");
  return tensor(role, it->second);
}

Result<Values*> CpuOpContext::out(const std::string& role) {
  auto it = op_.outputs.find(role);
  if (it == op_.outputs.end() || it->second < 0 || it->second >= static_cast<int>(g_.tensors.size()))
    return InvalidArgument(op_where(op_) + "has no valid output '" + role + "'");
  const ResolvedTensor& t = g_.tensors[it->second];
  Values& v = outputs_[it->second];
  v.dims = t.dims;
  v.data.assign(static_cast<size_t>(std::max<int64_t>(product(t.dims), 0)), 0.0f);
  return &v;
}

void CpuOpContext::commit() {
  for (auto& [idx, v] : outputs_) values_[idx] = std::move(v);
  outputs_.clear();
}

}  // namespace reference_detail

namespace {

Result<ReferenceOutputs> reference_cpu_impl(const ResolvedGraph& g,
                                            const std::map<std::string, HostTensor>& inputs) {
  std::vector<std::optional<Values>> values(g.tensors.size());
  for (const ResolvedOp& op : g.ops) {
    CpuOpContext ctx(g, inputs, values, op);
    FUSEBOX_RETURN_IF_ERROR(
        std::visit([&](const auto& attrs) { return reference_detail::run_cpu(ctx, op, attrs); }, op.attrs));
    ctx.commit();
  }

  ReferenceOutputs out;
  for (const ResolvedOp& op : g.ops) {
    for (const auto& [role, idx] : op.outputs) {
      const ResolvedTensor& t = g.tensors[idx];
      if (role == "dropout_mask") continue;  // read from the inputs, not computed
      if (!t.is_virtual && values[idx]) out[t.name] = values[idx]->data;
    }
  }
  return out;
}

}  // namespace

Result<ReferenceOutputs> reference_cpu(const ResolvedGraph& g,
                                       const std::map<std::string, HostTensor>& inputs) {
  try {
    return reference_cpu_impl(g, inputs);
  } catch (const std::bad_alloc&) {
    return Internal("[reference_cpu] out of host memory for graph '" + g.name + "'");
  } catch (const std::exception& e) {
    return Internal("[reference_cpu] unexpected exception: " + std::string(e.what()));
  }
}

namespace reference_detail {

void parallel_for(int64_t count, double work_per_item, const std::function<void(int64_t, int64_t)>& fn) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t threads = std::min<int64_t>({static_cast<int64_t>(hw), 16, count});
  if (count * work_per_item < 2e5) threads = 1;
  if (threads <= 1) return fn(0, count);
  std::vector<std::thread> pool;
  const int64_t chunk = (count + threads - 1) / threads;
  int64_t begin = chunk;  // this thread takes the first chunk
  try {
    for (; begin < count; begin += chunk) pool.emplace_back(fn, begin, std::min(count, begin + chunk));
  } catch (const std::exception&) {
    for (auto& t : pool) t.join();
    pool.clear();
    fn(0, count);  // could not start threads: do it all here
    return;
  }
  fn(0, std::min(count, chunk));
  for (auto& t : pool) t.join();
}

}  // namespace reference_detail

}  // namespace fusebox
