// fusebox: check_gradients() (fusebox/gradient_check.h).
#include "fusebox/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "fusebox/reference.h"
#include "fusebox/tensor.h"

namespace fusebox {

namespace {

using Values = GradientInputs;

// The graph with its 16-bit tensors in fp32: the check is of the gradient rules' math,
// which rounding to bf16 (and the coarse steps it would force) would blur.
ResolvedGraph in_fp32(const ResolvedGraph& g) {
  ResolvedGraph p = g;
  auto widen = [](DType& d) {
    if (d == DType::kBF16 || d == DType::kFP16) d = DType::kFP32;
  };
  widen(p.io_dtype);
  for (ResolvedTensor& t : p.tensors) widen(t.dtype);
  return p;
}

Result<ReferenceOutputs> run_forward(const ResolvedGraph& g, const Values& in) {
  std::map<std::string, HostTensor> h;
  for (int t : g.input_tensors())
    h.emplace(g.tensors[t].name, host_tensor_of(g.tensors[t], in.at(g.tensors[t].name)));
  return reference_cpu(g, h);
}

}  // namespace

std::vector<double> gradient_check_values(int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> d(-64, 63);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = (d(rng) + 0.5) / 64.0;
  return v;
}

HostTensor host_tensor_of(const ResolvedTensor& t, const std::vector<double>& values) {
  HostTensor h = HostTensor::like(t);
  const size_t es = dtype_size_bytes(h.dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t rem = static_cast<int64_t>(i), off = 0;
    for (int d = static_cast<int>(h.dims.size()) - 1; d >= 0; --d) {
      off += (rem % h.dims[d]) * h.strides[d];
      rem /= h.dims[d];
    }
    store_element(h.data.data() + off * es, h.dtype, values[i]);
  }
  return h;
}

namespace {

Result<GradientCheckRow> check_row(const std::string& x, const std::string& gradient,
                                   const std::vector<float>& g, const GradientInputs& in,
                                   const std::function<Result<double>(const GradientInputs&)>& loss,
                                   std::mt19937& rng, double tol, double e) {
  const std::vector<double>& base = in.at(x);
  if (g.size() != base.size())
    return Internal("gradient '" + gradient + "' has " + std::to_string(g.size()) + " values, input '" + x +
                    "' " + std::to_string(base.size()));
  std::uniform_int_distribution<int> dir(-1, 1);
  GradientCheckRow row;
  row.input = x;
  row.gradient = gradient;
  row.step = e;
  double scale = 0;
  GradientInputs plus = in, minus = in;
  for (size_t i = 0; i < g.size(); ++i) {
    const int u = dir(rng);
    row.analytic += g[i] * u;
    scale += std::fabs(g[i] * u);
    plus[x][i] += e * u;
    minus[x][i] -= e * u;
  }
  FUSEBOX_ASSIGN_OR_RETURN(double lp, loss(plus));
  FUSEBOX_ASSIGN_OR_RETURN(double lm, loss(minus));
  row.numeric = (lp - lm) / (2 * e);
  row.allowed = tol * std::fabs(row.numeric) + 1e-4 * scale;
  row.pass = std::isfinite(row.analytic) && std::fabs(row.analytic - row.numeric) <= row.allowed;
  return row;
}

}  // namespace

Result<GradientCheck> gradient_check_rows(const std::map<std::string, std::string>& gradients,
                                          const std::map<std::string, std::vector<float>>& values,
                                          const GradientInputs& in,
                                          const std::function<Result<double>(const GradientInputs&)>& loss,
                                          std::mt19937& rng, double tol, double step) {
  GradientCheck out;
  for (const auto& [x, gname] : gradients) {
    auto g = values.find(gname);
    if (g == values.end()) return Internal("no values for gradient '" + gname + "'");
    FUSEBOX_ASSIGN_OR_RETURN(GradientCheckRow row, check_row(x, gname, g->second, in, loss, rng, tol, step));
    out.rows.push_back(row);
  }
  return out;
}

Status check_gradient_check_size(const std::string& what, double forward_flops, double backward_flops,
                                 size_t gradients) {
  const double work = forward_flops * (2.0 * static_cast<double>(gradients) + 1.0) + backward_flops;
  if (work <= kMaxGradientCheckFlops) return Status::Ok();
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.3g FLOPs", work);
  char limit[32];
  std::snprintf(limit, sizeof(limit), "%.3g", kMaxGradientCheckFlops);
  return InvalidArgument("gradient check of '" + what + "': " + buf + " through the CPU reference (" +
                         std::to_string(gradients) +
                         " gradients, two forward runs each) is over the limit of " + limit +
                         ": check a smaller shape of the graph");
}

bool GradientCheck::pass() const {
  return !rows.empty() &&
         std::all_of(rows.begin(), rows.end(), [](const GradientCheckRow& r) { return r.pass; });
}

std::string GradientCheckRow::ToString() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%s (%s): backward %.6g, finite differences %.6g (step %.3g), off by %.3g, allowed %.3g: %s",
                input.c_str(), gradient.c_str(), analytic, numeric, step, std::fabs(analytic - numeric),
                allowed, pass ? "PASS" : "FAIL");
  return buf;
}

Result<GradientCheck> check_gradients(const ResolvedGraph& given_fwd, const BackwardGraph& bwd, uint32_t seed,
                                      double tol) {
  FUSEBOX_ASSIGN_OR_RETURN(ResolvedGraph given_bg, resolve(bwd.spec));
  const ResolvedGraph fwd = in_fp32(given_fwd), bg = in_fp32(given_bg);
  FUSEBOX_RETURN_IF_ERROR(
      check_gradient_check_size(given_fwd.name, fwd.flops(), bg.flops(), bwd.gradients.size()));
  std::mt19937 rng(seed);
  Values in, seeds;
  for (int t : fwd.input_tensors()) {
    const ResolvedTensor& ft = fwd.tensors[t];
    if (!ft.values.empty()) {
      in[ft.name] = ft.values;
    } else if (!dtype_is_float(ft.dtype)) {
      std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(ft.random_lo),
                                               static_cast<int64_t>(ft.random_hi));
      std::vector<double> v(static_cast<size_t>(ft.element_count()));
      for (auto& x : v) x = static_cast<double>(d(rng));
      in[ft.name] = v;
    } else {
      in[ft.name] = gradient_check_values(ft.element_count(), rng);
    }
  }
  if (tol <= 0) tol = 2e-3;
  for (const std::string& s : bwd.seeds)
    seeds[s] = gradient_check_values(fwd.tensors[fwd.find_tensor(s)].element_count(), rng);
  auto loss = [&](const Values& v) -> Result<double> {
    FUSEBOX_ASSIGN_OR_RETURN(ReferenceOutputs out, run_forward(fwd, v));
    double l = 0;
    for (const auto& [name, g] : seeds) {
      const auto& y = out.at(name);
      for (size_t i = 0; i < g.size(); ++i) l += g[i] * y[i];
    }
    return l;
  };
  // The backward's inputs: seeds, saved forward tensors (transposed views: the same bytes).
  FUSEBOX_ASSIGN_OR_RETURN(ReferenceOutputs fo, run_forward(fwd, in));
  std::map<std::string, HostTensor> h;
  for (int t : bg.input_tensors()) {
    const ResolvedTensor& bt = bg.tensors[t];
    auto b = bwd.inputs.find(bt.name);
    if (b == bwd.inputs.end()) return Internal("backward input '" + bt.name + "' has no binding");
    if (b->second.kind == BackwardInput::Kind::kGradient) {
      h.emplace(bt.name, host_tensor_of(bt, seeds.at(b->second.forward_tensor)));
      continue;
    }
    const ResolvedTensor& ft = fwd.tensors[fwd.find_tensor(b->second.forward_tensor)];
    std::vector<double> v;
    if (auto it = in.find(ft.name); it != in.end()) {
      v = it->second;
    } else {
      const auto& o = fo.at(ft.name);
      v.assign(o.begin(), o.end());
    }
    HostTensor f = host_tensor_of(ft, v);
    if (!b->second.transposed) {
      h.emplace(bt.name, std::move(f));
    } else {
      HostTensor view = HostTensor::like(bt);
      if (view.data.size() != f.data.size())
        return Internal("transposed view '" + bt.name + "' spans other bytes");
      view.data = f.data;
      h.emplace(bt.name, std::move(view));
    }
  }
  FUSEBOX_ASSIGN_OR_RETURN(ReferenceOutputs grads, reference_cpu(bg, h));
  return gradient_check_rows(bwd.gradients, grads, in, loss, rng, tol);
}

}  // namespace fusebox
