// The paged KV write on the GPU (kernels/kv_pages.h, issue 34) against its host twin: random
// 16-bit and fp32 rows from a strided view, shuffled page tables, ragged starts and counts (decode
// and prefill shapes), the pool compared byte for byte, bad rows counted alike. Skipped without a GPU.
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "fusebox/runtime.h"
#include "kernels/kv_pages.h"

namespace fusebox::kernels {
namespace {

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

TEST(KvPagesGpu, TheKernelWritesWhatTheHostTwinWrites) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  std::mt19937 rng(7);
  struct Shape {
    int64_t batch, heads, tokens, dim, page_size;
    int elem_bytes;
  };
  for (const Shape& sh : {Shape{8, 4, 1, 64, 16, 2}, Shape{3, 2, 37, 128, 16, 2}, Shape{5, 8, 9, 64, 4, 4}}) {
    KvWrite w;
    w.batch = sh.batch, w.heads = sh.heads, w.tokens = sh.tokens, w.dim = sh.dim;
    w.elem_bytes = sh.elem_bytes;
    w.page_size = sh.page_size;
    w.max_pages = 12;
    w.num_pages = sh.batch * w.max_pages + 3;
    // Source [B, T, H, D] in memory, read as [B, H, T, D].
    const int64_t strides[4] = {sh.tokens * sh.heads * sh.dim, sh.dim, sh.heads * sh.dim, 1};
    std::copy(strides, strides + 4, w.src_strides);
    std::vector<uint8_t> src(static_cast<size_t>(sh.batch * sh.tokens * sh.heads * sh.dim * sh.elem_bytes));
    for (auto& b : src) b = static_cast<uint8_t>(rng());
    std::vector<int32_t> pages(static_cast<size_t>(w.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(sh.batch * w.max_pages)), start(sh.batch), count(sh.batch);
    for (size_t i = 0; i < table.size(); ++i) table[i] = pages[i];
    table[1] = static_cast<int32_t>(w.num_pages + 2);  // a bad page: its rows are counted, not written
    for (int64_t b = 0; b < sh.batch; ++b) {
      start[b] = static_cast<int32_t>(rng() % (w.max_pages * sh.page_size - sh.tokens + 1));
      count[b] = static_cast<int32_t>(1 + rng() % sh.tokens);
    }
    std::vector<uint8_t> pool(
        static_cast<size_t>(w.num_pages * sh.heads * sh.page_size * sh.dim * sh.elem_bytes));
    for (auto& b : pool) b = static_cast<uint8_t>(rng());
    std::vector<uint8_t> want = pool;
    w.src = src.data();
    const int64_t bad_host = write_kv_pages_host(w, want, table, start, count);

    KvWrite d = w;
    d.src = upload(src);
    d.pool = upload(pool);
    d.page_table = upload(table);
    d.start = upload(start);
    d.count = upload(count);
    d.bad_rows = upload(std::vector<int32_t>{0});
    Status st = write_kv_pages(d, nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<uint8_t> got(pool.size());
    int32_t bad_gpu = -1;
    ASSERT_EQ(cudaMemcpy(got.data(), d.pool, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaMemcpy(&bad_gpu, d.bad_rows, sizeof bad_gpu, cudaMemcpyDeviceToHost);
    EXPECT_TRUE(got == want) << "B " << sh.batch << " T " << sh.tokens << ": the pools differ";
    EXPECT_EQ(bad_gpu, bad_host);
    // The same launch writing a second source (dense [B, H, T, D]) into a second pool (the values
    // beside the keys): both pools as two host calls write them.
    {
      std::vector<uint8_t> src2(src.size()), pool2(pool.size());
      for (auto& b : src2) b = static_cast<uint8_t>(rng());
      for (auto& b : pool2) b = static_cast<uint8_t>(rng());
      KvWrite h2 = w;
      h2.src = src2.data();
      const int64_t dense[4] = {sh.heads * sh.tokens * sh.dim, sh.tokens * sh.dim, sh.dim, 1};
      std::copy(dense, dense + 4, h2.src_strides);
      std::vector<uint8_t> want2 = pool2;
      write_kv_pages_host(h2, want2, table, start, count);
      KvWrite pair = d;
      pair.pool = upload(pool);
      pair.src2 = upload(src2);
      std::copy(dense, dense + 4, pair.src2_strides);
      pair.pool2 = upload(pool2);
      ASSERT_TRUE(write_kv_pages(pair, nullptr).ok());
      std::vector<uint8_t> got1(pool.size()), got2(pool2.size());
      ASSERT_EQ(cudaMemcpy(got1.data(), pair.pool, got1.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(got2.data(), pair.pool2, got2.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(got1 == want) << "B " << sh.batch << " T " << sh.tokens
                                << ": the first pool differs (pair)";
      EXPECT_TRUE(got2 == want2) << "B " << sh.batch << " T " << sh.tokens
                                 << ": the second pool differs (pair)";
      for (const void* p :
           {static_cast<const void*>(pair.pool), pair.src2, static_cast<const void*>(pair.pool2)})
        cudaFree(const_cast<void*>(p));
      KvWrite half = pair;
      half.pool2 = nullptr;
      EXPECT_NE(write_kv_pages(half, nullptr).message().find("src2 and pool2 come together"),
                std::string::npos);
    }
    for (const void* p : {d.src, static_cast<const void*>(d.pool), static_cast<const void*>(d.page_table),
                          static_cast<const void*>(d.start), static_cast<const void*>(d.count),
                          static_cast<const void*>(d.bad_rows)})
      cudaFree(const_cast<void*>(p));
  }
}

// The FP8 form: bf16 and fp16 rows (random finite values, one row of zeros) from a strided view
// into e4m3 pools and descales, both pairs of pools as the host twin writes them, byte for byte.
TEST(KvPagesGpu, TheFp8KernelWritesWhatTheHostTwinWrites) {
  if (gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU visible: GPU tests skipped";
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 2.f);
  for (bool half : {false, true}) {
    KvWrite w;
    w.batch = 6, w.heads = 8, w.tokens = 5, w.dim = 64;
    w.elem_bytes = 2;
    w.src_half = half;
    w.page_size = 16;
    w.max_pages = 4;
    w.num_pages = w.batch * w.max_pages + 2;
    const int64_t strides[4] = {w.tokens * w.heads * w.dim, w.dim, w.heads * w.dim, 1};  // [B, T, H, D]
    std::copy(strides, strides + 4, w.src_strides);
    std::copy(strides, strides + 4, w.src2_strides);
    const size_t n = static_cast<size_t>(w.batch * w.tokens * w.heads * w.dim);
    auto rows = [&] {
      std::vector<uint16_t> v(n);
      for (auto& e : v) {
        const float f = normal(rng);
        if (half) {
          e = __half_as_ushort(__float2half_rn(f));
        } else {
          uint32_t b;
          std::memcpy(&b, &f, 4);
          e = static_cast<uint16_t>(b >> 16);
        }
      }
      return v;
    };
    std::vector<uint16_t> src = rows(), src2 = rows();
    std::fill(src.begin(), src.begin() + w.dim, uint16_t{0});  // one row of zeros (b 0, t 0, h 0)
    std::vector<int32_t> pages(static_cast<size_t>(w.num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int32_t> table(static_cast<size_t>(w.batch * w.max_pages)), start(w.batch), count(w.batch);
    for (size_t i = 0; i < table.size(); ++i) table[i] = pages[i];
    for (int64_t b = 0; b < w.batch; ++b) {
      start[b] = static_cast<int32_t>(rng() % (w.max_pages * w.page_size - w.tokens + 1));
      count[b] = static_cast<int32_t>(1 + rng() % w.tokens);
    }
    const size_t pool_bytes = static_cast<size_t>(w.num_pages * w.heads * w.page_size * w.dim);
    const size_t n_scales = static_cast<size_t>(w.num_pages * w.heads * w.page_size);
    std::vector<uint8_t> want(pool_bytes, 0), want2(pool_bytes, 0);
    std::vector<float> want_s(n_scales, 0.f), want_s2(n_scales, 0.f);
    KvWrite h = w;
    h.src = src.data();
    write_kv_pages_fp8_host(h, want, want_s, table, start, count);
    h.src = src2.data();
    write_kv_pages_fp8_host(h, want2, want_s2, table, start, count);

    KvWrite d = w;
    d.src = upload(src);
    d.src2 = upload(src2);
    d.pool = upload(std::vector<uint8_t>(pool_bytes, 0));
    d.pool2 = upload(std::vector<uint8_t>(pool_bytes, 0));
    d.fp8_scale = upload(std::vector<float>(n_scales, 0.f));
    d.fp8_scale2 = upload(std::vector<float>(n_scales, 0.f));
    d.page_table = upload(table);
    d.start = upload(start);
    d.count = upload(count);
    Status st = write_kv_pages(d, nullptr);
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::vector<uint8_t> got(pool_bytes), got2(pool_bytes);
    std::vector<float> got_s(n_scales), got_s2(n_scales);
    ASSERT_EQ(cudaMemcpy(got.data(), d.pool, pool_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got2.data(), d.pool2, pool_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_s.data(), d.fp8_scale, n_scales * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_s2.data(), d.fp8_scale2, n_scales * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == want) << (half ? "fp16" : "bf16") << ": the K pools differ";
    EXPECT_TRUE(got2 == want2) << (half ? "fp16" : "bf16") << ": the V pools differ";
    EXPECT_TRUE(got_s == want_s) << (half ? "fp16" : "bf16") << ": the K descales differ";
    EXPECT_TRUE(got_s2 == want_s2) << (half ? "fp16" : "bf16") << ": the V descales differ";
    EXPECT_GT(std::count_if(want_s.begin(), want_s.end(), [](float f) { return f > 0.f && f != 1.f; }), 10)
        << "few rows written: the test's tables";
    KvWrite no_scale2 = d;
    no_scale2.fp8_scale2 = nullptr;
    EXPECT_NE(write_kv_pages(no_scale2, nullptr).message().find("fp8_scale2"), std::string::npos);
    for (const void* p : {d.src, d.src2, static_cast<const void*>(d.pool), static_cast<const void*>(d.pool2),
                          static_cast<const void*>(d.fp8_scale), static_cast<const void*>(d.fp8_scale2),
                          static_cast<const void*>(d.page_table), static_cast<const void*>(d.start),
                          static_cast<const void*>(d.count)})
      cudaFree(const_cast<void*>(p));
  }
}

}  // namespace
}  // namespace fusebox::kernels
