// fusebox: the optimizer's CUDA kernels (optim_kernels.h).
#include <cuda_bf16.h>

#include <cfloat>
#include <cmath>

#include "optim_kernels.h"

namespace fusebox::train_kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float load(const void* p, ElemType t, int64_t i) {
  return t == ElemType::kBF16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i])
                              : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ void store(void* p, ElemType t, int64_t i, float x) {
  if (t == ElemType::kBF16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
  else
    static_cast<float*>(p)[i] = x;
}

__global__ void accumulate_kernel(const Segment* segs, const Chunk* chunks, bool first) {
  const Chunk c = chunks[blockIdx.x];
  const Segment s = segs[c.seg];
  for (int64_t i = c.start + threadIdx.x; i < c.start + c.len; i += blockDim.x) {
    const float g = load(s.grad, s.grad_type, i);
    s.accum[i] = first ? g : s.accum[i] + g;
  }
}

// Block sum of a double, fixed order (tree over the threads).
__device__ double block_sum(double x) {
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = x;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  const double r = sh[0];
  __syncthreads();
  return r;
}

__global__ void sumsq_kernel(const Segment* segs, const Chunk* chunks, bool from_grad, double* partials) {
  const Chunk c = chunks[blockIdx.x];
  const Segment s = segs[c.seg];
  double acc = 0;
  for (int64_t i = c.start + threadIdx.x; i < c.start + c.len; i += blockDim.x) {
    const double g = from_grad ? load(s.grad, s.grad_type, i) : s.accum[i];
    acc += g * g;
  }
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void finish_norm_kernel(const double* partials, int n, StepScalars* s, const Hyper* h) {
  double acc = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partials[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) {
    const double norm = sqrt(total);
    s->sumsq = total;
    s->norm = static_cast<float>(norm);
    const double coef = h->clip / (norm + 1e-6);
    s->coef = h->clip > 0 && coef < 1 ? static_cast<float>(coef) : 1.f;
    s->finite = isfinite(norm) && isfinite(s->loss_sum) ? 1 : 0;
  }
}

__global__ void adamw_kernel(const Segment* segs, const Chunk* chunks, bool from_grad, const StepScalars* sc,
                             const Hyper* h) {
  if (!sc->finite) return;
  const Chunk c = chunks[blockIdx.x];
  const Segment s = segs[c.seg];
  const float coef = sc->coef, lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps;
  const float decay = s.decay ? 1.f - lr * h->weight_decay : 1.f;
  const float c1 = h->c1, c2 = h->c2;
  for (int64_t i = c.start + threadIdx.x; i < c.start + c.len; i += blockDim.x) {
    const float g = (from_grad ? load(s.grad, s.grad_type, i) : s.accum[i]) * coef;
    const float m = b1 * s.m[i] + h->one_minus_beta1 * g;
    const float v = b2 * s.v[i] + h->one_minus_beta2 * g * g;
    s.m[i] = m;
    s.v[i] = v;
    const float p = s.master[i] * decay - lr * (m / c1) / (sqrtf(v / c2) + eps);
    s.master[i] = p;
    if (s.work) store(s.work, s.work_type, i, p);
  }
}

__global__ void loss_sum_kernel(const float* loss, int64_t n, bool first, StepScalars* s, const Hyper* h) {
  double acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += loss[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) s->loss_sum = (first ? 0.0 : s->loss_sum) + total * h->loss_scale;
}

__global__ void copy_kernel(const Segment* segs, const Chunk* chunks) {
  const Chunk c = chunks[blockIdx.x];
  const Segment s = segs[c.seg];
  if (!s.work) return;
  for (int64_t i = c.start + threadIdx.x; i < c.start + c.len; i += blockDim.x)
    store(s.work, s.work_type, i, s.master[i]);
}

}  // namespace

cudaError_t accumulate(const Segment* segs, const Chunk* chunks, int nchunks, bool first,
                       cudaStream_t stream) {
  accumulate_kernel<<<nchunks, kThreads, 0, stream>>>(segs, chunks, first);
  return cudaGetLastError();
}

cudaError_t grad_norm(const Segment* segs, const Chunk* chunks, int nchunks, bool from_grad, double* partials,
                      StepScalars* s, const Hyper* h, cudaStream_t stream) {
  sumsq_kernel<<<nchunks, kThreads, 0, stream>>>(segs, chunks, from_grad, partials);
  finish_norm_kernel<<<1, kThreads, 0, stream>>>(partials, nchunks, s, h);
  return cudaGetLastError();
}

cudaError_t adamw(const Segment* segs, const Chunk* chunks, int nchunks, bool from_grad, const StepScalars* s,
                  const Hyper* h, cudaStream_t stream) {
  adamw_kernel<<<nchunks, kThreads, 0, stream>>>(segs, chunks, from_grad, s, h);
  return cudaGetLastError();
}

cudaError_t loss_sum(const float* loss, int64_t n, bool first, StepScalars* s, const Hyper* h,
                     cudaStream_t stream) {
  loss_sum_kernel<<<1, kThreads, 0, stream>>>(loss, n, first, s, h);
  return cudaGetLastError();
}

namespace {

__global__ void fp8_fold_kernel(Fp8State st, bool first) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < st.n; i += gridDim.x * blockDim.x)
    st.step_amax[i] = first ? st.amax[i * st.stride] : fmaxf(st.step_amax[i], st.amax[i * st.stride]);
}

// One block: every thread reads the ring position before thread 0 advances it.
__global__ void fp8_update_kernel(Fp8State st) {
  const int pos = *st.pos;
  __syncthreads();
  for (int i = threadIdx.x; i < st.n; i += blockDim.x) {
    float a = st.step_amax[i];
    if (!(a >= 0.f) || isinf(a)) a = 0.f;
    float* ring = st.history + static_cast<int64_t>(i) * st.h;
    ring[pos] = a;
    float m = 0.f;
    for (int k = 0; k < st.h; ++k) m = fmaxf(m, ring[k]);
    if (!(m > 0.f)) continue;
    const double s = static_cast<double>(st.fp8_max[i]) / static_cast<double>(m) / ldexp(1.0, st.margin);
    if (s > static_cast<double>(FLT_MAX)) continue;
    const float f = static_cast<float>(s);
    st.scale[i * st.stride] = f;
    st.scale_inv[i * st.stride] = 1.f / f;
  }
  if (threadIdx.x == 0) *st.pos = (pos + 1) % st.h;
}

}  // namespace

cudaError_t fp8_fold_amax(const Fp8State& st, bool first, cudaStream_t stream) {
  if (st.n == 0) return cudaSuccess;
  fp8_fold_kernel<<<(st.n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(st, first);
  return cudaGetLastError();
}

cudaError_t fp8_update(const Fp8State& st, cudaStream_t stream) {
  if (st.n == 0) return cudaSuccess;
  fp8_update_kernel<<<1, kThreads, 0, stream>>>(st);
  return cudaGetLastError();
}

cudaError_t copy_to_working(const Segment* segs, const Chunk* chunks, int nchunks, cudaStream_t stream) {
  copy_kernel<<<nchunks, kThreads, 0, stream>>>(segs, chunks);
  return cudaGetLastError();
}

}  // namespace fusebox::train_kernels
