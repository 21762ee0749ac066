// The paged KV write on the GPU (kernels/kv_pages.h, issue 34) against its host twin: random
// 16-bit and fp32 rows from a strided view, shuffled page tables, ragged starts and counts (decode
// and prefill shapes), the pool compared byte for byte, bad rows counted alike. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace fusebox::kernels
