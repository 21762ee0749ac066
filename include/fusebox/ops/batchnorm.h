// fusebox op family: batch normalization (batchnorm, batchnorm_inference,
// batchnorm_bwd). One of the op families of OpAttrs (fusebox/graph.h);
// its graph-layer definition is src/graph/ops/batchnorm.cpp (docs/architecture.md, "Adding an op").
//
// x [N, C, (D,) H, W] is normalized per channel c over its M = N*(D*)H*W
// elements; every per-channel tensor (scale, bias, statistics) is [1, C, 1, 1]
// ([1, C, 1, 1, 1] for rank 5). The statistics are fp32.
//   batchnorm (training forward): inputs x, scale, bias, running_mean,
//     running_var; outputs y, mean, inv_variance (saved for the backward),
//     next_running_mean, next_running_var:
//       mean = sum(x) / M,  var = sum((x - mean)^2) / M  (biased),
//       inv_variance = 1 / sqrt(var + epsilon),
//       y = (x - mean) * inv_variance * scale + bias,
//       next_running_mean = (1 - momentum) * running_mean + momentum * mean,
//       next_running_var  = (1 - momentum) * running_var + momentum * var * M / (M - 1)
//     (the running variance takes the unbiased batch variance, as torch and
//     cuDNN's batch-norm API do).
//   batchnorm_inference: inputs x, scale, bias, mean, inv_variance; output y
//     = (x - mean) * inv_variance * scale + bias. cuDNN's operation takes the
//     inverse standard deviation, not the variance: from running statistics,
//     inv_variance = 1 / sqrt(running_var + epsilon), computed once per model.
//   batchnorm_bwd: inputs dy (like x), x, scale, mean, inv_variance (the
//     forward's saved statistics, used as given); outputs dx (like x), dscale,
//     dbias (like scale). With xhat = (x - mean) * inv_variance and mean_M()
//     the mean over a channel's M elements:
//       dx = scale * inv_variance * (dy - mean_M(dy) - xhat * mean_M(dy * xhat)),
//       dscale = sum over M of dy * xhat,  dbias = sum over M of dy.
#pragma once

namespace fusebox {

struct BatchNormAttrs {
  double epsilon = 1e-5;  // by value, baked into the plan
  double momentum = 0.1;  // the running statistics' update factor (torch's), in [0, 1]
};
struct BatchNormInferenceAttrs {};
struct BatchNormBwdAttrs {};

}  // namespace fusebox
