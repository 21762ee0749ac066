// fusebox: data-parallel training (issue 31). How a process learns its place in a job (the
// torchrun convention), the communicator the step all-reduces gradients through, and the
// gradient buckets that let the all-reduce start before the backward ends. docs/training.md,
// "Data parallel".
//
// The step (LmTrainer with LmTrainerOptions::communicator): each rank runs the step on its share
// of the global batch (config.train.batch sequences per micro-batch over all ranks, batch /
// world_size each, rank r taking the r-th contiguous slice), all-reduces the loss and the
// gradients bucket by bucket in the order the backward produces them, divides by the world
// size, and then every rank applies the same AdamW update. The losses equal a one-rank run of the
// global batch up to float summation order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusebox/status.h"

namespace fusebox {

// A process's place in a data-parallel job, as torchrun (and torch.distributed.launch, and most
// cluster launchers that imitate it) sets it: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // the GPU of this process on its node
  std::string master_addr;
  int master_port = 0;
  bool from_env = false;  // false: none of the variables was set (a single process)
};

// Reads the variables through `getenv` (the process's own by default). None set: a single process.
// WORLD_SIZE set: RANK and LOCAL_RANK must be too, and MASTER_ADDR and MASTER_PORT when the world
// has more than one rank; each an integer in range (0 <= RANK < WORLD_SIZE <= 4096, a port in
// 1..65535). Anything else is InvalidArgument naming the variable, its value and what is accepted.
Result<LaunchEnv> parse_launch_env(const std::function<const char*(const char*)>& getenv = nullptr);

// Sums buffers across the ranks of a job. One object per rank; every rank must make the same
// calls in the same order (as with NCCL).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "single", "threads", "nccl"
  // Replaces `data` (count fp32 values; host memory for the host communicators) with its sum
  // over all ranks. Every rank gets the same bits. `stream`: a cudaStream_t for device
  // communicators, ignored by the host ones.
  virtual Status all_reduce_sum(float* data, size_t count, void* stream) = 0;
  // Ends the group: every pending and later call on every rank returns an error at once (what
  // a rank that fails calls so that the others do not wait forever; NCCL's ncclCommAbort).
  virtual void abort() = 0;
};

// World size 1: all_reduce_sum leaves the data as it is. What a single process uses, so that it
// runs the same code as a job.
std::unique_ptr<Communicator> make_single_communicator();

// `world` communicators of one in-process group, one per thread (rank i is element i), over host
// memory: the reference backend's multi-rank runs ("one process driving every rank", `fusebox
// train lm --ranks N`) and the fake the unit tests use. The sum is taken in rank order, so it is
// deterministic. A rank calling with a different count than the others gets InvalidArgument, as
// do all the others in that call.
std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world);

// Consecutive gradients (in the order the backward produces them) all-reduced as one buffer.
struct GradientBucket {
  std::vector<std::string> params;  // in production order
  std::vector<int64_t> offsets;     // each parameter's first element in the bucket
  int64_t elements = 0;
};

// Groups `params` ({name, fp32 elements}, in the order the backward produces their gradients)
// into buckets of at most `bucket_bytes` (a larger tensor is a bucket of its own), keeping the
// order. InvalidArgument for a repeated name, a non-positive size or bucket_bytes < 4.
Result<std::vector<GradientBucket>> plan_gradient_buckets(
    const std::vector<std::pair<std::string, int64_t>>& params, int64_t bucket_bytes);

// Which buckets may start their all-reduce as gradients become ready. Buckets start in order (all
// ranks must issue the collectives in the same order), each once all its gradients are ready.
class BucketTracker {
 public:
  explicit BucketTracker(const std::vector<GradientBucket>& buckets);
  // Marks `param`'s gradient ready; returns the buckets that may start now, in order.
  // InvalidArgument for a name no bucket holds or one marked twice in this step.
  Result<std::vector<int>> mark_ready(const std::string& param);
  bool all_started() const { return next_ == static_cast<int>(pending_.size()); }
  void reset();  // a new step

 private:
  std::vector<std::vector<std::string>> names_;
  std::vector<int> pending_;                        // gradients not yet ready, per bucket
  std::vector<std::pair<std::string, int>> where_;  // param -> bucket, sorted by name
  std::vector<bool> ready_;                         // per where_ entry
  int next_ = 0;
};

}  // namespace fusebox
