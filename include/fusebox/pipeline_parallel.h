// fusebox: a symbolic pipeline run data parallel over several GPUs of one
// machine (`fusebox pipeline run --devices 0,1`): the batch symbol's value is
// split across the devices, each device runs the pipeline resolved at its
// share of the batch on a session of its own (one thread each, one plan cache
// file for all), and the outputs are stacked back in device order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/pipeline.h"
#include "fusebox/pipeline_run.h"
#include "fusebox/session.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

// Batch sizes of `parts` devices for a batch of `total`: as even as possible,
// the first ones one larger (8 over 3: 3, 3, 2). InvalidArgument when parts
// < 1 or total < parts (a device would get nothing).
Result<std::vector<int64_t>> split_batch(int64_t total, int parts);

// Rows [offset, offset + count) of dim 0 of `t`, a copy. Dim 0 must be the
// outermost and dense (strides[0] == the product of the other dims, as in
// NCHW, NHWC or row-major layouts), else InvalidArgument naming `what`.
Result<HostTensor> slice_batch(const HostTensor& t, int64_t offset, int64_t count, const std::string& what);
// `parts` stacked along dim 0: the same dtype, other dims and strides[1:]
// (each laid out as slice_batch leaves it), else InvalidArgument naming `what`.
Result<HostTensor> concat_batch(const std::vector<const HostTensor*>& parts, const std::string& what);

// The symbol a data-parallel run splits: `requested` when given (it must be
// one of the pipeline's symbols), else the pipeline's only symbol.
// InvalidArgument naming the pipeline and its symbols otherwise (a pipeline
// without symbols has no batch to split).
Result<std::string> batch_symbol_of(const Pipeline& p, const std::string& requested);

// Per buffer of `full` (the pipeline at the whole batch), whether it is
// split along dim 0 across `shares` (the same file resolved at each device's
// batch: dim 0 follows the batch) or the same on every device (identical
// dims: weights, a shared mask). InvalidArgument naming the pipeline and the
// buffer when a buffer changes in another way (a dim other than the first
// follows the batch) or an output does not follow the batch (it would need a
// reduction across devices).
Result<std::vector<bool>> batch_split(const Pipeline& full, const std::vector<const Pipeline*>& shares,
                                      const std::vector<int64_t>& share_batches);

struct DataParallelOptions {
  std::vector<int> devices;  // CUDA device ids, one share of the batch each (an id may repeat)
  std::string batch_symbol;  // "": the pipeline's only symbol
  PlanRequest request;
  // The plan cache file every device's session opens (SQLite: several
  // connections at once); "": no cache.
  std::string cache_path;
  PipelineRunOptions run;  // per device (verify, timing, cuda_graph)
};

struct DeviceShare {
  int device = 0;
  int64_t offset = 0, batch = 0;  // rows [offset, offset + batch) of the batch
  std::string device_name;
  double build_ms = 0;
  PipelineBuild build;
  PipelineRunResult result;
};

struct DataParallelResult {
  std::string batch_symbol;
  int64_t batch = 0;
  std::vector<DeviceShare> shares;        // in device-list order
  std::vector<Pipeline> share_pipelines;  // the pipeline each share ran (same order)
  // Every output buffer stacked from the shares, by name.
  std::map<std::string, HostTensor> outputs;
  // From starting the threads to the last one's end (sessions, plans, runs):
  // what the whole data-parallel step cost this process.
  double wall_ms = 0;
  bool verified_ok = true;
};

// Runs `full` (loaded at the whole batch, with `data` for it) data parallel:
// split_batch over options.devices, each share's pipeline loaded from
// full.path at its batch (the other symbols as in full.shape), its inputs
// sliced from `data` (batch_split), built and run by run_pipeline on a
// session of its own device in a thread of its own. Errors name the device
// and its share; the first failing share's error is returned.
Result<DataParallelResult> run_pipeline_data_parallel(const Pipeline& full, const PipelineHostData& data,
                                                      const DataParallelOptions& options);

}  // namespace fusebox
