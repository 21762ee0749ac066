// fusebox: gradient clipping and AdamW on the host (optimizer.h).
#include "optimizer.h"

#include <cmath>

namespace fusebox {

double global_grad_norm(const std::vector<AdamWTensor>& tensors) {
  double sum = 0;
  for (const AdamWTensor& t : tensors)
    for (float g : *t.grad) sum += static_cast<double>(g) * g;
  return std::sqrt(sum);
}

double clip_coefficient(double norm, double clip) {
  const double c = clip / (norm + 1e-6);
  return clip > 0 && c < 1 ? c : 1.0;
}

void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, int64_t t, double grad_scale) {
  const double c1 = 1 - std::pow(h.beta1, static_cast<double>(t));
  const double c2 = 1 - std::pow(h.beta2, static_cast<double>(t));
  for (const AdamWTensor& x : tensors) {
    std::vector<float>& p = *x.param;
    std::vector<float>& m = *x.m;
    std::vector<float>& v = *x.v;
    const std::vector<float>& g = *x.grad;
    const double decay = x.decay ? 1 - h.lr * h.weight_decay : 1.0;
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = static_cast<double>(g[i]) * grad_scale;
      const double mi = h.beta1 * m[i] + (1 - h.beta1) * gi;
      const double vi = h.beta2 * v[i] + (1 - h.beta2) * gi * gi;
      m[i] = static_cast<float>(mi);
      v[i] = static_cast<float>(vi);
      const double step = h.lr * (mi / c1) / (std::sqrt(vi / c2) + h.eps);
      p[i] = static_cast<float>(static_cast<double>(p[i]) * decay - step);
    }
  }
}

}  // namespace fusebox
