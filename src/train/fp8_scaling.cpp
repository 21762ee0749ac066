// fusebox train layer: per-tensor delayed scaling for FP8 (fusebox/fp8_scaling.h).
#include "fusebox/fp8_scaling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace fusebox {

Result<Fp8DelayedScaling> Fp8DelayedScaling::create(const std::vector<std::pair<std::string, DType>>& tensors,
                                                    const Fp8ScalingConfig& config) {
  if (config.history < 1 || config.history > 1024)
    return InvalidArgument("fp8 scaling: history " + std::to_string(config.history) +
                           " (accepted: 1 to 1024 steps)");
  if (config.margin < 0 || config.margin > 32)
    return InvalidArgument("fp8 scaling: margin " + std::to_string(config.margin) + " (accepted: 0 to 32)");
  Fp8DelayedScaling s;
  s.config_ = config;
  for (const auto& [name, dtype] : tensors) {
    if (dtype != DType::kFP8E4M3 && dtype != DType::kFP8E5M2)
      return InvalidArgument("fp8 scaling: tensor '" + name + "' is " + std::string(dtype_name(dtype)) +
                             " (accepted: fp8_e4m3, fp8_e5m2)");
    if (!s.entries_.emplace(name, Entry{dtype, 1.f, {}}).second)
      return InvalidArgument("fp8 scaling: tensor '" + name + "' is listed twice");
  }
  return s;
}

Result<const Fp8DelayedScaling::Entry*> Fp8DelayedScaling::find(const std::string& tensor) const {
  auto it = entries_.find(tensor);
  if (it == entries_.end()) return InvalidArgument("fp8 scaling: no tensor '" + tensor + "'");
  return &it->second;
}

Result<float> Fp8DelayedScaling::scale(const std::string& tensor) const {
  FUSEBOX_ASSIGN_OR_RETURN(const Entry* e, find(tensor));
  return e->scale;
}

Result<float> Fp8DelayedScaling::scale_inv(const std::string& tensor) const {
  FUSEBOX_ASSIGN_OR_RETURN(const Entry* e, find(tensor));
  return 1.f / e->scale;
}

void Fp8DelayedScaling::update_scale(Entry& e) const {
  if (e.history.empty()) return;
  const float amax = config_.amax == Fp8ScalingConfig::Amax::kMostRecent
                         ? e.history.back()
                         : *std::max_element(e.history.begin(), e.history.end());
  if (!(amax > 0.f)) return;  // nothing to scale by: the scale stays
  const double s = dtype_saturation(e.dtype) / static_cast<double>(amax) / std::ldexp(1.0, config_.margin);
  if (s <= std::numeric_limits<float>::max()) e.scale = static_cast<float>(s);  // else it stays
}

Status Fp8DelayedScaling::record(const std::string& tensor, float amax) {
  auto it = entries_.find(tensor);
  if (it == entries_.end()) return InvalidArgument("fp8 scaling: no tensor '" + tensor + "'");
  if (!std::isfinite(amax) || amax < 0.f)
    return InvalidArgument("fp8 scaling: tensor '" + tensor + "' has amax " + std::to_string(amax) +
                           " (a finite value >= 0): the step that produced it overflowed or diverged");
  Entry& e = it->second;
  e.history.push_back(amax);
  if (static_cast<int64_t>(e.history.size()) > config_.history) e.history.erase(e.history.begin());
  update_scale(e);
  return Status::Ok();
}

std::map<std::string, std::vector<float>> Fp8DelayedScaling::state() const {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, e] : entries_) {
    out["fp8_scale." + name] = {e.scale};
    std::vector<float> h(static_cast<size_t>(config_.history), 0.f);  // unrecorded steps: 0 (no amax)
    std::copy(e.history.begin(), e.history.end(), h.end() - static_cast<std::ptrdiff_t>(e.history.size()));
    out["fp8_amax_history." + name] = std::move(h);
  }
  return out;
}

Status Fp8DelayedScaling::restore(const std::map<std::string, std::vector<float>>& state) {
  std::map<std::string, Entry> next = entries_;
  for (auto& [name, e] : next) {
    auto sc = state.find("fp8_scale." + name);
    auto hi = state.find("fp8_amax_history." + name);
    if (sc == state.end() || hi == state.end())
      return InvalidArgument("fp8 scaling: the checkpoint has no scale or amax history for tensor '" + name +
                             "'");
    if (sc->second.size() != 1 || !std::isfinite(sc->second[0]) || !(sc->second[0] > 0.f))
      return InvalidArgument("fp8 scaling: tensor '" + name + "': the scale must be one finite value > 0");
    if (static_cast<int64_t>(hi->second.size()) != config_.history)
      return InvalidArgument("fp8 scaling: tensor '" + name + "': amax history of " +
                             std::to_string(hi->second.size()) + " steps, the config keeps " +
                             std::to_string(config_.history));
    for (float a : hi->second)
      if (!std::isfinite(a) || a < 0.f)
        return InvalidArgument("fp8 scaling: tensor '" + name +
                               "': an amax in its history is not finite and >= 0");
    e.scale = sc->second[0];
    // Leading zeros are steps never recorded (state() pads with them).
    auto first = std::find_if(hi->second.begin(), hi->second.end(), [](float a) { return a > 0.f; });
    e.history.assign(first, hi->second.end());
  }
  entries_ = std::move(next);
  return Status::Ok();
}

std::vector<std::string> Fp8DelayedScaling::tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

}  // namespace fusebox
