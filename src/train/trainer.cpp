// fusebox: the language-model trainer (include/fusebox/train.h). The reference backend
// runs the forward and the derived backward pipelines through the CPU reference chain,
// stage by stage, with the buffers in their declared dtypes (bf16 weights and
// activations), then clips and applies AdamW to the fp32 master weights.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "fusebox/fp8_scaling.h"
#include "fusebox/fp8_training.h"
#include "fusebox/pipeline_backward.h"
#include "fusebox/pipeline_run.h"
#include "fusebox/tensor.h"
#include "fusebox/train.h"
#include "gpu_step.h"
#include "optimizer.h"

namespace fusebox {
namespace {

constexpr char kCheckpointFormat[] = "fusebox-lm/1";
// The reference chain runs every stage on the CPU whatever its size (the reference backend
// is for small models); the limit only keeps a GPU reference from being picked.
constexpr double kCpuFlops = 1e300;

using Values = std::map<std::string, std::vector<double>>;

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

ResolvedTensor fp32_tensor(const std::string& name, const std::vector<int64_t>& shape) {
  ResolvedTensor t;
  t.name = name;
  t.dims = shape;
  t.dtype = DType::kFP32;
  t.strides = dense_strides_like(shape, {});  // row-major
  return t;
}

// The model for `batch` x `seq` tokens: its forward pipeline, loaded, in `dir`.
Result<Pipeline> model_pipeline(const LmModelConfig& m, int64_t batch, int64_t seq, const std::string& dir,
                                const std::string& recompute = "none", const std::string& swiglu = "fused") {
  FUSEBOX_ASSIGN_OR_RETURN(std::string path, write_lm_pipeline(m, batch, seq, dir, recompute, swiglu));
  return load_pipeline_file(path);
}

BackwardOptions lm_backward_options(const LmConfig& c) {
  BackwardOptions o;
  for (const LmParameter& p : lm_parameters(c.model)) o.wrt.push_back(p.name);
  o.seeds = {"loss"};
  o.deterministic = c.train.deterministic;
  return o;
}

}  // namespace

struct LmTrainer::Impl {
  LmConfig config;
  LmTrainerOptions options;
  std::vector<LmParameter> params;
  Pipeline fwd, bwd;
  PipelineBackward derived;
  std::optional<Pipeline> gen;  // batch 1, context tokens: generate()
  // train.fp8: the delayed scaling of every quantized buffer, the buffers whose amax the pipelines
  // record, and this step's amaxes so far (the largest over its micro-batches).
  std::optional<Fp8DelayedScaling> fp8;
  std::vector<std::string> fp8_amax;
  std::map<std::string, float> fp8_step_amax;
  bool fp8_calibrated = false;
  std::map<std::string, std::vector<float>> master, m, v, grad;
  int64_t step = 0, sequences = 0;
  double last_loss = 0;
  // Data parallel: this rank, the world, the sequences each rank runs per micro-batch, the
  // gradient buckets (in the order the backward produces the gradients) and their buffer.
  Communicator* comm = nullptr;
  int rank = 0, world = 1;
  int64_t local_batch = 0;
  std::vector<GradientBucket> buckets;
  std::vector<float> bucket_buffer;
  std::vector<std::pair<std::string, double>> startup;  // start-up phases, ms
  // kGpu: the device holds the state; the host copies above are refreshed on demand.
  std::unique_ptr<GpuStep> gpu;
  bool device_stale = true;  // the host state is newer (initialized, loaded)
  bool host_stale = false;   // the device state is newer (steps taken)

  Status sync_to_device() {
    if (gpu && device_stale) {
      FUSEBOX_RETURN_IF_ERROR(gpu->upload(master, m, v));
      device_stale = false;
    }
    return Status::Ok();
  }
  Result<LmStepResult> step_gpu(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                                std::chrono::steady_clock::time_point t0);
  // train.fp8: the forward and backward pipelines with their GEMMs in FP8 (fusebox/fp8_training.h)
  // replace fwd and bwd; the scaling state starts with every scale 1.
  Status use_fp8(const std::string& fwd_path, const std::string& bwd_path, const std::filesystem::path& dir) {
    if (world > 1)
      return InvalidArgument(
          "train: train.fp8 with " + std::to_string(world) +
          " ranks: not yet (each rank's amaxes would have to be all-reduced); run one rank");
    Fp8RewriteOptions fo;
    fo.keep_buffers = {"output", "h_norm"};  // the output projection stays bf16
    fo.fuse_casts = config.train.fp8_fuse_casts;
    // Buffers the backward reads as saved under the forward's name (so under the same scales): the
    // forward's casts of them also write the transposed copies the backward's GEMMs read.
    for (const auto& [name, in] : derived.inputs) {
      if (in.kind != BackwardInput::Kind::kSaved) continue;
      if (name == in.forward_tensor) fo.export_copies.insert(name);
      fo.read_elsewhere.insert(in.forward_tensor);  // the backward reads it: it stays in memory
    }
    const std::string fdir = (dir / "fp8_forward").string();
    FUSEBOX_ASSIGN_OR_RETURN(Fp8PipelineRewrite f, fp8_rewrite_pipeline(fwd_path, fdir, fo));
    Fp8RewriteOptions bo = fo;
    bo.export_copies.clear();
    bo.amax_of_e4m3 = false;
    bo.provided = f.exported;
    for (const PipelineBuffer& b : bwd.buffers) {
      auto it = derived.inputs.find(b.name);
      if (it == derived.inputs.end() || it->second.kind != BackwardInput::Kind::kSaved)
        bo.gradients.insert(b.name);
    }
    FUSEBOX_ASSIGN_OR_RETURN(Fp8PipelineRewrite b,
                             fp8_rewrite_pipeline(bwd_path, (dir / "fp8_backward").string(), bo));
    // A copy added for the backward that it did not take is not written: the forward again without.
    const std::set<std::string> taken(b.taken.begin(), b.taken.end());
    size_t unused = 0;
    for (const Fp8Copy& c : f.exported)
      if (!taken.count(c.copy) && std::count(f.added.begin(), f.added.end(), c.copy))
        unused += fo.skip_transposed.insert(c.buffer).second ? 1 : 0;
    // With the casts fused: a saved buffer the backward no longer reads (it takes the forward's FP8
    // copies instead) may leave the forward too, where a cast fused into the stage that writes it
    // was its last reader. (Unfused, nothing changes: no second rewrite for it.)
    if (fo.fuse_casts) {
      const std::set<std::string> dropped(b.dropped.begin(), b.dropped.end());
      std::set<std::string> still_read;
      for (const auto& [name, in] : derived.inputs)
        if (in.kind == BackwardInput::Kind::kSaved && !dropped.count(name))
          still_read.insert(in.forward_tensor);
      unused += fo.read_elsewhere.size() - still_read.size();
      fo.read_elsewhere = std::move(still_read);
    }
    if (unused > 0) {
      std::error_code ec;
      std::filesystem::remove_all(fdir, ec);
      FUSEBOX_ASSIGN_OR_RETURN(f, fp8_rewrite_pipeline(fwd_path, fdir, fo));
    }
    std::set<std::string> written;
    for (const Fp8Copy& c : f.exported) written.insert(c.copy);
    for (const std::string& c : taken) {
      if (!written.count(c))
        return Internal("train: FP8 copy '" + c + "' is read by the backward, written by no forward");
      derived.inputs[c] = BackwardInput{BackwardInput::Kind::kSaved, c, false};
    }
    FUSEBOX_ASSIGN_OR_RETURN(fwd, load_pipeline_file(f.pipeline_path));
    FUSEBOX_ASSIGN_OR_RETURN(bwd, load_pipeline_file(b.pipeline_path));
    std::map<std::string, DType> all = f.quantized;
    all.insert(b.quantized.begin(), b.quantized.end());
    std::vector<std::pair<std::string, DType>> tensors(all.begin(), all.end());
    fp8_dtype = all;
    Fp8ScalingConfig sc;
    sc.history = config.train.fp8_history;
    sc.margin = static_cast<int>(config.train.fp8_margin);
    FUSEBOX_ASSIGN_OR_RETURN(Fp8DelayedScaling state, Fp8DelayedScaling::create(tensors, sc));
    fp8 = std::move(state);
    fp8_amax = f.amax;
    fp8_amax.insert(fp8_amax.end(), b.amax.begin(), b.amax.end());
    fp8_summary =
        std::to_string(f.gemms) + " forward and " + std::to_string(b.gemms) + " backward GEMMs in FP8, " +
        std::to_string(f.casts + b.casts) + " casts (" + std::to_string(taken.size()) +
        " of the forward's copies read by the backward), " + std::to_string(tensors.size()) +
        " scaled tensors; " + std::to_string(f.kept.size() + b.kept.size()) + " GEMMs kept in bf16; " +
        std::to_string(f.split.size() + b.split.size()) + " stages split per GEMM; " +
        std::to_string(f.fused + b.fused) + " casts fused into the pointwise stages before them (" +
        std::to_string(f.virtualized.size() + b.virtualized.size()) + " bf16 buffers no longer written)";
    return Status::Ok();
  }
  std::string fp8_summary;
  std::map<std::string, DType> fp8_dtype;  // each quantized buffer's format
  // The step taken: the counters advanced, the timing filled in.
  LmStepResult finish_step(LmStepResult r, std::chrono::steady_clock::time_point t0);
  // The next step's micro-batches of `train` (this rank's slice of each global one), micro-batch
  // after micro-batch; the data position does not move.
  void next_micro_batches(const TokenStream& train, std::vector<int32_t>* all_ids,
                          std::vector<int32_t>* all_labels) const {
    const LmTrainConfig& tc = config.train;
    std::vector<int32_t> ids, labels;
    for (int64_t k = 0; k < tc.accum; ++k) {
      lm_micro_batch(train, config.model.context, local_batch, sequences + k * tc.batch + rank * local_batch,
                     &ids, &labels);
      all_ids->insert(all_ids->end(), ids.begin(), ids.end());
      all_labels->insert(all_labels->end(), labels.begin(), labels.end());
    }
  }
  Status sync_to_host() {
    if (gpu && host_stale) {
      FUSEBOX_RETURN_IF_ERROR(gpu->download(&master, &m, &v));
      host_stale = false;
    }
    return Status::Ok();
  }

  // The mean over the ranks of one value each rank holds (the world's sum / world).
  Result<double> all_mean(double x) {
    if (world == 1) return x;
    float v = static_cast<float>(x);
    FUSEBOX_RETURN_IF_ERROR(comm->all_reduce_sum(&v, 1, nullptr));
    return static_cast<double>(v) / world;
  }

  // Averages the gradients over the ranks, bucket by bucket as the backward would make them
  // ready (all at once on the reference backend: BucketTracker gives the order). Returns the
  // buckets all-reduced.
  Result<int> all_reduce_gradients() {
    if (world == 1) return 0;
    BucketTracker tracker(buckets);
    int issued = 0;
    for (auto p = params.rbegin(); p != params.rend(); ++p) {  // the backward's order
      FUSEBOX_ASSIGN_OR_RETURN(std::vector<int> start, tracker.mark_ready(p->name));
      for (int b : start) {
        const GradientBucket& bucket = buckets[static_cast<size_t>(b)];
        bucket_buffer.resize(static_cast<size_t>(bucket.elements));
        for (size_t i = 0; i < bucket.params.size(); ++i) {
          const std::vector<float>& g = grad.at(bucket.params[i]);
          std::copy(g.begin(), g.end(), bucket_buffer.begin() + bucket.offsets[i]);
        }
        FUSEBOX_RETURN_IF_ERROR(comm->all_reduce_sum(bucket_buffer.data(), bucket_buffer.size(), nullptr));
        const float inv = 1.f / static_cast<float>(world);
        for (size_t i = 0; i < bucket.params.size(); ++i) {
          std::vector<float>& g = grad.at(bucket.params[i]);
          for (size_t j = 0; j < g.size(); ++j)
            g[j] = bucket_buffer[static_cast<size_t>(bucket.offsets[i]) + j] * inv;
        }
        ++issued;
      }
    }
    if (!tracker.all_started()) return Internal("gradient buckets: not every bucket was all-reduced");
    return issued;
  }

  Values forward_inputs(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                        int64_t seq) const {
    Values in;
    in["ids"] = widen(ids);
    in["labels"] = widen(labels);
    in["freqs"] = widen(lm_rope_angles(config.model, seq));
    for (const LmParameter& p : params) in[p.name] = widen(master.at(p.name));
    for (auto& [name, value] : fp8_scales())
      if (fwd.find_buffer(name) >= 0) in[name] = value;
    return in;
  }

  // train.fp8: every scale buffer's value for the coming step, by buffer name.
  Values fp8_scales() const {
    Values out;
    if (!fp8) return out;
    for (const std::string& b : fp8->tensors()) {
      out[fp8_scale_buffer(b)] = {static_cast<double>(*fp8->scale(b))};
      out[fp8_scale_inv_buffer(b)] = {static_cast<double>(*fp8->scale_inv(b))};
    }
    return out;
  }

  // train.fp8: the amaxes a pass recorded (its outputs by buffer name), into this step's.
  void fold_amax(const std::map<std::string, std::vector<float>>& outputs) {
    for (const std::string& b : fp8_amax) {
      auto it = outputs.find(fp8_amax_buffer(b));
      if (it == outputs.end() || it->second.empty()) continue;
      float& m = fp8_step_amax[b];
      m = std::max(m, it->second[0]);
    }
  }

  // train.fp8: this step's amaxes into the scaling state (the next step's scales).
  Status record_amax() {
    if (!fp8) return Status::Ok();
    for (const auto& [b, a] : fp8_step_amax) FUSEBOX_RETURN_IF_ERROR(fp8->record(b, a));
    fp8_step_amax.clear();
    return Status::Ok();
  }

  // Forward (and, with `grad_scale` > 0, backward adding grad_scale * dL/dp into `grad`) of
  // one micro-batch; returns its mean loss.
  Result<double> micro_batch(const std::vector<int32_t>& ids, const std::vector<int32_t>& labels,
                             double grad_scale) {
    const int64_t seq = config.model.context;
    const Values in = forward_inputs(ids, labels, seq);
    FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData data, pipeline_host_data(fwd, in));
    FUSEBOX_ASSIGN_OR_RETURN(auto chain, reference_chain(fwd, data, kCpuFlops));
    fold_amax(chain);
    const std::vector<float>& loss = chain.at("loss");
    double sum = 0;
    for (float l : loss) sum += l;
    const double mean = sum / static_cast<double>(loss.size());
    if (grad_scale <= 0 || !std::isfinite(mean)) return mean;
    Values seeds;
    seeds["loss"].assign(loss.size(), grad_scale / static_cast<double>(loss.size()));
    FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData bdata,
                             backward_pipeline_data(fwd, derived, bwd, in, chain, seeds, fp8_scales()));
    FUSEBOX_ASSIGN_OR_RETURN(auto grads, reference_chain(bwd, bdata, kCpuFlops));
    fold_amax(grads);
    for (const LmParameter& p : params) {
      auto it = grads.find(derived.gradients.at(p.name));
      if (it == grads.end()) return Internal("the backward produced no gradient for '" + p.name + "'");
      std::vector<float>& g = grad[p.name];
      if (it->second.size() != g.size()) return Internal("gradient of '" + p.name + "' has the wrong size");
      for (size_t i = 0; i < g.size(); ++i) g[i] += it->second[i];
    }
    return mean;
  }

  Result<const Pipeline*> generation_pipeline() {
    if (!gen) {
      const std::string dir = (std::filesystem::path(options.work_dir) / "generate").string();
      FUSEBOX_ASSIGN_OR_RETURN(Pipeline p, model_pipeline(config.model, 1, config.model.context, dir));
      gen = std::move(p);
    }
    return &*gen;
  }
};

LmTrainer::LmTrainer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LmTrainer::~LmTrainer() = default;

Result<std::unique_ptr<LmTrainer>> LmTrainer::create(const LmConfig& config,
                                                     const LmTrainerOptions& options) {
  if (options.work_dir.empty()) return InvalidArgument("train: no work folder for the model's pipelines");
  if (options.total_steps < 1) return InvalidArgument("train: total_steps must be at least 1");
  // The host state (fp32 master weights, two moments, gradients: 16 bytes a parameter) must fit
  // this machine: a config asking for more is refused here, not by a failed allocation.
  const double host_bytes = 16.0 * static_cast<double>(lm_parameter_count(config.model));
  const double phys =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (phys > 0 && host_bytes > 0.8 * phys)
    return InvalidArgument("train: the model's " + std::to_string(lm_parameter_count(config.model)) +
                           " parameters need " + std::to_string(host_bytes / (1 << 30)) +
                           " GiB of host memory (master weights, moments, gradients); this machine has " +
                           std::to_string(phys / (1 << 30)) + " GiB");
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->options = options;
  impl->params = lm_parameters(config.model);
  impl->comm = options.communicator;
  impl->world = impl->comm ? impl->comm->world_size() : 1;
  impl->rank = impl->comm ? impl->comm->rank() : 0;
  impl->local_batch = config.train.batch;
  if (impl->world > 1) {
    if (options.backend != TrainBackend::kReference)
      return NotSupported(
          "train: a data-parallel step on the GPU needs a device communicator (NCCL), which is "
          "not built yet (issue 31); the reference backend runs data parallel");
    if (config.train.batch % impl->world != 0)
      return InvalidArgument("train: the global batch (" + std::to_string(config.train.batch) +
                             " sequences) does not divide among " + std::to_string(impl->world) + " ranks");
    impl->local_batch = config.train.batch / impl->world;
    std::vector<std::pair<std::string, int64_t>> order;
    for (auto p = impl->params.rbegin(); p != impl->params.rend(); ++p)
      order.push_back({p->name, p->elements()});
    FUSEBOX_ASSIGN_OR_RETURN(impl->buckets, plan_gradient_buckets(order, options.bucket_bytes));
  }
  const std::filesystem::path dir(options.work_dir);
  using Clock = std::chrono::steady_clock;
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  auto t0 = Clock::now();
  FUSEBOX_ASSIGN_OR_RETURN(
      impl->fwd, model_pipeline(config.model, impl->local_batch, config.model.context,
                                (dir / "forward").string(), config.train.recompute, config.train.swiglu));
  impl->startup.push_back({"forward pipeline written and loaded", ms_since(t0)});
  t0 = Clock::now();
  FUSEBOX_ASSIGN_OR_RETURN(impl->derived, derive_pipeline_backward(impl->fwd, lm_backward_options(config)));
  FUSEBOX_ASSIGN_OR_RETURN(std::string bpath,
                           write_pipeline_backward(impl->fwd, impl->derived, (dir / "backward").string()));
  FUSEBOX_ASSIGN_OR_RETURN(impl->bwd, load_pipeline_file(bpath));
  impl->startup.push_back({"backward derived, written and loaded", ms_since(t0)});
  if (config.train.fp8) {
    t0 = Clock::now();
    FUSEBOX_RETURN_IF_ERROR(impl->use_fp8((dir / "forward" / "lm.json").string(), bpath, dir));
    impl->startup.push_back({"FP8: " + impl->fp8_summary, ms_since(t0)});
  }
  for (const LmParameter& p : impl->params) {
    if (!impl->derived.gradients.count(p.name))
      return Internal("train: the derived backward has no gradient for parameter '" + p.name + "'");
    impl->master[p.name].assign(static_cast<size_t>(p.elements()), 0.f);
  }
  if (options.backend == TrainBackend::kGpu) {
    t0 = Clock::now();
    std::optional<GpuFp8> fp8;
    if (impl->fp8) {
      fp8.emplace();
      fp8->tensors.assign(impl->fp8_dtype.begin(), impl->fp8_dtype.end());
      fp8->history = config.train.fp8_history;
      fp8->margin = config.train.fp8_margin;
    }
    auto g = GpuStep::create(config, impl->fwd, impl->bwd, impl->derived, options.plan_cache,
                             fp8 ? &*fp8 : nullptr);
    if (!g.ok()) return g.status().WithContext("train: the GPU step");
    impl->gpu = std::move(*g);
    impl->startup.push_back(
        {"GPU: plans (" + impl->gpu->plan_summary() + "), executors, optimizer", ms_since(t0)});
  }
  auto t = std::unique_ptr<LmTrainer>(new LmTrainer(std::move(impl)));
  t->init_parameters();
  return t;
}

void LmTrainer::init_parameters() {
  Impl& s = *impl_;
  std::mt19937_64 rng(s.config.train.seed);
  for (const LmParameter& p : s.params) {
    std::vector<float>& w = s.master[p.name];
    if (p.init_std == 0) {
      std::fill(w.begin(), w.end(), 1.f);
    } else {
      std::normal_distribution<double> d(0, p.init_std);
      for (float& x : w) x = static_cast<float>(d(rng));
    }
    s.m[p.name].assign(w.size(), 0.f);
    s.v[p.name].assign(w.size(), 0.f);
    s.grad[p.name].assign(w.size(), 0.f);
  }
  s.step = 0;
  s.sequences = 0;
  s.device_stale = true;
  s.host_stale = false;
}

Result<LmStepResult> LmTrainer::step(const TokenStream& train) {
  Impl& s = *impl_;
  const int64_t seq = s.config.model.context;
  if (train.sequences(seq) < 1)
    return InvalidArgument(train.path + ": too few tokens for one sequence of " + std::to_string(seq));
  std::vector<int32_t> all_ids, all_labels;
  s.next_micro_batches(train, &all_ids, &all_labels);
  return step_tokens(all_ids, all_labels);
}

Result<LmStepResult> LmTrainer::step_tokens(const std::vector<int32_t>& all_ids,
                                            const std::vector<int32_t>& all_labels) {
  Impl& s = *impl_;
  const auto t0 = std::chrono::steady_clock::now();
  const LmTrainConfig& tc = s.config.train;
  const int64_t seq = s.config.model.context;
  const size_t micro = static_cast<size_t>(s.local_batch * seq);
  if (all_ids.size() != micro * static_cast<size_t>(tc.accum) || all_labels.size() != all_ids.size())
    return InvalidArgument("train: a step takes accum x batch x context = " + std::to_string(tc.accum) +
                           " x " + std::to_string(s.local_batch) + " x " + std::to_string(seq) +
                           " ids and as many labels, not " + std::to_string(all_ids.size()) + " and " +
                           std::to_string(all_labels.size()));
  for (size_t i = 0; i < all_ids.size(); ++i)
    if (all_ids[i] < 0 || all_ids[i] >= s.config.model.vocab || all_labels[i] < 0 ||
        all_labels[i] >= s.config.model.vocab)
      return InvalidArgument("train: token " + std::to_string(i) + " (id " + std::to_string(all_ids[i]) +
                             ", label " + std::to_string(all_labels[i]) + ") is outside the vocabulary [0, " +
                             std::to_string(s.config.model.vocab) + ")");
  if (s.gpu) return s.step_gpu(all_ids, all_labels, t0);
  if (s.fp8 && !s.fp8_calibrated) {
    // FP8's first step: no amax is known, every scale is 1, and gradients smaller than e5m2's
    // smallest value (2^-16) round to 0, so the layers below a zeroed one see no gradient either.
    // Calibration passes of the first micro-batch, discarded, record the amaxes first: each pass
    // reaches one layer deeper, until every quantized tensor has one (or a pass finds none new).
    const std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + static_cast<std::ptrdiff_t>(micro));
    const std::vector<int32_t> labels(all_labels.begin(),
                                      all_labels.begin() + static_cast<std::ptrdiff_t>(micro));
    size_t zero = std::numeric_limits<size_t>::max();
    for (int64_t pass = 0; pass < s.config.model.layers + 2; ++pass) {
      s.fp8_step_amax.clear();
      auto l = s.micro_batch(ids, labels, 1.0);
      if (!l.ok()) return l.status().WithContext("train: FP8 calibration");
      size_t now = 0;
      for (const auto& [b, a] : s.fp8_step_amax) now += a > 0 ? 0 : 1;
      FUSEBOX_RETURN_IF_ERROR(s.record_amax());
      if (now == 0 || now >= zero) break;
      zero = now;
    }
    s.fp8_calibrated = true;
  }
  for (auto& [name, g] : s.grad) std::fill(g.begin(), g.end(), 0.f);
  s.fp8_step_amax.clear();
  double loss = 0;
  for (int64_t k = 0; k < tc.accum; ++k) {
    const auto from = static_cast<std::ptrdiff_t>(micro * static_cast<size_t>(k));
    const std::vector<int32_t> ids(all_ids.begin() + from,
                                   all_ids.begin() + from + static_cast<std::ptrdiff_t>(micro));
    const std::vector<int32_t> labels(all_labels.begin() + from,
                                      all_labels.begin() + from + static_cast<std::ptrdiff_t>(micro));
    auto l = s.micro_batch(ids, labels, 1.0 / static_cast<double>(tc.accum));
    if (!l.ok()) {
      if (s.comm) s.comm->abort();  // the other ranks would wait for this one forever
      return l.status().WithContext("train: step " + std::to_string(s.step));
    }
    loss += *l / static_cast<double>(tc.accum);
    if (!std::isfinite(*l)) break;  // every rank learns it from the all-reduced loss
  }
  FUSEBOX_ASSIGN_OR_RETURN(loss, s.all_mean(loss));
  if (!std::isfinite(loss))
    return InvalidArgument("train: step " + std::to_string(s.step) + ": the loss is " + std::to_string(loss) +
                           (s.world > 1 ? " on some rank" : "") +
                           " (non-finite); the parameters are unchanged");
  FUSEBOX_ASSIGN_OR_RETURN(const int issued, s.all_reduce_gradients());
  for (const LmParameter& p : s.params) {
    const std::vector<float>& g = s.grad.at(p.name);
    for (size_t i = 0; i < g.size(); ++i)
      if (!std::isfinite(g[i]))
        return InvalidArgument("train: step " + std::to_string(s.step) + ": the gradient of '" + p.name +
                               "' is non-finite at element " + std::to_string(i) +
                               "; the parameters are unchanged");
  }
  LmStepResult r;
  r.step = s.step;
  r.loss = loss;
  r.lr = lm_learning_rate(tc, s.step, s.options.total_steps);
  r.world_size = s.world;
  r.buckets = issued;
  std::vector<AdamWTensor> tensors;
  for (const LmParameter& p : s.params)
    tensors.push_back({&s.master[p.name], &s.m[p.name], &s.v[p.name], &s.grad[p.name], p.decay});
  r.grad_norm = global_grad_norm(tensors);
  adamw_step(tensors, AdamWHyper{r.lr, tc.beta1, tc.beta2, tc.eps, tc.weight_decay}, s.step + 1,
             clip_coefficient(r.grad_norm, tc.clip));
  FUSEBOX_RETURN_IF_ERROR(s.record_amax());
  return s.finish_step(r, t0);
}

Result<LmStepResult> LmTrainer::Impl::step_gpu(const std::vector<int32_t>& all_ids,
                                               const std::vector<int32_t>& all_labels,
                                               std::chrono::steady_clock::time_point t0) {
  Impl& s = *this;
  const LmTrainConfig& tc = s.config.train;
  FUSEBOX_RETURN_IF_ERROR(s.sync_to_device());
  LmStepResult r;
  r.step = s.step;
  r.lr = lm_learning_rate(tc, s.step, s.options.total_steps);
  if (s.fp8 && !s.fp8_calibrated) {  // as the reference backend's step_tokens() does
    const auto micro = static_cast<std::ptrdiff_t>(s.local_batch * s.config.model.context);
    const std::vector<int32_t> ids(all_ids.begin(), all_ids.begin() + micro);
    const std::vector<int32_t> labels(all_labels.begin(), all_labels.begin() + micro);
    auto passes = s.gpu->fp8_calibrate(ids, labels, static_cast<int>(s.config.model.layers) + 2);
    if (!passes.ok()) return passes.status().WithContext("train: FP8 calibration");
    s.fp8_calibrated = true;
  }
  auto g = s.gpu->step(all_ids, all_labels, r.lr, s.step + 1);
  if (!g.ok()) return g.status().WithContext("train: step " + std::to_string(s.step));
  if (!g->finite) {
    host_stale = true;  // the kernels skipped the update: a download shows the state as it is
    std::string what = "the loss is " + std::to_string(g->loss);
    if (std::isfinite(g->loss)) {
      auto first = s.gpu->first_non_finite_gradient();
      what = "the gradient of " + (first.ok() ? *first : std::string("a parameter")) + " is non-finite";
    }
    return InvalidArgument("train: step " + std::to_string(s.step) + ": " + what +
                           " (non-finite); the parameters are unchanged");
  }
  r.loss = g->loss;
  r.grad_norm = g->norm;
  r.cuda_graph = g->graph;
  s.host_stale = true;
  return s.finish_step(r, t0);
}

LmStepResult LmTrainer::Impl::finish_step(LmStepResult r, std::chrono::steady_clock::time_point t0) {
  const LmTrainConfig& tc = config.train;
  last_loss = r.loss;
  ++step;
  sequences += tc.accum * tc.batch;
  r.tokens = tc.accum * tc.batch * config.model.context;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Result<LmStepProfile> LmTrainer::profile_step(const TokenStream& train, int iters) {
  Impl& s = *impl_;
  if (!s.gpu) return NotSupported("train: profile_step needs the gpu backend");
  const int64_t seq = s.config.model.context;
  if (train.sequences(seq) < 1)
    return InvalidArgument(train.path + ": too few tokens for one sequence of " + std::to_string(seq));
  std::vector<int32_t> all_ids, all_labels;
  s.next_micro_batches(train, &all_ids, &all_labels);  // the position stays
  FUSEBOX_RETURN_IF_ERROR(s.sync_to_device());
  FUSEBOX_RETURN_IF_ERROR(s.sync_to_host());  // the state the profile's optimizer runs overwrite
  auto p = s.gpu->profile(all_ids, all_labels, iters);
  s.device_stale = true;  // uploaded again before the next use, whatever the profile left there
  return p;
}

Result<double> LmTrainer::validation_loss(const TokenStream& val, int64_t batches) {
  Impl& s = *impl_;
  const int64_t seq = s.config.model.context;
  if (val.sequences(seq) < 1)
    return InvalidArgument(val.path + ": too few tokens for one sequence of " + std::to_string(seq));
  double sum = 0;
  std::vector<int32_t> ids, labels;
  for (int64_t k = 0; k < batches; ++k) {  // this rank's slice of each global micro-batch
    lm_micro_batch(val, seq, s.local_batch, k * s.config.train.batch + s.rank * s.local_batch, &ids, &labels);
    if (s.gpu) FUSEBOX_RETURN_IF_ERROR(s.sync_to_device());
    auto l = s.gpu ? s.gpu->loss(ids, labels) : s.micro_batch(ids, labels, 0);
    if (!l.ok() && s.comm) s.comm->abort();
    FUSEBOX_RETURN_IF_ERROR(l.status());
    FUSEBOX_ASSIGN_OR_RETURN(double mean, s.all_mean(*l));
    sum += mean;
  }
  return sum / static_cast<double>(batches);
}

Result<std::vector<float>> LmTrainer::next_token_logits(const std::vector<int32_t>& tokens) {
  Impl& s = *impl_;
  const LmModelConfig& m = s.config.model;
  if (tokens.empty() || static_cast<int64_t>(tokens.size()) > m.context)
    return InvalidArgument("next_token_logits: " + std::to_string(tokens.size()) +
                           " tokens (accepted: 1 to the context, " + std::to_string(m.context) + ")");
  for (int32_t t : tokens)
    if (t < 0 || t >= m.vocab)
      return InvalidArgument("next_token_logits: token " + std::to_string(t) + " is outside [0, " +
                             std::to_string(m.vocab) + ")");
  FUSEBOX_ASSIGN_OR_RETURN(const Pipeline* g, s.generation_pipeline());
  // Through the CPU reference (the GPU backend's greedy decoding is the serving engine's, issue 34).
  if (g->flops() > 1e10)
    return NotSupported(
        "a forward of " + std::to_string(g->flops() / 1e9) +
        " GFLOP through the CPU reference; decoding this model on the GPU is the serving engine's "
        "(issue 34)");
  FUSEBOX_RETURN_IF_ERROR(s.sync_to_host());
  // Causal attention: the logits at position t see tokens 0..t only, so the rest of the
  // context is padding (token 0) that changes nothing before it.
  std::vector<int32_t> ids(static_cast<size_t>(m.context), 0);
  std::copy(tokens.begin(), tokens.end(), ids.begin());
  FUSEBOX_ASSIGN_OR_RETURN(PipelineHostData data,
                           pipeline_host_data(*g, s.forward_inputs(ids, ids, m.context)));
  FUSEBOX_ASSIGN_OR_RETURN(auto chain, reference_chain(*g, data, kCpuFlops));
  const std::vector<float>& logits = chain.at("logits");
  const size_t row = (tokens.size() - 1) * static_cast<size_t>(m.vocab);
  return std::vector<float>(logits.begin() + static_cast<std::ptrdiff_t>(row),
                            logits.begin() + static_cast<std::ptrdiff_t>(row + static_cast<size_t>(m.vocab)));
}

Result<std::vector<int32_t>> LmTrainer::generate(const std::vector<int32_t>& prompt, int64_t n) {
  const LmModelConfig& m = impl_->config.model;
  if (prompt.empty() || static_cast<int64_t>(prompt.size()) + n > m.context)
    return InvalidArgument("generate: a prompt of " + std::to_string(prompt.size()) + " tokens plus " +
                           std::to_string(n) + " new ones must fit the context of " +
                           std::to_string(m.context));
  std::vector<int32_t> out = prompt;
  for (int64_t k = 0; k < n; ++k) {
    auto logits = next_token_logits(out);
    if (!logits.ok()) return logits.status().WithContext("generate");
    out.push_back(static_cast<int32_t>(std::max_element(logits->begin(), logits->end()) - logits->begin()));
  }
  return std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(prompt.size()), out.end());
}

Status LmTrainer::save_checkpoint(const std::string& path) const {
  FUSEBOX_RETURN_IF_ERROR(impl_->sync_to_host());
  const Impl& s = *impl_;
  std::vector<SafetensorsEntry> e;
  for (const LmParameter& p : s.params) e.push_back({p.name, p.shape, s.master.at(p.name).data()});
  for (const LmParameter& p : s.params) e.push_back({"adam_m." + p.name, p.shape, s.m.at(p.name).data()});
  for (const LmParameter& p : s.params) e.push_back({"adam_v." + p.name, p.shape, s.v.at(p.name).data()});
  std::map<std::string, std::string> meta{{"format", kCheckpointFormat},
                                          {"step", std::to_string(s.step)},
                                          {"sequences", std::to_string(s.sequences)},
                                          {"config", lm_config_json(s.config)}};
  // train.fp8: the delayed scaling's state, once it holds amaxes (before the first step a resumed
  // run calibrates, as a new one does).
  std::map<std::string, std::vector<float>> fp8_state;
  if (s.fp8 && s.fp8_calibrated) {
    if (s.gpu) {
      FUSEBOX_ASSIGN_OR_RETURN(fp8_state, s.gpu->fp8_state());
    } else {
      fp8_state = s.fp8->state();
    }
    for (const auto& [key, v] : fp8_state) e.push_back({key, {static_cast<int64_t>(v.size())}, v.data()});
    meta["fp8_state"] = "1";
  }
  return write_safetensors_f32(path, e, meta);
}

namespace {

// The checkpoint's metadata, checked to be a fusebox language-model checkpoint.
Result<std::map<std::string, std::string>> checkpoint_metadata(const std::string& path) {
  FUSEBOX_ASSIGN_OR_RETURN(auto meta, read_safetensors_metadata(path));
  if (meta["format"] != kCheckpointFormat)
    return InvalidArgument(path + ": not a fusebox language-model checkpoint (metadata format '" +
                           meta["format"] + "', expected '" + kCheckpointFormat + "')");
  return meta;
}

// Tensors "<prefix><name>" of every parameter, fp32; shapes checked, so that a checkpoint of
// another size names its first mismatched tensor.
Result<std::map<std::string, std::vector<float>>> read_lm_tensors(const LmConfig& config,
                                                                  const std::string& path,
                                                                  const std::string& prefix, bool finite) {
  std::map<std::string, std::vector<float>> out;
  for (const LmParameter& p : lm_parameters(config.model)) {
    const std::string key = prefix + p.name;
    auto t = read_safetensors_for(path, key, fp32_tensor(key, p.shape));
    if (!t.ok())
      return t.status().WithContext("checkpoint of another model config? (this one: " +
                                    lm_config_json(LmConfig{config.model, {}}) + ")");
    std::vector<float>& v = out[p.name] = t->to_float_logical();
    if (finite)
      for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))
          return InvalidArgument(path + ": tensor '" + key + "' is non-finite at element " +
                                 std::to_string(i));
  }
  return out;
}

}  // namespace

Result<LmConfig> lm_checkpoint_config(const std::string& checkpoint) {
  FUSEBOX_ASSIGN_OR_RETURN(auto meta, checkpoint_metadata(checkpoint));
  return parse_lm_config(meta["config"], checkpoint + " (its config)");
}

Result<std::map<std::string, std::vector<float>>> load_lm_weights(const LmConfig& config,
                                                                  const std::string& checkpoint) {
  FUSEBOX_RETURN_IF_ERROR(checkpoint_metadata(checkpoint).status());
  return read_lm_tensors(config, checkpoint, "", true);
}

Status LmTrainer::load_checkpoint(const std::string& path) {
  Impl& s = *impl_;
  const std::string where = path + ": ";
  FUSEBOX_ASSIGN_OR_RETURN(auto meta, checkpoint_metadata(path));
  auto count = [&](const char* key) -> Result<int64_t> {
    const std::string& v = meta[key];
    if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string::npos)
      return InvalidArgument(where + "metadata '" + key + "' = '" + v + "' is not a non-negative integer");
    return std::stoll(v);
  };
  FUSEBOX_ASSIGN_OR_RETURN(int64_t step, count("step"));
  FUSEBOX_ASSIGN_OR_RETURN(int64_t sequences, count("sequences"));
  auto theirs = parse_lm_config(meta["config"], path + " (its config)");
  if (!theirs.ok()) return theirs.status();
  FUSEBOX_ASSIGN_OR_RETURN(auto master, read_lm_tensors(s.config, path, "", true));
  FUSEBOX_ASSIGN_OR_RETURN(auto m, read_lm_tensors(s.config, path, "adam_m.", true));
  FUSEBOX_ASSIGN_OR_RETURN(auto v, read_lm_tensors(s.config, path, "adam_v.", true));
  for (const auto& [name, vals] : v)
    for (size_t i = 0; i < vals.size(); ++i)
      if (vals[i] < 0)
        return InvalidArgument(where + "tensor 'adam_v." + name + "' is negative at element " +
                               std::to_string(i) + " (a second moment is a mean of squares)");
  // Every model field, not only the shapes: heads 4 / kv 2 / dim 16 and 2 / 1 / 32 share them.
  const nlohmann::json ours_m = nlohmann::json::parse(lm_config_json(s.config))["model"];
  const nlohmann::json theirs_m = nlohmann::json::parse(lm_config_json(*theirs))["model"];
  for (auto it = ours_m.begin(); it != ours_m.end(); ++it)
    if (theirs_m[it.key()] != it.value())
      return InvalidArgument(where + "a checkpoint of another model: model." + it.key() + " is " +
                             theirs_m[it.key()].dump() + " there, " + it.value().dump() + " here");
  if (s.fp8 && meta["fp8_state"] == "1") {
    std::map<std::string, std::vector<float>> state;
    for (const std::string& b : s.fp8->tensors())
      for (auto [prefix, len] :
           {std::pair<const char*, int64_t>{"fp8_scale.", 1},
            std::pair<const char*, int64_t>{"fp8_amax_history.", s.config.train.fp8_history}}) {
        const std::string key = prefix + b;
        auto t = read_safetensors_for(path, key, fp32_tensor(key, {len}));
        if (!t.ok()) return t.status().WithContext(where + "the FP8 scaling state");
        state[key] = t->to_float_logical();
      }
    FUSEBOX_RETURN_IF_ERROR(s.fp8->restore(state));
    if (s.gpu) FUSEBOX_RETURN_IF_ERROR(s.gpu->fp8_restore(state));
    s.fp8_calibrated = true;
  } else if (s.fp8) {
    s.fp8_calibrated = false;  // a checkpoint without FP8 state: the first step calibrates
  }
  s.master = std::move(master);
  s.m = std::move(m);
  s.v = std::move(v);
  s.step = step;
  s.sequences = sequences;
  s.device_stale = true;
  s.host_stale = false;
  return Status::Ok();
}

Status LmTrainer::save_gradients(const std::string& path) const {
  const Impl& s = *impl_;
  ParamMap from_gpu;
  if (s.gpu) {
    FUSEBOX_ASSIGN_OR_RETURN(from_gpu, s.gpu->gradients());
  }
  const ParamMap& grads = s.gpu ? from_gpu : s.grad;
  std::vector<SafetensorsEntry> e;
  for (const LmParameter& p : s.params) e.push_back({"grad." + p.name, p.shape, grads.at(p.name).data()});
  return write_safetensors_f32(path, e,
                               {{"format", "fusebox-lm-grads/1"},
                                {"step", std::to_string(s.step - 1)},
                                {"loss", nlohmann::json(s.last_loss).dump()}});
}

Result<GradientCheck> LmTrainer::check_gradients(int64_t seq, uint32_t seed) {
  Impl& s = *impl_;
  const std::filesystem::path dir = std::filesystem::path(s.options.work_dir) / "gradcheck";
  FUSEBOX_ASSIGN_OR_RETURN(Pipeline fwd, model_pipeline(s.config.model, 1, seq, (dir / "forward").string(),
                                                        s.config.train.recompute, s.config.train.swiglu));
  FUSEBOX_ASSIGN_OR_RETURN(PipelineBackward b, derive_pipeline_backward(fwd, lm_backward_options(s.config)));
  FUSEBOX_ASSIGN_OR_RETURN(std::string bpath, write_pipeline_backward(fwd, b, (dir / "backward").string()));
  FUSEBOX_ASSIGN_OR_RETURN(Pipeline bwd, load_pipeline_file(bpath));
  // Random weights and activations on the check's grid, the model's RoPE angles. Step 2^-10
  // and 1%: the chain rounds each of its ~9 stages per layer to fp32 and the central
  // difference divides that noise by 2e, so 2^-14 is noise-bound here (a 2-layer, width-64
  // model: a few rows 1-13% off), while 2^-8 is truncation-bound (softmax curvature); at 2^-10
  // both stay under 1%. A wrong wiring (a gradient into the wrong buffer, a missing sum) is off
  // by far more. Each op's rule is checked alone at 0.2% (tests/unit/autodiff_test.cpp).
  GradientInputs fixed;
  fixed["freqs"] = widen(lm_rope_angles(s.config.model, seq));
  const double step = 1.0 / 1024;
  return check_pipeline_gradients(fwd, b, bwd, seed, 1e-2, fixed, step);
}

int64_t LmTrainer::steps_done() const { return impl_->step; }
int64_t LmTrainer::sequences_done() const { return impl_->sequences; }
const LmConfig& LmTrainer::config() const { return impl_->config; }
const std::map<std::string, std::vector<float>>& LmTrainer::parameters() const {
  (void)impl_->sync_to_host();  // a failed download keeps the last host copy
  return impl_->master;
}
const std::vector<std::pair<std::string, double>>& LmTrainer::startup_ms() const { return impl_->startup; }
int64_t LmTrainer::device_bytes() const { return impl_->gpu ? impl_->gpu->device_bytes() : 0; }
std::string LmTrainer::plan_summary() const { return impl_->gpu ? impl_->gpu->plan_summary() : ""; }

int64_t LmTrainer::saved_activation_bytes() const {
  const Impl& s = *impl_;
  int64_t bytes = 0;
  std::set<int> seen;  // a buffer saved as is and transposed is one allocation
  for (const auto& [name, in] : s.derived.inputs) {
    if (in.kind != BackwardInput::Kind::kSaved || s.bwd.find_buffer(name) < 0) continue;  // FP8: dropped
    const int b = s.fwd.find_buffer(in.forward_tensor);
    if (b < 0 || s.fwd.buffers[static_cast<size_t>(b)].kind == BufferKind::kInput || !seen.insert(b).second)
      continue;
    bytes += buffer_tensor(s.fwd, b).storage_bytes();
  }
  return bytes;
}

}  // namespace fusebox
