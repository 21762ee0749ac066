// fusebox: a derived backward graph (fusebox/autodiff.h) checked against central
// finite differences of its forward, both run by the CPU reference
// (docs/training.md, "How the rules are tested"). For random seeds g_y of the
// forward's seed outputs, L = sum_y <g_y, y>; for each gradient dL/dx the backward
// gives, along a random direction u in {-1, 0, 1}^n, <dL/dx, u> must match
// (L(x + e u) - L(x - e u)) / 2e. Both graphs run with their bf16 and fp16 tensors
// in fp32 (the rules' math is checked, not the rounding). Inputs are odd multiples of
// 1/128 in (-1, 1) (never 0, a relu's kink; integer inputs: their fixed values or
// random rows in their range) and e = 2^-14, so x +- e u is exact. For small graphs
// (the CPU reference: up to about 1e8 multiply-adds per run).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "fusebox/autodiff.h"
#include "fusebox/graph.h"
#include "fusebox/status.h"
#include "fusebox/tensor.h"

namespace fusebox {

struct GradientCheckRow {
  std::string input;     // the forward input
  std::string gradient;  // the backward output holding its gradient
  double analytic = 0;   // <dL/dx, u> from the backward
  double numeric = 0;    // the central difference
  double allowed = 0;    // |analytic - numeric| allowed: tol |numeric| + 1e-4 sum |dL/dx_i u_i|
  double step = 0;       // e
  bool pass = false;
  std::string ToString() const;  // one line
};

struct GradientCheck {
  std::vector<GradientCheckRow> rows;  // one per gradient, in the backward's order
  bool pass() const;                   // every row (and at least one)
};

// The building blocks both checks share (check_pipeline_gradients, fusebox/pipeline_backward.h).
using GradientInputs = std::map<std::string, std::vector<double>>;  // name -> values, logical order
// Odd multiples of 1/128 in (-1, 1).
std::vector<double> gradient_check_values(int64_t n, std::mt19937& rng);
// A host tensor laid out as `t` holding `values` (logical row-major order).
HostTensor host_tensor_of(const ResolvedTensor& t, const std::vector<double>& values);
// One row per (input -> gradient) of `gradients`, the gradient's values in `values`
// (logical order): <g, u> along a random u in {-1, 0, 1}^n against the central
// difference of `loss` around `in` with step `step` (a power of 2 that keeps the grid exact).
inline constexpr double kGradientCheckStep = 1.0 / 16384;
Result<GradientCheck> gradient_check_rows(const std::map<std::string, std::string>& gradients,
                                          const std::map<std::string, std::vector<float>>& values,
                                          const GradientInputs& in,
                                          const std::function<Result<double>(const GradientInputs&)>& loss,
                                          std::mt19937& rng, double tol, double step = kGradientCheckStep);

// The CPU reference's work a check may take (forward runs for the differences plus one
// backward): more is InvalidArgument naming the FLOPs, before anything runs.
inline constexpr double kMaxGradientCheckFlops = 1e10;
Status check_gradient_check_size(const std::string& what, double forward_flops, double backward_flops,
                                 size_t gradients);

// `tol`: the relative tolerance (0: 2e-3).
Result<GradientCheck> check_gradients(const ResolvedGraph& fwd, const BackwardGraph& bwd, uint32_t seed = 1,
                                      double tol = 0);

}  // namespace fusebox
