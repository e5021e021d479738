// Flash attention forward and backward on CUDA (ops.h attention_forward / attention_backward).
//
// Our own kernels on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate), after
// FlashAttention-2 (Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
// Partitioning", 2023): the score matrix is never stored; the forward keeps a running max and
// sum per query row (online softmax) and saves lse = log-sum-exp of the scaled scores; the
// backward recomputes the probabilities from lse, one thread block per 64 keys of one K/V group
// looping over that group's query heads (grouped-query attention without repeating K/V), with
// dK/dV in registers and dQ accumulated in fp32 through atomics. The deterministic backward
// (--deterministic-mode) runs the same dK/dV kernels without their dQ atomics and then a second
// kernel over query blocks (fa_bwd_dq_kernel) that sums dQ over the key tiles in a fixed order.
//
// Layouts (ops.h): q, out [s, b, np, d]; k, v [sk, b, ng, d]; lse float32 [b, np, s].
// Masking: causal (key j visible to query i iff j <= i) or an explicit boolean mask
// [b, 1, s, sk] (true = masked). Head dims 64 and 128, bfloat16 only. Attention dropout (kDrop
// kernels): FlashAttention-2's equations with dropout (forward O = (P∘F)V / l with m, l, lse of the
// un-dropped P; backward dV = (P∘F)ᵀdO, dS = P∘(F∘dP − D)), F regenerated in registers from the
// counter-based stream of dropout_stream.cuh at element (bh·s + i)·sk + j, so the masks equal the
// generic kernel's and the CPU reference's bit for bit.
// Dispatch (attention_forward / attention_backward below): a forward with one query row and no mask
// (generation's decode step) runs the split-K kernel of attention_decode.cu; otherwise cuDNN's SDPA
// or these kernels when the call is bfloat16 and 16-byte aligned (float16 calls: cuDNN's SDPA only;
// dropout: these kernels only, cuDNN's stream differs); every other call (float32, float16 without
// cuDNN or with dropout, other head dims up to 256) runs the generic kernels of attention_generic.cu.
// Deterministic mode (deterministic.h) skips cuDNN under auto, and the flash backward takes the
// two-pass dQ.
#include <cmath>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/deterministic.h"
#include "megatron/core/ops/cuda/attention_decode.h"
#include "megatron/core/ops/cuda/attention_generic.h"
#include "megatron/core/ops/cuda/cudnn_attention.h"
#include "megatron/core/ops/cuda/dropout_stream.cuh"
#include "megatron/core/ops/cuda/variants.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBN = 64;  // keys per tile
constexpr int kWarpsPerBlock = 4;

struct FaArgs {
  int S, SK, B, NP, NG;
  float scale, scale_log2;
  bool causal;
  const uint8_t* mask;  // [B, S, SK] or null
  float drop_p;         // attention dropout probability (read only by the kDrop kernels)
  float drop_scale;     // 1 / (1 - p)
  uint64_t stream;      // dropout stream key ddropout_stream(seed, offset)
};

// Attention dropout keep-scale F of probability (bh, qi, kj): element e = (bh*S + qi)*SK + kj of
// the counter-based stream, kept (1 / (1 - p)) iff its uniform >= p: the same element and test as
// drop_factor() of attention_generic.cu and the CPU reference, so the masks are equal bit for bit.
// The kernels split e = base + off, base the element of a tile corner (bh, qi, kj) and off a small
// offset inside the tile: uniform number e of the stream is dmix64(stream + e), so with
// key = drop_key(bh, qi, kj) = stream + base, formed once per tile, keep_scale(key, off) tests
// element base + off (all sums mod 2^64, as in ddropout_uniform).
__device__ __forceinline__ uint64_t drop_key(const FaArgs& a, int64_t bh, int qi, int kj) {
  return a.stream + (static_cast<uint64_t>(bh) * static_cast<uint64_t>(a.S) + static_cast<uint64_t>(qi)) *
                        static_cast<uint64_t>(a.SK) +
         static_cast<uint64_t>(kj);
}
__device__ __forceinline__ float keep_scale(const FaArgs& a, uint64_t key, uint64_t off) {
  return ddropout_uniform(key, off) >= a.drop_p ? a.drop_scale : 0.0f;
}

__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}

__device__ __forceinline__ uint32_t lds32(const bf16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Copies `rows` rows of D bf16 (global row stride `stride` elements) into shared memory
// (row stride LD); rows at or past `valid` are zero-filled.
template <int D, int LD>
__device__ __forceinline__ void load_tile(bf16_t* s, const bf16_t* g, int64_t stride, int rows, int valid) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
    int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < valid) v = *reinterpret_cast<const uint4*>(g + r * stride + c);
    *reinterpret_cast<uint4*>(s + r * LD + c) = v;
  }
}

// The A fragment (m16n8k16, bf16) of k-chunk kc from a warp's fp32 accumulator tile x [16][8·NT]
// (mma.sync's C layout: n-tiles 2kc and 2kc + 1 are the chunk's 16 columns).
template <int NT>
__device__ __forceinline__ void acc_a_frag(uint32_t (&f)[4], const float (&x)[NT][4], int kc) {
  f[0] = pack_bf16(x[2 * kc][0], x[2 * kc][1]);
  f[1] = pack_bf16(x[2 * kc][2], x[2 * kc][3]);
  f[2] = pack_bf16(x[2 * kc + 1][0], x[2 * kc + 1][1]);
  f[3] = pack_bf16(x[2 * kc + 1][2], x[2 * kc + 1][3]);
}

// acc [16][D] += A · rows kc·16 .. kc·16 + 15 of the row-major [rows][D] tile (row stride LD), the
// tile as the column-major B operand through ldmatrix .trans (O += P V, dQ += dS K).
template <int D, int LD>
__device__ __forceinline__ void mma_a_tile_rows(float (&acc)[D / 8][4], const uint32_t (&f)[4], const bf16_t* tile,
                                                int kc, int lane) {
#pragma unroll
  for (int dt = 0; dt < D / 8; dt += 2) {
    uint32_t b0, b1, b2, b3;
    ldsm_x4_trans(b0, b1, b2, b3, tile + (kc * 16 + (lane & 15)) * LD + dt * 8 + (lane >> 4) * 8);
    mma16816(acc[dt], f, b0, b1);
    mma16816(acc[dt + 1], f, b2, b3);
  }
}

__device__ __forceinline__ bool visible(const FaArgs& a, int b, int qi, int kj) {
  if (kj >= a.SK || qi >= a.S) return false;
  if (a.mask) return a.mask[((int64_t)b * a.S + qi) * a.SK + kj] == 0;
  return !a.causal || kj <= qi;
}

// One K/V tile of the forward's online softmax, shared by fa_fwd_kernel and fa_fwd_v2_kernel:
// scales this warp's scores s (16 query rows from qr0 = q0 + m0, kBN keys from k0) to log2 units,
// masks them unless `full` (every key of the tile visible to every row), updates the running max
// mrow and sum lrow (rescaling oacc), then O += P V with V's tile sV (row stride LD) in shared memory.
// kDrop: O += (P∘F) V with F the dropout keep-scales of row bh (keep_scale); m and l stay those of
// the un-dropped P (FlashAttention-2 with dropout), so lse is dropout-free.
template <int D, int LD, bool kDrop = false>
__device__ __forceinline__ void fwd_softmax_pv(float (&s)[8][4], float (&oacc)[D / 8][4], float (&mrow)[2],
                                               float (&lrow)[2], const FaArgs& a, bool full, int bi, int qr0, int k0,
                                               int g, int t, int lane, const bf16_t* sV, int bh = 0) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = s[nt][e] * a.scale_log2;
      if (!full) {
        int qi = qr0 + g + (e >= 2 ? 8 : 0), kj = k0 + nt * 8 + 2 * t + (e & 1);
        if (!visible(a, bi, qi, kj)) x = -INFINITY;
      }
      s[nt][e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
  float muse[2];
  uint64_t dkey[2] = {0, 0};  // kDrop: stream keys of rows qr0 + g and qr0 + g + 8 at key k0
  if constexpr (kDrop) {
    dkey[0] = drop_key(a, bh, qr0 + g, k0);
    dkey[1] = drop_key(a, bh, qr0 + g + 8, k0);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    float mnew = fmaxf(mrow[r], mx[r]);
    muse[r] = mnew == -INFINITY ? 0.0f : mnew;
    float alpha = exp2f(mrow[r] - muse[r]);
    mrow[r] = mnew;
    lrow[r] *= alpha;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      oacc[dt][2 * r] *= alpha;
      oacc[dt][2 * r + 1] *= alpha;
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float p = exp2f(s[nt][e] - muse[e >> 1]);
      lrow[e >> 1] += p;
      if constexpr (kDrop) p *= keep_scale(a, dkey[e >> 1], nt * 8 + 2 * t + (e & 1));
      s[nt][e] = p;
    }
  // O += P V
#pragma unroll
  for (int kc = 0; kc < 4; ++kc) {
    uint32_t pa[4];
    acc_a_frag(pa, s, kc);
    mma_a_tile_rows<D, LD>(oacc, pa, sV, kc, lane);
  }
}

// The forward's end: this warp's rows (from qr0) of out = oacc / l in bf16 and lse = ln(sum exp)
// (-inf for a fully masked row), row bh of lse [b·np, s].
template <int D>
__device__ __forceinline__ void fwd_store(const float (&oacc)[D / 8][4], const float (&mrow)[2], float (&lrow)[2],
                                          const FaArgs& a, bf16_t* __restrict__ o, float* __restrict__ lse, int bi,
                                          int h, int bh, int qr0, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 1);
    lrow[r] += __shfl_xor_sync(0xffffffffu, lrow[r], 2);
    const int qi = qr0 + g + r * 8;
    if (qi >= a.S) continue;
    const float inv = lrow[r] > 0.0f ? 1.0f / lrow[r] : 0.0f;
    bf16_t* orow = o + ((int64_t)qi * a.B + bi) * a.NP * D + (int64_t)h * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + 2 * t) =
          pack_bf16(oacc[dt][2 * r] * inv, oacc[dt][2 * r + 1] * inv);
    if (t == 0)
      lse[(int64_t)bh * a.S + qi] = lrow[r] > 0.0f ? (mrow[r] + log2f(lrow[r])) * 0.6931471805599453f : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Forward: block = 4 warps x 16 query rows; loops over 64-key tiles.
// ---------------------------------------------------------------------------------------------
template <int D, bool kDrop = false>
__global__ void __launch_bounds__(128) fa_fwd_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                                     const bf16_t* __restrict__ v, bf16_t* __restrict__ o,
                                                     float* __restrict__ lse, FaArgs a) {
  constexpr int BM = 64, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sK = sQ + BM * LD;
  bf16_t* sV = sK + kBN * LD;

  const int qb = gridDim.x - 1 - blockIdx.x;  // heavy (late) causal blocks first
  const int bh = blockIdx.y, bi = bh / a.NP, h = bh % a.NP, grp = h / (a.NP / a.NG);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int q0 = qb * BM;
  const int64_t qstride = (int64_t)a.B * a.NP * D, kstride = (int64_t)a.B * a.NG * D;
  const bf16_t* qg = q + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D;
  const bf16_t* kg = k + (int64_t)bi * a.NG * D + (int64_t)grp * D;
  const bf16_t* vg = v + (int64_t)bi * a.NG * D + (int64_t)grp * D;

  load_tile<D, LD>(sQ, qg, qstride, BM, a.S - q0);
  __syncthreads();
  const int m0 = warp * 16;
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    qf[kk][0] = lds32(sQ + (m0 + g) * LD + kk * 16 + 2 * t);
    qf[kk][1] = lds32(sQ + (m0 + g + 8) * LD + kk * 16 + 2 * t);
    qf[kk][2] = lds32(sQ + (m0 + g) * LD + kk * 16 + 8 + 2 * t);
    qf[kk][3] = lds32(sQ + (m0 + g + 8) * LD + kk * 16 + 8 + 2 * t);
  }
  float oacc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

  int nkb = (a.SK + kBN - 1) / kBN;
  if (a.causal && !a.mask) nkb = min(nkb, (min(a.S, q0 + BM) - 1) / kBN + 1);
  for (int kb = 0; kb < nkb; ++kb) {
    const int k0 = kb * kBN;
    __syncthreads();
    load_tile<D, LD>(sK, kg + (int64_t)k0 * kstride, kstride, kBN, a.SK - k0);
    load_tile<D, LD>(sV, vg + (int64_t)k0 * kstride, kstride, kBN, a.SK - k0);
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        uint32_t b0 = lds32(sK + (nt * 8 + g) * LD + kk * 16 + 2 * t);
        uint32_t b1 = lds32(sK + (nt * 8 + g) * LD + kk * 16 + 8 + 2 * t);
        mma16816(s[nt], qf[kk], b0, b1);
      }
    // scale, mask, online softmax; O += P V
    const bool full = !a.mask && k0 + kBN <= a.SK && q0 + BM <= a.S && (!a.causal || k0 + kBN - 1 <= q0);
    fwd_softmax_pv<D, LD, kDrop>(s, oacc, mrow, lrow, a, full, bi, q0 + m0, k0, g, t, lane, sV, bh);
  }
  // finalize
  fwd_store<D>(oacc, mrow, lrow, a, o, lse, bi, h, bh, q0 + m0, g, t);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------
// Dvec[b, np, s] = sum_d dO * O (one warp per row).
template <int D>
__global__ void fa_bwd_dot_kernel(const bf16_t* __restrict__ dout, const bf16_t* __restrict__ out,
                                  float* __restrict__ dvec, FaArgs a) {
  const int64_t rows = (int64_t)a.S * a.B * a.NP;
  const int lane = threadIdx.x & 31;
  for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; r < rows;
       r += (int64_t)gridDim.x * blockDim.x / 32) {
    // r indexes [s, b, np]
    float acc = 0.0f;
    for (int c = lane; c < D; c += 32) acc += to_f(dout[r * D + c]) * to_f(out[r * D + c]);
    acc = warp_sum(acc);
    if (lane == 0) {
      const int64_t h = r % a.NP, bi = (r / a.NP) % a.B, qi = r / ((int64_t)a.NP * a.B);
      dvec[(bi * a.NP + h) * a.S + qi] = acc;
    }
  }
}

// dV += Pᵀ dO and dK += dSᵀ Q for this warp's 16 keys (k-dim: the BM queries of the tile), shared
// by fa_bwd_kernel and fa_bwd_v2_kernel: st = Pᵀ, dp = dSᵀ (unscaled) in registers; the Q and dO
// tiles in shared memory (row stride LD).
template <int D, int LD, int BM>
__device__ __forceinline__ void bwd_dkdv_accumulate(float (&dka)[D / 8][4], float (&dva)[D / 8][4],
                                                    const float (&st)[BM / 8][4], const float (&dp)[BM / 8][4],
                                                    const bf16_t* sQ, const bf16_t* sdO, int lane) {
#pragma unroll
  for (int kc = 0; kc < BM / 16; ++kc) {
    uint32_t pa[4], da[4];
    acc_a_frag(pa, st, kc);
    acc_a_frag(da, dp, kc);
#pragma unroll
    for (int dt = 0; dt < D / 8; dt += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3, sdO + (kc * 16 + (lane & 15)) * LD + dt * 8 + (lane >> 4) * 8);
      mma16816(dva[dt], pa, b0, b1);
      mma16816(dva[dt + 1], pa, b2, b3);
      ldsm_x4_trans(b0, b1, b2, b3, sQ + (kc * 16 + (lane & 15)) * LD + dt * 8 + (lane >> 4) * 8);
      mma16816(dka[dt], da, b0, b1);
      mma16816(dka[dt + 1], da, b2, b3);
    }
  }
}

// dQ += dS K for one query tile, shared by both backward kernels: every warp stores its dSᵀ rows
// (dp, keys n0.. of the block's KB keys) to sdS [KB][LDS], then computes its DC-column slice
// (rows dq_m0.., columns dq_c0..) of dS K over the block's keys (sK, row stride LD) and adds it,
// times the softmax scale, to the fp32 accumulator dq_acc [b·np, s, D] row bh (atomics).
template <int D, int LD, int LDS, int BM, int KB, int DC>
__device__ __forceinline__ void bwd_dq_accumulate(const float (&dp)[BM / 8][4], bf16_t* sdS, const bf16_t* sK,
                                                  float* __restrict__ dq_acc, const FaArgs& a, int64_t bh, int q0,
                                                  int n0, int dq_m0, int dq_c0, int g, int t, int lane) {
#pragma unroll
  for (int nt = 0; nt < BM / 8; ++nt) {
    *reinterpret_cast<uint32_t*>(sdS + (n0 + g) * LDS + nt * 8 + 2 * t) = pack_bf16(dp[nt][0], dp[nt][1]);
    *reinterpret_cast<uint32_t*>(sdS + (n0 + g + 8) * LDS + nt * 8 + 2 * t) = pack_bf16(dp[nt][2], dp[nt][3]);
  }
  __syncthreads();
  float dqa[DC / 8][4];
#pragma unroll
  for (int i = 0; i < DC / 8; ++i) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.0f;
#pragma unroll
  for (int kc = 0; kc < KB / 16; ++kc) {
    uint32_t aa[4];
    const int mat = lane >> 3, r = lane & 7;
    ldsm_x4_trans(aa[0], aa[1], aa[2], aa[3], sdS + (kc * 16 + r + (mat >> 1) * 8) * LDS + dq_m0 + (mat & 1) * 8);
#pragma unroll
    for (int dt = 0; dt < DC / 8; dt += 2) {
      uint32_t b0, b1, b2, b3;
      ldsm_x4_trans(b0, b1, b2, b3, sK + (kc * 16 + (lane & 15)) * LD + dq_c0 + dt * 8 + (lane >> 4) * 8);
      mma16816(dqa[dt], aa, b0, b1);
      mma16816(dqa[dt + 1], aa, b2, b3);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = q0 + dq_m0 + g + r * 8;
    if (qi >= a.S) continue;
    float* row = dq_acc + (bh * a.S + qi) * D + dq_c0;
#pragma unroll
    for (int dt = 0; dt < DC / 8; ++dt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      atomicAdd(reinterpret_cast<float2*>(row + dt * 8 + 2 * t),
                make_float2(dqa[dt][2 * r] * a.scale, dqa[dt][2 * r + 1] * a.scale));
#else
      atomicAdd(row + dt * 8 + 2 * t, dqa[dt][2 * r] * a.scale);
      atomicAdd(row + dt * 8 + 2 * t + 1, dqa[dt][2 * r + 1] * a.scale);
#endif
    }
  }
}

// One element of the backward's Pᵀ / dSᵀ tiles, shared by both backward kernels: st = P (dV's
// operand) and dp = P (dP − D) (dSᵀ unscaled) from the recomputed probability p, dp = dP on entry and
// d = D of the element's query row. kDrop: st = P∘F and dp = P (F∘dP − D), F = keep_scale(key, off).
template <bool kDrop>
__device__ __forceinline__ void bwd_p_ds(float& st, float& dp, float p, float d, const FaArgs& a, uint64_t key,
                                         uint64_t off) {
  if constexpr (kDrop) {
    const float f = keep_scale(a, key, off);
    st = p * f;
    dp = p * (dp * f - d);
  } else {
    st = p;
    dp = p * (dp - d);
  }
}

// The backward's end: this warp's key rows (from kr0 = k0 + n0) of dK (times the softmax scale)
// and dV in bf16, layout [sk, b, ng, D], K/V group grp.
template <int D>
__device__ __forceinline__ void bwd_store_dkdv(const float (&dka)[D / 8][4], const float (&dva)[D / 8][4],
                                               bf16_t* __restrict__ dk, bf16_t* __restrict__ dv, const FaArgs& a,
                                               int bi, int grp, int kr0, int g, int t) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = kr0 + g + r * 8;
    if (kj >= a.SK) continue;
    const int64_t off = ((int64_t)kj * a.B + bi) * a.NG * D + (int64_t)grp * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<uint32_t*>(dk + off + dt * 8 + 2 * t) =
          pack_bf16(dka[dt][2 * r] * a.scale, dka[dt][2 * r + 1] * a.scale);
      *reinterpret_cast<uint32_t*>(dv + off + dt * 8 + 2 * t) = pack_bf16(dva[dt][2 * r], dva[dt][2 * r + 1]);
    }
  }
}

// kTwoPassDq: dK/dV only (dQ comes from fa_bwd_dq_kernel; dq_acc unused): the deterministic backward.
template <int D, int BM, bool kDrop = false, bool kTwoPassDq = false>
__global__ void __launch_bounds__(128) fa_bwd_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                                     const bf16_t* __restrict__ v, const bf16_t* __restrict__ dout,
                                                     const float* __restrict__ lse, const float* __restrict__ dvec,
                                                     float* __restrict__ dq_acc, bf16_t* __restrict__ dk,
                                                     bf16_t* __restrict__ dv, FaArgs a) {
  constexpr int LD = D + 8, LDS = BM + 8;
  constexpr int NT = BM / 8;  // query n-tiles per warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sV = sK + kBN * LD;
  bf16_t* sQ = sV + kBN * LD;
  bf16_t* sdO = sQ + BM * LD;
  bf16_t* sdS = sdO + BM * LD;  // [kBN][LDS], dS^T
  float* sL = reinterpret_cast<float*>(sdS + kBN * LDS);
  float* sD = sL + BM;

  const int kb = blockIdx.x, bg = blockIdx.y, bi = bg / a.NG, grp = bg % a.NG;
  const int npg = a.NP / a.NG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int k0 = kb * kBN, n0 = warp * 16;
  const int64_t qstride = (int64_t)a.B * a.NP * D, kstride = (int64_t)a.B * a.NG * D;
  load_tile<D, LD>(sK, k + ((int64_t)k0 * a.B + bi) * a.NG * D + (int64_t)grp * D, kstride, kBN, a.SK - k0);
  load_tile<D, LD>(sV, v + ((int64_t)k0 * a.B + bi) * a.NG * D + (int64_t)grp * D, kstride, kBN, a.SK - k0);

  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[i][e] = dva[i][e] = 0.0f;

  const int nqb = (a.S + BM - 1) / BM;
  const int qb0 = (a.causal && !a.mask) ? k0 / BM : 0;
  // dQ tile split among warps: BM/16 row groups x (4 / (BM/16)) column groups.
  constexpr int kRowGroups = BM / 16, kColGroups = kWarpsPerBlock / kRowGroups, DC = D / kColGroups;
  const int dq_m0 = (warp % kRowGroups) * 16, dq_c0 = (warp / kRowGroups) * DC;

  for (int hh = 0; hh < npg; ++hh) {
    const int h = grp * npg + hh;
    const int64_t bh = (int64_t)bi * a.NP + h;
    for (int qb = qb0; qb < nqb; ++qb) {
      const int q0 = qb * BM;
      __syncthreads();
      load_tile<D, LD>(sQ, q + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D, qstride, BM, a.S - q0);
      load_tile<D, LD>(sdO, dout + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D, qstride, BM, a.S - q0);
      for (int i = threadIdx.x; i < BM; i += blockDim.x) {
        const int qi = q0 + i;
        float l = qi < a.S ? lse[bh * a.S + qi] : INFINITY;
        sL[i] = l == -INFINITY ? INFINITY : l * kLog2e;  // fully masked rows: P = 0
        sD[i] = qi < a.S ? dvec[bh * a.S + qi] : 0.0f;
      }
      __syncthreads();
      // S^T = K Q^T (rows: this warp's 16 keys; cols: BM queries)
      float st[NT][4], dp[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t ka[4] = {lds32(sK + (n0 + g) * LD + kk * 16 + 2 * t), lds32(sK + (n0 + g + 8) * LD + kk * 16 + 2 * t),
                          lds32(sK + (n0 + g) * LD + kk * 16 + 8 + 2 * t),
                          lds32(sK + (n0 + g + 8) * LD + kk * 16 + 8 + 2 * t)};
        uint32_t va[4] = {lds32(sV + (n0 + g) * LD + kk * 16 + 2 * t), lds32(sV + (n0 + g + 8) * LD + kk * 16 + 2 * t),
                          lds32(sV + (n0 + g) * LD + kk * 16 + 8 + 2 * t),
                          lds32(sV + (n0 + g + 8) * LD + kk * 16 + 8 + 2 * t)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mma16816(st[nt], ka, lds32(sQ + (nt * 8 + g) * LD + kk * 16 + 2 * t),
                   lds32(sQ + (nt * 8 + g) * LD + kk * 16 + 8 + 2 * t));
          mma16816(dp[nt], va, lds32(sdO + (nt * 8 + g) * LD + kk * 16 + 2 * t),
                   lds32(sdO + (nt * 8 + g) * LD + kk * 16 + 8 + 2 * t));
        }
      }
      // P^T and dS^T = P^T * (dP^T - D); kDrop: (P∘F)^T and dS^T = P^T * (F∘dP^T - D)
      const bool full = !a.mask && k0 + kBN <= a.SK && q0 + BM <= a.S && (!a.causal || k0 + kBN - 1 <= q0);
      uint64_t dkey = 0;  // kDrop: stream key of (query q0, key k0 + n0 + g) of this head
      if constexpr (kDrop) dkey = drop_key(a, bh, q0, k0 + n0 + g);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kl = n0 + g + (e >= 2 ? 8 : 0), ql = nt * 8 + 2 * t + (e & 1);
          float x = st[nt][e] * a.scale_log2;
          if (!full && !visible(a, bi, q0 + ql, k0 + kl)) x = -INFINITY;
          const float p = exp2f(x - sL[ql]);
          bwd_p_ds<kDrop>(st[nt][e], dp[nt][e], p, sD[ql], a, dkey, (uint64_t)(uint32_t)ql * (uint32_t)a.SK + (e >= 2 ? 8 : 0));
        }
      // dV += P^T dO ; dK += dS^T Q (k-dim = queries)
      bwd_dkdv_accumulate<D, LD, BM>(dka, dva, st, dp, sQ, sdO, lane);
      // dS^T to shared memory for dQ = dS K
      if constexpr (!kTwoPassDq)
        bwd_dq_accumulate<D, LD, LDS, BM, kBN, DC>(dp, sdS, sK, dq_acc, a, bh, q0, n0, dq_m0, dq_c0, g, t, lane);
    }
  }
  // write dK (scaled), dV
  bwd_store_dkdv<D>(dka, dva, dk, dv, a, bi, grp, k0 + n0, g, t);
}

// ---------------------------------------------------------------------------------------------
// Pipelined versions (v2): K/V tiles (forward) and Q/dO/lse/D tiles (backward) are fetched with
// cp.async into two shared-memory stages, so the next tile's loads overlap this tile's math;
// B fragments of row-major tiles come from ldmatrix (non-transposed). Used when s % 4 == 0
// (16-byte cp.async of the lse/D rows); v1 above is the fallback.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  uint32_t sa = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  int sz = valid ? 16 : 0;  // 0: zero-fill, nothing read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(sa), "l"(gmem), "r"(sz));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(a));
}

template <int D, int LD>
__device__ __forceinline__ void async_tile(bf16_t* s, const bf16_t* g, int64_t stride, int rows, int valid) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < rows * kChunks; i += blockDim.x) {
    int r = i / kChunks, c = (i % kChunks) * 8;
    const bool ok = r < valid;
    cp_async16(s + r * LD + c, ok ? g + r * stride + c : g, ok);
  }
}

// B fragments for two n-tiles (nt, nt+1) and k-chunk kk from a row-major [n][k] tile (B = M^T).
__device__ __forceinline__ void ldsm_b_pair(uint32_t (&b)[4], const bf16_t* tile, int ld, int nt, int kk, int lane) {
  const int mat = lane >> 3, r = lane & 7;
  ldsm_x4(b[0], b[1], b[2], b[3], tile + ((nt + (mat >> 1)) * 8 + r) * ld + kk * 16 + (mat & 1) * 8);
}

// The K/V loop of the query-tile kernels (fa_fwd_v2_kernel, fa_bwd_dq_kernel), at tile kb of nkb:
// starts the copy of tile kb + 1 into the other stage of sKV (K, then V; stage st at
// sKV + st·2·kBN·LD), waits for tile kb's copies and meets the block at a barrier.
template <int D, int LD>
__device__ __forceinline__ void kv_tile_ready(bf16_t* sKV, const bf16_t* kg, const bf16_t* vg, int64_t kstride,
                                              const FaArgs& a, int kb, int nkb) {
  const int k0 = kb * kBN;
  if (kb + 1 < nkb) {
    bf16_t* nk = sKV + ((kb + 1) & 1) * 2 * kBN * LD;
    async_tile<D, LD>(nk, kg + (int64_t)(k0 + kBN) * kstride, kstride, kBN, a.SK - k0 - kBN);
    async_tile<D, LD>(nk + kBN * LD, vg + (int64_t)(k0 + kBN) * kstride, kstride, kBN, a.SK - k0 - kBN);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// A fragments (m16n8k16) of rows m0..m0+15 of a row-major [rows][D] tile (row stride LD), k-chunks 0..D/16-1.
template <int D, int LD>
__device__ __forceinline__ void ldsm_a_rows(uint32_t (&f)[D / 16][4], const bf16_t* tile, int m0, int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const int mat = lane >> 3, r = lane & 7;
    ldsm_x4(f[kk][0], f[kk][1], f[kk][2], f[kk][3], tile + (m0 + r + (mat & 1) * 8) * LD + kk * 16 + (mat >> 1) * 8);
  }
}

// c [16][kBN] = A · tileᵀ: A the warp's 16 rows as fragments (ldsm_a_rows), tile kBN row-major rows
// of D (row stride LD) as the B operand (S = Q Kᵀ, dP = dO Vᵀ).
template <int D, int LD>
__device__ __forceinline__ void mma_rows_tile_t(float (&c)[8][4], const uint32_t (&f)[D / 16][4], const bf16_t* tile,
                                                int lane) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int nt = 0; nt < 8; nt += 2) {
      uint32_t b[4];
      ldsm_b_pair(b, tile, LD, nt, kk, lane);
      mma16816(c[nt], f[kk], b[0], b[1]);
      mma16816(c[nt + 1], f[kk], b[2], b[3]);
    }
}

template <int D, int kWarps, bool kDrop = false>  // kWarps warps x 16 query rows per block
__global__ void __launch_bounds__(kWarps * 32) fa_fwd_v2_kernel(const bf16_t* __restrict__ q,
                                                                 const bf16_t* __restrict__ k,
                                                                 const bf16_t* __restrict__ v, bf16_t* __restrict__ o,
                                                                 float* __restrict__ lse, FaArgs a) {
  constexpr int BM = 16 * kWarps, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sKV = sQ + BM * LD;  // stage st: K at sKV + st*2*kBN*LD, V after it

  const int qb = gridDim.x - 1 - blockIdx.x;
  const int bh = blockIdx.y, bi = bh / a.NP, h = bh % a.NP, grp = h / (a.NP / a.NG);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int q0 = qb * BM;
  const int64_t qstride = (int64_t)a.B * a.NP * D, kstride = (int64_t)a.B * a.NG * D;
  const bf16_t* qg = q + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D;
  const bf16_t* kg = k + (int64_t)bi * a.NG * D + (int64_t)grp * D;
  const bf16_t* vg = v + (int64_t)bi * a.NG * D + (int64_t)grp * D;

  int nkb = (a.SK + kBN - 1) / kBN;
  if (a.causal && !a.mask) nkb = min(nkb, (min(a.S, q0 + BM) - 1) / kBN + 1);

  async_tile<D, LD>(sQ, qg, qstride, BM, a.S - q0);
  async_tile<D, LD>(sKV, kg, kstride, kBN, a.SK);
  async_tile<D, LD>(sKV + kBN * LD, vg, kstride, kBN, a.SK);
  cp_async_commit();

  const int m0 = warp * 16;
  uint32_t qf[D / 16][4];
  float oacc[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.0f;
  float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.0f, 0.0f};

  for (int kb = 0; kb < nkb; ++kb) {
    const int k0 = kb * kBN;
    kv_tile_ready<D, LD>(sKV, kg, vg, kstride, a, kb, nkb);
    if (kb == 0) ldsm_a_rows<D, LD>(qf, sQ, m0, lane);
    const bf16_t* sK = sKV + (kb & 1) * 2 * kBN * LD;
    const bf16_t* sV = sK + kBN * LD;
    float s[8][4];
    mma_rows_tile_t<D, LD>(s, qf, sK, lane);
    const bool full = !a.mask && k0 + kBN <= a.SK && q0 + BM <= a.S && (!a.causal || k0 + kBN - 1 <= q0);
    fwd_softmax_pv<D, LD, kDrop>(s, oacc, mrow, lrow, a, full, bi, q0 + m0, k0, g, t, lane, sV, bh);
    __syncthreads();  // this stage is refilled two iterations on
  }
  fwd_store<D>(oacc, mrow, lrow, a, o, lse, bi, h, bh, q0 + m0, g, t);
}

// kWarps warps x 16 keys per block. kTwoPassDq: dK/dV only, no sdS (dQ comes from fa_bwd_dq_kernel).
template <int D, int BM, int kWarps, bool kDrop = false, bool kTwoPassDq = false>
__global__ void __launch_bounds__(kWarps * 32) fa_bwd_v2_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                                        const bf16_t* __restrict__ v, const bf16_t* __restrict__ dout,
                                                        const float* __restrict__ lse, const float* __restrict__ dvec,
                                                        float* __restrict__ dq_acc, bf16_t* __restrict__ dk,
                                                        bf16_t* __restrict__ dv, FaArgs a) {
  constexpr int LD = D + 8, LDS = BM + 8;
  constexpr int NT = BM / 8, kBNB = 16 * kWarps;
  constexpr int kStage = 2 * BM * LD + 2 * BM * 2;  // Q, dO, then lse, D (floats as 2 bf16 each)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sV = sK + kBNB * LD;
  bf16_t* sdS = sV + kBNB * LD;        // [kBNB][LDS] (none with kTwoPassDq)
  bf16_t* sStage = sdS + (kTwoPassDq ? 0 : kBNB * LDS);  // 2 stages of kStage bf16

  const int kb = blockIdx.x, bg = blockIdx.y, bi = bg / a.NG, grp = bg % a.NG;
  const int npg = a.NP / a.NG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int k0 = kb * kBNB, n0 = warp * 16;
  const int64_t qstride = (int64_t)a.B * a.NP * D, kstride = (int64_t)a.B * a.NG * D;

  const int nqb = (a.S + BM - 1) / BM;
  const int qb0 = (a.causal && !a.mask) ? k0 / BM : 0;
  const int per_head = nqb - qb0, iters = per_head * npg;

  auto issue = [&](int it) {
    const int hh = it / per_head, qb = qb0 + it % per_head, h = grp * npg + hh, q0 = qb * BM;
    const int64_t bh = (int64_t)bi * a.NP + h;
    bf16_t* st = sStage + (it & 1) * kStage;
    async_tile<D, LD>(st, q + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D, qstride, BM, a.S - q0);
    async_tile<D, LD>(st + BM * LD, dout + ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D, qstride, BM,
                      a.S - q0);
    float* sl = reinterpret_cast<float*>(st + 2 * BM * LD);
    for (int i = threadIdx.x; i < 2 * BM / 4; i += blockDim.x) {
      const int which = i / (BM / 4), c = (i % (BM / 4)) * 4;
      const float* src = (which == 0 ? lse : dvec) + bh * a.S + q0 + c;
      cp_async16(sl + which * BM + c, src, q0 + c < a.S);  // s % 4 == 0: a chunk is all in or all out
    }
    cp_async_commit();
  };

  async_tile<D, LD>(sK, k + ((int64_t)k0 * a.B + bi) * a.NG * D + (int64_t)grp * D, kstride, kBNB, a.SK - k0);
  async_tile<D, LD>(sV, v + ((int64_t)k0 * a.B + bi) * a.NG * D + (int64_t)grp * D, kstride, kBNB, a.SK - k0);
  if (iters > 0) issue(0);
  else cp_async_commit();

  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[i][e] = dva[i][e] = 0.0f;

  constexpr int kRowGroups = BM / 16, kColGroups = kWarps / kRowGroups, DC = D / kColGroups;
  const int dq_m0 = (warp % kRowGroups) * 16, dq_c0 = (warp / kRowGroups) * DC;

  for (int it = 0; it < iters; ++it) {
    const int hh = it / per_head, qb = qb0 + it % per_head, h = grp * npg + hh, q0 = qb * BM;
    const int64_t bh = (int64_t)bi * a.NP + h;
    if (it + 1 < iters) {
      issue(it + 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16_t* sQ = sStage + (it & 1) * kStage;
    const bf16_t* sdO = sQ + BM * LD;
    const float* sL = reinterpret_cast<const float*>(sdO + BM * LD);
    const float* sD = sL + BM;

    float st[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      uint32_t ka[4], va[4];
      {
        const int mat = lane >> 3, r = lane & 7;
        ldsm_x4(ka[0], ka[1], ka[2], ka[3], sK + (n0 + r + (mat & 1) * 8) * LD + kk * 16 + (mat >> 1) * 8);
        ldsm_x4(va[0], va[1], va[2], va[3], sV + (n0 + r + (mat & 1) * 8) * LD + kk * 16 + (mat >> 1) * 8);
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        uint32_t b[4];
        ldsm_b_pair(b, sQ, LD, nt, kk, lane);
        mma16816(st[nt], ka, b[0], b[1]);
        mma16816(st[nt + 1], ka, b[2], b[3]);
        ldsm_b_pair(b, sdO, LD, nt, kk, lane);
        mma16816(dp[nt], va, b[0], b[1]);
        mma16816(dp[nt + 1], va, b[2], b[3]);
      }
    }
    const bool full = !a.mask && k0 + kBNB <= a.SK && q0 + BM <= a.S && (!a.causal || k0 + kBNB - 1 <= q0);
    uint64_t dkey = 0;  // kDrop: stream key of (query q0, key k0 + n0 + g) of head h
    if constexpr (kDrop) dkey = drop_key(a, bh, q0, k0 + n0 + g);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int kl = n0 + g + (e >= 2 ? 8 : 0), ql = nt * 8 + 2 * t + (e & 1);
        float x = st[nt][e] * a.scale_log2;
        if (!full && !visible(a, bi, q0 + ql, k0 + kl)) x = -INFINITY;
        const float l = sL[ql];
        const float p = l == -INFINITY ? 0.0f : exp2f(x - l * kLog2e);
        bwd_p_ds<kDrop>(st[nt][e], dp[nt][e], p, sD[ql], a, dkey, (uint64_t)(uint32_t)ql * (uint32_t)a.SK + (e >= 2 ? 8 : 0));
      }
    bwd_dkdv_accumulate<D, LD, BM>(dka, dva, st, dp, sQ, sdO, lane);
    if constexpr (!kTwoPassDq)
      bwd_dq_accumulate<D, LD, LDS, BM, kBNB, DC>(dp, sdS, sK, dq_acc, a, bh, q0, n0, dq_m0, dq_c0, g, t, lane);
    __syncthreads();  // sdS and this stage are rewritten later
  }
  cp_async_wait<0>();  // no copy may be in flight at exit (iters == 0 when sk > s, causal)
  bwd_store_dkdv<D>(dka, dva, dk, dv, a, bi, grp, k0 + n0, g, t);
}

// ---------------------------------------------------------------------------------------------
// Two-pass dQ (the deterministic backward; variants::forced().flash_dq_two_pass elsewhere): the
// dK/dV kernels above run with kTwoPassDq (their dQ atomics skipped) and this kernel computes dQ
// without atomics. One block per BM = 16·kWarps query rows of one head (the forward's partition);
// each warp owns 16 rows and loops over the visible 64-key tiles of the head's K/V group in
// ascending order (K/V double-buffered by cp.async, as fa_fwd_v2_kernel), recomputing S = Q Kᵀ,
// P = exp(S·scale − lse) from the forward's lse, dP = dO Vᵀ and dS = P∘(dP − D) with D = rowsum(dO∘O)
// (kDrop: dS = P∘(F∘dP − D), F the forward's keep-scales of the same stream elements), then
// dQ += dS K in fp32 registers; dQ·scale is written once, in bf16. Every sum has a fixed order, so
// the result is bitwise reproducible run to run.
// ---------------------------------------------------------------------------------------------
template <int D, int kWarps, bool kDrop = false>
__global__ void __launch_bounds__(kWarps * 32) fa_bwd_dq_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                                                 const bf16_t* __restrict__ v,
                                                                 const bf16_t* __restrict__ dout,
                                                                 const float* __restrict__ lse,
                                                                 const float* __restrict__ dvec,
                                                                 bf16_t* __restrict__ dq, FaArgs a) {
  constexpr int BM = 16 * kWarps, LD = D + 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem_raw);
  bf16_t* sdO = sQ + BM * LD;
  bf16_t* sKV = sdO + BM * LD;  // stage st: K at sKV + st*2*kBN*LD, V after it

  const int qb = gridDim.x - 1 - blockIdx.x;  // heavy (late) causal blocks first
  const int bh = blockIdx.y, bi = bh / a.NP, h = bh % a.NP, grp = h / (a.NP / a.NG);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int q0 = qb * BM, m0 = warp * 16, qr0 = q0 + m0;
  const int64_t qstride = (int64_t)a.B * a.NP * D, kstride = (int64_t)a.B * a.NG * D;
  const int64_t qoff = ((int64_t)q0 * a.B + bi) * a.NP * D + (int64_t)h * D;
  const bf16_t* kg = k + (int64_t)bi * a.NG * D + (int64_t)grp * D;
  const bf16_t* vg = v + (int64_t)bi * a.NG * D + (int64_t)grp * D;

  int nkb = (a.SK + kBN - 1) / kBN;
  if (a.causal && !a.mask) nkb = min(nkb, (min(a.S, q0 + BM) - 1) / kBN + 1);

  async_tile<D, LD>(sQ, q + qoff, qstride, BM, a.S - q0);
  async_tile<D, LD>(sdO, dout + qoff, qstride, BM, a.S - q0);
  async_tile<D, LD>(sKV, kg, kstride, kBN, a.SK);
  async_tile<D, LD>(sKV + kBN * LD, vg, kstride, kBN, a.SK);
  cp_async_commit();

  // lse and D of rows qr0 + g and qr0 + g + 8 (lse -inf: a fully masked row or one past s, P = 0)
  float lrow[2], drow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qr0 + g + r * 8;
    lrow[r] = qi < a.S ? lse[(int64_t)bh * a.S + qi] : -INFINITY;
    drow[r] = qi < a.S ? dvec[(int64_t)bh * a.S + qi] : 0.0f;
  }
  uint32_t qf[D / 16][4], df[D / 16][4];
  float dqa[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) dqa[i][0] = dqa[i][1] = dqa[i][2] = dqa[i][3] = 0.0f;

  for (int kb = 0; kb < nkb; ++kb) {
    const int k0 = kb * kBN;
    kv_tile_ready<D, LD>(sKV, kg, vg, kstride, a, kb, nkb);
    if (kb == 0) {
      ldsm_a_rows<D, LD>(qf, sQ, m0, lane);
      ldsm_a_rows<D, LD>(df, sdO, m0, lane);
    }
    const bf16_t* sK = sKV + (kb & 1) * 2 * kBN * LD;
    const bf16_t* sV = sK + kBN * LD;
    // S = Q Kᵀ and dP = dO Vᵀ (rows: this warp's 16 queries; columns: the tile's 64 keys)
    float s[8][4], dp[8][4];
    mma_rows_tile_t<D, LD>(s, qf, sK, lane);
    mma_rows_tile_t<D, LD>(dp, df, sV, lane);
    // P from lse, dS = P (dP − D) (kDrop: P (F∘dP − D)), as the dK/dV kernels compute them
    const bool full = !a.mask && k0 + kBN <= a.SK && q0 + BM <= a.S && (!a.causal || k0 + kBN - 1 <= q0);
    uint64_t dkey[2] = {0, 0};  // kDrop: stream keys of rows qr0 + g and qr0 + g + 8 at key k0
    if constexpr (kDrop) {
      dkey[0] = drop_key(a, bh, qr0 + g, k0);
      dkey[1] = drop_key(a, bh, qr0 + g + 8, k0);
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1, qi = qr0 + g + r * 8, kl = nt * 8 + 2 * t + (e & 1);
        float x = s[nt][e] * a.scale_log2;
        if (!full && !visible(a, bi, qi, k0 + kl)) x = -INFINITY;
        const float p = lrow[r] == -INFINITY ? 0.0f : exp2f(x - lrow[r] * kLog2e);
        float pf;  // P∘F (dV's operand; unused here)
        bwd_p_ds<kDrop>(pf, dp[nt][e], p, drow[r], a, dkey[r], (uint64_t)kl);
      }
    // dQ += dS K (K's tile [keys][D] as the column-major B operand: ldmatrix .trans, as V in P V)
#pragma unroll
    for (int kc = 0; kc < kBN / 16; ++kc) {
      uint32_t da[4];
      acc_a_frag(da, dp, kc);
      mma_a_tile_rows<D, LD>(dqa, da, sK, kc, lane);
    }
    __syncthreads();  // this stage is refilled two iterations on
  }
  cp_async_wait<0>();  // no copy may be in flight at exit (nkb == 0 when sk == 0)
  // dq [s, b, np, D] = scale · dS K, this warp's rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = qr0 + g + r * 8;
    if (qi >= a.S) continue;
    bf16_t* row = dq + ((int64_t)qi * a.B + bi) * a.NP * D + (int64_t)h * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(row + dt * 8 + 2 * t) = pack_bf16(dqa[dt][2 * r] * a.scale, dqa[dt][2 * r + 1] * a.scale);
  }
}

// dq[s, b, np, d] = dq_acc[b, np, s, d]
template <int D>
__global__ void fa_dq_convert_kernel(const float* __restrict__ acc, bf16_t* __restrict__ dq, FaArgs a) {
  const int64_t total = (int64_t)a.S * a.B * a.NP * D;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t c = i % D, r = i / D;
    const int64_t h = r % a.NP, bi = (r / a.NP) % a.B, qi = r / ((int64_t)a.NP * a.B);
    dq[i] = __float2bfloat16_rn(acc[((bi * a.NP + h) * a.S + qi) * D + c]);
  }
}

FaArgs make_args(const Tensor& q, const Tensor& k, const AttentionParams& p) {
  FaArgs a{};
  a.S = (int)q.size(0);
  a.B = (int)q.size(1);
  a.NP = (int)q.size(2);
  a.SK = (int)k.size(0);
  a.NG = (int)k.size(2);
  a.scale = p.softmax_scale;
  a.scale_log2 = p.softmax_scale * kLog2e;
  a.causal = p.causal;
  a.mask = p.attention_mask ? static_cast<const uint8_t*>(p.attention_mask->data_ptr()) : nullptr;
  a.drop_p = p.dropout_p;
  a.drop_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  a.stream = ddropout_stream(p.seed, p.offset);
  return a;
}

void check_args(const char* name, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  check_cuda(q, name);
  MEGATRON_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(1) == q.size(1) &&
                 k.size(3) == q.size(3) && k.size(2) > 0 && q.size(2) % k.size(2) == 0 &&
                 q.dtype() == DType::kBFloat16 && k.dtype() == DType::kBFloat16 && v.dtype() == DType::kBFloat16)
      << name << ": q " << q.str() << " k " << k.str() << " v " << v.str() << " (CUDA attention needs bfloat16)";
  MEGATRON_CHECK(q.size(3) == 64 || q.size(3) == 128) << name << ": head dim " << q.size(3) << " (64 or 128 on CUDA)";
  MEGATRON_CHECK(aligned16(q.data_ptr()) && aligned16(k.data_ptr()) && aligned16(v.data_ptr()))
      << name << ": q/k/v must be 16-byte aligned";
  MEGATRON_CHECK(p.dropout_p >= 0.0f && p.dropout_p < 1.0f) << name << ": dropout p " << p.dropout_p;
  if (p.attention_mask)
    MEGATRON_CHECK(p.attention_mask->is_cuda() && dtype_size(p.attention_mask->dtype()) == 1 &&
                   p.attention_mask->numel() == q.size(1) * q.size(0) * k.size(0))
        << name << ": attention_mask " << p.attention_mask->str() << " must be a bool [b, 1, s, sk] CUDA tensor";
}

template <class K>
void set_smem(K kern, size_t smem) {
  if (smem > 48 * 1024) CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

// The pipelined kernels need 16-byte cp.async of lse rows: s % 4 == 0 and an aligned lse.
// variants::forced().flash_v1 forces the simple kernels (gpu_ops_test and dev/cuda/flash.cu run both).
// Pipelined kernels with 4 warps per block (64 query rows / keys) or 8 (128). Measured on the
// H200 (docs/performance.md, run 3): 8 warps win at head dim 128 (LLaMA-3-8B shape, fwd+bwd
// 10.6 vs 11.7 ms), 4 warps at head dim 64 (GPT-2 shape, 2.81 vs 3.02 ms).
// variants::forced().flash_small = 1 / 0 forces 4 / 8 warps (the tests and dev/cuda/flash.cu run both).
bool small_blocks(int head_dim) {
  const int f = variants::forced().flash_small;
  if (f == 0 || f == 1) return f == 1;
  return head_dim <= 64;
}

// Backward v2 with `warps` x 16 keys per block; two_pass: a kTwoPassDq kernel (no dS tile in shared memory).
template <class K>
void launch_bwd_v2(K kern, int warps, int d, int bm, const FaArgs& a, cudaStream_t st, const bf16_t* qp,
                   const bf16_t* kp, const bf16_t* vp, const bf16_t* dop, const float* lp, const float* dvec,
                   float* dq_acc, bf16_t* dkp, bf16_t* dvp, bool two_pass = false) {
  const int keys = 16 * warps, ld = d + 8;
  size_t smem = (2 * keys * ld + (two_pass ? 0 : keys * (bm + 8)) + 2 * (2 * bm * ld + 4 * bm)) * 2;
  set_smem(kern, smem);
  dim3 grid((a.SK + keys - 1) / keys, a.B * a.NG);
  kern<<<grid, warps * 32, smem, st>>>(qp, kp, vp, dop, lp, dvec, dq_acc, dkp, dvp, a);
}

// Which implementation runs: MEGATRON_ATTENTION_BACKEND=cudnn (cuDNN's SDPA; error if cuDNN
// cannot run the call), flash (our kernels), auto or unset (cuDNN when libcudnn loads and accepts
// the shape, else ours). cuDNN is the default because it measured faster at every shape we time
// (docs/performance.md: LLaMA-3-8B fwd+bwd 3.8 vs 10.6 ms, GPT-2 1.6 vs 2.8 ms). Both produce the
// same lse (natural-log log-sum-exp), so a forward from one and a backward from the other agree.
// generic: always the generic kernels (attention_generic.cu). Calls the tensor-core paths cannot
// take (float32, head dims other than 64/128 that cuDNN rejects) run the generic kernels under auto
// and flash; under cudnn they are an error. Attention dropout never runs cuDNN (its dropout random
// stream is not ours, so its masks would differ from the CPU reference's and the generic kernel's):
// under auto and flash a bfloat16 call with head dim 64/128 runs our flash kernels with dropout
// (kDrop, the same stream as attention_generic.cu), any other dropout call the generic kernels;
// under cudnn dropout is an error.
enum class Backend { kAuto, kCudnn, kFlash, kGeneric };
Backend attention_backend() {
  const char* e = std::getenv("MEGATRON_ATTENTION_BACKEND");
  if (!e || !*e || !std::strcmp(e, "auto")) return Backend::kAuto;
  if (!std::strcmp(e, "cudnn")) return Backend::kCudnn;
  if (!std::strcmp(e, "flash")) return Backend::kFlash;
  if (!std::strcmp(e, "generic")) return Backend::kGeneric;
  MEGATRON_CHECK(false) << "MEGATRON_ATTENTION_BACKEND=" << e << ": use auto, cudnn, flash or generic";
  return Backend::kAuto;
}

// True when cuDNN / our flash kernels can take the call: every tensor bfloat16 (or every tensor
// float16: cuDNN only) and 16-byte aligned (head dims and dropout are checked by each path).
bool tensor_core_ok(std::initializer_list<const Tensor*> ts) {
  const DType dt = (*ts.begin())->dtype();
  if (dt != DType::kBFloat16 && dt != DType::kFloat16) return false;
  for (const Tensor* t : ts)
    if (t->dtype() != dt || !aligned16(t->data_ptr())) return false;
  return true;
}

// Which kernel runs attention dropout (never cuDNN, whose dropout stream is not ours): said once
// per process and kernel (flash / generic), with the reason when a bfloat16 call lands on the
// slower generic kernels.
void note_dropout_once(const AttentionParams& p, const Tensor& q, bool flash, const char* why) {
  static std::atomic<bool> said_flash{false}, said_generic{false};
  if (p.dropout_p == 0.0f || q.dtype() != DType::kBFloat16) return;
  if ((flash ? said_flash : said_generic).exchange(true)) return;
  if (flash)
    std::fprintf(stderr,
                 "note: attention dropout %g runs the flash attention kernels with the CPU reference's dropout stream "
                 "(not cuDNN, whose stream differs); MEGATRON_ATTENTION_BACKEND=generic selects the generic kernel\n",
                 p.dropout_p);
  else
    std::fprintf(stderr, "note: attention dropout %g runs the generic CUDA attention kernel (%s)\n", p.dropout_p, why);
}

// The flash kernels take the call's head dim and dtype (bfloat16, 64 or 128).
bool flash_shape_ok(const Tensor& q) {
  return (q.size(3) == 64 || q.size(3) == 128) && q.dtype() == DType::kBFloat16;
}

// Which attention backward --deterministic-mode runs: said once per process.
void note_deterministic_backward_once(Backend be) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  if (be == Backend::kCudnn)
    std::fprintf(stderr, "note: --deterministic-mode with MEGATRON_ATTENTION_BACKEND=cudnn: cuDNN's attention backward "
                         "was measured not bitwise reproducible run to run; unset the variable for the deterministic "
                         "flash backward\n");
  else
    std::fprintf(stderr, "note: --deterministic-mode: attention runs our flash forward and a flash backward with dQ "
                         "from a second pass over the key tiles in a fixed order (no atomics; cuDNN's attention was "
                         "measured not reproducible run to run); bf16 calls with head dims other than 64/128 and "
                         "other dtypes run the generic CUDA backward\n");
}

// The flash backward computes dQ in a second kernel (fa_bwd_dq_kernel, no atomics): always in
// deterministic mode; elsewhere when variants::forced().flash_dq_two_pass (dev/cuda/flash.cpp times it).
bool dq_two_pass(bool det) { return det || variants::forced().flash_dq_two_pass; }

// Shapes shared by every path (ops.h contract).
void check_shapes(const char* name, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  check_cuda(q, name);
  MEGATRON_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(1) == q.size(1) &&
                 k.size(3) == q.size(3) && k.size(2) > 0 && q.size(2) % k.size(2) == 0)
      << name << ": q " << q.str() << " k " << k.str() << " v " << v.str();
  if (p.attention_mask)
    MEGATRON_CHECK(p.attention_mask->is_cuda() && dtype_size(p.attention_mask->dtype()) == 1 &&
                   p.attention_mask->numel() == q.size(1) * q.size(0) * k.size(0))
        << name << ": attention_mask " << p.attention_mask->str() << " must be a bool [b, 1, s, sk] CUDA tensor";
}

bool use_v2(const FaArgs& a, const Tensor& lse) {
  if (variants::forced().flash_v1) return false;
  return a.S % 4 == 0 && aligned16(lse.data_ptr());
}
}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out,
                       Tensor& lse) {
  check_shapes("attention_forward", q, k, v, p);
  if (p.kv_len) {  // a key count in device memory (the decode step as a CUDA graph): the decode kernel only
    MEGATRON_CHECK(decode_attention::forward(q, k, v, p, out, lse))
        << "attention_forward: a device key count (AttentionParams::kv_len) needs the decode kernel's call "
           "(bfloat16, s 1, head dim 64/128, <= 8 heads per group, 16-byte aligned): q "
        << q.str() << " k " << k.str();
    return;
  }
  const Backend be = attention_backend();
  const bool drop = p.dropout_p != 0.0f;
  if (be == Backend::kGeneric || !tensor_core_ok({&q, &k, &v, &out}) || (drop && be == Backend::kCudnn)) {
    MEGATRON_CHECK(be != Backend::kCudnn) << "attention_forward: MEGATRON_ATTENTION_BACKEND=cudnn but cuDNN takes only "
                                             "bfloat16/float16 16-byte-aligned calls without dropout: q "
                                          << q.str() << " out " << out.str() << " dropout " << p.dropout_p;
    note_dropout_once(p, q, false, be == Backend::kGeneric ? "MEGATRON_ATTENTION_BACKEND=generic" : "unaligned or mixed-dtype tensors");
    return generic_attention::forward(q, k, v, p, out, lse);
  }
  // One query row per sequence (text generation's decode step against the KV cache): the
  // split-K decode kernel (no dropout). cuDNN would build a new plan for every cache length.
  if (be != Backend::kCudnn && decode_attention::forward(q, k, v, p, out, lse)) return;
  // Deterministic mode under auto: our flash forward, not cuDNN's (on the H200, GPT-2 124M's
  // deterministic runs still differed with cuDNN's forward + the generic backward, and matched
  // with the flash forward + the generic backward; see attention_backward).
  const bool det_auto = megatron::cuda::deterministic() && be == Backend::kAuto;
  if (be != Backend::kFlash && !drop && !det_auto && q.size(0) > 0 && q.size(1) > 0) {
    if (cudnn_sdpa::forward(q, k, v, p, out, lse)) return;
    MEGATRON_CHECK(be != Backend::kCudnn) << "attention_forward: MEGATRON_ATTENTION_BACKEND=cudnn but cuDNN cannot run q "
                                          << q.str() << " k " << k.str() << ": " << cudnn_sdpa::last_error();
  }
  // Our flash kernels: bfloat16, head dims 64 and 128, with or without dropout.
  if (!flash_shape_ok(q)) {
    note_dropout_once(p, q, false, "the flash kernels take head dims 64 and 128");
    return generic_attention::forward(q, k, v, p, out, lse);
  }
  note_dropout_once(p, q, true, "");
  check_args("attention_forward", q, k, v, p);
  MEGATRON_CHECK(out.shape() == q.shape() && out.dtype() == DType::kBFloat16 && lse.dtype() == DType::kFloat32 &&
                 lse.numel() == q.size(1) * q.size(2) * q.size(0))
      << "attention_forward: out " << out.str() << " lse " << lse.str();
  FaArgs a = make_args(q, k, p);
  if (a.S == 0 || a.B == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  dim3 grid((a.S + 63) / 64, a.B * a.NP);
  auto* qp = static_cast<const bf16_t*>(q.data_ptr());
  auto* kp = static_cast<const bf16_t*>(k.data_ptr());
  auto* vp = static_cast<const bf16_t*>(v.data_ptr());
  auto* op = static_cast<bf16_t*>(out.data_ptr());
  auto* lp = static_cast<float*>(lse.data_ptr());
  // kDrop = false: the dropout-free kernels, compiled exactly as without dropout support.
  auto run = [&](auto with_drop) {
    constexpr bool kD = decltype(with_drop)::value;
    if (use_v2(a, lse)) {
      // 8 warps (128 query rows) share each K/V tile; small_blocks(): 4 warps (64 rows).
      const bool small = small_blocks((int)q.size(3));
      const dim3 g2(small ? (a.S + 63) / 64 : (a.S + 127) / 128, a.B * a.NP);
      auto launch = [&](auto kern, int d, int warps) {
        size_t smem = (16 * warps + 4 * kBN) * (d + 8) * 2;
        set_smem(kern, smem);
        kern<<<g2, warps * 32, smem, st>>>(qp, kp, vp, op, lp, a);
      };
      if (q.size(3) == 64) {
        if (small) launch(fa_fwd_v2_kernel<64, 4, kD>, 64, 4);
        else launch(fa_fwd_v2_kernel<64, 8, kD>, 64, 8);
      } else {
        if (small) launch(fa_fwd_v2_kernel<128, 4, kD>, 128, 4);
        else launch(fa_fwd_v2_kernel<128, 8, kD>, 128, 8);
      }
    } else {
      auto launch = [&](auto kern, int d) {
        size_t smem = 3 * 64 * (d + 8) * 2;
        set_smem(kern, smem);
        kern<<<grid, 128, smem, st>>>(qp, kp, vp, op, lp, a);
      };
      if (q.size(3) == 64) launch(fa_fwd_kernel<64, kD>, 64);
      else launch(fa_fwd_kernel<128, kD>, 128);
    }
  };
  if (drop) run(std::true_type{});
  else run(std::false_type{});
  CUDA_CHECK_LAUNCH();
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  check_shapes("attention_backward", q, k, v, p);
  const Backend be = attention_backend();
  const bool drop = p.dropout_p != 0.0f;
  if (be == Backend::kGeneric || !tensor_core_ok({&q, &k, &v, &out, &dout, &dq, &dk, &dv}) ||
      (drop && be == Backend::kCudnn)) {
    MEGATRON_CHECK(be != Backend::kCudnn) << "attention_backward: MEGATRON_ATTENTION_BACKEND=cudnn but cuDNN takes only "
                                             "bfloat16/float16 16-byte-aligned calls without dropout: q "
                                          << q.str() << " dq " << dq.str() << " dropout " << p.dropout_p;
    note_dropout_once(p, q, false, be == Backend::kGeneric ? "MEGATRON_ATTENTION_BACKEND=generic" : "unaligned or mixed-dtype tensors");
    return generic_attention::backward(dout, q, k, v, out, lse, p, dq, dk, dv);
  }
  // Deterministic mode under auto skips cuDNN's backward (and forward): on an H200 (cuDNN 9,
  // 2026-12-01) two --deterministic-mode runs of GPT-2 124M and of a LLaMA-8B-shaped layer differed
  // after one step with cuDNN and matched bit for bit with the flash forward + the generic backward
  // (docs/cuda.md "Attention").
  const bool det = megatron::cuda::deterministic();
  if (det) note_deterministic_backward_once(be);
  if (be != Backend::kFlash && !drop && !(det && be == Backend::kAuto) && q.size(0) > 0 && q.size(1) > 0) {
    if (cudnn_sdpa::backward(dout, q, k, v, out, lse, p, dq, dk, dv)) return;
    MEGATRON_CHECK(be != Backend::kCudnn) << "attention_backward: MEGATRON_ATTENTION_BACKEND=cudnn but cuDNN cannot run q "
                                          << q.str() << " k " << k.str() << ": " << cudnn_sdpa::last_error();
  }
  // Our flash backward; in deterministic mode with dQ from the second pass (no atomics, deterministic.h).
  if (!flash_shape_ok(q)) {
    note_dropout_once(p, q, false, "the flash kernels take head dims 64 and 128");
    return generic_attention::backward(dout, q, k, v, out, lse, p, dq, dk, dv);
  }
  check_args("attention_backward", q, k, v, p);
  MEGATRON_CHECK(dout.shape() == q.shape() && out.shape() == q.shape() && dq.shape() == q.shape() &&
                 dk.shape() == k.shape() && dv.shape() == v.shape() && dout.dtype() == DType::kBFloat16 &&
                 out.dtype() == DType::kBFloat16 && dq.dtype() == DType::kBFloat16 && dk.dtype() == DType::kBFloat16 &&
                 dv.dtype() == DType::kBFloat16 && lse.dtype() == DType::kFloat32)
      << "attention_backward: dout " << dout.str() << " dq " << dq.str() << " dk " << dk.str();
  MEGATRON_CHECK(aligned16(dout.data_ptr())) << "attention_backward: dout must be 16-byte aligned";
  FaArgs a = make_args(q, k, p);
  if (a.S == 0 || a.B == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const int D = (int)q.size(3);
  const int64_t rows = (int64_t)a.S * a.B * a.NP;
  const bool two_pass = dq_two_pass(det);
  float *dvec = nullptr, *dq_acc = nullptr;
  CUDA_CHECK(cudaMallocAsync(&dvec, sizeof(float) * rows, st));
  if (!two_pass) {
    CUDA_CHECK(cudaMallocAsync(&dq_acc, sizeof(float) * rows * D, st));
    CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, sizeof(float) * rows * D, st));
  }
  auto* dop = static_cast<const bf16_t*>(dout.data_ptr());
  auto* qp = static_cast<const bf16_t*>(q.data_ptr());
  auto* kp = static_cast<const bf16_t*>(k.data_ptr());
  auto* vp = static_cast<const bf16_t*>(v.data_ptr());
  auto* outp = static_cast<const bf16_t*>(out.data_ptr());
  auto* lp = static_cast<const float*>(lse.data_ptr());
  auto* dkp = static_cast<bf16_t*>(dk.data_ptr());
  auto* dvp = static_cast<bf16_t*>(dv.data_ptr());
  dim3 grid((a.SK + kBN - 1) / kBN, a.B * a.NG);
  const bool v2 = use_v2(a, lse);
  unsigned g1 = grid_for(rows * 32, 256);
  auto* dqp = static_cast<bf16_t*>(dq.data_ptr());
  // D = HD (64 or 128): Δ = rowsum(dO ∘ O), the dK/dV/dQ kernel (v2 with 4 or 8 warps, or v1),
  // then dQ from its fp32 accumulator. Two-pass (kTP): the dK/dV kernel without its dQ atomics,
  // then fa_bwd_dq_kernel (query blocks of 16 rows per warp, 4 or 8 warps as the forward) writes dQ.
  // kDrop (with_drop) = false: the dropout-free kernels, compiled exactly as without dropout support.
  auto run = [&](auto head_dim, auto with_drop, auto two) {
    constexpr int HD = decltype(head_dim)::value, BM = 64, LD = HD + 8;
    constexpr bool kD = decltype(with_drop)::value, kTP = decltype(two)::value;
    fa_bwd_dot_kernel<HD><<<g1, 256, 0, st>>>(dop, outp, dvec, a);
    if (v2) {
      if (small_blocks(HD))
        launch_bwd_v2(fa_bwd_v2_kernel<HD, BM, 4, kD, kTP>, 4, HD, BM, a, st, qp, kp, vp, dop, lp, dvec, dq_acc, dkp, dvp, kTP);
      else
        launch_bwd_v2(fa_bwd_v2_kernel<HD, BM, 8, kD, kTP>, 8, HD, BM, a, st, qp, kp, vp, dop, lp, dvec, dq_acc, dkp, dvp, kTP);
    } else {
      size_t smem = (2 * kBN * LD + 2 * BM * LD + kBN * (BM + 8)) * 2 + 2 * BM * 4;
      set_smem(fa_bwd_kernel<HD, BM, kD, kTP>, smem);
      fa_bwd_kernel<HD, BM, kD, kTP><<<grid, 128, smem, st>>>(qp, kp, vp, dop, lp, dvec, dq_acc, dkp, dvp, a);
    }
    CUDA_CHECK_LAUNCH();
    if constexpr (kTP) {
      auto launch = [&](auto kern, int warps) {
        const size_t smem = (2 * 16 * warps + 4 * kBN) * LD * 2;
        set_smem(kern, smem);
        kern<<<dim3((a.S + 16 * warps - 1) / (16 * warps), a.B * a.NP), warps * 32, smem, st>>>(qp, kp, vp, dop, lp,
                                                                                                 dvec, dqp, a);
      };
      if (small_blocks(HD)) launch(fa_bwd_dq_kernel<HD, 4, kD>, 4);
      else launch(fa_bwd_dq_kernel<HD, 8, kD>, 8);
    } else {
      fa_dq_convert_kernel<HD><<<grid_for(rows * HD, 256), 256, 0, st>>>(dq_acc, dqp, a);
    }
  };
  auto run_dq = [&](auto head_dim, auto with_drop) {
    if (two_pass) run(head_dim, with_drop, std::true_type{});
    else run(head_dim, with_drop, std::false_type{});
  };
  if (D == 64) {
    if (drop) run_dq(std::integral_constant<int, 64>{}, std::true_type{});
    else run_dq(std::integral_constant<int, 64>{}, std::false_type{});
  } else {
    if (drop) run_dq(std::integral_constant<int, 128>{}, std::true_type{});
    else run_dq(std::integral_constant<int, 128>{}, std::false_type{});
  }
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(dvec, st));
  if (dq_acc) CUDA_CHECK(cudaFreeAsync(dq_acc, st));
}

}  // namespace megatron::ops::cuda
