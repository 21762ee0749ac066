// Uses fusebox as an installed package: declares conv + bias + relu with the
// C++ builder, builds a plan deviceless for the H200 through a Session and,
// when a GPU is there, builds, binds and runs it there and checks the output.
//   usage: consumer [DEVICE_PROPERTIES_FILE]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/session.h"

using namespace fusebox;

namespace {

// x = 1, w = 1, b = -4: y = relu(64 * taps - 4), exact in bf16.
Result<ResolvedGraph> conv_bias_relu() {
  GraphSpec spec;
  spec.name = "consumer_conv_bias_relu";  // io bf16, intermediates and compute fp32
  std::string x = spec.tensor("x", {2, 64, 8, 8}, "nhwc");
  std::string w = spec.tensor("w", {64, 64, 3, 3}, "nhwc");
  std::string b = spec.tensor("b", {1, 64, 1, 1}, "nhwc");
  std::string conv =
      spec.conv_fprop("conv1", x, w, {.padding = {1, 1}, .stride = {1, 1}, .dilation = {1, 1}});
  std::string y =
      spec.pointwise("act", PointwiseMode::kRelu, spec.pointwise("bias", PointwiseMode::kBiasAdd, conv, b));
  spec.output(y, "nhwc");
  return resolve(spec);
}

int fail(const char* what, const Status& st) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, st.ToString().c_str());
  return 1;
}

std::vector<uint16_t> bf16_filled(int64_t n, float v) {
  return std::vector<uint16_t>(n, float_to_bf16_bits(v));
}

// Builds, binds and runs on GPU 0; 0 when the output is right.
int run_on_gpu(const ResolvedGraph& g) {
  Result<std::unique_ptr<Session>> s = Session::create({});
  if (!s.ok()) {
    if (s.status().code() == StatusCode::kNoDevice) {
      std::printf("skipped GPU run: %s\n", s.status().message().c_str());
      return 0;
    }
    return fail("GPU session", s.status());
  }
  PlanReport where;
  Result<Plan> plan = (*s)->get_plan(g, PlanRequest{}, &where);
  if (!plan.ok()) return fail("GPU plan", plan.status());

  // The builder named the output after its op ("act.y").
  const std::string out = g.tensors[g.output_tensors().at(0)].name;
  std::map<std::string, void*> buffers;
  std::map<std::string, std::vector<uint16_t>> host = {
      {"x", bf16_filled(2 * 64 * 8 * 8, 1)},
      {"w", bf16_filled(64 * 64 * 9, 1)},
      {"b", bf16_filled(64, -4)},
      {out, std::vector<uint16_t>(2 * 64 * 8 * 8, 0xFFFF)}};  // poisoned: NaN in bf16
  for (auto& [name, data] : host) {
    void* d = nullptr;
    if (cudaMalloc(&d, data.size() * 2) != cudaSuccess ||
        cudaMemcpy(d, data.data(), data.size() * 2, cudaMemcpyHostToDevice) != cudaSuccess) {
      std::fprintf(stderr, "consumer: cudaMalloc/cudaMemcpy of '%s' failed\n", name.c_str());
      return 1;
    }
    buffers[name] = d;
  }
  Result<BoundPlan> bound = (*s)->bind(*plan, buffers);
  if (!bound.ok()) return fail("bind", bound.status());
  Status st = bound->execute();
  if (!st.ok()) return fail("execute", st);
  auto stream = static_cast<cudaStream_t>((*s)->context()->stream());
  std::vector<uint16_t>& y = host[out];
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpy(y.data(), buffers[out], y.size() * 2, cudaMemcpyDeviceToHost) != cudaSuccess) {
    std::fprintf(stderr, "consumer: the run or the download failed\n");
    return 1;
  }
  for (auto& [name, d] : buffers) cudaFree(d);
  // nhwc: (n, h, w, c) at ((n * 8 + h) * 8 + w) * 64 + c
  float inside = bf16_bits_to_float(y[((1 * 8 + 4) * 8 + 4) * 64 + 7]);
  float edge = bf16_bits_to_float(y[((0 * 8 + 0) * 8 + 3) * 64 + 5]);
  float corner = bf16_bits_to_float(y[((1 * 8 + 7) * 8 + 7) * 64 + 63]);
  std::printf("GPU run on %s: %s, engine %s; y inside %g, edge %g, corner %g (expected 572, 380, 252)\n",
              (*s)->target().device_name.c_str(), where.source_text().c_str(), plan->engine_name().c_str(),
              inside, edge, corner);
  return inside == 572 && edge == 380 && corner == 252 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string devprop = argc > 1 ? argv[1] : FUSEBOX_DEVICES_DIR "/h200-cudnn-9.27.devprop";
  Result<ResolvedGraph> g = conv_bias_relu();
  if (!g.ok()) return fail("graph", g.status());
  std::printf("%s", describe(*g).c_str());

  SessionOptions so;
  so.device_properties_file = devprop;  // deviceless: no GPU needed
  Result<std::unique_ptr<Session>> s = Session::create(so);
  if (!s.ok()) return fail("deviceless session", s.status());
  PlanReport where;
  Result<Plan> plan = (*s)->get_plan(*g, PlanRequest{}, &where);
  if (!plan.ok()) return fail("deviceless plan", plan.status());
  std::printf("deviceless plan for %s: %s, engine %s, workspace %lld B\n", (*s)->target().device_name.c_str(),
              where.source_text().c_str(), plan->engine_name().c_str(),
              static_cast<long long>(plan->workspace_bytes()));

  int rc = run_on_gpu(*g);
  std::printf(rc == 0 ? "consumer: ok\n" : "consumer: FAILED\n");
  return rc;
}
