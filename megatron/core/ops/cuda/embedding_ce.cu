// Embedding forward/backward and the vocab cross-entropy statistics/backward on CUDA (ops.h).
// Cross entropy reads each logit once per pass (online max/sum-exp), never materializes a
// softmax, and may write dlogits over the logits.
#include <cfloat>
#include <cstdlib>

#include "megatron/core/utils/env.h"

#include "megatron/core/ops/cuda/async_copy.cuh"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/deterministic.h"
#include "megatron/core/ops/cuda/variants.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kThreads = 256;

template <class T>
__global__ void embed_fwd_kernel(const int64_t* __restrict__ ids, const T* __restrict__ table, T* __restrict__ out,
                                 int64_t rows, int64_t h, int64_t vstart, int64_t vlocal, bool vec) {
  const int64_t per = (h + 7) / 8, work = rows * per;
  for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = w / per, c = (w % per) * 8;
    int64_t id = ids[r] - vstart;
    float f[8];
    if (id >= 0 && id < vlocal) {
      ld8(table + id * h, c, h, vec, f);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = 0.0f;
    }
    st8(out + r * h, c, h, vec, f);
  }
}

__device__ __forceinline__ void atomic_add_f(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add_f(bf16_t* p, float v) { atomicAdd(p, __float2bfloat16_rn(v)); }
__device__ __forceinline__ void atomic_add_f(fp16_t* p, float v) { atomicAdd(p, __float2half_rn(v)); }

// v4 (fp32 table, 16-byte aligned rows, h % 8 == 0): two 16-byte vector atomics (sm_90
// red.global.add.v4.f32) per 8 elements instead of eight scalar ones (gpt2perf: the scalar atomics
// took 0.58 ms per GPT-2 call, L2-atomic bound).
template <class X, class D>
__global__ void embed_bwd_kernel(const X* __restrict__ dout, const int64_t* __restrict__ ids, D* __restrict__ dtable,
                                 int64_t rows, int64_t h, int64_t vstart, int64_t vlocal, bool vec, bool v4) {
  const int64_t per = (h + 7) / 8, work = rows * per;
  for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = w / per, c = (w % per) * 8;
    int64_t id = ids[r] - vstart;
    if (id < 0 || id >= vlocal) continue;
    float f[8];
    ld8(dout + r * h, c, h, vec, f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (sizeof(D) == 4) {
      if (v4) {
        float4* dst = reinterpret_cast<float4*>(dtable + id * h + c);
        atomicAdd(dst, make_float4(f[0], f[1], f[2], f[3]));
        atomicAdd(dst + 1, make_float4(f[4], f[5], f[6], f[7]));
        continue;
      }
    }
#endif
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < h) atomic_add_f(dtable + id * h + c + j, f[j]);
  }
}

// Deterministic mode (deterministic.h): one thread per column adds the token rows in order (no
// atomics; rows x h work on h threads: slower, only with MEGATRON_DETERMINISTIC=1).
template <class X, class D>
__global__ void embed_bwd_det_kernel(const X* __restrict__ dout, const int64_t* __restrict__ ids,
                                     D* __restrict__ dtable, int64_t rows, int64_t h, int64_t vstart, int64_t vlocal) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < h; c += (int64_t)gridDim.x * blockDim.x)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = ids[r] - vstart;
      if (id < 0 || id >= vlocal) continue;
      D* p = dtable + id * h + c;
      *p = from_f<D>(to_f(*p) + to_f(dout[r * h + c]));
    }
}

// Scalar atomics only when a dev/cuda driver forces it (variants.h).
bool embed_bwd_v4_host() { return !variants::forced().embed_bwd_v1; }

// Combines (m, s) pairs: s = sum exp(x - m).
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  float M = fmaxf(m, m2);
  if (M == -INFINITY) return;
  s = s * __expf(m - M) + s2 * __expf(m2 - M);
  m = M;
}

// The one-load-per-iteration loop only when a dev/cuda driver forces it (variants.h).
bool ce_stats_unroll_host() { return !variants::forced().ce_stats_v1; }

template <class L>
__global__ void ce_stats_kernel(const L* __restrict__ logits, const int64_t* __restrict__ labels, int64_t V,
                                int64_t vstart, float* __restrict__ row_max, float* __restrict__ row_sum,
                                float* __restrict__ pred, bool vec, bool unroll) {
  const int64_t r = blockIdx.x;
  const L* lr = logits + r * V;
  float m = -INFINITY, s = 0.0f;
  int64_t c = threadIdx.x * 8;
  // Four 16-byte loads in flight per thread and one max/sum-exp combine per 32 logits (the loop
  // below alone, one load and one combine per 8, ran at ~2.2 TB/s on GPT-2's 50304-wide rows).
  if (vec && unroll) {
    constexpr int64_t kStep = kThreads * 8;
    for (; c + 3 * kStep < V; c += 4 * kStep) {
      float f[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) ld8(lr, c + u * kStep, V, true, f[u]);
      float bm = -INFINITY;
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) bm = fmaxf(bm, f[u][j]);
      float bs = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) bs += __expf(f[u][j] - bm);
      ms_combine(m, s, bm, bs);
    }
  }
  for (; c < V; c += kThreads * 8) {
    float f[8];
    ld8(lr, c, V, vec, f);
    float bm = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < V) bm = fmaxf(bm, f[j]);
    float bs = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < V) bs += __expf(f[j] - bm);
    ms_combine(m, s, bm, bs);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
  __shared__ float sm[kThreads / 32], ss[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = sm[0], S = ss[0];
    for (int w = 1; w < kThreads / 32; ++w) ms_combine(M, S, sm[w], ss[w]);
    row_max[r] = M;
    row_sum[r] = S;
    int64_t t = labels[r] - vstart;
    pred[r] = (t >= 0 && t < V) ? to_f(lr[t]) : 0.0f;
  }
}

template <class L, class D>
__global__ void ce_bwd_kernel(const L* logits, const int64_t* __restrict__ labels, int64_t V, int64_t vstart,
                              const float* __restrict__ lse, const float* __restrict__ dloss, D* dlogits, bool vec) {
  const int64_t r = blockIdx.x;
  const L* lr = logits + r * V;
  D* dr = dlogits + r * V;
  const float l = lse[r], g = dloss[r];
  const int64_t t = labels[r] - vstart;
  for (int64_t c = threadIdx.x * 8; c < V; c += kThreads * 8) {
    float f[8];
    ld8(lr, c, V, vec, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = (__expf(f[j] - l) - (c + j == t ? 1.0f : 0.0f)) * g;
    st8(dr, c, V, vec, f);
  }
}

// Fused cross entropy (ops.h cross_entropy_fused_): one block per row. Pass 1 reads the row once
// from DRAM (online max/sum-exp, four 16-byte loads in flight per thread) and, with kStash, keeps
// its first `stash` elements (a multiple of 8: all of a GPT-2 row, ~90% of a bf16 LLaMA-3 row) in
// shared memory; pass 2 writes g = softmax - onehot over the row from that copy and re-reads the
// rest from global memory (partly L2 hits). The unfused path reads the row twice from DRAM
// (ce_stats_kernel, ce_bwd_kernel) and writes it once; this one reads the stashed part once.
//
// kBulk (Session 11, gpt2mem; sm_90, the whole row in shared memory, two rows per SM: GPT-2's
// 100 KB bf16 rows): thread 0 fetches the whole row into shared memory with bulk copies (the TMA
// engine, one mbarrier) and both passes read it from there. The thread loads above keep at most
// a third of a row in flight per block (four 16-byte loads per thread, then a wait: ~4 DRAM round
// trips per pass 1) and none while the block writes, so the kernel ran at ~2.7 TB/s (4.9 ms per
// GPT-2 step); with the bulk copy the whole row is in flight at once and one SM's second block
// computes while the first one's row arrives. Same chunks per thread, same order of the
// max/sum-exp combines, same values read: the same bits as the stash.
// Partial rows (Session 12; LLaMA-3's 128256-wide bf16 rows, 250 KB): the bulk copy fetches the
// stashed part (`stash` elements, ~90% of the row; one block per SM), the threads load the rest
// in both passes as the stash kernel does. Same chunks and values: the same bits as the stash
// kernel. It was meant to lift the stash kernel's ~2.1 TB/s (32 KB of the row in flight per SM);
// on the H200 it gained only 1.93 vs 2.00 ms per 8192-row call (docs/performance.md "Session 12:
// fused cross entropy on LLaMA-3 rows by bulk copy").
constexpr int kFusedThreads = 512;
constexpr unsigned kBulkPiece = 16384;  // bytes per bulk copy instruction

template <class L, bool kStash, bool kBulk = false>
__global__ void __launch_bounds__(kFusedThreads)
    ce_fused_kernel(L* logits, const int64_t* __restrict__ labels, int64_t V, int64_t vstart, float* __restrict__ loss,
                    float* __restrict__ lse_out, int64_t stash, bool vec) {
  extern __shared__ __align__(16) unsigned char ce_fused_smem[];
  L* srow = reinterpret_cast<L*>(ce_fused_smem);
  const int64_t r = blockIdx.x;
  L* lr = logits + r * V;
  const int64_t t = labels[r] - vstart;
  // The label's logit, read before any thread of this block overwrites the row.
  float pred = 0.0f;
  if (threadIdx.x == 0 && t >= 0 && t < V) pred = to_f(lr[t]);
  if constexpr (kBulk) {
    __shared__ __align__(8) uint64_t bar;
    if (threadIdx.x == 0) {
      // The stashed part: all of the row or a multiple of 8 elements, a multiple of 16 bytes either
      // way (16-bit logits; V % 8 == 0).
      const unsigned bytes = static_cast<unsigned>(stash * sizeof(L));
      mbarrier_init(&bar, 1);
      mbarrier_arrive_expect_tx(&bar, bytes);
      for (unsigned o = 0; o < bytes; o += kBulkPiece)
        bulk_copy_g2s(ce_fused_smem + o, reinterpret_cast<const unsigned char*>(lr) + o,
                      bytes - o < kBulkPiece ? bytes - o : kBulkPiece, &bar);
    }
    __syncthreads();  // the barrier is initialised before anyone waits on it
    mbarrier_wait(&bar, 0);
  }
  // Pass 1 reads chunk cc from the copy when it is stashed (kBulk), else from global memory.
  auto src = [&](int64_t cc) -> const L* { return kBulk && cc < stash ? srow : lr; };
  float m = -INFINITY, s = 0.0f;
  constexpr int64_t kStep = kFusedThreads * 8;
  int64_t c = threadIdx.x * 8;
  if (vec) {
    for (; c + 3 * kStep < V; c += 4 * kStep) {
      float f[4][8];
#pragma unroll
      for (int u = 0; u < 4; ++u) ld8(src(c + u * kStep), c + u * kStep, V, true, f[u]);
      if constexpr (kStash) {
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (c + u * kStep < stash) st8(srow, c + u * kStep, V, true, f[u]);
      }
      float bm = -INFINITY;
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) bm = fmaxf(bm, f[u][j]);
      float bs = 0.0f;
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int j = 0; j < 8; ++j) bs += __expf(f[u][j] - bm);
      ms_combine(m, s, bm, bs);
    }
  }
  for (; c < V; c += kStep) {
    float f[8];
    ld8(src(c), c, V, vec, f);
    if constexpr (kStash)
      if (c < stash) st8(srow, c, V, vec, f);
    float bm = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < V) bm = fmaxf(bm, f[j]);
    float bs = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (c + j < V) bs += __expf(f[j] - bm);
    ms_combine(m, s, bm, bs);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    ms_combine(m, s, m2, s2);
  }
  constexpr int kWarps = kFusedThreads / 32;
  __shared__ float sm[kWarps], ss[kWarps];
  __shared__ float row_lse;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    ss[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = sm[0], S = ss[0];
    for (int w = 1; w < kWarps; ++w) ms_combine(M, S, sm[w], ss[w]);
    const float l = logf(S) + M;  // as ce_loss_kernel
    row_lse = l;
    lse_out[r] = l;
    loss[r] = l - pred;
  }
  __syncthreads();  // also orders every thread's stash writes and pass-1 reads before pass 2
  const float l = row_lse;
  for (c = threadIdx.x * 8; c < V; c += kStep) {
    float f[8];
    ld8((kBulk || kStash) && c < stash ? srow : lr, c, V, vec, f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = __expf(f[j] - l) - (c + j == t ? 1.0f : 0.0f);
    st8(lr, c, V, vec, f);
  }
}

// Pass 2 re-reads the whole row from global memory (L2) instead of shared memory when a dev/cuda
// driver forces it (variants.h).
bool ce_fused_stash_host() { return !variants::forced().ce_fused_no_stash; }

// MEGATRON_CE_FUSED_BULK=0 (A/B runs, docs/environment.md) or a dev/cuda driver (variants.h): the
// stash kernel (threads load the row) where the bulk-copy kernel would run (same bits).
bool ce_fused_bulk_host() {
  static const bool on = env_switch("MEGATRON_CE_FUSED_BULK", true);
  return on && !variants::forced().ce_fused_no_bulk;
}

template <class X>
__global__ void scale_rows_kernel(const X* x, const float* __restrict__ scale, X* out, int64_t rows, int64_t h,
                                  bool vec) {
  const int64_t per = (h + 7) / 8, work = rows * per;
  for (int64_t w = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; w < work; w += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = w / per, c = (w % per) * 8;
    float f[8];
    ld8(x + r * h, c, h, vec, f);
    const float a = scale[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] *= a;
    st8(out + r * h, c, h, vec, f);
  }
}
// argmax_last_dim: one block per row; each thread keeps the first maximum of its strided share,
// then the block keeps the best (value, index) pair, ties to the smaller index (the first one).
// NaN ranks above every number (torch.argmax).
__device__ __forceinline__ bool am_better(float a, int64_t ai, float b, int64_t bi) {
  const bool an = isnan(a), bn = isnan(b);
  if (an != bn) return an;
  if (!an && a != b) return a > b;
  return ai < bi;
}

constexpr int kArgmaxThreads = 1024;

template <class T>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const T* __restrict__ x, int64_t V, int64_t* __restrict__ idx, bool vec) {
  const T* row = x + blockIdx.x * V;
  float bv = -INFINITY;
  int64_t bi = V;  // "none yet": loses every comparison with a real element
  if (vec) {
    for (int64_t c = threadIdx.x * 8; c < V; c += kArgmaxThreads * 8) {
      float f[8];
      ld8(row, c, V, true, f);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c + j < V && (bi == V || am_better(f[j], c + j, bv, bi))) bv = f[j], bi = c + j;
    }
  } else {
    for (int64_t c = threadIdx.x; c < V; c += kArgmaxThreads) {
      const float f = to_f(row[c]);
      if (bi == V || am_better(f, c, bv, bi)) bv = f, bi = c;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi != V && (bi == V || am_better(ov, oi, bv, bi))) bv = ov, bi = oi;
  }
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int64_t si[kArgmaxThreads / 32];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[w] = bv, si[w] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kArgmaxThreads / 32; ++i)
      if (si[i] != V && (bi == V || am_better(sv[i], si[i], bv, bi))) bv = sv[i], bi = si[i];
    idx[blockIdx.x] = bi;
  }
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  check_cuda(table, "embedding_forward");
  const int64_t h = table.size(-1), rows = ids.numel();
  MEGATRON_CHECK(ids.dtype() == DType::kInt64 && table.dim() == 2 && out.numel() == rows * h &&
                 out.dtype() == table.dtype())
      << "embedding_forward: ids " << ids.str() << " table " << table.str() << " out " << out.str();
  if (rows == 0 || h == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = h % 8 == 0 && aligned16(table.data_ptr()) && aligned16(out.data_ptr());
  MCU_FLOAT_SWITCH(table.dtype(), T,
                   embed_fwd_kernel<T><<<grid_for(rows * ((h + 7) / 8), kThreads), kThreads, 0, st>>>(
                       static_cast<const int64_t*>(ids.data_ptr()), static_cast<const T*>(table.data_ptr()),
                       static_cast<T*>(out.data_ptr()), rows, h, vocab_start, table.size(0), vec));
  CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start) {
  check_cuda(dtable, "embedding_backward");
  const int64_t h = dtable.size(-1), rows = ids.numel();
  MEGATRON_CHECK(ids.dtype() == DType::kInt64 && dtable.dim() == 2 && dout.numel() == rows * h)
      << "embedding_backward: dout " << dout.str() << " ids " << ids.str() << " dtable " << dtable.str();
  if (rows == 0 || h == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = h % 8 == 0 && aligned16(dout.data_ptr());
  if (megatron::cuda::deterministic()) {
    MCU_FLOAT_SWITCH(dout.dtype(), X,
                     MCU_FLOAT_SWITCH(dtable.dtype(), D,
                                      embed_bwd_det_kernel<X, D><<<grid_for(h, 128), 128, 0, st>>>(
                                          static_cast<const X*>(dout.data_ptr()),
                                          static_cast<const int64_t*>(ids.data_ptr()),
                                          static_cast<D*>(dtable.data_ptr()), rows, h, vocab_start, dtable.size(0))));
    CUDA_CHECK_LAUNCH();
    return;
  }
  const bool v4 = h % 8 == 0 && dtable.dtype() == DType::kFloat32 && aligned16(dtable.data_ptr()) && embed_bwd_v4_host();
  MCU_FLOAT_SWITCH(dout.dtype(), X,
                      MCU_FLOAT_SWITCH(dtable.dtype(), D,
                                          embed_bwd_kernel<X, D><<<grid_for(rows * ((h + 7) / 8), kThreads), kThreads,
                                                                   0, st>>>(
                                              static_cast<const X*>(dout.data_ptr()),
                                              static_cast<const int64_t*>(ids.data_ptr()),
                                              static_cast<D*>(dtable.data_ptr()), rows, h, vocab_start,
                                              dtable.size(0), vec, v4)));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max,
                         Tensor& row_sumexp, Tensor& pred) {
  check_cuda(logits, "cross_entropy_stats");
  const int64_t V = logits.size(-1), N = V ? logits.numel() / V : 0;
  MEGATRON_CHECK(labels.numel() == N && labels.dtype() == DType::kInt64 && row_max.numel() == N &&
                 row_sumexp.numel() == N && pred.numel() == N && row_max.dtype() == DType::kFloat32 &&
                 row_sumexp.dtype() == DType::kFloat32 && pred.dtype() == DType::kFloat32)
      << "cross_entropy_stats: logits " << logits.str() << " labels " << labels.str();
  if (N == 0) return;
  MEGATRON_CHECK(N < (1ll << 31)) << "cross_entropy_stats: too many rows " << N;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = V % 8 == 0 && aligned16(logits.data_ptr());
  MCU_FLOAT_SWITCH(logits.dtype(), L,
                      ce_stats_kernel<L><<<(unsigned)N, kThreads, 0, st>>>(
                          static_cast<const L*>(logits.data_ptr()), static_cast<const int64_t*>(labels.data_ptr()), V,
                          vocab_start, static_cast<float*>(row_max.data_ptr()),
                          static_cast<float*>(row_sumexp.data_ptr()), static_cast<float*>(pred.data_ptr()), vec,
                          ce_stats_unroll_host()));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits) {
  check_cuda(logits, "cross_entropy_backward");
  const int64_t V = logits.size(-1), N = V ? logits.numel() / V : 0;
  MEGATRON_CHECK(labels.numel() == N && lse.numel() == N && dloss.numel() == N && dlogits.numel() == logits.numel() &&
                 lse.dtype() == DType::kFloat32 && dloss.dtype() == DType::kFloat32)
      << "cross_entropy_backward: logits " << logits.str() << " dlogits " << dlogits.str();
  if (N == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = V % 8 == 0 && aligned16(logits.data_ptr()) && aligned16(dlogits.data_ptr());
  MCU_FLOAT_SWITCH(logits.dtype(), L,
                      MCU_FLOAT_SWITCH(dlogits.dtype(), D,
                                          ce_bwd_kernel<L, D><<<(unsigned)N, kThreads, 0, st>>>(
                                              static_cast<const L*>(logits.data_ptr()),
                                              static_cast<const int64_t*>(labels.data_ptr()), V, vocab_start,
                                              static_cast<const float*>(lse.data_ptr()),
                                              static_cast<const float*>(dloss.data_ptr()),
                                              static_cast<D*>(dlogits.data_ptr()), vec)));
  CUDA_CHECK_LAUNCH();
}

void cross_entropy_fused_(Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse) {
  check_cuda(logits, "cross_entropy_fused_");
  const int64_t V = logits.size(-1), N = V ? logits.numel() / V : 0;
  MEGATRON_CHECK(labels.numel() == N && labels.dtype() == DType::kInt64 && loss.numel() == N && lse.numel() == N &&
                 loss.dtype() == DType::kFloat32 && lse.dtype() == DType::kFloat32)
      << "cross_entropy_fused_: logits " << logits.str() << " labels " << labels.str();
  if (N == 0) return;
  MEGATRON_CHECK(N < (1ll << 31)) << "cross_entropy_fused_: too many rows " << N;
  cudaStream_t st = megatron::cuda::current_stream();
  const bool vec = V % 8 == 0 && aligned16(logits.data_ptr());
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  // The stash: as much of the row as fits (1 KiB left for the kernel's static shared memory), in
  // whole 8-element chunks; none when that is under half the row (then the lower occupancy of a
  // near-full shared memory costs more than the re-read it saves).
  // A partial stash ends on a chunk boundary (chunks start at multiples of 8), so every chunk
  // is either all in shared memory or all re-read.
  const size_t esz = dtype_size(logits.dtype());
  const int64_t cap = (static_cast<int64_t>(optin) - 1024) / static_cast<int64_t>(esz) / 8 * 8;
  int64_t stash_elems = V <= cap ? V : cap;
  if (!ce_fused_stash_host() || 2 * stash_elems < V) stash_elems = 0;
  const bool stash = stash_elems > 0;
  const size_t stash_bytes = static_cast<size_t>(stash_elems) * esz;
  // The bulk-copy kernel where the whole row fits twice per SM (GPT-2 bf16: 2 x 100.6 KB of 228;
  // 1 KB per block is the runtime's) or only a part of it fits (LLaMA-3 bf16, one block per SM,
  // the rest loaded by the threads), with 16-byte aligned rows of 16-bit logits (fp32 rows keep
  // the stash kernel: a whole fp32 GPT-2 row fits only once per SM); else the stash kernel.
  int per_sm = 0, major = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  const bool whole = stash_elems == V && 2 * (stash_bytes + 2048) <= static_cast<size_t>(per_sm);
  const bool bulk = vec && stash && esz == 2 && major >= 9 && (whole || stash_elems < V) && ce_fused_bulk_host();
  MCU_FLOAT_SWITCH(logits.dtype(), L, {
    L* p = static_cast<L*>(logits.data_ptr());
    const int64_t* lab = static_cast<const int64_t*>(labels.data_ptr());
    float* lo = static_cast<float*>(loss.data_ptr());
    float* ls = static_cast<float*>(lse.data_ptr());
    if (bulk) {
      auto kern = ce_fused_kernel<L, false, true>;
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(stash_bytes)));
      CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      static_cast<int>(cudaSharedmemCarveoutMaxShared)));
      kern<<<(unsigned)N, kFusedThreads, stash_bytes, st>>>(p, lab, V, vocab_start, lo, ls, stash_elems, vec);
    } else if (stash) {
      CUDA_CHECK(cudaFuncSetAttribute(ce_fused_kernel<L, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(stash_bytes)));
      // All of the unified L1/shared memory as shared memory: two 100 KB bf16 rows (GPT-2) per SM.
      CUDA_CHECK(cudaFuncSetAttribute(ce_fused_kernel<L, true>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      static_cast<int>(cudaSharedmemCarveoutMaxShared)));
      ce_fused_kernel<L, true><<<(unsigned)N, kFusedThreads, stash_bytes, st>>>(p, lab, V, vocab_start, lo, ls,
                                                                                 stash_elems, vec);
    } else {
      ce_fused_kernel<L, false><<<(unsigned)N, kFusedThreads, 0, st>>>(p, lab, V, vocab_start, lo, ls, 0, vec);
    }
  });
  CUDA_CHECK_LAUNCH();
}

void scale_rows(const Tensor& x, const Tensor& scale, Tensor& out) {
  check_cuda(x, "scale_rows");
  check_cuda(out, "scale_rows");
  const int64_t h = x.dim() ? x.size(-1) : 1, rows = h ? x.numel() / h : 0;
  MEGATRON_CHECK(out.numel() == x.numel() && out.dtype() == x.dtype() && scale.dtype() == DType::kFloat32 &&
                 scale.numel() == rows)
      << "scale_rows: x " << x.str() << " scale " << scale.str() << " out " << out.str();
  if (rows == 0 || h == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const bool vec = h % 8 == 0 && aligned16(x.data_ptr()) && aligned16(out.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), X,
                   scale_rows_kernel<X><<<grid_for(rows * ((h + 7) / 8), kThreads), kThreads, 0, st>>>(
                       static_cast<const X*>(x.data_ptr()), static_cast<const float*>(scale.data_ptr()),
                       static_cast<X*>(out.data_ptr()), rows, h, vec));
  CUDA_CHECK_LAUNCH();
}

void argmax_last_dim(const Tensor& x, Tensor& idx) {
  check_cuda(x, "argmax_last_dim");
  const int64_t V = x.dim() == 0 ? 1 : x.size(-1), N = V ? x.numel() / V : 0;
  MEGATRON_CHECK(V >= 1 && idx.is_cuda() && idx.dtype() == DType::kInt64 && idx.numel() == N && N < (1ll << 31))
      << "argmax_last_dim: x " << x.str() << " idx " << idx.str() << " (int64, one per row of x)";
  if (N == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const bool vec = V % 8 == 0 && aligned16(x.data_ptr());
  MCU_FLOAT_SWITCH(x.dtype(), T,
                   argmax_kernel<T><<<(unsigned)N, kArgmaxThreads, 0, st>>>(
                       static_cast<const T*>(x.data_ptr()), V, static_cast<int64_t*>(idx.data_ptr()), vec));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
