// GPU reference against the CPU reference, op by op. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "../unit/reference_test_sdpa.h"
#include "../unit/reference_test_util.h"
#include "fusebox/reference.h"
#include "fusebox/runtime.h"

namespace fusebox {
namespace {

using testing_util::channels_last;
using testing_util::GraphBuilder;

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    int n = 0;                                                                                     \
    const cudaError_t e = cudaGetDeviceCount(&n);                                                  \
    if (e != cudaSuccess || n == 0)                                                                \
      GTEST_SKIP() << "no CUDA GPU: " << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices"); \
  } while (0)

#define ASSERT_CUDA(expr) \
  ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// Device buffers freed at scope exit.
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) return nullptr;
    ptrs.push_back(p);
    return p;
  }
};

std::map<std::string, HostTensor> random_inputs(const ResolvedGraph& g, uint64_t seed) {
  std::map<std::string, HostTensor> in;
  for (const ResolvedTensor& t : g.tensors)
    if (t.is_input && !t.scalar_value) in[t.name] = random_tensor(t, seed);
  return in;
}

// Runs both references on `in`; every output must agree within `tol`.
void expect_gpu_matches_cpu_on(const ResolvedGraph& g, const std::map<std::string, HostTensor>& in,
                               Tolerance tol = {1e-5, 1e-5}) {
  auto cpu = reference_cpu(g, in);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_FALSE(cpu->empty());

  DeviceBuffers buffers;
  std::map<std::string, const void*> dev_in;
  for (const auto& [name, h] : in) {
    void* p = buffers.alloc(h.data.size());
    ASSERT_NE(p, nullptr);
    ASSERT_CUDA(cudaMemcpy(p, h.data.data(), h.data.size(), cudaMemcpyHostToDevice));
    dev_in[name] = p;
  }
  std::map<std::string, float*> dev_out;
  for (const auto& [name, values] : *cpu) {
    dev_out[name] = static_cast<float*>(buffers.alloc(values.size() * sizeof(float)));
    ASSERT_NE(dev_out[name], nullptr);
    ASSERT_CUDA(cudaMemset(dev_out[name], 0xff, values.size() * sizeof(float)));  // NaN: unwritten shows
  }
  const Status st = reference_gpu(g, dev_in, dev_out, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::map<std::string, std::vector<float>> gpu;
  for (const auto& [name, values] : *cpu) {
    std::vector<float>& got = gpu[name];
    got.resize(values.size());
    ASSERT_CUDA(cudaMemcpy(got.data(), dev_out[name], got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  // Rows the mask keeps nothing of hold -inf stats in both; compare() takes finite values only.
  std::map<std::string, std::vector<float>> ref = *cpu;
  ASSERT_TRUE(mask_dont_care(g, in, ref).ok());
  ASSERT_TRUE(mask_dont_care(g, in, gpu).ok());
  for (const auto& [name, values] : ref) {
    const Comparison c = compare(name, values, gpu[name], tol);
    EXPECT_TRUE(c.pass) << g.name << ": " << c.ToString();
  }
}

// The same on random inputs.
void expect_gpu_matches_cpu(const ResolvedGraph& g, uint64_t seed = 1) {
  expect_gpu_matches_cpu_on(g, random_inputs(g, seed));
}

TEST(ReferenceGpu, Conv2dNchwFp32) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "conv2d_nchw";
  const int x = b.tensor("x", {2, 8, 9, 9});
  const int w = b.tensor("w", {16, 8, 3, 3});
  const int y = b.tensor("y", {2, 16, 9, 9});
  b.op("conv", ConvFpropAttrs{{1, 1}, {1, 1}, {1, 1}}, {{"x", x}, {"w", w}}, y);
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, Conv2dNhwcBf16StrideDilation) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "conv2d_nhwc";
  const std::vector<int64_t> xd = {2, 16, 12, 11}, wd = {8, 16, 3, 3};
  // H: (12 + 4 - 4 - 1) / 2 + 1 = 6; W: (11 + 2 - 2 - 1) / 1 + 1 = 11.
  const std::vector<int64_t> yd = {2, 8, 6, 11};
  const int x = b.tensor("x", xd, DType::kBF16, channels_last(xd));
  const int w = b.tensor("w", wd, DType::kBF16, channels_last(wd));
  const int y = b.tensor("y", yd, DType::kBF16, channels_last(yd));
  b.op("conv", ConvFpropAttrs{{2, 1}, {2, 1}, {2, 1}}, {{"x", x}, {"w", w}}, y);
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, Conv3dFp16) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "conv3d";
  const int x = b.tensor("x", {1, 4, 5, 6, 7}, DType::kFP16);
  const int w = b.tensor("w", {6, 4, 3, 3, 3}, DType::kFP16);
  const int y = b.tensor("y", {1, 6, 5, 3, 4}, DType::kFP16);
  b.op("conv", ConvFpropAttrs{{1, 1, 1}, {1, 2, 2}, {1, 1, 1}}, {{"x", x}, {"w", w}}, y);
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, GroupedConvFp8Input) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "grouped_conv";
  const int x = b.tensor("x", {1, 8, 6, 6}, DType::kFP8E4M3);
  const int w = b.tensor("w", {8, 2, 3, 3}, DType::kFP8E5M2);
  const int y = b.tensor("y", {1, 8, 4, 4});
  b.op("conv", ConvFpropAttrs{}, {{"x", x}, {"w", w}}, y);
  expect_gpu_matches_cpu(b.g);
}

// conv_dgrad and conv_wgrad: stride 2 onto an odd input (rows no tap reaches),
// padding and dilation, NHWC bf16.
TEST(ReferenceGpu, ConvDgradWgradNhwcBf16StrideDilation) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "conv_bwd_nhwc";
  const std::vector<int64_t> xd = {2, 16, 13, 11}, wd = {24, 16, 3, 2};
  // H: (13 + 2 - 2*2 - 1) / 2 + 1 = 6; W: (11 + 0 - 1 - 1) / 2 + 1 = 5.
  const std::vector<int64_t> yd = {2, 24, 6, 5};
  const std::vector<int64_t> pad = {1, 0}, str = {2, 2}, dil = {2, 1};
  const int dy = b.tensor("dy", yd, DType::kBF16, channels_last(yd));
  const int w = b.tensor("w", wd, DType::kBF16, channels_last(wd));
  const int x = b.tensor("x", xd, DType::kBF16, channels_last(xd));
  const int dx = b.tensor("dx", xd, DType::kBF16, channels_last(xd));
  const int dw = b.tensor("dw", wd, DType::kFP32, channels_last(wd));
  b.op_outputs("dgrad", ConvDgradAttrs{pad, str, dil, xd}, {{"dy", dy}, {"w", w}}, {{"dx", dx}});
  b.op_outputs("wgrad", ConvWgradAttrs{pad, str, dil, wd}, {{"dy", dy}, {"x", x}}, {{"dw", dw}});
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, Conv3dGroupedDgradWgradFp16) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "conv3d_bwd_grouped";
  const std::vector<int64_t> xd = {2, 8, 5, 6, 7}, wd = {6, 4, 3, 3, 3};  // 2 groups
  const std::vector<int64_t> yd = {2, 6, 5, 3, 4};                        // pad 1, stride (1, 2, 2)
  const int dy = b.tensor("dy", yd, DType::kFP16);
  const int w = b.tensor("w", wd, DType::kFP16);
  const int x = b.tensor("x", xd, DType::kFP16);
  const int dx = b.tensor("dx", xd);
  const int dw = b.tensor("dw", wd);
  b.op_outputs("dgrad", ConvDgradAttrs{{1, 1, 1}, {1, 2, 2}, {1, 1, 1}, xd}, {{"dy", dy}, {"w", w}},
               {{"dx", dx}});
  b.op_outputs("wgrad", ConvWgradAttrs{{1, 1, 1}, {1, 2, 2}, {1, 1, 1}, wd}, {{"dy", dy}, {"x", x}},
               {{"dw", dw}});
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, MatmulOddSizes) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "matmul_odd";
  const int a = b.tensor("a", {1, 65, 97});
  const int bb = b.tensor("b", {1, 97, 79});
  const int y = b.tensor("y", {1, 65, 79});
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, MatmulBatchBroadcastColumnMajorBf16) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "matmul_bcast";
  const int64_t K = 70, N = 129;
  const int a = b.tensor("a", {2, 3, 33, K}, DType::kBF16);
  const int bb = b.tensor("b", {2, 1, K, N}, DType::kBF16, {K * N, K * N, 1, K});
  const int y = b.tensor("y", {2, 3, 33, N}, DType::kBF16);
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  expect_gpu_matches_cpu(b.g);
}

TEST(ReferenceGpu, EveryPointwiseMode) {
  SKIP_WITHOUT_GPU();
  for (PointwiseMode m :
       {PointwiseMode::kAdd, PointwiseMode::kSub, PointwiseMode::kMul, PointwiseMode::kBiasAdd,
        PointwiseMode::kScale, PointwiseMode::kRelu, PointwiseMode::kGeluTanh, PointwiseMode::kGeluErf,
        PointwiseMode::kSilu, PointwiseMode::kSigmoid, PointwiseMode::kTanh, PointwiseMode::kReluBwd}) {
    GraphBuilder b;
    b.g.name = std::string(pointwise_mode_name(m));
    const std::vector<int64_t> d = {2, 3, 4, 5};
    const int x = b.tensor("x", d, DType::kBF16, channels_last(d));
    const int y = b.tensor("y", d, DType::kFP16);
    const auto roles = op_input_roles(PointwiseAttrs{m});
    if (roles.size() == 1) {
      b.op("pw", PointwiseAttrs{m}, {{"x", x}}, y);
    } else {
      const int other =
          m == PointwiseMode::kScale ? b.scalar("s", 0.75) : b.tensor("o", {1, 3, 1, 5}, DType::kFP32);
      b.op("pw", PointwiseAttrs{m}, {{std::string(roles[0]), x}, {std::string(roles[1]), other}}, y);
    }
    SCOPED_TRACE(b.g.name);
    expect_gpu_matches_cpu(b.g);
  }
}

TEST(ReferenceGpu, Int32Input) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  b.g.name = "int32";
  const int x = b.tensor("x", {1, 64}, DType::kInt32);
  const int o = b.tensor("o", {1, 64}, DType::kFP32);
  const int y = b.tensor("y", {1, 64});
  b.op("mul", PointwiseAttrs{PointwiseMode::kMul}, {{"a", x}, {"b", o}}, y);
  expect_gpu_matches_cpu(b.g);
}

// conv -> bias_add -> gelu, with virtual intermediates, and an output that a
// later op also reads (matmul -> add -> relu).
TEST(ReferenceGpu, ChainsWithVirtualIntermediates) {
  SKIP_WITHOUT_GPU();
  {
    GraphBuilder b;
    b.g.name = "conv_bias_gelu";
    const std::vector<int64_t> xd = {2, 8, 10, 10}, yd = {2, 16, 10, 10};
    const int x = b.tensor("x", xd, DType::kBF16, channels_last(xd));
    const int w = b.tensor("w", {16, 8, 3, 3}, DType::kBF16);
    const int c = b.tensor("c", yd, DType::kFP32, {}, true);
    const int bias = b.tensor("bias", {1, 16, 1, 1}, DType::kBF16);
    const int cb = b.tensor("cb", yd, DType::kFP32, {}, true);
    const int y = b.tensor("y", yd, DType::kBF16, channels_last(yd));
    b.op("conv", ConvFpropAttrs{{1, 1}, {1, 1}, {1, 1}}, {{"x", x}, {"w", w}}, c);
    b.op("bias", PointwiseAttrs{PointwiseMode::kBiasAdd}, {{"x", c}, {"bias", bias}}, cb);
    b.op("gelu", PointwiseAttrs{PointwiseMode::kGeluErf}, {{"x", cb}}, y);
    expect_gpu_matches_cpu(b.g);
  }
  {
    GraphBuilder b;
    b.g.name = "matmul_add_relu";
    const int a = b.tensor("a", {3, 40, 50}, DType::kFP16);
    const int bb = b.tensor("b", {3, 50, 60}, DType::kFP16);
    const int mm = b.tensor("mm", {3, 40, 60});  // non-virtual output, also read by "add"
    const int r = b.tensor("r", {1, 1, 60});
    const int s = b.tensor("s", {3, 40, 60}, DType::kFP32, {}, true);
    const int y = b.tensor("y", {3, 40, 60});
    b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, mm);
    b.op("add", PointwiseAttrs{PointwiseMode::kAdd}, {{"a", mm}, {"b", r}}, s);
    b.op("relu", PointwiseAttrs{PointwiseMode::kRelu}, {{"x", s}}, y);
    expect_gpu_matches_cpu(b.g);
  }
}

TEST(ReferenceGpu, MissingBuffersAreErrors) {
  SKIP_WITHOUT_GPU();
  GraphBuilder b;
  const int x = b.tensor("x", {1, 8});
  const int y = b.tensor("y", {1, 8});
  b.op("relu", PointwiseAttrs{PointwiseMode::kRelu}, {{"x", x}}, y);
  DeviceBuffers buf;
  float* out = static_cast<float*>(buf.alloc(8 * sizeof(float)));
  Status st = reference_gpu(b.g, {}, {{"y", out}});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  const void* in = buf.alloc(8 * sizeof(float));
  st = reference_gpu(b.g, {{"x", in}}, {});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
}

// The GPU reference exists for shapes the CPU cannot do: 4096^3 must be quick.
TEST(ReferenceGpu, Matmul4096IsFast) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 4096;
  GraphBuilder b;
  b.g.name = "matmul_4096";
  const int a = b.tensor("a", {1, n, n}, DType::kBF16);
  const int bb = b.tensor("b", {1, n, n}, DType::kBF16);
  const int y = b.tensor("y", {1, n, n}, DType::kBF16);
  b.op("mm", MatmulAttrs{}, {{"a", a}, {"b", bb}}, y);
  const std::map<std::string, HostTensor> in = random_inputs(b.g, 5);
  DeviceBuffers buf;
  void* da = buf.alloc(in.at("a").data.size());
  void* db = buf.alloc(in.at("b").data.size());
  float* dy = static_cast<float*>(buf.alloc(n * n * sizeof(float)));
  ASSERT_TRUE(da && db && dy);
  ASSERT_CUDA(cudaMemcpy(da, in.at("a").data.data(), in.at("a").data.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemcpy(db, in.at("b").data.data(), in.at("b").data.size(), cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  const Status st = reference_gpu(b.g, {{"a", da}, {"b", db}}, {{"y", dy}});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_LT(seconds, 2.0);
  std::printf("matmul 4096^3 GPU reference: %.1f ms\n", seconds * 1e3);
  std::vector<float> got(n * n);
  ASSERT_CUDA(cudaMemcpy(got.data(), dy, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (int64_t m : {int64_t{0}, int64_t{1}, n / 2, n - 1})
    for (int64_t c : {int64_t{0}, int64_t{7}, n / 3, n - 1}) {
      double acc = 0;
      for (int64_t k = 0; k < n; ++k) acc += in.at("a").at({0, m, k}) * in.at("b").at({0, k, c});
      EXPECT_NEAR(got[m * n + c], acc, 1e-3 * (1 + std::fabs(acc))) << m << "," << c;
    }
}

// sdpa_fwd: GQA, causal, stats; bshd inputs; a key count over one chunk (1024).
ResolvedGraph sdpa_resolved(const std::string& name, int64_t B, int64_t Hq, int64_t Hk, int64_t Sq,
                            int64_t Skv, int64_t D, bool causal, bool stats, const std::string& layout = "") {
  GraphSpec spec;
  spec.name = name;
  spec.tensor("q", {B, Hq, Sq, D}, layout);
  spec.tensor("k", {B, Hk, Skv, D}, layout);
  spec.tensor("v", {B, Hk, Skv, D}, layout);
  SdpaFwdAttrs a;
  a.causal = causal;
  a.generate_stats = stats;
  spec.output(spec.sdpa_fwd("attn", "q", "k", "v", a), layout);
  if (stats) spec.output("attn.stats");
  auto g = resolve(spec);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : ResolvedGraph{};
}

// Paged K/V: the GPU reference reads the pools through the (shuffled) page
// tables as the CPU one does; a table entry past the pool is refused before
// any kernel reads through it.
TEST(ReferenceGpu, SdpaPagedExamplesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::string dir = std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/small/";
  for (const char* f : {"sdpa_paged_decode_small.json", "sdpa_paged_prefill_small.json"}) {
    auto spec = load_graph_file(dir + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    auto in = make_inputs(*g, 3);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    expect_gpu_matches_cpu_on(*g, *in);
  }
  auto spec = load_graph_file(dir + "sdpa_paged_decode_small.json");
  ASSERT_TRUE(spec.ok());
  auto g = resolve(*spec);
  ASSERT_TRUE(g.ok());
  auto in = make_inputs(*g, 3);
  ASSERT_TRUE(in.ok());
  std::vector<double> bad(24, 0.0);
  bad[9] = 24;  // batch entry 1, slot 1: one past the 24-page pool
  (*in)["page_table_k"] = testing_util::host_from(g->tensors[g->find_tensor("page_table_k")], bad);
  DeviceBuffers buffers;
  std::map<std::string, const void*> dev_in;
  for (const auto& [name, h] : *in) {
    void* p = buffers.alloc(h.data.size());
    ASSERT_NE(p, nullptr);
    ASSERT_CUDA(cudaMemcpy(p, h.data.data(), h.data.size(), cudaMemcpyHostToDevice));
    dev_in[name] = p;
  }
  float* o = static_cast<float*>(buffers.alloc(3 * 8 * 64 * sizeof(float)));
  float* stats = static_cast<float*>(buffers.alloc(3 * 8 * sizeof(float)));
  const Status st = reference_gpu(*g, dev_in, {{"o", o}, {"stats", stats}}, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("batch entry 1 (slot 1)"), std::string::npos) << st.ToString();
}

TEST(ReferenceGpu, SdpaGqaCausalWithStats) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(sdpa_resolved("sdpa_gqa_causal", 2, 4, 2, 64, 64, 64, true, true));
}

TEST(ReferenceGpu, SdpaBshdLongKeysNonCausal) {
  SKIP_WITHOUT_GPU();
  expect_gpu_matches_cpu(sdpa_resolved("sdpa_bshd_long", 1, 2, 1, 3, 1500, 32, false, true, "bshd"));
}

TEST(ReferenceGpu, SdpaCausalMoreQueriesThanKeys) {
  SKIP_WITHOUT_GPU();
  ResolvedGraph g = sdpa_resolved("sdpa_causal_sq_gt_skv", 1, 2, 2, 40, 16, 16, true, true);
  expect_gpu_matches_cpu(g);
}

// ---- every SDPA variant: masks, padding, bias, ALiBi, GQA, bshd, more keys than one chunk.

using testing_util::make_sdpa;
using testing_util::SdpaCase;
using testing_util::SdpaKind;

std::vector<std::pair<std::string, SdpaCase>> sdpa_variants() {
  std::vector<std::pair<std::string, SdpaCase>> v;
  SdpaCase base;
  base.B = 2, base.Hq = 4, base.Hk = 2, base.Sq = 40, base.Skv = 48, base.D = 64, base.Dv = 32;
  base.dtype = DType::kBF16;
  v.emplace_back("plain", base);
  SdpaCase c = base;
  c.options.causal = true;
  c.bshd = true;
  v.emplace_back("causal_gqa_bshd", c);
  c = base;
  c.options.padding = true;
  c.seq_len_q = {17, 40};
  c.seq_len_kv = {48, 5};
  v.emplace_back("padding", c);
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  v.emplace_back("padding_bottom_right_causal", c);
  c = base;
  c.options.bias = true;
  c.bias_dims = {2, 1, 40, 48};
  v.emplace_back("bias_per_batch", c);
  c.bias_dims = {1, 4, 40, 48};
  c.options.causal = true;
  v.emplace_back("bias_per_head_causal", c);
  c = base;
  c.options.alibi = true;
  c.options.causal = true;
  v.emplace_back("alibi", c);
  c = base;
  c.options.causal = true;
  c.options.left_bound = 7;
  v.emplace_back("sliding_window", c);
  c = base;
  c.options.right_bound = 3;
  c.options.left_bound = 5;
  c.options.alignment = SdpaAlignment::kBottomRight;
  v.emplace_back("band_bottom_right", c);
  c = base;
  c.Sq = 60, c.Skv = 20;
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  v.emplace_back("bottom_right_empty_rows", c);
  c = base;
  c.B = 1, c.Sq = 6, c.Skv = 1500,
  c.Hk = 1;  // keys span two chunks of 1024 (rows too, in backward: Sq below)
  c.options.causal = true;
  c.options.alignment = SdpaAlignment::kBottomRight;
  v.emplace_back("long_keys", c);
  c = base;
  c.B = 1, c.Sq = 1100, c.Skv = 30, c.Hq = 2, c.Hk = 1;
  v.emplace_back("long_rows", c);
  return v;
}

TEST(ReferenceGpu, SdpaFwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c] : sdpa_variants()) {
    SCOPED_TRACE(name);
    const auto p = make_sdpa(c, SdpaKind::kFwd);
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-5, 5e-5});
  }
}

// Gradients cancel (sum_j dS_ij = 0), so fp32 accumulation order shows more than in forward.
TEST(ReferenceGpu, SdpaBwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c] : sdpa_variants()) {
    SCOPED_TRACE(name);
    auto p = make_sdpa(c, SdpaKind::kBwd);
    ASSERT_TRUE(derive_sdpa_bwd_inputs(p.g, p.inputs).ok());
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-4, 5e-4});
  }
}

// P rounds to e4m3 from fp32 here and fp64 there: a P on a rounding tie may land one
// e4m3 step apart, hence the looser tolerance.
TEST(ReferenceGpu, SdpaFp8FwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c0] : sdpa_variants()) {
    if (c0.options.bias) continue;  // cuDNN's FP8 SDPA takes no bias; the references would
    SdpaCase c = c0;
    c.D = c.Dv = 64;
    SCOPED_TRACE(name);
    const auto p = make_sdpa(c, SdpaKind::kFp8Fwd);
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-3, 2e-2});
  }
}

// derive_sdpa_bwd_inputs on the GPU (cpu_max_flops 0) gives the CPU's o and stats.
TEST(ReferenceGpu, SdpaDeriveBwdInputsOnGpu) {
  SKIP_WITHOUT_GPU();
  SdpaCase c = sdpa_variants()[3].second;  // padding, bottom-right causal
  auto gpu = make_sdpa(c, SdpaKind::kBwd), cpu = make_sdpa(c, SdpaKind::kBwd);
  ASSERT_TRUE(derive_sdpa_bwd_inputs(gpu.g, gpu.inputs, 0).ok());
  ASSERT_TRUE(derive_sdpa_bwd_inputs(cpu.g, cpu.inputs).ok());
  for (const char* name : {"o", "stats"}) {
    const std::vector<float> a = gpu.inputs.at(name).to_float_logical(),
                             b = cpu.inputs.at(name).to_float_logical();
    ASSERT_EQ(a.size(), b.size());
    for (size_t e = 0; e < a.size(); ++e) {
      if (std::isinf(b[e]))
        EXPECT_EQ(a[e], b[e]) << name << " " << e;
      else
        EXPECT_NEAR(a[e], b[e], 1e-2 * (1 + std::fabs(b[e]))) << name << " " << e;  // a bf16 step
    }
  }
}

// Dropout: every variant with dropout 0.25 and a fed-in keep-mask (as cuDNN's
// RNG dump gives it), through the same kernels.
std::vector<std::pair<std::string, SdpaCase>> sdpa_dropout_variants() {
  std::vector<std::pair<std::string, SdpaCase>> v = sdpa_variants();
  for (auto& [name, c] : v) {
    c.options.dropout = 0.25;
    c.options.dump_dropout_mask = true;
    name += "_dropout";
  }
  return v;
}

TEST(ReferenceGpu, SdpaDropoutFwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c] : sdpa_dropout_variants()) {
    SCOPED_TRACE(name);
    const auto p = make_sdpa(c, SdpaKind::kFwd);
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-5, 5e-5});
  }
}

TEST(ReferenceGpu, SdpaDropoutBwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c] : sdpa_dropout_variants()) {
    SCOPED_TRACE(name);
    auto p = make_sdpa(c, SdpaKind::kBwd);
    ASSERT_TRUE(derive_sdpa_bwd_inputs(p.g, p.inputs).ok());
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-4, 5e-4});
  }
}

TEST(ReferenceGpu, SdpaDropoutFp8FwdEveryVariant) {
  SKIP_WITHOUT_GPU();
  for (const auto& [name, c0] : sdpa_dropout_variants()) {
    if (c0.options.bias) continue;
    SdpaCase c = c0;
    c.D = c.Dv = 64;
    SCOPED_TRACE(name);
    const auto p = make_sdpa(c, SdpaKind::kFp8Fwd);
    expect_gpu_matches_cpu_on(p.g, p.inputs, {2e-3, 2e-2});
  }
}

// reference_gpu_host leaves the mask out of its outputs, and needs it among the inputs;
// derive_sdpa_bwd_inputs on the GPU gives the CPU's (dropout-free) o and stats.
TEST(ReferenceGpu, SdpaDropoutHostAndDerive) {
  SKIP_WITHOUT_GPU();
  SdpaCase c = sdpa_dropout_variants()[1].second;  // causal, GQA, bshd
  auto p = make_sdpa(c, SdpaKind::kFwd);
  auto gpu = reference_gpu_host(p.g, p.inputs);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  EXPECT_EQ(gpu->count("dropout_mask"), 0u);
  auto cpu = reference_cpu(p.g, p.inputs);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  for (const auto& [name, values] : *cpu) {
    const Comparison cmp = compare(name, values, gpu->at(name), {2e-5, 5e-5});
    EXPECT_TRUE(cmp.pass) << cmp.ToString();
  }
  p.inputs.erase("dropout_mask");
  gpu = reference_gpu_host(p.g, p.inputs);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(gpu.status().message().find("declare a 'dropout_mask' output to verify dropout"),
            std::string::npos)
      << gpu.status().message();

  auto on_gpu = make_sdpa(c, SdpaKind::kBwd), on_cpu = make_sdpa(c, SdpaKind::kBwd);
  ASSERT_TRUE(derive_sdpa_bwd_inputs(on_gpu.g, on_gpu.inputs, 0).ok());
  ASSERT_TRUE(derive_sdpa_bwd_inputs(on_cpu.g, on_cpu.inputs).ok());
  for (const char* name : {"o", "stats"}) {
    const std::vector<float> a = on_gpu.inputs.at(name).to_float_logical(),
                             b = on_cpu.inputs.at(name).to_float_logical();
    ASSERT_EQ(a.size(), b.size());
    for (size_t e = 0; e < a.size(); ++e)
      EXPECT_NEAR(a[e], b[e], 1e-2 * (1 + std::fabs(b[e]))) << name << " " << e;
  }
}

// The GPU reference exists for long sequences: forward and backward at S = 4096
// must take seconds.
TEST(ReferenceGpu, SdpaLongSequenceIsFast) {
  SKIP_WITHOUT_GPU();
  SdpaCase c;
  c.B = 1, c.Hq = 8, c.Hk = 2, c.Sq = 4096, c.Skv = 4096, c.D = 128, c.Dv = 128;
  c.dtype = DType::kBF16;
  c.options.causal = true;
  auto p = make_sdpa(c, SdpaKind::kBwd);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(derive_sdpa_bwd_inputs(p.g, p.inputs, 0).ok());  // the forward, on the GPU
  const auto t1 = std::chrono::steady_clock::now();
  auto r = reference_gpu_host(p.g, p.inputs);
  const auto t2 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const double fwd_s = std::chrono::duration<double>(t1 - t0).count(),
               bwd_s = std::chrono::duration<double>(t2 - t1).count();
  std::printf("sdpa GPU reference, B=1 Hq=8 Hk=2 S=4096 D=128 causal: forward %.2f s, backward %.2f s\n",
              fwd_s, bwd_s);
  EXPECT_LT(fwd_s + bwd_s, 30.0);
  for (const auto& [name, v] : *r)
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << name;
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Norm ops: the GPU reference against the CPU one on every norm example (small
// and large: 8192 x 4096) and on a rank-3 x normalized over its last dim.
TEST(ReferenceGpu, NormOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* f :
       {"small/layernorm_small.json", "small/rmsnorm_bias_small.json", "small/layernorm_bwd_small.json",
        "small/rmsnorm_bwd_dbias_small.json", "invalid_add_layernorm.json", "layernorm_train.json",
        "rmsnorm_train.json", "layernorm_bwd.json", "rmsnorm_bwd.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << f << ": " << g.status().ToString();
    // fp32 sums of up to 8192 terms on the GPU (sequential per thread for
    // dscale/dbias: error ~ 8192 * 2^-24 = 5e-4 of a partial sum at worst,
    // far less in practice) against double on the CPU.
    expect_gpu_matches_cpu_on(*g, random_inputs(*g, 7), {1e-4, 1e-4});
  }
  GraphSpec s;
  s.name = "ln_rank3";
  s.tensor("x", {4, 33, 96});
  s.tensor("scale", {1, 1, 96}, "", DType::kFP32);
  s.tensor("bias", {1, 1, 96}, "", DType::kFP32);
  OpSpec op;
  op.name = "ln";
  op.attrs = LayerNormAttrs{1e-3, NormPhase::kTraining};
  op.inputs = {{"x", "x"}, {"scale", "scale"}, {"bias", "bias"}};
  op.outputs = {{"y", "y"}, {"mean", "mean"}, {"inv_variance", "inv_variance"}};
  s.ops.push_back(op);
  s.output("y");
  s.output("mean");
  s.output("inv_variance");
  auto g = resolve(s);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  expect_gpu_matches_cpu_on(*g, random_inputs(*g, 3), {1e-5, 1e-5});
}

// Pool and batchnorm ops: the GPU reference against the CPU one on every
// example (the large ones are the ResNet shapes: 32x64x112x112).
TEST(ReferenceGpu, PoolAndBatchNormOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* f :
       {"small/max_pool_small.json", "small/avg_pool_small.json", "small/avg_pool_exclude_pad_small.json",
        "small/global_avg_pool_small.json", "max_pool_resnet_stem.json", "global_avg_pool.json",
        "small/batchnorm_train_small.json", "small/batchnorm_train_relu_small.json",
        "small/invalid_batchnorm_inference_relu_small.json", "small/batchnorm_bwd_small.json",
        "batchnorm_train.json", "batchnorm_train_relu.json", "invalid_batchnorm_inference_relu.json",
        "batchnorm_bwd.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << f << ": " << g.status().ToString();
    // fp32 sums of up to 401408 terms per channel (block reductions) against
    // double on the CPU: about 1e-6 relative.
    expect_gpu_matches_cpu_on(*g, random_inputs(*g, 7), {1e-4, 1e-4});
  }
}

}  // namespace
}  // namespace fusebox

namespace fusebox {
namespace {

// Reductions: the GPU reference against the CPU one on the reduction and FP8
// epilogue examples, and on a strided (NHWC) x reduced over every mode.
TEST(ReferenceGpu, ReductionOpsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const char* f :
       {"small/reduce_sum_bias_grad_small.json", "small/invalid_reduce_max_rows_small.json",
        "invalid_reduce_mean.json", "small/matmul_gelu_rowsum_small.json",
        "small/conv_relu_channel_sum_small.json", "small/fp8_matmul_bias_relu_amax_small.json",
        "small/fp8_matmul_e5m2_bf16_small.json"}) {
    auto spec = load_graph_file(std::string(FUSEBOX_SOURCE_DIR) + "/examples/graphs/" + f);
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    auto g = resolve(*spec);
    ASSERT_TRUE(g.ok()) << f << ": " << g.status().ToString();
    auto in = random_inputs(*g, 11);
    for (const ResolvedTensor& t : g->tensors)
      if (t.is_input && !t.values.empty()) in[t.name] = testing_util::host_from(t, t.values);
    // fp32 matmul sums on the GPU against double on the CPU.
    expect_gpu_matches_cpu_on(*g, in, {1e-5, 1e-5});
  }
  for (ReductionMode m : {ReductionMode::kSum, ReductionMode::kMax, ReductionMode::kMin, ReductionMode::kAmax,
                          ReductionMode::kMean}) {
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{0, 2, 3}, std::vector<int64_t>{1}, std::vector<int64_t>{}}) {
      GraphSpec s;
      s.name = std::string(reduction_mode_name(m));
      s.tensor("x", {3, 40, 9, 7}, "nhwc");
      s.output(s.reduction("r", m, "x", dims));
      auto g = resolve(s);
      ASSERT_TRUE(g.ok()) << g.status().ToString();
      expect_gpu_matches_cpu_on(*g, random_inputs(*g, 5), {1e-6, 1e-6});
    }
  }
}

}  // namespace
}  // namespace fusebox
