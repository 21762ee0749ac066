// fusebox: gradient clipping and AdamW on the host (docs/lm.md, "The optimizer step"): the
// reference backend's optimizer and the reference of the GPU one.
#pragma once

#include <cstdint>
#include <vector>

namespace fusebox {

struct AdamWTensor {
  std::vector<float>* param;  // fp32 master weights, updated in place
  std::vector<float>* m;
  std::vector<float>* v;
  const std::vector<float>* grad;
  bool decay;  // weight decay applies
};

struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// sqrt(sum of g^2) over every tensor's gradient, accumulated in double.
double global_grad_norm(const std::vector<AdamWTensor>& tensors);
// torch.nn.utils.clip_grad_norm_'s factor: clip / (norm + 1e-6) when below 1, else 1.
double clip_coefficient(double norm, double clip);
// One AdamW update (torch.optim.AdamW) of every tensor with gradient grad * grad_scale, at
// step t (from 1) for the bias corrections.
void adamw_step(const std::vector<AdamWTensor>& tensors, const AdamWHyper& h, int64_t t, double grad_scale);

}  // namespace fusebox
