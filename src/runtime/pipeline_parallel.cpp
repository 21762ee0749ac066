// fusebox: data-parallel pipeline runs over several GPUs (pipeline_parallel.h).
#include "fusebox/pipeline_parallel.h"

#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include "common/dims_string.h"
#include "common/stopwatch.h"
#include "fusebox/plan_cache.h"
#include "pipeline_text.h"

namespace fusebox {
namespace {

using runtime::sq;
using runtime::where;

int64_t product_after_first(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

// Rows of dim 0 are whole, outermost blocks of `row_elems` elements.
Status check_batch_layout(const HostTensor& t, const std::string& what) {
  if (t.dims.empty() || t.strides.size() != t.dims.size() || t.strides[0] != product_after_first(t.dims)) {
    return InvalidArgument(what + " has dims " + common::dims_string(t.dims) + " and strides " +
                           common::dims_string(t.strides) +
                           ": splitting a batch needs dim 0 outermost and dense (strides[0] = the product of "
                           "the other dims, as NCHW, NHWC and row-major layouts have)");
  }
  const size_t want = static_cast<size_t>(t.dims[0] * t.strides[0]) * dtype_size_bytes(t.dtype);
  if (t.data.size() != want) {
    return InvalidArgument(what + " holds " + std::to_string(t.data.size()) + " bytes; its dims need " +
                           std::to_string(want));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<int64_t>> split_batch(int64_t total, int parts) {
  if (parts < 1) return InvalidArgument("split_batch: no devices to split the batch over");
  if (total < parts) {
    return InvalidArgument("a batch of " + std::to_string(total) + " cannot be split over " +
                           std::to_string(parts) +
                           " devices: every device needs at least one row (give a batch of at least " +
                           std::to_string(parts) + ", or fewer devices)");
  }
  std::vector<int64_t> out(static_cast<size_t>(parts), total / parts);
  for (int64_t i = 0; i < total % parts; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

Result<HostTensor> slice_batch(const HostTensor& t, int64_t offset, int64_t count, const std::string& what) {
  FUSEBOX_RETURN_IF_ERROR(check_batch_layout(t, what));
  if (offset < 0 || count < 0 || offset + count > t.dims[0]) {
    return InvalidArgument(what + ": rows [" + std::to_string(offset) + ", " +
                           std::to_string(offset + count) + ") are outside its " + std::to_string(t.dims[0]) +
                           " rows");
  }
  HostTensor out;
  out.dtype = t.dtype;
  out.dims = t.dims;
  out.dims[0] = count;
  out.strides = t.strides;
  const size_t row_bytes = static_cast<size_t>(t.strides[0]) * dtype_size_bytes(t.dtype);
  out.data.assign(t.data.begin() + static_cast<std::ptrdiff_t>(offset * row_bytes),
                  t.data.begin() + static_cast<std::ptrdiff_t>((offset + count) * row_bytes));
  return out;
}

Result<HostTensor> concat_batch(const std::vector<const HostTensor*>& parts, const std::string& what) {
  if (parts.empty() || !parts[0]) return InvalidArgument(what + ": nothing to stack");
  HostTensor out;
  out.dtype = parts[0]->dtype;
  out.dims = parts[0]->dims;
  out.strides = parts[0]->strides;
  out.dims[0] = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const HostTensor* p = parts[i];
    const std::string part = what + " (part " + std::to_string(i) + ")";
    if (!p) return InvalidArgument(part + " is missing");
    FUSEBOX_RETURN_IF_ERROR(check_batch_layout(*p, part));
    if (p->dtype != out.dtype || p->dims.size() != out.dims.size() ||
        !std::equal(p->dims.begin() + 1, p->dims.end(), out.dims.begin() + 1) ||
        !std::equal(p->strides.begin() + 1, p->strides.end(), out.strides.begin() + 1)) {
      return InvalidArgument(part + " has dims " + common::dims_string(p->dims) + ", strides " +
                             common::dims_string(p->strides) + " and dtype " +
                             std::string(dtype_name(p->dtype)) + "; part 0 has " +
                             common::dims_string(parts[0]->dims) + ", " +
                             common::dims_string(parts[0]->strides) + " and " +
                             std::string(dtype_name(parts[0]->dtype)) + ": only dim 0 may differ");
    }
    out.dims[0] += p->dims[0];
    out.data.insert(out.data.end(), p->data.begin(), p->data.end());
  }
  out.strides[0] = product_after_first(out.dims);
  return out;
}

Result<std::string> batch_symbol_of(const Pipeline& p, const std::string& requested) {
  std::string names;
  for (const auto& [name, value] : p.shape)
    names += (names.empty() ? "" : ", ") + name + "=" + std::to_string(value);
  if (p.shape.empty()) {
    return InvalidArgument(where(p) +
                           " declares no symbols: a data-parallel run splits a symbolic batch "
                           "dim across the devices (declare the batch as a symbol in the stages' graphs, "
                           "docs/graph-format.md), or run on one device");
  }
  if (!requested.empty()) {
    if (!p.shape.count(requested)) {
      return InvalidArgument(where(p) + " has no symbol " + sq(requested) +
                             " to split; its symbols: " + names);
    }
    return requested;
  }
  if (p.shape.size() > 1) {
    return InvalidArgument(where(p) + " has several symbols (" + names +
                           "): say which is the batch with --batch-symbol");
  }
  return p.shape.begin()->first;
}

Result<std::vector<bool>> batch_split(const Pipeline& full, const std::vector<const Pipeline*>& shares,
                                      const std::vector<int64_t>& share_batches) {
  std::vector<bool> split(full.buffers.size(), false);
  if (shares.size() != share_batches.size()) return InvalidArgument("batch_split: one batch per share");
  for (size_t s = 0; s < shares.size(); ++s) {
    if (!shares[s] || shares[s]->buffers.size() != full.buffers.size()) {
      return InvalidArgument(where(full) + ": share " + std::to_string(s) +
                             " does not have the pipeline's buffers");
    }
  }
  int64_t total = 0;
  for (int64_t b : share_batches) total += b;
  for (size_t bi = 0; bi < full.buffers.size(); ++bi) {
    const PipelineBuffer& fb = full.buffers[bi];
    const std::string what = where(full) + ": buffer " + sq(fb.name);
    bool same = true, follows = !fb.dims.empty() && fb.dims[0] == total;
    for (size_t s = 0; s < shares.size(); ++s) {
      const PipelineBuffer& sb = shares[s]->buffers[bi];
      if (sb.dims.size() != fb.dims.size()) {
        return InvalidArgument(what + " has rank " + std::to_string(fb.dims.size()) +
                               " at the whole batch and " + std::to_string(sb.dims.size()) +
                               " at a share of it");
      }
      same = same && sb.dims == fb.dims;
      bool rest_same = std::equal(sb.dims.begin() + (sb.dims.empty() ? 0 : 1), sb.dims.end(),
                                  fb.dims.begin() + (fb.dims.empty() ? 0 : 1));
      follows = follows && rest_same && sb.dims[0] == share_batches[s];
    }
    if (same && !(follows && shares.size() == 1)) {
      if (fb.kind == BufferKind::kOutput && shares.size() > 1) {
        return InvalidArgument(
            what + " (an output) has dims " + common::dims_string(fb.dims) +
            " whatever the batch: its rows do not follow the batch, so the devices' outputs "
            "cannot be stacked (it would need a reduction across devices)");
      }
      split[bi] = false;
      continue;
    }
    if (!follows) {
      return InvalidArgument(
          what + " has dims " + common::dims_string(fb.dims) + " at the whole batch of " +
          std::to_string(total) +
          ": only its first dim may follow the batch symbol for a "
          "data-parallel run (a dim other than the first changes, or dim 0 is not the batch)");
    }
    split[bi] = true;
  }
  return split;
}

Result<DataParallelResult> run_pipeline_data_parallel(const Pipeline& full, const PipelineHostData& data,
                                                      const DataParallelOptions& options) {
  DataParallelResult r;
  FUSEBOX_ASSIGN_OR_RETURN(r.batch_symbol, batch_symbol_of(full, options.batch_symbol));
  r.batch = full.shape.at(r.batch_symbol);
  auto split_sizes = split_batch(r.batch, static_cast<int>(options.devices.size()));
  if (!split_sizes.ok()) {
    return split_sizes.status().WithContext(where(full) + ": " + r.batch_symbol + "=" +
                                            std::to_string(r.batch));
  }
  const std::vector<int64_t> batches = *split_sizes;
  const size_t n = batches.size();
  // Every share's pipeline and inputs before any GPU work.
  r.share_pipelines.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    ShapeValues shape = full.shape;
    shape[r.batch_symbol] = batches[i];
    auto p = load_pipeline_file(full.path, shape);
    if (!p.ok()) {
      return p.status().WithContext("device " + std::to_string(options.devices[i]) + " (" + r.batch_symbol +
                                    "=" + std::to_string(batches[i]) + ")");
    }
    r.share_pipelines.push_back(std::move(*p));
  }
  std::vector<const Pipeline*> share_ptrs;
  for (const Pipeline& p : r.share_pipelines) share_ptrs.push_back(&p);
  FUSEBOX_ASSIGN_OR_RETURN(const std::vector<bool> split, batch_split(full, share_ptrs, batches));
  std::vector<PipelineHostData> share_data(n);
  r.shares.resize(n);
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    r.shares[i].device = options.devices[i];
    r.shares[i].offset = offset;
    r.shares[i].batch = batches[i];
    for (const auto& [bi, t] : data) {
      const PipelineBuffer& b = full.buffers[static_cast<size_t>(bi)];
      if (!split[static_cast<size_t>(bi)]) {
        share_data[i][bi] = t;
        continue;
      }
      FUSEBOX_ASSIGN_OR_RETURN(share_data[i][bi],
                               slice_batch(t, offset, batches[i], where(full) + ": buffer " + sq(b.name)));
      const ResolvedTensor want = buffer_tensor(r.share_pipelines[i], bi);
      if (want.dims != share_data[i][bi].dims || want.strides != share_data[i][bi].strides) {
        return InvalidArgument(where(full) + ": buffer " + sq(b.name) + " sliced to " +
                               common::dims_string(share_data[i][bi].dims) + " strides " +
                               common::dims_string(share_data[i][bi].strides) + ", but the pipeline at " +
                               r.batch_symbol + "=" + std::to_string(batches[i]) + " lays it out as " +
                               common::dims_string(want.dims) + " strides " +
                               common::dims_string(want.strides));
      }
    }
    offset += batches[i];
  }

  std::vector<Status> status(n, Status::Ok());
  const common::Stopwatch wall;
  {
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto work = [&, i]() {
        DeviceShare& share = r.shares[i];
        const std::string who = "device " + std::to_string(share.device) + " (rows " +
                                std::to_string(share.offset) + ".." +
                                std::to_string(share.offset + share.batch - 1) + ")";
        std::unique_ptr<PlanCache> cache;
        if (!options.cache_path.empty())
          cache = std::make_unique<PlanCache>(PlanCache::open(options.cache_path));
        SessionOptions so;
        so.device_id = share.device;
        so.cache = cache.get();
        auto session = Session::create(so);
        if (!session.ok()) {
          status[i] = session.status().WithContext(who);
          return;
        }
        share.device_name = (*session)->target().device_name;
        const Pipeline& p = r.share_pipelines[i];
        const common::Stopwatch build;
        Status st = build_pipeline(**session, p, options.request, &share.build);
        share.build_ms = build.ms();
        if (!st.ok()) {
          status[i] = st.WithContext(who);
          return;
        }
        auto run = run_pipeline(**session, p, share.build.plans_by_stage(p), share_data[i], options.run);
        if (!run.ok()) {
          status[i] = run.status().WithContext(who);
          return;
        }
        share.result = std::move(*run);
      };
      try {
        threads.emplace_back(work);
      } catch (const std::exception&) {  // no thread: this share runs here, after the others started
        work();
      }
    }
    for (auto& t : threads) t.join();
  }
  r.wall_ms = wall.ms();
  for (const Status& st : status) FUSEBOX_RETURN_IF_ERROR(st);

  for (size_t bi = 0; bi < full.buffers.size(); ++bi) {
    const PipelineBuffer& b = full.buffers[bi];
    if (b.kind != BufferKind::kOutput) continue;
    std::vector<const HostTensor*> parts;
    for (const DeviceShare& s : r.shares) {
      auto it = s.result.outputs.find(b.name);
      parts.push_back(it == s.result.outputs.end() ? nullptr : &it->second);
    }
    FUSEBOX_ASSIGN_OR_RETURN(r.outputs[b.name], concat_batch(parts, where(full) + ": output " + sq(b.name)));
  }
  for (const DeviceShare& s : r.shares) r.verified_ok = r.verified_ok && s.result.verified_ok;
  return r;
}

}  // namespace fusebox
