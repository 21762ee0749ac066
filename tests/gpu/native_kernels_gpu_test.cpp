// fusebox's own kernels for graphs cuDNN 9.19 runs slowly (src/kernels/norm.cu,
// pool.cu; kernels::faster_native_kernel): each path against the references
// on random inputs, eager and as a CUDA graph, over shapes, dtypes and layouts
// that take the 16-byte path, the one-value path, several row dims and
// strided rows; and a pinned cuDNN engine still runs cuDNN.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusebox/graph.h"
#include "fusebox/plan.h"
#include "fusebox/runtime.h"
#include "fusebox/session.h"

namespace fusebox {
namespace {

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A layernorm (rms = false) or rmsnorm graph over x's trailing dims.
std::string norm_json(bool rms, const std::vector<int64_t>& x, const std::vector<int64_t>& scale,
                      const char* io, const char* layout, bool training, bool bias) {
  const std::string lay = layout ? std::string(R"(, "layout": ")") + layout + "\"" : "";
  std::string t = R"({"name": "x", "dims": )" + dims_text(x) + lay + "}," + R"({"name": "scale", "dims": )" +
                  dims_text(scale) + lay + R"(, "dtype": "fp32"},)";
  if (bias) t += R"({"name": "bias", "dims": )" + dims_text(scale) + lay + R"(, "dtype": "fp32"},)";
  t += R"({"name": "y")" + lay + "}";
  std::string outs = R"("y": "y")";
  if (training) {
    if (!rms) {
      t += R"(, {"name": "mean", "dtype": "fp32"})";
      outs += R"(, "mean": "mean")";
    }
    t += R"(, {"name": "inv_variance", "dtype": "fp32"})";
    outs += R"(, "inv_variance": "inv_variance")";
  }
  return std::string(R"({"name": "norm", "io_dtype": ")") + io +
         R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [)" + t +
         R"(], "ops": [{"op": ")" + (rms ? "rmsnorm" : "layernorm") + R"(", "name": "n", "epsilon": 1e-5, )" +
         R"("inputs": {"x": "x", "scale": "scale")" + (bias ? R"(, "bias": "bias")" : "") +
         R"(}, "outputs": {)" + outs + "}}]}";
}

std::string pool_json(const std::vector<int64_t>& x, const char* io, const char* layout,
                      const char* op_fields) {
  return std::string(R"({"name": "gap", "io_dtype": ")") + io +
         R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [{"name": "x", "dims": )" +
         dims_text(x) + R"(, "layout": ")" + layout + R"("}, {"name": "y", "layout": ")" + layout +
         R"("}], "ops": [)" + op_fields + "]}";
}

class NativeKernelsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
    auto ctx = GpuContext::create(0);
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
    auto t = DeviceTarget::live_gpu(0);
    ASSERT_TRUE(t.ok());
    target_ = *t;
  }
  ResolvedGraph load(const std::string& json) {
    auto spec = parse_graph_json(json);
    EXPECT_TRUE(spec.ok()) << spec.status().ToString() << "\n" << json;
    auto g = resolve(*spec);
    EXPECT_TRUE(g.ok()) << g.status().ToString() << "\n" << json;
    return *g;
  }
  // Builds `json` (with `pin`, `engine` pinned: a kernel not taken by default), expects `engine`,
  // runs it eager and as a CUDA graph, verified.
  void check(const std::string& json, const std::string& engine, bool pin = false) {
    SCOPED_TRACE(json);
    ResolvedGraph g = load(json);
    BuildReport report;
    BuildOptions options;
    if (pin) options.engine = engine;
    auto plan = build_plan(g, target_, options, &report, ctx_.get());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(plan->engine_name(), engine);
    for (bool graph : {false, true}) {
      RunOptions opt;
      opt.verify = true;
      opt.iters = 0;
      opt.seed = 23;
      opt.cuda_graph = graph;
      auto r = run_plan(g, *plan, *ctx_, opt);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_TRUE(r->verified_ok);
      EXPECT_FALSE(r->comparisons.empty());
      for (const auto& cmp : r->comparisons) {
        EXPECT_TRUE(cmp.pass) << cmp.ToString();
        EXPECT_EQ(cmp.non_finite, 0) << cmp.ToString();
      }
    }
  }
  std::unique_ptr<GpuContext> ctx_;
  DeviceTarget target_;
};

TEST_F(NativeKernelsGpu, LayerNormAndRmsNormWithFp32ParamsMatchTheReferences) {
  // 16-byte path, training and inference, the benchmark's shape.
  check(norm_json(false, {8192, 4096, 1, 1}, {1, 4096, 1, 1}, "bf16", "nhwc", true, true),
        "fusebox_layernorm");
  check(norm_json(false, {512, 768, 1, 1}, {1, 768, 1, 1}, "fp16", "nhwc", false, true), "fusebox_layernorm");
  check(norm_json(true, {8192, 4096, 1, 1}, {1, 4096, 1, 1}, "bf16", "nhwc", true, false), "fusebox_rmsnorm");
  check(norm_json(true, {300, 1024, 1, 1}, {1, 1024, 1, 1}, "bf16", "nhwc", false, true), "fusebox_rmsnorm");
  // [B, S, H] with [1, 1, H]: two row dims; a large row (16384) and a small one (8).
  check(norm_json(false, {4, 77, 16384}, {1, 1, 16384}, "bf16", nullptr, true, true), "fusebox_layernorm");
  check(norm_json(true, {3, 5, 8}, {1, 1, 8}, "fp16", nullptr, true, false), "fusebox_rmsnorm");
  // Rows not a multiple of 8: one value per load.
  check(norm_json(false, {257, 1001, 1, 1}, {1, 1001, 1, 1}, "bf16", "nhwc", true, true),
        "fusebox_layernorm");
  check(norm_json(true, {64, 13, 1, 1}, {1, 13, 1, 1}, "fp16", "nhwc", true, true), "fusebox_rmsnorm");
  // Normalized over C, H, W of an NHWC tensor: the row is dense (C fastest).
  check(norm_json(false, {16, 24, 5, 7}, {1, 24, 5, 7}, "bf16", "nhwc", true, true), "fusebox_layernorm");
}

// A paged decode attention graph (one query per sequence) as the serving engine declares it:
// q [B, H, 1, D] (rows `q_row` apart when given), pools [pages, KVH, page, D], one table for K
// and V, random lengths (the graph's values leave seq_len_kv random), `mask` the op's mask fields.
// `fp8`: an FP8 cache, e4m3 pools with fp32 descales "dk" and "dv" of dims `fp8` (one per row or
// [1, 1, 1, 1]). `sq` query rows a sequence (a prompt over the cache: 1 to sq of them kept).
std::string decode_json(int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t page, int64_t max_pages,
                        const char* io, const char* mask, int64_t q_row = 0, const char* fp8 = nullptr,
                        int64_t sq = 1) {
  const int64_t pages = B * max_pages + 3;
  const std::string pool_dtype = fp8 ? R"(, "dtype": "fp8_e4m3")" : "";
  const std::string descales = fp8 ? std::string(R"({"name": "dk", "dtype": "fp32", "dims": )") + fp8 +
                                         R"(}, {"name": "dv", "dtype": "fp32", "dims": )" + fp8 + "},"
                                   : std::string();
  const std::string q_strides = q_row ? ", \"strides\": " + dims_text({sq * q_row, D, q_row, 1})
                                      : std::string(", \"layout\": \"bshd\"");
  std::string ones;
  for (int64_t b = 0; b < B; ++b)  // some padding rows
    ones += (b ? ", " : "") + std::to_string(b % 7 == 3 ? 0 : b % 2 ? sq : 1 + b % sq);
  return std::string(R"({"name": "decode", "io_dtype": ")") + io +
         R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [)" +
         R"({"name": "q", "dims": )" + dims_text({B, H, sq, D}) + q_strides + "}," +
         R"({"name": "k", "dims": )" + dims_text({pages, KVH, page, D}) + pool_dtype + "}," +
         R"({"name": "v", "dims": )" + dims_text({pages, KVH, page, D}) + pool_dtype + "}," + descales +
         R"({"name": "table", "dims": )" + dims_text({B, 1, max_pages, 1}) + R"(, "dtype": "int32"},)" +
         R"({"name": "lq", "dims": )" + dims_text({B, 1, 1, 1}) + R"(, "dtype": "int32", "values": [)" +
         ones + "]}," + R"({"name": "lkv", "dims": )" + dims_text({B, 1, 1, 1}) + R"(, "dtype": "int32"},)" +
         R"({"name": "o", "layout": "bshd"}], "ops": [{"op": "sdpa_fwd", "name": "attn", )" + mask +
         R"("max_seq_len_kv": )" + std::to_string(max_pages * page) +
         R"(, "inputs": {"q": "q", "k": "k", "v": "v", "seq_len_q": "lq", "seq_len_kv": "lkv", )" +
         (fp8 ? R"("descale_k": "dk", "descale_v": "dv", )" : "") +
         R"("page_table_k": "table", "page_table_v": "table"}, "outputs": {"o": "o"}}]})";
}

// An FP8 cache (e4m3 K and V, fp32 descales per row or per tensor): fusebox_sdpa_decode by default
// (cuDNN 9.19 has no such SDPA); 8-byte loads, and one value at a time (q rows 324 values apart).
TEST_F(NativeKernelsGpu, PagedDecodeAttentionOverAnFp8CacheMatchesTheReferences) {
  const char* causal = R"("causal": true, "alignment": "bottom_right", )";
  check(decode_json(64, 32, 8, 64, 16, 8, "bf16", causal, 40 * 64, "[515, 8, 16, 1]"), "fusebox_sdpa_decode");
  check(decode_json(1, 32, 8, 64, 16, 128, "bf16", causal, 0, "[131, 8, 16, 1]"), "fusebox_sdpa_decode");
  check(decode_json(8, 16, 4, 128, 32, 4, "fp16", causal, 0, "[1, 1, 1, 1]"), "fusebox_sdpa_decode");
  check(decode_json(5, 8, 2, 40, 16, 6, "bf16", "", 324, "[33, 2, 16, 1]"), "fusebox_sdpa_decode");
  // Negative descales (the op allows any): every tile's V descales below zero, so a tile scaled by
  // its largest descale instead of its largest magnitude would drop out.
  check(decode_json(16, 32, 8, 64, 16, 8, "bf16", causal, 0, R"([1, 1, 1, 1], "values": [-0.5])"),
        "fusebox_sdpa_decode");
  // Prompts over the cache (several query rows a sequence): the serving engine's FP8 prefill.
  check(decode_json(4, 32, 8, 64, 16, 16, "bf16", causal, 40 * 64, "[67, 8, 16, 1]", 37),
        "fusebox_sdpa_decode");
  check(decode_json(3, 16, 2, 128, 32, 5, "fp16", causal, 0, "[1, 1, 1, 1]", 9), "fusebox_sdpa_decode");
  check(decode_json(2, 8, 4, 48, 16, 4, "bf16", causal, 0, "[11, 4, 16, 1]", 5), "fusebox_sdpa_decode");
}

TEST_F(NativeKernelsGpu, PagedDecodeAttentionMatchesTheReferences) {
  const char* causal = R"("causal": true, "alignment": "bottom_right", )";
  // The Llama-3.2-1B decode step (group 4, D 64) at batch 16 and 64, q read from the fused rows.
  check(decode_json(16, 32, 8, 64, 16, 16, "bf16", causal, 40 * 64), "fusebox_sdpa_decode", true);
  check(decode_json(64, 32, 8, 64, 16, 8, "bf16", causal), "fusebox_sdpa_decode", true);
  // Group 1, 2 and 8; D 128 (4 values a lane), 96 (not a power of two), 32; fp16; 64-token pages.
  check(decode_json(130, 4, 4, 128, 64, 3, "fp16", causal), "fusebox_sdpa_decode", true);
  check(decode_json(64, 8, 4, 96, 16, 5, "bf16", causal), "fusebox_sdpa_decode", true);
  check(decode_json(16, 64, 8, 128, 32, 4, "bf16", ""), "fusebox_sdpa_decode", true);
  check(decode_json(200, 1, 1, 32, 16, 2, "bf16", causal), "fusebox_sdpa_decode", true);
  // A sliding window (the last 5 keys), no causal bound.
  check(decode_json(32, 8, 4, 64, 16, 6, "bf16", R"("left_bound": 5, "alignment": "bottom_right", )"),
        "fusebox_sdpa_decode", true);
  // Few sequences: batch 1 of the 1B shapes at 2048 tokens (32 chunks), batch 8 over 128 keys (2),
  // a sliding window of 5 keys over 10 chunks (most of them empty), padding rows (4 sequences, one
  // with no query), group 8 with D 128.
  check(decode_json(1, 32, 8, 64, 16, 128, "bf16", causal, 40 * 64), "fusebox_sdpa_decode", true);
  check(decode_json(8, 32, 8, 64, 16, 8, "bf16", causal), "fusebox_sdpa_decode", true);
  check(decode_json(2, 8, 4, 64, 16, 40, "bf16", R"("left_bound": 5, "alignment": "bottom_right", )"),
        "fusebox_sdpa_decode", true);
  check(decode_json(4, 8, 2, 64, 16, 20, "fp16", causal), "fusebox_sdpa_decode", true);
  check(decode_json(2, 16, 2, 128, 64, 10, "bf16", ""), "fusebox_sdpa_decode", true);
  // Several query rows a sequence (pinned; cuDNN takes bf16 prompts by default).
  check(decode_json(4, 32, 8, 64, 16, 12, "bf16", causal, 0, nullptr, 21), "fusebox_sdpa_decode", true);
  check(decode_json(3, 8, 8, 128, 16, 4, "fp16", R"("left_bound": 7, "alignment": "bottom_right", )", 0,
                    nullptr, 6),
        "fusebox_sdpa_decode", true);
  {
    ResolvedGraph one = load(decode_json(1, 32, 8, 64, 16, 128, "bf16", causal));
    BuildOptions pinned;
    pinned.engine = "fusebox_sdpa_decode";
    auto plan = build_plan(one, target_, pinned, nullptr, ctx_.get());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_GT(plan->workspace_bytes(), 0) << "the split blocks' partials";
  }
  // A pool of one chunk (48 keys): one block a pair, o written directly, no workspace.
  ResolvedGraph few = load(decode_json(8, 32, 8, 64, 16, 3, "bf16", causal));
  BuildOptions pinned;
  pinned.engine = "fusebox_sdpa_decode";
  auto plan = build_plan(few, target_, pinned, nullptr, ctx_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->engine_name(), "fusebox_sdpa_decode");
  EXPECT_EQ(plan->workspace_bytes(), 0);
  // Not pinned: cuDNN's engine (measured faster, native_kernel.cpp).
  auto by_default = build_plan(few, target_, BuildOptions{}, nullptr, ctx_.get());
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  EXPECT_FALSE(by_default->native()) << by_default->engine_name();
}

// Sequence 0 of a batch of 64 and the same sequence alone (its page table row, its query, the same
// pool): bit for bit the same output (the serving engine's "batching changes nothing").
TEST_F(NativeKernelsGpu, PagedDecodeAttentionRowsDoNotDependOnTheBatch) {
  const char* causal = R"("causal": true, "alignment": "bottom_right", )";
  constexpr int64_t B = 64, H = 32, KVH = 8, D = 64, P = 16, MP = 256, pages = B * MP + 3;
  ResolvedGraph g64 = load(decode_json(B, H, KVH, D, P, MP, "bf16", causal));
  ResolvedGraph g1 = load(decode_json(1, H, KVH, D, P, MP, "bf16", causal));
  auto session = Session::create();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  PlanRequest pinned;
  pinned.engine = "fusebox_sdpa_decode";
  auto p64 = (*session)->get_plan(g64, pinned);
  auto p1 = (*session)->get_plan(g1, pinned);
  ASSERT_TRUE(p64.ok() && p1.ok()) << (p64.ok() ? p1.status().ToString() : p64.status().ToString());
  EXPECT_EQ(p64->engine_name(), "fusebox_sdpa_decode");
  EXPECT_EQ(p1->engine_name(), "fusebox_sdpa_decode");
  uint32_t state = 777;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  auto bf16 = [&](size_t n) {  // random values in (-1, 1)
    std::vector<uint16_t> v(n);
    for (auto& e : v) {
      const float f = 2.f * static_cast<float>(next()) / static_cast<float>(1u << 24) - 1.f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      e = static_cast<uint16_t>(bits >> 16);
    }
    return v;
  };
  const size_t pool = static_cast<size_t>(pages) * KVH * P * D;
  const std::vector<uint16_t> q = bf16(B * H * D), k = bf16(pool), v = bf16(pool);
  // Sequence b's pages: a permutation of the pool, so sequence 0's pages are scattered.
  std::vector<int32_t> table(B * MP), lq(B, 1), lkv(B);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7919) % (B * MP));
  for (auto& n : lkv) n = static_cast<int32_t>(1 + next() % (MP * P));
  lkv[0] = 3001;
  std::vector<void*> bufs;
  auto up = [&bufs](const void* host, size_t bytes) {
    void* d = nullptr;
    if (cudaMalloc(&d, bytes) != cudaSuccess) return static_cast<void*>(nullptr);
    bufs.push_back(d);
    cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    return d;
  };
  void *dq = up(q.data(), q.size() * 2), *dk = up(k.data(), pool * 2), *dv = up(v.data(), pool * 2),
       *dt = up(table.data(), table.size() * 4), *dlq = up(lq.data(), B * 4), *dlkv = up(lkv.data(), B * 4);
  std::vector<uint16_t> zeros(B * H * D, 0);
  void *do64 = up(zeros.data(), zeros.size() * 2), *do1 = up(zeros.data(), H * D * 2);
  ASSERT_EQ(bufs.size(), 8u);
  auto b64 = (*session)->bind(
      *p64, {{"q", dq}, {"k", dk}, {"v", dv}, {"table", dt}, {"lq", dlq}, {"lkv", dlkv}, {"o", do64}});
  // The B = 1 graph declares a pool of MP + 3 pages (the start of the same buffer): sequence 0 reads
  // pages 0 to MP - 1 in both graphs.
  std::vector<int32_t> row0(MP);
  for (int64_t i = 0; i < MP; ++i) row0[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::vector<int32_t> t64 = table;
  for (int64_t i = 0; i < MP; ++i) t64[static_cast<size_t>(i)] = static_cast<int32_t>(i);  // the same pages
  ASSERT_EQ(cudaMemcpy(dt, t64.data(), t64.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  void* dt1 = up(row0.data(), MP * 4);
  auto b1 = (*session)->bind(
      *p1, {{"q", dq}, {"k", dk}, {"v", dv}, {"table", dt1}, {"lq", dlq}, {"lkv", dlkv}, {"o", do1}});
  ASSERT_TRUE(b64.ok() && b1.ok()) << (b64.ok() ? b1.status().ToString() : b64.status().ToString());
  ASSERT_TRUE(b64->execute().ok());
  ASSERT_TRUE(b1->execute().ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> o64(H * D), o1(H * D);
  ASSERT_EQ(cudaMemcpy(o64.data(), do64, o64.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(o1.data(), do1, o1.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int differ = 0, nonzero = 0;
  for (size_t j = 0; j < o1.size(); ++j) {
    differ += o64[j] != o1[j];
    nonzero += o1[j] != 0;
  }
  EXPECT_EQ(differ, 0) << "of " << o1.size() << " values of sequence 0";
  EXPECT_GT(nonzero, static_cast<int>(o1.size()) / 2)
      << "the output is mostly zeros: the inputs did not arrive";
  for (void* p : bufs) cudaFree(p);
}

// y = epilogue(a [1, m, k] x w [1, k, n]): `epi` "" (none), a unary op, or "add", "mul", "sub" with
// r [1, m, n] (`product_first`: the product is input a); y of `y_dtype` (io when null).
// With `norm_scale` (the gain's dtype), an RMSNorm of a over k (epsilon 1e-5) comes first: the matmul
// reads its virtual output.
std::string gemv_json(int m, int k, int n, const char* io, const std::string& epi, bool product_first = true,
                      const char* y_dtype = nullptr, const char* r_dtype = nullptr,
                      const char* norm_scale = nullptr) {
  const bool binary = epi == "add" || epi == "mul" || epi == "sub";
  auto dims = [](int x, int y) { return "[1, " + std::to_string(x) + ", " + std::to_string(y) + "]"; };
  std::string t = R"({"name": "a", "dims": )" + dims(m, k) + R"(}, {"name": "w", "dims": )" + dims(k, n) +
                  R"(}, {"name": "y")" + (y_dtype ? std::string(R"(, "dtype": ")") + y_dtype + "\"" : "") +
                  "}";
  if (binary)
    t += R"(, {"name": "r", "dims": )" + dims(m, n) +
         (r_dtype ? std::string(R"(, "dtype": ")") + r_dtype + "\"" : "") + "}";
  std::string ops;
  if (norm_scale) {
    t += R"(, {"name": "scale", "dims": )" + dims(1, k) + R"(, "dtype": ")" + norm_scale + "\"}";
    ops = R"({"op": "rmsnorm", "name": "n", "epsilon": 1e-5, "inputs": {"x": "a", "scale": "scale"}, )"
          R"("outputs": {"y": "an"}}, )";
  }
  ops += R"({"op": "matmul", "name": "mm", "inputs": {"a": ")" + std::string(norm_scale ? "an" : "a") +
         R"(", "b": "w"}, "outputs": {"y": ")" + (epi.empty() ? "y" : "z") + R"("}})";
  if (binary) {
    ops += R"(, {"op": ")" + epi + R"(", "name": "e", "inputs": {"a": ")" + (product_first ? "z" : "r") +
           R"(", "b": ")" + (product_first ? "r" : "z") + R"("}, "outputs": {"y": "y"}})";
  } else if (!epi.empty()) {
    ops += R"(, {"op": ")" + epi + R"(", "name": "e", "inputs": {"x": "z"}, "outputs": {"y": "y"}})";
  }
  return std::string(R"({"name": "gemv", "io_dtype": ")") + io +
         R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [)" + t + R"(], "ops": [)" +
         ops + "]}";
}

// y = act(a w_gate) * (a w_up), a [1, m, k], both weights [1, k, n] (the gated form), with an RMSNorm
// of a first when `norm_scale` names the gain's dtype.
std::string gated_gemv_json(int m, int k, int n, const char* io, const char* act, const char* norm_scale) {
  auto dims = [](int x, int y) { return "[1, " + std::to_string(x) + ", " + std::to_string(y) + "]"; };
  std::string t = R"({"name": "a", "dims": )" + dims(m, k) + R"(}, {"name": "wg", "dims": )" + dims(k, n) +
                  R"(}, {"name": "wu", "dims": )" + dims(k, n) + R"(}, {"name": "y"})";
  std::string ops;
  if (norm_scale) {
    t += R"(, {"name": "scale", "dims": )" + dims(1, k) + R"(, "dtype": ")" + norm_scale + "\"}";
    ops = R"({"op": "rmsnorm", "name": "n", "epsilon": 1e-5, "inputs": {"x": "a", "scale": "scale"}, )"
          R"("outputs": {"y": "an"}}, )";
  }
  const std::string in = norm_scale ? "an" : "a";
  ops +=
      R"({"op": "matmul", "name": "g", "inputs": {"a": ")" + in +
      R"(", "b": "wg"}, "outputs": {"y": "zg"}}, {"op": ")" + act +
      R"(", "name": "s", "inputs": {"x": "zg"}, "outputs": {"y": "sg"}}, {"op": "matmul", "name": "u", )"
      R"("inputs": {"a": ")" +
      in +
      R"(", "b": "wu"}, "outputs": {"y": "zu"}}, {"op": "mul", "name": "m", "inputs": {"a": "sg", "b": "zu"}, )"
      R"("outputs": {"y": "y"}})";
  return std::string(R"({"name": "gated", "io_dtype": ")") + io +
         R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [)" + t + R"(], "ops": [)" +
         ops + "]}";
}

TEST_F(NativeKernelsGpu, FewRowMatmulsMatchTheReferences) {
  // The Llama-3.2-1B decode GEMMs (16-byte loads) at batch 1, 4 and 8: fused QKV, the output
  // projection with the residual, the gate with SiLU, the up projection times the gate, the down
  // projection with the residual; the LM head into fp32 logits (wide: 8 column threads a block).
  check(gemv_json(1, 2048, 3072, "bf16", ""), "fusebox_gemv");
  check(gemv_json(1, 2048, 2048, "bf16", "add"), "fusebox_gemv");
  check(gemv_json(8, 2048, 8192, "bf16", "silu"), "fusebox_gemv");
  check(gemv_json(4, 2048, 8192, "bf16", "mul", false), "fusebox_gemv");
  check(gemv_json(1, 8192, 2048, "bf16", "add"), "fusebox_gemv");
  check(gemv_json(2, 2048, 32000, "bf16", "", true, "fp32"), "fusebox_gemv");
  // Sizes that are not multiples of 8 (one value a load), fp16, 3, 5 and 7 rows, the product as
  // sub's second input, fp32 outputs and epilogue tensors, each activation.
  check(gemv_json(3, 1001, 1100, "fp16", "sub", false), "fusebox_gemv");
  check(gemv_json(5, 1024, 1030, "fp16", "gelu_erf", true, "fp32"), "fusebox_gemv");
  check(gemv_json(7, 4096, 512, "bf16", "add", true, nullptr, "fp32"), "fusebox_gemv");
  for (const char* act : {"relu", "sigmoid", "tanh", "gelu_tanh"})
    check(gemv_json(2, 1024, 1024, "bf16", act), "fusebox_gemv");
  // An RMSNorm before the matmul (fp32 and bf16 gains): the serving engine's QKV, gate and up
  // projections of the normalized residual stream; unaligned sizes too.
  check(gemv_json(1, 2048, 3072, "bf16", "", true, nullptr, nullptr, "fp32"), "fusebox_gemv");
  check(gemv_json(8, 2048, 8192, "bf16", "silu", true, nullptr, nullptr, "fp32"), "fusebox_gemv");
  check(gemv_json(4, 2048, 8192, "bf16", "mul", false, nullptr, nullptr, "bf16"), "fusebox_gemv");
  check(gemv_json(3, 1001, 1100, "fp16", "", true, nullptr, nullptr, "fp32"), "fusebox_gemv");
  // Gated (the SwiGLU's gate and up projections in one pass): the 1B shapes at 1 and 8 rows (two
  // block rows of 4) with the RMSNorm, unaligned fp16 without it, another activation.
  check(gated_gemv_json(1, 2048, 8192, "bf16", "silu", "fp32"), "fusebox_gemv");
  check(gated_gemv_json(8, 2048, 8192, "bf16", "silu", "bf16"), "fusebox_gemv");
  check(gated_gemv_json(3, 1001, 1100, "fp16", "silu", nullptr), "fusebox_gemv");
  check(gated_gemv_json(2, 1024, 2048, "bf16", "gelu_tanh", "fp32"), "fusebox_gemv");
  // 16 rows, pinned: fusebox_gemv's block rows of 8 (the deterministic mode's decode step).
  check(gemv_json(16, 2048, 2048, "bf16", "add"), "fusebox_gemv", true);
  // 65 rows: cuDNN.
  ResolvedGraph rows65 = load(gemv_json(65, 2048, 2048, "bf16", ""));
  auto plan = build_plan(rows65, target_, BuildOptions{}, nullptr, ctx_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_FALSE(plan->native()) << plan->engine_name();
}

// Pinned (cuDNN's GEMMs are faster, skinny_gemm.h).
TEST_F(NativeKernelsGpu, SkinnyTensorCoreMatmulsMatchTheReferences) {
  // The Llama-3.2-1B decode GEMMs at batch 64: QKV, the output projection with the residual, the
  // gate with SiLU, the up projection times the gate (the product second), the down projection
  // with the residual (8 K splits on sm_90, a cluster each).
  check(gemv_json(64, 2048, 3072, "bf16", ""), "fusebox_skinny_gemm", true);
  check(gemv_json(64, 2048, 2048, "bf16", "add"), "fusebox_skinny_gemm", true);
  check(gemv_json(64, 2048, 8192, "bf16", "silu"), "fusebox_skinny_gemm", true);
  check(gemv_json(64, 2048, 8192, "bf16", "mul", false), "fusebox_skinny_gemm", true);
  check(gemv_json(64, 8192, 2048, "bf16", "add"), "fusebox_skinny_gemm", true);
  // 16, 32 and 48 rows (one to three row tiles), 9 rows (a tile mostly padding), fp16; N not a
  // multiple of the 128-column tile and K not a multiple of the 32-row step nor of the splits; fp32
  // outputs and epilogue tensors; the product as sub's second input; every activation.
  check(gemv_json(16, 2048, 2048, "bf16", "add"), "fusebox_skinny_gemm", true);
  check(gemv_json(32, 2048, 8192, "bf16", "silu"), "fusebox_skinny_gemm", true);
  check(gemv_json(48, 4096, 1096, "fp16", "sub", false), "fusebox_skinny_gemm", true);
  check(gemv_json(9, 1032, 1032, "fp16", "gelu_erf", true, "fp32"), "fusebox_skinny_gemm", true);
  check(gemv_json(33, 4104, 520, "bf16", "add", true, nullptr, "fp32"), "fusebox_skinny_gemm", true);
  for (const char* act : {"relu", "sigmoid", "tanh", "gelu_tanh"})
    check(gemv_json(24, 1024, 1024, "bf16", act), "fusebox_skinny_gemm", true);
  // Weights under 2^20 values: one K split.
  check(gemv_json(64, 256, 512, "bf16", "add"), "fusebox_skinny_gemm", true);
}

// The tensor-core form's pointers off 16-byte boundaries run fusebox_gemv's loop (the same plan):
// a 48-row product read from a buffer 2 bytes in, against the same product on aligned buffers.
TEST_F(NativeKernelsGpu, SkinnyMatmulOffSixteenByteBoundariesMatchesAligned) {
  constexpr int M = 48, K = 1024, N = 1024;
  ResolvedGraph g = load(gemv_json(M, K, N, "bf16", ""));
  auto session = Session::create();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  PlanRequest pin;
  pin.engine = "fusebox_skinny_gemm";
  auto plan = (*session)->get_plan(g, pin);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->engine_name(), "fusebox_skinny_gemm");
  uint32_t state = 777;
  std::vector<uint16_t> x(M * K + 8), w(static_cast<size_t>(K) * N + 8);
  for (auto* v : {&x, &w})
    for (auto& e : *v) {
      state = state * 1664525u + 1013904223u;
      const float f = static_cast<float>(state >> 8) / static_cast<float>(1u << 24) - 0.5f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      e = static_cast<uint16_t>(bits >> 16);
    }
  void *dx = nullptr, *dw = nullptr, *dy = nullptr, *dy2 = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, M * N * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy2, M * N * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  // The same values at an offset of one element (2 bytes) in a second copy.
  void *dx1 = nullptr, *dw1 = nullptr;
  ASSERT_EQ(cudaMalloc(&dx1, x.size() * 2 + 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw1, w.size() * 2 + 16), cudaSuccess);
  void* xo = static_cast<char*>(dx1) + 2;
  void* wo = static_cast<char*>(dw1) + 2;
  ASSERT_EQ(cudaMemcpy(xo, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(wo, w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  auto ba = (*session)->bind(*plan, {{"a", dx}, {"w", dw}, {"y", dy}});
  auto bo = (*session)->bind(*plan, {{"a", xo}, {"w", wo}, {"y", dy2}});
  ASSERT_TRUE(ba.ok() && bo.ok()) << (ba.ok() ? bo.status().ToString() : ba.status().ToString());
  ASSERT_TRUE(ba->execute().ok());
  ASSERT_TRUE(bo->execute().ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> y(M * N), y2(M * N);
  ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y2.data(), dy2, y2.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  // Both against a host product in double: the two kernels sum in different orders.
  auto as_float = [](uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  double err = 0, err2 = 0, ref2 = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double r = 0;
      for (int k = 0; k < K; ++k)
        r += static_cast<double>(as_float(x[m * K + k])) * as_float(w[static_cast<size_t>(k) * N + n]);
      const size_t i = static_cast<size_t>(m) * N + n;
      err += (as_float(y[i]) - r) * (as_float(y[i]) - r);
      err2 += (as_float(y2[i]) - r) * (as_float(y2[i]) - r);
      ref2 += r * r;
    }
  EXPECT_GT(ref2, 0.0);
  EXPECT_LT(std::sqrt(err / ref2), 1e-2) << "aligned (tensor cores)";
  EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << "off 16-byte boundaries (fusebox_gemv's loop)";
  for (void* p : {dx, dw, dy, dy2, dx1, dw1}) cudaFree(p);
}

// A row's result does not depend on the other rows (the serving engine's batching changes nothing):
// row 3 of an 8-row product, with the RMSNorm prologue and SiLU, equals that row alone, bit for bit.
TEST_F(NativeKernelsGpu, FewRowMatmulRowsDoNotDependOnTheBatch) {
  constexpr int K = 2048, N = 4096;
  ResolvedGraph g8 = load(gemv_json(8, K, N, "bf16", "silu", true, nullptr, nullptr, "fp32"));
  ResolvedGraph g1 = load(gemv_json(1, K, N, "bf16", "silu", true, nullptr, nullptr, "fp32"));
  auto session = Session::create();
  ASSERT_TRUE(session.ok()) << session.status().ToString();
  auto p8 = (*session)->get_plan(g8);
  auto p1 = (*session)->get_plan(g1);
  ASSERT_TRUE(p8.ok() && p1.ok()) << (p8.ok() ? p1.status().ToString() : p8.status().ToString());
  EXPECT_EQ(p8->engine_name(), "fusebox_gemv");
  EXPECT_EQ(p1->engine_name(), "fusebox_gemv");
  // Random bf16 (the top half of random floats) for x and w, gains in [0.5, 1.5].
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1u << 24);
  };
  auto bf16 = [&](size_t n) {
    std::vector<uint16_t> v(n);
    for (auto& e : v) {
      const float f = 2.f * next() - 1.f;
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      e = static_cast<uint16_t>(bits >> 16);
    }
    return v;
  };
  const std::vector<uint16_t> x = bf16(8 * K), w = bf16(static_cast<size_t>(K) * N);
  std::vector<float> scale(K);
  for (float& f : scale) f = 0.5f + next();
  void *dx = nullptr, *dw = nullptr, *ds = nullptr, *dy8 = nullptr, *dy1 = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&ds, K * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy8, 8 * N * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy1, N * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ds, scale.data(), K * 4, cudaMemcpyHostToDevice), cudaSuccess);
  void* row3 = static_cast<char*>(dx) + 3 * K * 2;
  auto b8 = (*session)->bind(*p8, {{"a", dx}, {"scale", ds}, {"w", dw}, {"y", dy8}});
  auto b1 = (*session)->bind(*p1, {{"a", row3}, {"scale", ds}, {"w", dw}, {"y", dy1}});
  ASSERT_TRUE(b8.ok() && b1.ok()) << (b8.ok() ? b1.status().ToString() : b8.status().ToString());
  ASSERT_TRUE(b8->execute().ok());
  ASSERT_TRUE(b1->execute().ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> y8(8 * N), y1(N);
  ASSERT_EQ(cudaMemcpy(y8.data(), dy8, y8.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y1.data(), dy1, y1.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  int differ = 0, nonzero = 0;
  for (int j = 0; j < N; ++j) {
    differ += y8[3 * N + j] != y1[j];
    nonzero += y1[j] != 0;
  }
  EXPECT_EQ(differ, 0) << "of " << N << " values of row 3";
  EXPECT_GT(nonzero, N / 2) << "the product is mostly zeros: the inputs did not arrive";
  for (void* p : {dx, dw, ds, dy8, dy1}) cudaFree(p);
}

TEST_F(NativeKernelsGpu, GlobalAveragePoolMatchesTheReferences) {
  const char* gap =
      R"({"op": "global_avg_pool", "name": "gap", "inputs": {"x": "x"}, "outputs": {"y": "y"}})";
  check(pool_json({32, 2048, 7, 7}, "bf16", "nhwc", gap), "fusebox_global_avg_pool");
  check(pool_json({256, 2048, 7, 7}, "bf16", "nhwc", gap), "fusebox_global_avg_pool");
  check(pool_json({5, 100, 9, 11}, "fp16", "nchw", gap), "fusebox_global_avg_pool");
  check(pool_json({3, 33, 56, 56}, "fp32", "nhwc", gap), "fusebox_global_avg_pool");
  check(pool_json({2, 40, 3, 5, 6}, "bf16", "ndhwc", gap), "fusebox_global_avg_pool");
  // An avg_pool whose window is the whole spatial extent is the same op.
  check(
      pool_json(
          {4, 64, 7, 7}, "bf16", "nhwc",
          R"({"op": "avg_pool", "name": "p", "window": [7, 7], "inputs": {"x": "x"}, "outputs": {"y": "y"}})"),
      "fusebox_global_avg_pool");
}

std::string reduce_json(const char* op, const std::vector<int64_t>& x, const char* io, const char* layout,
                        const char* dims) {
  const std::string lay = layout ? std::string(R"(, "layout": ")") + layout + "\"" : "";
  return std::string(R"({"name": "red", "io_dtype": ")") + io + R"(", "tensors": [{"name": "x", "dims": )" +
         dims_text(x) + lay + R"(}, {"name": "y", "dtype": "fp32"}], "ops": [{"op": ")" + op +
         R"(", "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}, "reduce_dims": )" + dims + "}]}";
}

TEST_F(NativeKernelsGpu, Bf16WindowPoolsMatchTheReferences) {
  auto pool = [](const char* fields) {
    return std::string(R"({"op": )") + fields +
           R"(, "name": "p", "inputs": {"x": "x"}, "outputs": {"y": "y"}})";
  };
  // The ResNet-50 stem's max pool: eight channels per thread.
  check(pool_json({32, 64, 112, 112}, "bf16", "nhwc",
                  pool(R"("max_pool", "window": [3, 3], "stride": [2, 2], "padding": [1, 1])").c_str()),
        "fusebox_pool");
  check(
      pool_json(
          {2, 16, 10, 10}, "bf16", "nhwc",
          pool(
              R"("avg_pool", "window": [3, 3], "stride": [2, 2], "padding": [1, 1], "count_include_pad": false)")
              .c_str()),
      "fusebox_pool");
  check(pool_json({2, 16, 9, 9}, "bf16", "nhwc",
                  pool(R"("avg_pool", "window": [3, 3], "padding": [1, 1])").c_str()),
        "fusebox_pool");
  // One value per thread: NCHW, channels not a multiple of 8, rank 5.
  check(pool_json({3, 5, 11, 13}, "bf16", "nchw",
                  pool(R"("max_pool", "window": [2, 3], "stride": [2, 1])").c_str()),
        "fusebox_pool");
  check(pool_json({2, 12, 6, 7, 8}, "bf16", "ndhwc",
                  pool(R"("avg_pool", "window": [2, 2, 2], "padding": [1, 1, 1])").c_str()),
        "fusebox_pool");
}

TEST_F(NativeKernelsGpu, SumAndMeanOverOuterDimsMatchTheReferences) {
  // The bias gradient of an NHWC dy: 16-byte loads.
  check(reduce_json("reduce_sum", {32, 64, 112, 112}, "bf16", "nhwc", "[0, 2, 3]"), "fusebox_reduce_rows");
  check(reduce_json("reduce_sum", {8, 24, 5, 7}, "fp16", "nhwc", "[0, 2, 3]"), "fusebox_reduce_rows");
  check(reduce_json("reduce_mean", {640, 1000}, "bf16", nullptr, "[0]"), "fusebox_reduce_rows");
  // One value per load: fp32, and kept dims that span two dims (117 columns).
  check(reduce_json("reduce_sum", {16, 13, 9}, "fp32", nullptr, "[0]"), "fusebox_reduce_rows");
  // Everything reduced: one column.
  check(reduce_json("reduce_sum", {128, 257}, "fp32", nullptr, "[0, 1]"), "fusebox_reduce_rows");
}

// rope / rope_bwd (src/kernels/rope.cu, every cuDNN): x [B, H, S, D] in a layout.
std::string rope_json(const char* op, const std::vector<int64_t>& x, const char* io, const char* layout,
                      const char* attrs, int64_t positions, bool offset) {
  const bool fwd = std::string(op) == "rope";
  const int64_t d = x[3];
  int64_t r = d;
  if (const char* rd = std::strstr(attrs, "\"rope_dim\": ")) r = std::atoll(rd + 12);
  const std::string in = fwd ? "x" : "dy", out = fwd ? "y" : "dx";
  std::string t = R"({"name": ")" + in + R"(", "dims": )" + dims_text(x) + R"(, "layout": ")" + layout +
                  R"("}, {"name": "freqs", "dims": )" + dims_text({1, 1, positions, r / 2}) +
                  R"(, "dtype": "fp32"})";
  if (offset) t += R"(, {"name": "offset", "dims": )" + dims_text({x[0], 1, 1, 1}) + R"(, "dtype": "int32"})";
  t += R"(, {"name": ")" + out + R"(", "layout": ")" + layout + R"("})";
  return std::string(R"({"name": "rope", "io_dtype": ")") + io + R"(", "tensors": [)" + t +
         R"(], "ops": [{"op": ")" + op + R"(", "name": "r", )" + attrs + R"("inputs": {")" + in + R"(": ")" +
         in + R"(", "freqs": "freqs")" + (offset ? R"(, "offset": "offset")" : "") + R"(}, "outputs": {")" +
         out + R"(": ")" + out + R"("}}]})";
}

TEST_F(NativeKernelsGpu, RopeAndItsBackwardMatchTheReferences) {
  // Llama's q at the benchmark shape (BSHD), half layout; and the backward.
  check(rope_json("rope", {8, 32, 2048, 128}, "bf16", "bshd", "", 2048, false), "fusebox_rope");
  check(rope_json("rope_bwd", {8, 32, 2048, 128}, "bf16", "bshd", "", 2048, false), "fusebox_rope_bwd");
  // Interleaved pairs, a pass-through prefix, a scale, offsets (decode), BHSD and odd sizes, every dtype.
  check(rope_json("rope", {4, 8, 1, 64}, "bf16", "bshd",
                  R"("layout": "interleaved", "rope_dim": 32, "scale": 0.125, )", 4096, true),
        "fusebox_rope");
  check(rope_json("rope_bwd", {3, 5, 77, 96}, "fp16", "bhsd", R"("rope_dim": 64, "scale": 2.0, )", 100, true),
        "fusebox_rope_bwd");
  check(rope_json("rope", {2, 3, 33, 10}, "fp32", "bhsd", R"("layout": "interleaved", )", 33, false),
        "fusebox_rope");
  // Few rows: the heads split into groups, 40 into groups of 14, 14 and 12 (2 x 700 rows of 32 pairs
  // want 3 groups), and one decode row of 40 heads (a group a head), as the serving engine calls it.
  check(rope_json("rope", {2, 40, 700, 64}, "bf16", "bshd", "", 1024, true), "fusebox_rope");
  check(rope_json("rope_bwd", {2, 40, 700, 64}, "bf16", "bhsd", R"("rope_dim": 48, )", 1024, false),
        "fusebox_rope_bwd");
  check(rope_json("rope", {1, 40, 1, 64}, "bf16", "bshd", "", 8192, true), "fusebox_rope");
}

// cross_entropy / cross_entropy_bwd (src/kernels/cross_entropy.cu): logits [N, V, 1, 1]; 16-bit rows
// of a multiple of 8 classes take the 8-at-a-time kernels, the others one value per load.
std::string cross_entropy_json(bool bwd, int64_t n, int64_t v, const char* io) {
  const std::string rows = dims_text({n, 1, 1, 1});
  std::string t = R"({"name": "logits", "dims": )" + dims_text({n, v, 1, 1}) +
                  R"(, "layout": "nhwc"}, {"name": "labels", "dims": )" + rows + R"(, "dtype": "int32"})";
  std::string op;
  if (bwd) {
    t += R"(, {"name": "lse", "dims": )" + rows + R"(, "dtype": "fp32"}, {"name": "dloss", "dims": )" + rows +
         R"(, "dtype": "fp32"}, {"name": "dlogits", "layout": "nhwc"})";
    op = R"({"op": "cross_entropy_bwd", "name": "x", "inputs": {"logits": "logits", "labels": "labels", )"
         R"("lse": "lse", "dloss": "dloss"}, "outputs": {"dlogits": "dlogits"}})";
  } else {
    t += R"(, {"name": "loss", "dtype": "fp32"}, {"name": "lse", "dtype": "fp32"})";
    op = R"({"op": "cross_entropy", "name": "x", "inputs": {"logits": "logits", "labels": "labels"}, )"
         R"("outputs": {"loss": "loss", "lse": "lse"}})";
  }
  return std::string(R"({"name": "xent", "io_dtype": ")") + io + R"(", "tensors": [)" + t + R"(], "ops": [)" +
         op + "]}";
}

TEST_F(NativeKernelsGpu, CrossEntropyAndItsBackwardMatchTheReferences) {
  // A language model's loss (32k vocabulary), GPT-2's odd vocabulary in fp16, a tiny fp32 case.
  check(cross_entropy_json(false, 4096, 32000, "bf16"), "fusebox_cross_entropy");
  check(cross_entropy_json(false, 100, 50257, "fp16"), "fusebox_cross_entropy");
  check(cross_entropy_json(false, 7, 3, "fp32"), "fusebox_cross_entropy");
  // 16-bit rows of a multiple of 8 classes go 8 at a time, forward and backward, in both dtypes.
  check(cross_entropy_json(false, 257, 4096, "fp16"), "fusebox_cross_entropy");
  check(cross_entropy_json(true, 300, 24, "fp16"), "fusebox_cross_entropy_bwd");
  check(cross_entropy_json(true, 2048, 16384, "bf16"), "fusebox_cross_entropy_bwd");
  check(cross_entropy_json(true, 33, 1001, "fp32"), "fusebox_cross_entropy_bwd");
  // Few classes: there the softmax term is a large part of dlogits, so a wrong softmax cannot hide
  // behind the one-hot term in the relative L2 (at 16384 classes it is about 1/sqrt(V) of it).
  check(cross_entropy_json(true, 512, 64, "bf16"), "fusebox_cross_entropy_bwd");
  check(cross_entropy_json(true, 300, 7, "fp16"), "fusebox_cross_entropy_bwd");
}

// A graph of pointwise ops only with several outputs (src/kernels/pointwise.cu), pinned: one kernel
// where cuDNN 9.19 runs one plan per output (slower so far: kernels::faster_native_kernel). Every mode, the
// three dtypes, a one-element tensor and a by-value scalar broadcast, an NHWC layout, sizes that are no
// multiple of a block.
TEST_F(NativeKernelsGpu, PointwiseGraphsOfSeveralOutputsMatchTheReferences) {
  auto graph = [](const char* io, const std::string& tensors, const std::string& ops) {
    return std::string(R"({"name": "pw", "io_dtype": ")") + io +
           R"(", "intermediate_dtype": "fp32", "compute_dtype": "fp32", "tensors": [)" + tensors +
           R"(], "ops": [)" + ops + "]}";
  };
  auto op = [](const char* type, const char* name, const std::string& inputs, const char* y) {
    return std::string(R"({"op": ")") + type + R"(", "name": ")" + name + R"(", "inputs": {)" + inputs +
           R"(}, "outputs": {"y": ")" + y + R"("}})";
  };
  // The SwiGLU backward of the training step, pinned: [4, 1000, 257] runs as the compiled form,
  // [1, 3, 5] (not whole vectors of 8) as the interpreted program.
  const std::string swiglu_ops = op("mul", "dy_b", R"("a": "dy", "b": "b")", "t") + "," +
                                 op("silu_bwd", "da", R"("dy": "t", "x": "a")", "da") + "," +
                                 op("silu", "silu_a", R"("x": "a")", "s") + "," +
                                 op("mul", "db", R"("a": "dy", "b": "s")", "db");
  for (const char* dims : {"[4, 1000, 257]", "[1, 3, 5]"}) {
    const std::string d = dims;
    check(graph("bf16",
                R"({"name": "dy", "dims": )" + d + R"(}, {"name": "a", "dims": )" + d +
                    R"(}, {"name": "b", "dims": )" + d + R"(}, {"name": "da"}, {"name": "db"})",
                swiglu_ops),
          "fusebox_pointwise", /*pin=*/true);
  }
  // The gated-MLP forms, compiled (pointwise.cu), taken by default. SwiGLU: the backward as `fusebox
  // backward` derives it (tensors and ops in its order) in both 16-bit dtypes, and the forward.
  const std::string derived_ops = op("mul", "glu.da", R"("a": "y.grad", "b": "b")", "t") + "," +
                                  op("silu", "silu.recompute", R"("x": "a")", "s") + "," +
                                  op("mul", "glu.db", R"("a": "y.grad", "b": "s")", "b.grad") + "," +
                                  op("silu_bwd", "silu.dx", R"("dy": "t", "x": "a")", "a.grad");
  for (const char* io : {"bf16", "fp16"}) {
    const std::string d = "[2, 1024, 344]";
    check(graph(io,
                R"({"name": "y.grad", "dims": )" + d + R"(}, {"name": "b", "dims": )" + d +
                    R"(}, {"name": "a", "dims": )" + d + R"(}, {"name": "a.grad"}, {"name": "b.grad"})",
                derived_ops),
          "fusebox_pointwise");
  }
  check(graph("bf16",
              R"({"name": "a", "dims": [3, 128, 40]}, {"name": "b", "dims": [3, 128, 40]}, {"name": "y"})",
              op("silu", "s", R"("x": "a")", "g") + "," + op("mul", "glu", R"("a": "g", "b": "b")", "y")),
        "fusebox_pointwise");
  // GeGLU's backward (tanh GELU), fp16, its tensors and products in another order.
  check(graph("fp16",
              R"({"name": "dy", "dims": [5, 64, 48]}, {"name": "a", "dims": [5, 64, 48]},)"
              R"({"name": "b", "dims": [5, 64, 48]}, {"name": "da"}, {"name": "db"})",
              op("mul", "t", R"("a": "b", "b": "dy")", "t") + "," +
                  op("gelu_tanh_bwd", "da", R"("dy": "t", "x": "a")", "da") + "," +
                  op("gelu_tanh", "g", R"("x": "a")", "g") + "," +
                  op("mul", "db", R"("a": "g", "b": "dy")", "db")),
        "fusebox_pointwise");
  // The GELU forms and their backward, a by-value scalar, outputs of three dtypes, fp16 in.
  check(graph("fp16",
              R"({"name": "x", "dims": [3, 517, 33]}, {"name": "dy", "dims": [3, 517, 33]},)"
              R"({"name": "half", "scalar": 0.5}, {"name": "y1"}, {"name": "y2", "dtype": "fp32"},)"
              R"({"name": "y3", "dtype": "bf16"})",
              op("gelu_tanh", "g1", R"("x": "x")", "y1") + "," +
                  op("gelu_tanh_bwd", "g2", R"("dy": "dy", "x": "x")", "t2") + "," +
                  op("scale", "s2", R"("x": "t2", "scale": "half")", "y2") + "," +
                  op("gelu_erf", "g3", R"("x": "x")", "e") + "," +
                  op("gelu_erf_bwd", "g4", R"("dy": "e", "x": "dy")", "y3")),
        "fusebox_pointwise", /*pin=*/true);
  // A one-element tensor broadcast, NHWC, the other activations and their backward, fp32 io.
  const char* nhwc = R"(, "layout": "nhwc")";
  check(graph("fp32",
              std::string(R"({"name": "x", "dims": [2, 6, 5, 7])") + nhwc +
                  R"(}, {"name": "c", "dims": [1, 1, 1, 1]}, {"name": "dy", "dims": [2, 6, 5, 7])" + nhwc +
                  R"(}, {"name": "y1"}, {"name": "y2"}, {"name": "y3"})",
              op("tanh", "t", R"("x": "x")", "th") + "," + op("add", "y1", R"("a": "th", "b": "c")", "y1") +
                  "," + op("sigmoid", "sg", R"("x": "x")", "sg") + "," +
                  op("sub", "y2", R"("a": "sg", "b": "c")", "y2") + "," +
                  op("relu_bwd", "rb", R"("dy": "dy", "x": "x")", "rb") + "," +
                  op("sigmoid_bwd", "sb", R"("dy": "rb", "x": "x")", "sb") + "," +
                  op("tanh_bwd", "tb", R"("dy": "sb", "x": "x")", "tb") + "," +
                  op("relu", "r", R"("x": "tb")", "r") + "," +
                  op("bias_add", "y3", R"("x": "r", "bias": "c")", "y3")),
        "fusebox_pointwise", /*pin=*/true);
}

TEST_F(NativeKernelsGpu, APinnedCudnnEngineStillRunsCudnn) {
  const std::string json = norm_json(false, {256, 1024, 1, 1}, {1, 1024, 1, 1}, "bf16", "nhwc", true, true);
  ResolvedGraph g = load(json);
  BuildOptions cudnn_only;
  cudnn_only.native_kernels = false;  // cuDNN's candidates, as `fusebox engines --cudnn` lists them
  auto set = CandidateSet::create(g, target_, cudnn_only, nullptr, ctx_.get());
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  set->check_all(false);
  std::string cudnn_engine;
  for (const EngineCandidate& c : set->candidates())
    if (c.supported && cudnn_engine.empty()) cudnn_engine = c.name;
  ASSERT_FALSE(cudnn_engine.empty()) << "no supported cuDNN candidate";
  EXPECT_NE(cudnn_engine.rfind("fusebox_", 0), 0u) << cudnn_engine;
  BuildOptions pin;
  pin.engine = cudnn_engine;
  auto plan = build_plan(g, target_, pin, nullptr, ctx_.get());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->engine_name(), cudnn_engine);
  EXPECT_FALSE(plan->native());
  auto unpinned = build_plan(g, target_, cudnn_only, nullptr, ctx_.get());
  ASSERT_TRUE(unpinned.ok()) << unpinned.status().ToString();
  EXPECT_FALSE(unpinned->native());
  RunOptions opt;
  opt.verify = true;
  opt.iters = 0;
  auto r = run_plan(g, *plan, *ctx_, opt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->verified_ok);
}

}  // namespace
}  // namespace fusebox
