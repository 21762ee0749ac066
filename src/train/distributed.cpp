// fusebox_train: the launch environment, the host communicators and the gradient buckets of
// data-parallel training (include/fusebox/distributed.h, issue 31).
#include "fusebox/distributed.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

namespace fusebox {

namespace {

// An integer in [lo, hi], the whole text.
Result<int> env_int(const char* name, const char* value, int lo, int hi) {
  const std::string v(value);
  int x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi) {
    return InvalidArgument("launch environment: " + std::string(name) + "='" + v.substr(0, 64) +
                           "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return x;
}

}  // namespace

Result<LaunchEnv> parse_launch_env(const std::function<const char*(const char*)>& getenv_in) {
  const std::function<const char*(const char*)> get =
      getenv_in ? getenv_in : [](const char* n) -> const char* { return std::getenv(n); };
  LaunchEnv e;
  const char* rank = get("RANK");
  const char* world = get("WORLD_SIZE");
  const char* local = get("LOCAL_RANK");
  const char* addr = get("MASTER_ADDR");
  const char* port = get("MASTER_PORT");
  if (!rank && !world && !local && !addr && !port) return e;
  e.from_env = true;
  if (!world || !rank || !local) {
    return InvalidArgument(
        "launch environment: RANK, WORLD_SIZE and LOCAL_RANK are set together (torchrun sets all "
        "three); missing: " +
        std::string(!rank ? "RANK " : "") + (!world ? "WORLD_SIZE " : "") + (!local ? "LOCAL_RANK" : ""));
  }
  FUSEBOX_ASSIGN_OR_RETURN(e.world_size, env_int("WORLD_SIZE", world, 1, 4096));
  FUSEBOX_ASSIGN_OR_RETURN(e.rank, env_int("RANK", rank, 0, e.world_size - 1));
  FUSEBOX_ASSIGN_OR_RETURN(e.local_rank, env_int("LOCAL_RANK", local, 0, std::min(e.world_size - 1, 1023)));
  if (e.world_size > 1) {
    if (!addr || !*addr || !port)
      return InvalidArgument("launch environment: WORLD_SIZE=" + std::to_string(e.world_size) +
                             " needs MASTER_ADDR and MASTER_PORT (where rank 0 listens)");
    const std::string a(addr);
    const bool printable = std::all_of(a.begin(), a.end(), [](char c) { return c > ' ' && c < 127; });
    if (a.size() > 255 || !printable)
      return InvalidArgument(
          "launch environment: MASTER_ADDR is not a host name or address (at most 255 "
          "printable characters, no spaces)");
    e.master_addr = a;
    FUSEBOX_ASSIGN_OR_RETURN(e.master_port, env_int("MASTER_PORT", port, 1, 65535));
  }
  return e;
}

namespace {

class SingleCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "single"; }
  Status all_reduce_sum(float*, size_t, void*) override { return Status::Ok(); }
  void abort() override {}
};

// What the ranks of one in-process group share: each call is two phases (all ranks arrive, the
// last one sums in rank order; all ranks copy the sum out, the last one to leave opens the next
// call).
struct ThreadGroup {
  explicit ThreadGroup(int world) : world(world), data(static_cast<size_t>(world)), counts(data.size()) {}
  const int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0, left = 0;
  uint64_t generation = 0;  // completed sums
  bool summing_done = false;
  std::vector<float*> data;
  std::vector<size_t> counts;
  std::vector<float> sum;
  std::string error;
  bool aborted = false;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return g_->world; }
  std::string name() const override { return "threads"; }

  Status all_reduce_sum(float* data, size_t count, void*) override {
    ThreadGroup& g = *g_;
    std::unique_lock<std::mutex> lock(g.mu);
    const auto aborted = [&] {
      return Status(StatusCode::kInternal, "all_reduce_sum: rank " + std::to_string(rank_) +
                                               ": another rank of the group failed and aborted it");
    };
    // Wait until the previous call has been left by every rank.
    g.cv.wait(lock, [&] { return !g.summing_done || g.aborted; });
    if (g.aborted) return aborted();
    g.data[static_cast<size_t>(rank_)] = data;
    g.counts[static_cast<size_t>(rank_)] = count;
    const uint64_t gen = g.generation;
    if (++g.arrived == g.world) {
      g.error.clear();
      for (int r = 1; r < g.world; ++r) {
        if (g.counts[static_cast<size_t>(r)] != g.counts[0]) {
          g.error = "all_reduce_sum: rank " + std::to_string(r) + " gave " +
                    std::to_string(g.counts[static_cast<size_t>(r)]) + " values, rank 0 gave " +
                    std::to_string(g.counts[0]) + " (every rank must make the same calls)";
        }
      }
      if (g.error.empty()) {
        g.sum.assign(g.counts[0], 0.f);
        for (int r = 0; r < g.world; ++r) {  // rank order: the same bits every time
          const float* d = g.data[static_cast<size_t>(r)];
          for (size_t i = 0; i < g.counts[0]; ++i) g.sum[i] += d[i];
        }
      }
      g.arrived = 0;
      g.summing_done = true;
      ++g.generation;
      g.cv.notify_all();
    } else {
      g.cv.wait(lock, [&] { return g.generation != gen || g.aborted; });
      if (g.generation == gen) return aborted();  // a completed sum is still served
    }
    const std::string error = g.error;
    if (error.empty()) std::copy(g.sum.begin(), g.sum.end(), data);
    if (++g.left == g.world) {
      g.left = 0;
      g.summing_done = false;
      g.cv.notify_all();
    }
    if (!error.empty()) return InvalidArgument(error);
    return Status::Ok();
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    g_->aborted = true;
    g_->cv.notify_all();
  }

 private:
  std::shared_ptr<ThreadGroup> g_;
  int rank_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_communicator() { return std::make_unique<SingleCommunicator>(); }

std::vector<std::unique_ptr<Communicator>> make_thread_communicators(int world) {
  std::vector<std::unique_ptr<Communicator>> out;
  if (world < 1) return out;
  auto g = std::make_shared<ThreadGroup>(world);
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r));
  return out;
}

Result<std::vector<GradientBucket>> plan_gradient_buckets(
    const std::vector<std::pair<std::string, int64_t>>& params, int64_t bucket_bytes) {
  if (bucket_bytes < 4)
    return InvalidArgument("gradient buckets: bucket_bytes " + std::to_string(bucket_bytes) +
                           " holds no fp32 value");
  const int64_t cap = bucket_bytes / 4;
  std::set<std::string> seen;
  std::vector<GradientBucket> out;
  for (const auto& [name, elements] : params) {
    if (elements <= 0)
      return InvalidArgument("gradient buckets: parameter '" + name + "' has " + std::to_string(elements) +
                             " elements");
    if (!seen.insert(name).second)
      return InvalidArgument("gradient buckets: parameter '" + name + "' is listed twice");
    if (out.empty() || out.back().elements + elements > cap) out.emplace_back();
    GradientBucket& b = out.back();
    b.params.push_back(name);
    b.offsets.push_back(b.elements);
    b.elements += elements;
  }
  return out;
}

BucketTracker::BucketTracker(const std::vector<GradientBucket>& buckets) {
  for (size_t b = 0; b < buckets.size(); ++b) {
    names_.push_back(buckets[b].params);
    for (const std::string& p : buckets[b].params) where_.push_back({p, static_cast<int>(b)});
  }
  std::sort(where_.begin(), where_.end());
  reset();
}

void BucketTracker::reset() {
  pending_.clear();
  for (const auto& n : names_) pending_.push_back(static_cast<int>(n.size()));
  ready_.assign(where_.size(), false);
  next_ = 0;
}

Result<std::vector<int>> BucketTracker::mark_ready(const std::string& param) {
  const auto it = std::lower_bound(where_.begin(), where_.end(), std::make_pair(param, -1));
  if (it == where_.end() || it->first != param)
    return InvalidArgument("gradient buckets: no bucket holds parameter '" + param + "'");
  const size_t i = static_cast<size_t>(it - where_.begin());
  if (ready_[i])
    return InvalidArgument("gradient buckets: '" + param + "' was marked ready twice in one step");
  ready_[i] = true;
  --pending_[static_cast<size_t>(it->second)];
  std::vector<int> start;
  while (next_ < static_cast<int>(pending_.size()) && pending_[static_cast<size_t>(next_)] == 0)
    start.push_back(next_++);
  return start;
}

}  // namespace fusebox
