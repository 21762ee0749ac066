// fusebox: the CPU reference of the embedding lookup (include/fusebox/ops/embedding.h),
// and its verification tolerance: y[n, h] = table[ids[n], h] + add[n % P, h]; an id
// outside the table gives a NaN row.
#include <cmath>
#include <limits>

#include "ops/cpu_context.h"
#include "ops/ops.h"
#include "tensor_util.h"

namespace fusebox::reference_detail {

namespace {

// embedding_bwd: dtable[v, :] = sum of dy[n, :] over n with ids[n] = v, in fp64;
// ids outside [0, V) add nothing.
Status run_backward(CpuOpContext& ctx, const ResolvedOp& op, const EmbeddingAttrs& a) {
  FUSEBOX_ASSIGN_OR_RETURN(const Values* ids, ctx.in("ids"));
  FUSEBOX_ASSIGN_OR_RETURN(const Values* dy, ctx.in("dy"));
  FUSEBOX_ASSIGN_OR_RETURN(Values * dtable, ctx.out("dtable"));
  const int64_t n = ids->dims.at(0), h = dy->dims.at(1), v = a.rows;
  if (dtable->dims.at(0) != v || dtable->dims.at(1) != h)
    return InvalidArgument(op_where(op) + "dtable " + dims_string(dtable->dims) + " is not [rows, H, 1, 1]");
  std::vector<double> acc(static_cast<size_t>(v * h), 0.0);
  for (int64_t r = 0; r < n; ++r) {
    const double id = ids->data[static_cast<size_t>(r)];
    if (!(id >= 0 && id < static_cast<double>(v))) continue;
    const int64_t row = static_cast<int64_t>(id);
    for (int64_t c = 0; c < h; ++c)
      acc[static_cast<size_t>(row * h + c)] += dy->data[static_cast<size_t>(r * h + c)];
  }
  for (size_t i = 0; i < acc.size(); ++i) dtable->data[i] = static_cast<float>(acc[i]);
  return Status::Ok();
}

}  // namespace

Status run_cpu(CpuOpContext& ctx, const ResolvedOp& op, const EmbeddingAttrs& a) {
  if (a.backward) return run_backward(ctx, op, a);
  FUSEBOX_ASSIGN_OR_RETURN(const Values* ids, ctx.in("ids"));
  // The table as the caller gave it, where it is a graph input: the lookup reads the rows the ids
  // name where they lie, instead of widening the whole table to floats first (the Llama-3.2-1B
  // table is 128256 x 2048: 1 GB as floats, for a plan check of a few rows).
  FUSEBOX_ASSIGN_OR_RETURN(const HostTensor* raw, ctx.host_in("table"));
  const Values* table = nullptr;
  if (!raw) {
    FUSEBOX_ASSIGN_OR_RETURN(table, ctx.in("table"));
  }
  const Values* add = nullptr;
  if (a.add) {
    FUSEBOX_ASSIGN_OR_RETURN(add, ctx.in("add"));
  }
  FUSEBOX_ASSIGN_OR_RETURN(Values * y, ctx.out("y"));
  const std::vector<int64_t>& table_dims = raw ? raw->dims : table->dims;
  const int64_t n = ids->dims.at(0), v = table_dims.at(0), h = table_dims.at(1);
  const int64_t p = add ? add->dims.at(0) : 1;
  if (y->dims.at(0) != n || y->dims.at(1) != h)
    return InvalidArgument(op_where(op) + "y " + dims_string(y->dims) + " is not [N, H, 1, 1]");
  // Element (row, c) of the table as float, read where it lies (raw) or from its float copy.
  const auto esize = raw ? static_cast<int64_t>(dtype_size_bytes(raw->dtype)) : 0;
  auto element = [&](int64_t row, int64_t c) -> float {
    if (raw)
      return static_cast<float>(
          load_element(raw->data.data() + (row * raw->strides[0] + c * raw->strides[1]) * esize, raw->dtype));
    return table->data[static_cast<size_t>(row * h + c)];
  };
  for (int64_t r = 0; r < n; ++r) {
    const double id = ids->data[static_cast<size_t>(r)];
    const bool inside = id >= 0 && id < static_cast<double>(v);
    const int64_t row = inside ? static_cast<int64_t>(id) : 0;
    for (int64_t c = 0; c < h; ++c) {
      double s = std::numeric_limits<double>::quiet_NaN();
      if (inside) {
        s = element(row, c);
        if (add) s += add->data[static_cast<size_t>((r % p) * h + c)];
      }
      y->data[static_cast<size_t>(r * h + c)] = static_cast<float>(s);
    }
  }
  return Status::Ok();
}

}  // namespace fusebox::reference_detail

namespace fusebox {

Status check_embedding_ids(const ResolvedGraph& g, const std::map<std::string, HostTensor>& inputs) {
  for (const ResolvedOp& op : g.ops) {
    const auto* a = std::get_if<EmbeddingAttrs>(&op.attrs);
    if (!a) continue;
    const ResolvedTensor& ids = g.tensors[op.inputs.at("ids")];
    // The forward's table; embedding_bwd's table gradient has its rows.
    const ResolvedTensor& table = g.tensors[a->backward ? op.outputs.at("dtable") : op.inputs.at("table")];
    auto it = inputs.find(ids.name);
    if (it == inputs.end()) continue;
    const std::vector<float> v = it->second.to_float_logical();
    const int64_t rows = table.dims.at(0);
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i] >= 0 && v[i] < static_cast<float>(rows)) continue;
      return InvalidArgument(reference_detail::op_where(op) + "input 'ids' ('" + ids.name + "'): ids[" +
                             std::to_string(i) + "] = " + std::to_string(static_cast<int64_t>(v[i])) +
                             " is outside table '" + table.name + "' of " + std::to_string(rows) +
                             " rows: every id must be in [0, " + std::to_string(rows) + ")");
    }
  }
  return Status::Ok();
}

}  // namespace fusebox

namespace fusebox::reference_detail {

// One fp32 add rounded once to y's dtype: the default tolerance of that dtype.
Tolerance tolerance(const EmbeddingAttrs&, std::string_view, DType dtype) { return default_tolerance(dtype); }

}  // namespace fusebox::reference_detail
