// Elementwise and reduction ops of ops.h on CUDA: cast, fill, add_, scale_, sum_of_squares,
// count_zeros, has_inf_or_nan, GeLU, SwiGLU, dropout (the CPU reference's SplitMix64 stream:
// same masks as the CPU), Adam(W).
// Memory-bound: each thread handles 8 consecutive elements with 16-byte accesses where the
// pointers allow, in a grid-stride loop; everything runs on current_stream().
#include <cuda_fp8.h>

#include <cmath>

#include "megatron/core/ops/cuda/adam_update.cuh"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/dropout_stream.cuh"
#include "megatron/core/ops/cuda/variants.h"
#include "megatron/core/utils/env.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace detail {
int sm_count() {
  static int n = [] {
    int dev = 0, c = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev));
    return c;
  }();
  return n;
}
}  // namespace detail

namespace {
constexpr int kThreads = 256;

inline unsigned grid8(int64_t n) { return grid_for((n + 7) / 8, kThreads); }

template <class S, class D>
__global__ void cast_kernel(const S* __restrict__ s, D* __restrict__ d, int64_t n, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float f[8];
    ld8(s, i, n, vec, f);
    st8(d, i, n, vec, f);
  }
}

template <class S, int kFmt>  // kFmt 0: e4m3, 1: e5m2
__global__ void cast_fp8_kernel(const S* __restrict__ s, uint8_t* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    d[i] = __nv_cvt_float_to_fp8(to_f(s[i]), __NV_SATFINITE, kFmt == 0 ? __NV_E4M3 : __NV_E5M2);
}

template <class T>
__global__ void fill_kernel(T* __restrict__ x, int64_t n, float v, bool vec) {
  float f[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = v;
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8)
    st8(x, i, n, vec, f);
}

template <class Y, class X>
__global__ void axpy_kernel(Y* __restrict__ y, const X* __restrict__ x, int64_t n, float alpha, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8], b[8];
    ld8(y, i, n, vec, a);
    ld8(x, i, n, vec, b);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = fmaf(alpha, b[j], a[j]);
    st8(y, i, n, vec, a);
  }
}

template <class T>
__global__ void scale_kernel(T* __restrict__ x, int64_t n, float alpha, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8];
    ld8(x, i, n, vec, a);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] *= alpha;
    st8(x, i, n, vec, a);
  }
}

// Reductions: kind 0 = sum of squares (double), 1 = zero count, 2 = non-finite count.
// Stage 1 writes one partial per block; stage 2 (one block) sums the partials in a fixed
// order, so results are deterministic.
// Adds the reduction terms of f[0..8) = x[i..i+8) (those below n) to acc, in order.
template <int kKind>
__device__ __forceinline__ void reduce_add8(double& acc, const float (&f)[8], int64_t i, int64_t n) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (i + j >= n) break;
    if (kKind == 0) acc += (double)f[j] * (double)f[j];
    else if (kKind == 1) acc += (f[j] == 0.0f) ? 1.0 : 0.0;
    else acc += isfinite(f[j]) ? 0.0 : 1.0;
  }
}

// One block's partial of a reduction over x[0, n) split over `blocks` blocks (this one is
// `block`): the body of reduce_stage1 and of reduce_stage1_multi, so both give identical partials.
// Each thread adds the 8 elements at i, i + stride, i + 2 stride, ... (stride = blocks x 256 x 8)
// in that order. kV1 (the loop before Session 11, variants.h reduce_stage1_v1): one 8-element load
// per step; else two steps' loads in flight before their additions, which happen in the same
// order, so both give the same bits.
template <class T, int kKind, bool kV1>
__device__ __forceinline__ void reduce_block(const T* __restrict__ x, int64_t n, bool vec, int64_t block,
                                             int64_t blocks, double* __restrict__ out) {
  double acc = 0.0;
  const int64_t stride = blocks * blockDim.x * 8;
  int64_t i = (block * blockDim.x + threadIdx.x) * 8;
  if constexpr (!kV1) {
    for (; i + stride < n; i += 2 * stride) {
      float f[8], h[8];
      ld8(x, i, n, vec, f);
      ld8(x, i + stride, n, vec, h);
      reduce_add8<kKind>(acc, f, i, n);
      reduce_add8<kKind>(acc, h, i + stride, n);
    }
  }
  for (; i < n; i += stride) {
    float f[8];
    ld8(x, i, n, vec, f);
    reduce_add8<kKind>(acc, f, i, n);
  }
  __shared__ double sh[kThreads];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}

template <class T, int kKind>
__global__ void reduce_stage1(const T* __restrict__ x, int64_t n, bool vec, double* __restrict__ partial) {
  reduce_block<T, kKind, false>(x, n, vec, blockIdx.x, gridDim.x, partial + blockIdx.x);
}

// Multi-tensor stage 1: up to kMultiMax tensors of one dtype in one launch. Tensor k owns the
// blocks [start[k], start[k+1]) and reduces exactly as its own reduce_stage1 launch with
// start[k+1] - start[k] blocks would (same partials, same order for stage 2).
constexpr int kMultiMax = 64;
struct MultiReduceArgs {
  const void* ptr[kMultiMax];
  int64_t n[kMultiMax];
  unsigned start[kMultiMax + 1];
  bool vec[kMultiMax];
  int count;
};

template <class T, int kKind, bool kV1>
__global__ void reduce_stage1_multi(const MultiReduceArgs a, double* __restrict__ partial) {
  int lo = 0, hi = a.count - 1;  // the last k with start[k] <= blockIdx.x
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.start[mid] <= blockIdx.x) lo = mid;
    else hi = mid - 1;
  }
  reduce_block<T, kKind, kV1>(static_cast<const T*>(a.ptr[lo]), a.n[lo], a.vec[lo], blockIdx.x - a.start[lo],
                         a.start[lo + 1] - a.start[lo], partial + blockIdx.x);
}

// One stage-1 launch per tensor in the *_many reductions when a dev/cuda driver forces it
// (variants.h).
bool reduce_multi_host() { return !variants::forced().reduce_per_tensor; }

// Stage 1 with one load in flight per thread (the loop before Session 11) when a dev/cuda driver
// forces it or MEGATRON_REDUCE_V1=1 (read once): same partials either way.
bool reduce_stage1_v1() {
  static const bool env = env_switch("MEGATRON_REDUCE_V1", false);
  return variants::forced().reduce_stage1_v1 || env;
}

__global__ void reduce_stage2(const double* __restrict__ partial, int n, double* __restrict__ out) {
  __shared__ double sh[kThreads];
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0];
}

template <int kKind>
double reduce(const Tensor& x, const char* name) {
  check_cuda(x, name);
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  cudaStream_t st = megatron::cuda::current_stream();
  unsigned g = grid8(n);
  double* buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(&buf, sizeof(double) * (g + 1), st));  // from the stream-ordered pool
  bool vec = aligned16(x.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), T, reduce_stage1<T, kKind><<<g, kThreads, 0, st>>>(
      static_cast<const T*>(x.data_ptr()), n, vec, buf));
  CUDA_CHECK_LAUNCH();
  reduce_stage2<<<1, kThreads, 0, st>>>(buf, static_cast<int>(g), buf + g);
  CUDA_CHECK_LAUNCH();
  double out = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&out, buf + g, sizeof(double), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaFreeAsync(buf, st));
  megatron::cuda::sync_stream(st);
  return out;
}

// ---- activations ----
__device__ __forceinline__ float gelu_f(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    float u = k0 * (x + k1 * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
  return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}
__device__ __forceinline__ float gelu_grad(float x, bool tanh_approx) {
  if (tanh_approx) {
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    float u = k0 * (x + k1 * x * x * x);
    float t = tanhf(u);
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k0 * (1.0f + 3.0f * k1 * x * x);
  }
  float cdf = 0.5f * (1.0f + erff(x * 0.7071067811865476f));
  float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

template <class X, class Y>
__global__ void gelu_fwd_kernel(const X* __restrict__ x, Y* __restrict__ y, int64_t n, bool th, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8];
    ld8(x, i, n, vec, a);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = gelu_f(a[j], th);
    st8(y, i, n, vec, a);
  }
}

template <class X, class D>
__global__ void gelu_bwd_kernel(const D* __restrict__ dy, const X* __restrict__ x, D* __restrict__ dx, int64_t n,
                                bool th, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8], g[8];
    ld8(x, i, n, vec, a);
    ld8(dy, i, n, vec, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] *= gelu_grad(a[j], th);
    st8(dx, i, n, vec, g);
  }
}

// Squared ReLU (--squared-relu): y = relu(x)^2, dx = dy * 2 relu(x).
template <class X, class Y>
__global__ void squared_relu_fwd_kernel(const X* __restrict__ x, Y* __restrict__ y, int64_t n, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8];
    ld8(x, i, n, vec, a);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float r = fmaxf(a[j], 0.0f);
      a[j] = r * r;
    }
    st8(y, i, n, vec, a);
  }
}

template <class X, class D>
__global__ void squared_relu_bwd_kernel(const D* __restrict__ dy, const X* __restrict__ x, D* __restrict__ dx,
                                        int64_t n, bool vec) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float a[8], g[8];
    ld8(x, i, n, vec, a);
    ld8(dy, i, n, vec, g);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = a[j] > 0.0f ? g[j] * 2.0f * a[j] : 0.0f;
    st8(dx, i, n, vec, g);
  }
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

// SwiGLU on rows: x [N, 2f] = [gate | up], y [N, f]. Work item = 8 consecutive outputs of one row.
template <class X, class Y>
__global__ void swiglu_fwd_kernel(const X* __restrict__ x, Y* __restrict__ y, int64_t rows, int64_t f, bool vec) {
  const int64_t per_row = (f + 7) / 8, work = rows * per_row;
  for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = w / per_row, c = (w % per_row) * 8;
    float g[8], u[8];
    ld8(x + r * 2 * f, c, f, vec, g);
    ld8(x + r * 2 * f + f, c, f, vec, u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = silu(g[j]) * u[j];
    st8(y + r * f, c, f, vec, g);
  }
}

template <class X, class D>
__global__ void swiglu_bwd_kernel(const D* __restrict__ dy, const X* __restrict__ x, D* __restrict__ dx, int64_t rows,
                                  int64_t f, bool vec) {
  const int64_t per_row = (f + 7) / 8, work = rows * per_row;
  for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = w / per_row, c = (w % per_row) * 8;
    float g[8], u[8], d[8], dg[8], du[8];
    ld8(x + r * 2 * f, c, f, vec, g);
    ld8(x + r * 2 * f + f, c, f, vec, u);
    ld8(dy + r * f, c, f, vec, d);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float sg = 1.0f / (1.0f + expf(-g[j]));
      float s = g[j] * sg;
      du[j] = d[j] * s;
      dg[j] = d[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
    }
    st8(dx + r * 2 * f, c, f, vec, dg);
    st8(dx + r * 2 * f + f, c, f, vec, du);
  }
}

// ---- dropout: the CPU reference's counter-based SplitMix64 stream (dropout_stream.cuh), so the
// CUDA and CPU ops keep and drop the same elements for the same (seed, offset) ----
// Element i is kept iff uniform(stream(seed, offset), i) >= p (exactly cpu::dropout_forward).
template <class X, class Y>
__global__ void dropout_fwd_kernel(const X* __restrict__ x, Y* __restrict__ y, uint8_t* __restrict__ mask, int64_t n,
                                   float p, float inv_keep, uint64_t stream) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const bool keep = p == 0.0f || ddropout_uniform(stream, static_cast<uint64_t>(i)) >= p;
    mask[i] = keep ? 1 : 0;
    y[i] = from_f<Y>(keep ? to_f(x[i]) * inv_keep : 0.0f);
  }
}

template <class D>
__global__ void dropout_bwd_kernel(const D* __restrict__ dy, const uint8_t* __restrict__ mask, D* __restrict__ dx,
                                   int64_t n, float inv_keep) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dx[i] = from_f<D>(mask[i] ? to_f(dy[i]) * inv_keep : 0.0f);
}

// ---- Adam(W) on fp32 master params, optional cast into the model param ----
template <class M>
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, M* __restrict__ mp, int64_t n, float lr, float b1, float b2,
                            float eps, float wd, float bc1, float bc2, bool decoupled, bool vec, float gscale) {
  for (int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * 8; i < n; i += (int64_t)gridDim.x * blockDim.x * 8) {
    float pp[8], gg[8], mm[8], vv[8];
    ld8(p, i, n, vec, pp);
    ld8(g, i, n, vec, gg);
    ld8(m, i, n, vec, mm);
    ld8(v, i, n, vec, vv);
    adam_update8(pp, gg, mm, vv, gscale, lr, b1, b2, eps, wd, bc1, bc2, decoupled);
    st8(p, i, n, vec, pp);
    st8(m, i, n, vec, mm);
    st8(v, i, n, vec, vv);
    if (mp) st8(mp, i, n, vec, pp);
  }
}
}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  check_cuda(src, "cast");
  check_cuda(dst, "cast");
  MEGATRON_CHECK(src.numel() == dst.numel()) << "cast: " << src.str() << " -> " << dst.str();
  const int64_t n = src.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  if (dst.dtype() == DType::kFloat8E4M3 || dst.dtype() == DType::kFloat8E5M2) {
    bool e4 = dst.dtype() == DType::kFloat8E4M3;
    MCU_FLOAT_SWITCH(src.dtype(), S,
                     if (e4) cast_fp8_kernel<S, 0><<<grid_for(n, kThreads), kThreads, 0, st>>>(
                         static_cast<const S*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()), n);
                     else cast_fp8_kernel<S, 1><<<grid_for(n, kThreads), kThreads, 0, st>>>(
                         static_cast<const S*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()), n));
    CUDA_CHECK_LAUNCH();
    return;
  }
  if (src.dtype() == dst.dtype()) {
    CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), src.nbytes(), cudaMemcpyDeviceToDevice, st));
    return;
  }
  bool vec = aligned16(src.data_ptr()) && aligned16(dst.data_ptr());
  MCU_FLOAT_SWITCH(src.dtype(), S,
                   MCU_FLOAT_SWITCH(dst.dtype(), D,
                                    cast_kernel<S, D><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<const S*>(src.data_ptr()), static_cast<D*>(dst.data_ptr()), n,
                                        vec)));
  CUDA_CHECK_LAUNCH();
}

void fill(Tensor& x, float value) {
  check_cuda(x, "fill");
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(x.dtype(), T,
                   fill_kernel<T><<<grid8(n), kThreads, 0, st>>>(static_cast<T*>(x.data_ptr()), n, value,
                                                                   aligned16(x.data_ptr())));
  CUDA_CHECK_LAUNCH();
}

void add_(Tensor& y, const Tensor& x, float alpha) {
  check_cuda(y, "add_");
  check_cuda(x, "add_");
  MEGATRON_CHECK(y.numel() == x.numel()) << "add_: " << y.str() << " += " << x.str();
  const int64_t n = y.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(y.data_ptr());
  MCU_FLOAT_SWITCH(y.dtype(), Y,
                   MCU_FLOAT_SWITCH(x.dtype(), X,
                                    axpy_kernel<Y, X><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<Y*>(y.data_ptr()), static_cast<const X*>(x.data_ptr()), n, alpha,
                                        vec)));
  CUDA_CHECK_LAUNCH();
}

void scale_(Tensor& x, float alpha) {
  check_cuda(x, "scale_");
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(x.dtype(), T,
                   scale_kernel<T><<<grid8(n), kThreads, 0, st>>>(static_cast<T*>(x.data_ptr()), n, alpha,
                                                                    aligned16(x.data_ptr())));
  CUDA_CHECK_LAUNCH();
}

double sum_of_squares(const Tensor& x) { return reduce<0>(x, "sum_of_squares"); }

// Stage-1 partials of every tensor into one buffer (multi-tensor launches, or one launch per
// tensor when dev/cuda/reduce_many forces it), one stage-2 over all partials, one
// device-to-host copy and synchronization for the whole list.
template <int kKind>
double reduce_many(const std::vector<Tensor>& xs, const char* name) {
  std::vector<unsigned> grids(xs.size());
  int64_t total = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_cuda(xs[i], name);
    grids[i] = xs[i].numel() > 0 ? grid8(xs[i].numel()) : 0;
    total += grids[i];
  }
  if (total == 0) return 0.0;
  cudaStream_t st = megatron::cuda::current_stream();
  double* buf = nullptr;
  CUDA_CHECK(cudaMallocAsync(&buf, sizeof(double) * (total + 1), st));
  int64_t off = 0;
  if (reduce_multi_host()) {
    // Runs of consecutive tensors of one dtype, kMultiMax at a time: one launch each (GPT-2's
    // 148 fp32 main grads: 3 launches instead of 148), partials at the same offsets as below.
    MultiReduceArgs a{};
    DType dt = DType::kFloat32;
    auto flush = [&] {
      if (!a.count) return;
      const unsigned blocks = a.start[a.count];
      if (reduce_stage1_v1()) {
        MCU_FLOAT_SWITCH(dt, T, reduce_stage1_multi<T, kKind, true><<<blocks, kThreads, 0, st>>>(a, buf + off));
      } else {
        MCU_FLOAT_SWITCH(dt, T, reduce_stage1_multi<T, kKind, false><<<blocks, kThreads, 0, st>>>(a, buf + off));
      }
      CUDA_CHECK_LAUNCH();
      off += blocks;
      a = MultiReduceArgs{};
    };
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!grids[i]) continue;
      if (a.count && (a.count == kMultiMax || xs[i].dtype() != dt)) flush();
      dt = xs[i].dtype();
      a.ptr[a.count] = xs[i].data_ptr();
      a.n[a.count] = xs[i].numel();
      a.vec[a.count] = aligned16(xs[i].data_ptr());
      a.start[a.count + 1] = a.start[a.count] + grids[i];
      ++a.count;
    }
    flush();
  } else {
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!grids[i]) continue;
      const Tensor& x = xs[i];
      bool vec = aligned16(x.data_ptr());
      MCU_FLOAT_SWITCH(x.dtype(), T, reduce_stage1<T, kKind><<<grids[i], kThreads, 0, st>>>(
          static_cast<const T*>(x.data_ptr()), x.numel(), vec, buf + off));
      CUDA_CHECK_LAUNCH();
      off += grids[i];
    }
  }
  MEGATRON_CHECK(total < (1LL << 31)) << name << ": " << total << " partials";
  reduce_stage2<<<1, kThreads, 0, st>>>(buf, static_cast<int>(total), buf + total);
  CUDA_CHECK_LAUNCH();
  double out = 0.0;
  CUDA_CHECK(cudaMemcpyAsync(&out, buf + total, sizeof(double), cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaFreeAsync(buf, st));
  megatron::cuda::sync_stream(st);
  return out;
}

double sum_of_squares_many(const std::vector<Tensor>& xs) { return reduce_many<0>(xs, "sum_of_squares_many"); }
int64_t count_zeros_many(const std::vector<Tensor>& xs) {
  return static_cast<int64_t>(reduce_many<1>(xs, "count_zeros_many"));
}
bool has_inf_or_nan_many(const std::vector<Tensor>& xs) { return reduce_many<2>(xs, "has_inf_or_nan_many") > 0.0; }
int64_t count_zeros(const Tensor& x) { return static_cast<int64_t>(reduce<1>(x, "count_zeros")); }
bool has_inf_or_nan(const Tensor& x) { return reduce<2>(x, "has_inf_or_nan") > 0.0; }

void gelu_forward(const Tensor& x, Tensor& y, bool approximate_tanh) {
  check_cuda(x, "gelu_forward");
  check_cuda(y, "gelu_forward");
  MEGATRON_CHECK(x.numel() == y.numel()) << "gelu_forward: " << x.str() << " -> " << y.str();
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(y.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(y.dtype(), Y,
                                    gelu_fwd_kernel<X, Y><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<const X*>(x.data_ptr()), static_cast<Y*>(y.data_ptr()), n,
                                        approximate_tanh, vec)));
  CUDA_CHECK_LAUNCH();
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh) {
  check_cuda(dy, "gelu_backward");
  MEGATRON_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dx.dtype() == dy.dtype())
      << "gelu_backward: dy " << dy.str() << " x " << x.str() << " dx " << dx.str();
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(dy.data_ptr()) && aligned16(dx.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(dy.dtype(), D,
                                    gelu_bwd_kernel<X, D><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<const D*>(dy.data_ptr()), static_cast<const X*>(x.data_ptr()),
                                        static_cast<D*>(dx.data_ptr()), n, approximate_tanh, vec)));
  CUDA_CHECK_LAUNCH();
}

void squared_relu_forward(const Tensor& x, Tensor& y) {
  check_cuda(x, "squared_relu_forward");
  check_cuda(y, "squared_relu_forward");
  MEGATRON_CHECK(x.numel() == y.numel()) << "squared_relu_forward: " << x.str() << " -> " << y.str();
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(y.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(y.dtype(), Y,
                                    squared_relu_fwd_kernel<X, Y><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<const X*>(x.data_ptr()), static_cast<Y*>(y.data_ptr()), n, vec)));
  CUDA_CHECK_LAUNCH();
}

void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_cuda(dy, "squared_relu_backward");
  MEGATRON_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && dx.dtype() == dy.dtype())
      << "squared_relu_backward: dy " << dy.str() << " x " << x.str() << " dx " << dx.str();
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(dy.data_ptr()) && aligned16(dx.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(dy.dtype(), D,
                                    squared_relu_bwd_kernel<X, D><<<grid8(n), kThreads, 0, st>>>(
                                        static_cast<const D*>(dy.data_ptr()), static_cast<const X*>(x.data_ptr()),
                                        static_cast<D*>(dx.data_ptr()), n, vec)));
  CUDA_CHECK_LAUNCH();
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  check_cuda(x, "swiglu_forward");
  const int64_t two_f = x.size(-1), f = two_f / 2;
  MEGATRON_CHECK(two_f % 2 == 0 && y.size(-1) == f && y.numel() * 2 == x.numel())
      << "swiglu_forward: x " << x.str() << " y " << y.str();
  const int64_t rows = f ? y.numel() / f : 0;
  if (rows == 0 || f == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(y.data_ptr()) && f % 8 == 0;
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(y.dtype(), Y,
                                    swiglu_fwd_kernel<X, Y><<<grid_for(rows * ((f + 7) / 8), kThreads), kThreads, 0,
                                                              st>>>(static_cast<const X*>(x.data_ptr()),
                                                                    static_cast<Y*>(y.data_ptr()), rows, f, vec)));
  CUDA_CHECK_LAUNCH();
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  check_cuda(x, "swiglu_backward");
  const int64_t two_f = x.size(-1), f = two_f / 2;
  MEGATRON_CHECK(two_f % 2 == 0 && dy.size(-1) == f && dy.numel() * 2 == x.numel() && dx.numel() == x.numel() &&
                 dx.dtype() == dy.dtype())
      << "swiglu_backward: dy " << dy.str() << " x " << x.str() << " dx " << dx.str();
  const int64_t rows = f ? dy.numel() / f : 0;
  if (rows == 0 || f == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = aligned16(x.data_ptr()) && aligned16(dy.data_ptr()) && aligned16(dx.data_ptr()) && f % 8 == 0;
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(dy.dtype(), D,
                                    swiglu_bwd_kernel<X, D><<<grid_for(rows * ((f + 7) / 8), kThreads), kThreads, 0,
                                                              st>>>(static_cast<const D*>(dy.data_ptr()),
                                                                    static_cast<const X*>(x.data_ptr()),
                                                                    static_cast<D*>(dx.data_ptr()), rows, f, vec)));
  CUDA_CHECK_LAUNCH();
}

void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset) {
  check_cuda(x, "dropout_forward");
  MEGATRON_CHECK(x.numel() == y.numel() && mask.numel() == x.numel() &&
                 (mask.dtype() == DType::kUInt8 || mask.dtype() == DType::kBool) && p >= 0.0f && p <= 1.0f)
      << "dropout_forward: x " << x.str() << " y " << y.str() << " mask " << mask.str() << " p " << p;
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  float inv_keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   MCU_FLOAT_SWITCH(y.dtype(), Y,
                                    dropout_fwd_kernel<X, Y><<<grid_for(n, kThreads), kThreads, 0, st>>>(
                                        static_cast<const X*>(x.data_ptr()), static_cast<Y*>(y.data_ptr()),
                                        static_cast<uint8_t*>(mask.data_ptr()), n, p, inv_keep,
                                        ddropout_stream(seed, offset))));
  CUDA_CHECK_LAUNCH();
}

void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  check_cuda(dy, "dropout_backward");
  MEGATRON_CHECK(dy.numel() == dx.numel() && mask.numel() == dy.numel() && dx.dtype() == dy.dtype())
      << "dropout_backward: dy " << dy.str() << " mask " << mask.str() << " dx " << dx.str();
  const int64_t n = dy.numel();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  float inv_keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
  MCU_FLOAT_SWITCH(dy.dtype(), D,
                   dropout_bwd_kernel<D><<<grid_for(n, kThreads), kThreads, 0, st>>>(
                       static_cast<const D*>(dy.data_ptr()), static_cast<const uint8_t*>(mask.data_ptr()),
                       static_cast<D*>(dx.data_ptr()), n, inv_keep));
  CUDA_CHECK_LAUNCH();
}

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
               Tensor* model_param) {
  check_cuda(param, "adam_step");
  const float gscale = p.grad_scale;
  const int64_t n = param.numel();
  MEGATRON_CHECK(param.dtype() == DType::kFloat32 && grad.dtype() == DType::kFloat32 &&
                 exp_avg.dtype() == DType::kFloat32 && exp_avg_sq.dtype() == DType::kFloat32 && grad.numel() == n &&
                 exp_avg.numel() == n && exp_avg_sq.numel() == n && (!model_param || model_param->numel() == n))
      << "adam_step: param " << param.str() << " grad " << grad.str() << " m " << exp_avg.str() << " v "
      << exp_avg_sq.str();
  if (n == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const float bc1 = static_cast<float>(1.0 - std::pow((double)p.beta1, (double)p.step));
  const float bc2 = static_cast<float>(1.0 - std::pow((double)p.beta2, (double)p.step));
  bool vec = aligned16(param.data_ptr()) && aligned16(grad.data_ptr()) && aligned16(exp_avg.data_ptr()) &&
             aligned16(exp_avg_sq.data_ptr()) && (!model_param || aligned16(model_param->data_ptr()));
  auto* P = static_cast<float*>(param.data_ptr());
  auto* G = static_cast<const float*>(grad.data_ptr());
  auto* Mm = static_cast<float*>(exp_avg.data_ptr());
  auto* V = static_cast<float*>(exp_avg_sq.data_ptr());
  if (!model_param) {
    adam_kernel<float><<<grid8(n), kThreads, 0, st>>>(P, G, Mm, V, nullptr, n, p.lr, p.beta1, p.beta2, p.eps,
                                                      p.weight_decay, bc1, bc2, p.decoupled, vec, gscale);
  } else {
    MCU_FLOAT_SWITCH(model_param->dtype(), T,
                     adam_kernel<T><<<grid8(n), kThreads, 0, st>>>(P, G, Mm, V, static_cast<T*>(model_param->data_ptr()),
                                                                   n, p.lr, p.beta1, p.beta2, p.eps, p.weight_decay,
                                                                   bc1, bc2, p.decoupled, vec, gscale));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
