// LayerNorm and RMSNorm forward/backward on CUDA (ops.h contract): one warp per row of x [N, h]
// (forward with few wide rows, as in decode: one block per row), fp32 statistics; float32/bfloat16 (any mix) or float16. The backward's dgamma/dbeta column sums
// are accumulated per block (in registers for h <= 1024 and, with one block per row, for
// 1024 < h <= 8192 bf16 rows (norm_bwd_rowblk_kernel); else with shared-memory atomics, whose
// order varies run to run; per warp without atomics in deterministic mode, deterministic.h),
// written as partial rows and summed in a fixed order by a second kernel.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "megatron/core/utils/env.h"

#include "megatron/core/ops/cuda/async_copy.cuh"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/deterministic.h"
#include "megatron/core/ops/cuda/variants.h"

namespace megatron::ops::cuda {
using namespace detail;

namespace {
constexpr int kWarps = 8;

// Binds X, G, Y to the device types of the input, gamma/beta and output (or dy) dtypes: any mix of
// float32 and bfloat16, or all three float16 (--fp16 models: float16 params and activations; the
// only mix they produce, which keeps the instantiation count down).
#define NORM_TYPE_SWITCH(name, xd, gd, yd, X, G, Y, ...)                                                 \
  if ((xd) == DType::kFloat16 || (gd) == DType::kFloat16 || (yd) == DType::kFloat16) {                   \
    MEGATRON_CHECK((xd) == DType::kFloat16 && (gd) == DType::kFloat16 && (yd) == DType::kFloat16)        \
        << name << ": float16 needs float16 input, weight and output (got " << dtype_name(xd) << ", "     \
        << dtype_name(gd) << ", " << dtype_name(yd) << ")";                                             \
    using X = fp16_t;                                                                                    \
    using G = fp16_t;                                                                                    \
    using Y = fp16_t;                                                                                    \
    __VA_ARGS__;                                                                                         \
  } else {                                                                                               \
    MCU_F32_BF16_SWITCH(xd, X, MCU_F32_BF16_SWITCH(gd, G, MCU_F32_BF16_SWITCH(yd, Y, __VA_ARGS__)));     \
  }

// kLN: LayerNorm (mean subtracted, beta added) vs RMSNorm.
template <bool kLN, class X, class G, class Y>
__global__ void norm_fwd_kernel(const X* __restrict__ x, const G* __restrict__ gamma, const G* __restrict__ beta,
                                Y* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                int64_t rows, int h, float eps, float gofs, bool vec) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * (int64_t)kWarps + threadIdx.x / 32; r < rows; r += (int64_t)gridDim.x * kWarps) {
    const X* xr = x + r * h;
    float mean = 0.0f;
    if (kLN) {
      float s = 0.0f;
      for (int c = lane * 8; c < h; c += 256) {
        float f[8];
        ld8(xr, c, h, vec, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[j];
      }
      mean = warp_sum(s) / h;
    }
    float ss = 0.0f;
    for (int c = lane * 8; c < h; c += 256) {
      float f[8];
      ld8(xr, c, h, vec, f);
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c + j < h) ss += (f[j] - mean) * (f[j] - mean);
    }
    const float rstd = rsqrtf(warp_sum(ss) / h + eps);
    for (int c = lane * 8; y && c < h; c += 256) {  // y == nullptr: statistics only (fp8_rmsnorm_quantize)
      float f[8], g[8], b[8];
      ld8(xr, c, h, vec, f);
      ld8(gamma, c, h, vec, g);
      if (kLN) ld8(beta, c, h, vec, b);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = (f[j] - mean) * rstd * (g[j] + gofs) + (kLN ? b[j] : 0.0f);
      st8(y + r * h, c, h, vec, f);
    }
    if (lane == 0) {
      if (kLN) mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// kDet (deterministic mode, deterministic.h): no shared-memory atomics; each warp adds its rows'
// dgamma/dbeta terms, in row order, into its own partial row of part_g/part_b (zeroed by the
// caller; every column is owned by one lane), and the column sums add the partial rows in order.
template <bool kLN, bool kDet, class X, class G, class D>
__global__ void norm_bwd_kernel(const D* __restrict__ dy, const X* __restrict__ x, const G* __restrict__ gamma,
                                const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                                D* __restrict__ dx, float* __restrict__ part_g, float* __restrict__ part_b,
                                int64_t rows, int h, float gofs, bool vec, bool perm, const D* __restrict__ dres) {
  extern __shared__ float sm[];
  float* sg = sm;
  float* sb = sm + h;
  if constexpr (!kDet) {
    for (int c = threadIdx.x; c < (kLN ? 2 * h : h); c += blockDim.x) sm[c] = 0.0f;
    __syncthreads();
  }
  const int lane = threadIdx.x & 31;
  float* wg = part_g + ((int64_t)blockIdx.x * kWarps + threadIdx.x / 32) * h;  // kDet only
  float* wb = part_b + ((int64_t)blockIdx.x * kWarps + threadIdx.x / 32) * h;
  for (int64_t r = blockIdx.x * (int64_t)kWarps + threadIdx.x / 32; r < rows; r += (int64_t)gridDim.x * kWarps) {
    const X* xr = x + r * h;
    const D* dyr = dy + r * h;
    const float mean = kLN ? mean_in[r] : 0.0f, rstd = rstd_in[r];
    float a = 0.0f, b = 0.0f;  // sum(dxhat), sum(dxhat * xhat)
    for (int c = lane * 8; c < h; c += 256) {
      float f[8], g[8], d[8];
      ld8(xr, c, h, vec, f);
      ld8(gamma, c, h, vec, g);
      ld8(dyr, c, h, vec, d);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (c + j >= h) break;
        float xh = (f[j] - mean) * rstd;
        float dxh = d[j] * (g[j] + gofs);
        a += dxh;
        b += dxh * xh;
        // h % 8 == 0: column c+j lives at j*(h/8) + c/8, so the 32 lanes (c = 8*lane + 256k) hit
        // 32 different banks; the plain index c+j puts 8 lanes on each bank (8-way conflicts on
        // every atomic: measured 0.38 ms per 8192x4096 bf16 RMSNorm backward, ~0.5 TB/s).
        if constexpr (kDet) {
          wg[c + j] += d[j] * xh;
          if (kLN) wb[c + j] += d[j];
        } else {
          const int si = perm ? j * (h >> 3) + (c >> 3) : c + j;
          atomicAdd(&sg[si], d[j] * xh);
          if (kLN) atomicAdd(&sb[si], d[j]);
        }
      }
    }
    a = warp_sum(a) / h;
    b = warp_sum(b) / h;
    for (int c = lane * 8; c < h; c += 256) {
      float f[8], g[8], d[8];
      ld8(xr, c, h, vec, f);
      ld8(gamma, c, h, vec, g);
      ld8(dyr, c, h, vec, d);
      float rr[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      if (dres) ld8(dres + r * h, c, h, vec, rr);  // + the residual branch's gradient
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float xh = (f[j] - mean) * rstd;
        float dxh = d[j] * (g[j] + gofs);
        f[j] = rstd * (dxh - (kLN ? a : 0.0f) - xh * b) + rr[j];
      }
      st8(dx + r * h, c, h, vec, f);
    }
  }
  if constexpr (!kDet) {
    __syncthreads();
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      const int si = perm ? (c & 7) * (h >> 3) + (c >> 3) : c;
      part_g[(int64_t)blockIdx.x * h + c] = sg[si];
      if (kLN) part_b[(int64_t)blockIdx.x * h + c] = sb[si];
    }
  }
}

// dgamma (blockIdx.y = 0) / dbeta (1) = the column sums of the [nb, h] partials: 32 columns x 8
// row slices per block, each slice summed in row order, then the 8 slices in order
// (deterministic; the partials of one call are always summed the same way).
template <class G>
__global__ void colsum_kernel(const float* __restrict__ part, int nb, int h, G* __restrict__ out_g,
                              G* __restrict__ out_b, bool accumulate) {
  __shared__ float red[8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const float* p = part + (int64_t)blockIdx.y * nb * h;
  float s = 0.0f;
  if (c < h)
    for (int b = threadIdx.y; b < nb; b += 8) s += p[(int64_t)b * h + c];
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= h) return;
  float t = 0.0f;
#pragma unroll
  for (int y = 0; y < 8; ++y) t += red[y][threadIdx.x];
  G* out = blockIdx.y ? out_b : out_g;
  if (accumulate) t += to_f(out[c]);
  out[c] = from_f<G>(t);
}

// Eight elements of one row as stored (a 16-byte load for 2-byte types, two for float).
template <class T>
struct alignas(16) Pack8 {
  T v[8];
};

constexpr int kRegMaxChunks = 4;  // h <= 4 * 256 = 1024 columns per row
constexpr int kRegWarps = 4;      // 4 warps per block, 3 blocks per SM: <= 168 registers, no spills

// The per-row arithmetic of the register forward kernels (norm_fwd_reg_kernel and its pipelined
// version): lane `lane` holds the row's chunks xp[k] (columns 8 lane + 256 k .. + 8, k < NC, those
// below h); writes the row's y at yr and returns its mean (0 for RMSNorm) and rstd. One source for
// both kernels, so they run the same fp32 operations in the same order (the same bits).
template <bool kLN, int NC, class T, class G>
__device__ __forceinline__ void norm_fwd_row(const Pack8<T> (&xp)[NC], const G* __restrict__ gamma,
                                             const G* __restrict__ beta, T* __restrict__ yr, int h, int lane,
                                             float eps, float gofs, float& mean_o, float& rstd_o) {
  float mean = 0.0f;
  if (kLN) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NC; ++k)
      if (lane * 8 + 256 * k < h)
#pragma unroll
        for (int j = 0; j < 8; ++j) s += to_f(xp[k].v[j]);
    mean = warp_sum(s) / h;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NC; ++k)
    if (lane * 8 + 256 * k < h)
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += (to_f(xp[k].v[j]) - mean) * (to_f(xp[k].v[j]) - mean);
  const float rstd = rsqrtf(warp_sum(ss) / h + eps);
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = lane * 8 + 256 * k;
    if (c >= h) continue;
    float g[8], b[8];
    ld8(gamma, c, h, true, g);
    if (kLN) ld8(beta, c, h, true, b);
    Pack8<T> o;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      o.v[j] = from_f<T>((to_f(xp[k].v[j]) - mean) * rstd * (g[j] + gofs) + (kLN ? b[j] : 0.0f));
    *reinterpret_cast<Pack8<T>*>(yr + c) = o;
  }
  mean_o = mean;
  rstd_o = rstd;
}

// Norm forward for h <= 1024, h % 8 == 0, 16-byte aligned rows, x and y of one dtype: like
// norm_fwd_kernel (warp per row, same sums in the same order, so the same bits) but the row is
// loaded once into registers instead of read three times.
template <bool kLN, class T, class G>
__global__ void norm_fwd_reg_kernel(const T* __restrict__ x, const G* __restrict__ gamma, const G* __restrict__ beta,
                                    T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
                                    int64_t rows, int h, float eps, float gofs) {
  const int lane = threadIdx.x & 31;
  for (int64_t r = blockIdx.x * (int64_t)kWarps + threadIdx.x / 32; r < rows; r += (int64_t)gridDim.x * kWarps) {
    Pack8<T> xp[kRegMaxChunks];
#pragma unroll
    for (int k = 0; k < kRegMaxChunks; ++k)
      if (lane * 8 + 256 * k < h) xp[k] = *reinterpret_cast<const Pack8<T>*>(x + r * h + lane * 8 + 256 * k);
    float mean, rstd;
    norm_fwd_row<kLN, kRegMaxChunks, T, G>(xp, gamma, beta, y + r * h, h, lane, eps, gofs, mean, rstd);
    if (lane == 0) {
      if (kLN) mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// The per-row arithmetic of the register backward kernels (norm_bwd_reg_kernel and its pipelined
// version): xk(k), dk(k), rk(k) give lane `lane`'s chunk k of the row's x, dy and (when `res`)
// residual gradient; adds the row's dgamma/dbeta terms to the lane's accumulators ag/ab and writes
// its dx at dxr. One source for both kernels (same operations in the same order: the same bits).
// Same per-element formulas as norm_bwd_kernel.
template <bool kLN, int NC, class T, class G, class XK, class DK, class RK>
__device__ __forceinline__ void norm_bwd_row(const XK& xk, const DK& dk, const RK& rk, bool res,
                                             const G* __restrict__ gamma, float mean, float rstd, float gofs, int h,
                                             int lane, float (&ag)[NC][8], float (&ab)[NC][8], T* __restrict__ dxr) {
  // gamma is re-read per row (an L1 hit) rather than held: registers go to the accumulators.
  auto gam = [&](int k) { return *reinterpret_cast<const Pack8<G>*>(gamma + lane * 8 + 256 * k); };
  float a = 0.0f, b = 0.0f;  // sum(dxhat), sum(dxhat * xhat)
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    if (lane * 8 + 256 * k >= h) continue;
    const Pack8<G> gp = gam(k);
    const Pack8<T> xp = xk(k), dp = dk(k);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xh = (to_f(xp.v[j]) - mean) * rstd, d = to_f(dp.v[j]);
      const float dxh = d * (to_f(gp.v[j]) + gofs);
      a += dxh;
      b += dxh * xh;
      ag[k][j] += d * xh;
      if (kLN) ab[k][j] += d;
    }
  }
  a = warp_sum(a) / h;
  b = warp_sum(b) / h;
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = lane * 8 + 256 * k;
    if (c >= h) continue;
    Pack8<T> rp, out;
    if (res) rp = rk(k);  // + the residual branch's gradient
    const Pack8<G> gp = gam(k);
    const Pack8<T> xp = xk(k), dp = dk(k);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xh = (to_f(xp.v[j]) - mean) * rstd, dxh = to_f(dp.v[j]) * (to_f(gp.v[j]) + gofs);
      // One explicit fused multiply-add, not `rstd * (...) + dres`: nvcc contracts that per
      // instantiation, and for NC = 1 (h <= 256) it hoisted element 0's product above the `res`
      // branch (shared with the no-residual path) and added dres with a separate add.f32 (two
      // roundings), while the register kernel (NC = 4) and NC = 2..4 fused all eight: the h = 256
      // residual dx then differed from the unpipelined kernel's in the last bit (H200, device
      // call 19). fma(p, q, +0) == round(p q) + 0, so without dres the bits are unchanged.
      const float v = __fmaf_rn(rstd, dxh - (kLN ? a : 0.0f) - xh * b, res ? to_f(rp.v[j]) : 0.0f);
      out.v[j] = from_f<T>(v);
    }
    *reinterpret_cast<Pack8<T>*>(dxr + c) = out;
  }
}

// The block partials of the register backward kernels: warp w's value of column c at
// red[w * h + c] (red: kRegWarps * h floats of shared memory), summed over w in order into
// part_[gb][blockIdx.x, h] (deterministic).
template <bool kLN, int NC>
__device__ __forceinline__ void norm_bwd_block_partials(float* red, const float (&ag)[NC][8],
                                                        const float (&ab)[NC][8], float* __restrict__ part_g,
                                                        float* __restrict__ part_b, int h, int lane, int warp) {
  for (int part = 0; part < (kLN ? 2 : 1); ++part) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = lane * 8 + 256 * k;
      if (c >= h) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) red[warp * h + c + j] = part ? ab[k][j] : ag[k][j];
    }
    __syncthreads();
    float* out = part ? part_b : part_g;
    for (int c = threadIdx.x; c < h; c += blockDim.x) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kRegWarps; ++w) s += red[w * h + c];
      out[(int64_t)blockIdx.x * h + c] = s;
    }
    __syncthreads();
  }
}

// Norm backward for h <= 1024, h % 8 == 0, 16-byte aligned rows (GPT-2's 768, 1024): lane l of a
// warp owns the columns 8l + 256k + j (k < 4, j < 8) of every row it visits, so dgamma/dbeta
// accumulate in registers over the warp's rows (no shared-memory float atomics, which are
// compare-and-swap loops); x and dy are loaded once per row (kept in registers between the two
// passes). At the end the block's 4 warp partials are summed in warp order into part_[gb]
// [blockIdx.x, h] (deterministic).
template <bool kLN, class T, class G>
__global__ void __launch_bounds__(kRegWarps * 32, 3)
    norm_bwd_reg_kernel(const T* __restrict__ dy, const T* __restrict__ x, const G* __restrict__ gamma,
                        const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
                        float* __restrict__ part_g, float* __restrict__ part_b, int64_t rows, int h, float gofs,
                        const T* __restrict__ dres) {
  __shared__ float red[kRegWarps * 32 * 8 * kRegMaxChunks];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float ag[kRegMaxChunks][8], ab[kRegMaxChunks][8];
#pragma unroll
  for (int k = 0; k < kRegMaxChunks; ++k)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      ag[k][j] = 0.0f;
      ab[k][j] = 0.0f;
    }
  for (int64_t r = blockIdx.x * (int64_t)kRegWarps + warp; r < rows; r += (int64_t)gridDim.x * kRegWarps) {
    const float mean = kLN ? mean_in[r] : 0.0f, rstd = rstd_in[r];
    Pack8<T> xp[kRegMaxChunks], dp[kRegMaxChunks];
#pragma unroll
    for (int k = 0; k < kRegMaxChunks; ++k) {
      const int c = lane * 8 + 256 * k;
      if (c < h) {
        xp[k] = *reinterpret_cast<const Pack8<T>*>(x + r * h + c);
        dp[k] = *reinterpret_cast<const Pack8<T>*>(dy + r * h + c);
      }
    }
    norm_bwd_row<kLN, kRegMaxChunks, T, G>(
        [&](int k) { return xp[k]; }, [&](int k) { return dp[k]; },
        [&](int k) { return *reinterpret_cast<const Pack8<T>*>(dres + r * h + lane * 8 + 256 * k); }, dres != nullptr,
        gamma, mean, rstd, gofs, h, lane, ag, ab, dx + r * h);
  }
  norm_bwd_block_partials<kLN, kRegMaxChunks>(red, ag, ab, part_g, part_b, h, lane, warp);
}

// ---------------------------------------------------------------------------------------------
// Pipelined register kernels (Session 11, gpt2mem): the same warp-per-row computation as
// norm_fwd_reg_kernel / norm_bwd_reg_kernel (norm_fwd_row / norm_bwd_row; the same rows per warp
// in the backward, so the same bits), but every lane fetches its 16-byte chunks of the warp's
// next kPipeStages rows with cp.async into its own shared-memory slots while it computes the
// current row. bfloat16 rows (the training dtype; float32 rows keep the register kernels, whose
// 32-byte chunks would need twice the stage memory). The register kernels have one row's loads
// in flight per warp and none while the warp reduces and stores: the backward runs 12 warps per
// SM (168 registers), so at most ~36 KB per SM is in flight, and the dres chunks (GPT-2's
// residual gradient) were loaded only in the second pass, a second dependent DRAM round trip per
// row (149 us per GPT-2 call, 2.7 TB/s of 403 MB); the forward took 94 registers (2 blocks of 8
// warps per SM, 84 us, 2.4 TB/s). Each lane reads back only the slots it filled itself, so no
// barrier is needed between copy and use (cp.async.wait_group orders them for the issuing
// thread); a stage is refilled only after every value read from it has been consumed (the row's
// stores depend on them).
// ---------------------------------------------------------------------------------------------
constexpr int kPipeStages = 3;   // rows in flight per warp (backward with h > 768: 2, shared memory)
constexpr int kFwdPipeWarps = 8;  // forward: 8 warps per block, 4 blocks per SM (<= 64 registers)

// Number of row stages of the backward for NC 256-column chunks: 3 up to h = 768, else 2 (so 3
// blocks of 4 warps still fit the SM's 228 KB of shared memory).
constexpr int bwd_pipe_stages(int nc) { return nc <= 3 ? 3 : 2; }

template <bool kLN, int NC, class T, class G>
__global__ void __launch_bounds__(kFwdPipeWarps * 32, 4)
    norm_fwd_pipe_kernel(const T* __restrict__ x, const G* __restrict__ gamma, const G* __restrict__ beta,
                         T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out, int64_t rows,
                         int h, float eps, float gofs) {
  static_assert(sizeof(T) == 2, "one 16-byte copy per 8-element chunk: bfloat16 rows");
  extern __shared__ uint4 norm_pipe_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint4* slots = norm_pipe_smem + warp * (kPipeStages * NC * 32);  // [stage][chunk][lane]
  const int64_t w0 = blockIdx.x * (int64_t)kFwdPipeWarps + warp, nw = (int64_t)gridDim.x * kFwdPipeWarps;
  auto issue = [&](int64_t r, int s) {
    if (r < rows)
#pragma unroll
      for (int k = 0; k < NC; ++k)
        if (lane * 8 + 256 * k < h) cp_async_16(&slots[(s * NC + k) * 32 + lane], x + r * h + lane * 8 + 256 * k);
    cp_async_commit_group();  // one group per stage, empty past the last row
  };
#pragma unroll
  for (int s = 0; s < kPipeStages; ++s) issue(w0 + s * nw, s);
  int s = 0;
  for (int64_t r = w0; r < rows; r += nw) {
    cp_async_wait_group<kPipeStages - 1>();  // this row's group (the oldest) has landed
    Pack8<T> xp[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k)
      if (lane * 8 + 256 * k < h) xp[k] = *reinterpret_cast<const Pack8<T>*>(&slots[(s * NC + k) * 32 + lane]);
    float mean, rstd;
    norm_fwd_row<kLN, NC, T, G>(xp, gamma, beta, y + r * h, h, lane, eps, gofs, mean, rstd);
    if (lane == 0) {
      if (kLN) mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    issue(r + kPipeStages * nw, s);  // the row's values are consumed (stored): refill its stage
    s = s + 1 == kPipeStages ? 0 : s + 1;
  }
  cp_async_wait_group<0>();
}

// Shared-memory bytes of norm_bwd_pipe_kernel per block: per warp and stage the x, dy (and dres)
// chunks of one row plus one 16-byte slot per lane for its (mean, rstd).
constexpr size_t bwd_pipe_smem(int nc, bool dres) {
  return sizeof(uint4) * kRegWarps * bwd_pipe_stages(nc) * ((dres ? 3 : 2) * nc + 1) * 32;
}

// The pipelined norm_bwd_reg_kernel: same grid (so the same rows per warp, the same dgamma/dbeta
// accumulation order and the same block partials), same row arithmetic.
template <bool kLN, int NC, class T, class G>
__global__ void __launch_bounds__(kRegWarps * 32, 3)
    norm_bwd_pipe_kernel(const T* __restrict__ dy, const T* __restrict__ x, const G* __restrict__ gamma,
                         const float* __restrict__ mean_in, const float* __restrict__ rstd_in, T* __restrict__ dx,
                         float* __restrict__ part_g, float* __restrict__ part_b, int64_t rows, int h, float gofs,
                         const T* __restrict__ dres) {
  static_assert(sizeof(T) == 2, "one 16-byte copy per 8-element chunk: bfloat16 rows");
  constexpr int S = bwd_pipe_stages(NC);
  extern __shared__ uint4 norm_pipe_smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nbuf = dres ? 3 : 2;                 // x, dy (, dres)
  const int stage_slots = (nbuf * NC + 1) * 32;  // + one (mean, rstd) slot per lane
  uint4* slots = norm_pipe_smem + warp * S * stage_slots;
  // Slot of chunk k of buffer b (0 x, 1 dy, 2 dres) in stage s, and the stage's statistics slot.
  auto slot = [&](int s, int b, int k) { return &slots[s * stage_slots + (b * NC + k) * 32 + lane]; };
  auto stat = [&](int s) { return reinterpret_cast<float*>(&slots[s * stage_slots + nbuf * NC * 32 + lane]); };
  const int64_t w0 = blockIdx.x * (int64_t)kRegWarps + warp, nw = (int64_t)gridDim.x * kRegWarps;
  auto issue = [&](int64_t r, int s) {
    if (r < rows) {
      if (kLN) cp_async_4(stat(s), mean_in + r);
      cp_async_4(stat(s) + 1, rstd_in + r);
#pragma unroll
      for (int k = 0; k < NC; ++k) {
        const int c = lane * 8 + 256 * k;
        if (c < h) {
          cp_async_16(slot(s, 0, k), x + r * h + c);
          cp_async_16(slot(s, 1, k), dy + r * h + c);
          if (dres) cp_async_16(slot(s, 2, k), dres + r * h + c);
        }
      }
    }
    cp_async_commit_group();
  };
  float ag[NC][8], ab[NC][8];
#pragma unroll
  for (int k = 0; k < NC; ++k)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      ag[k][j] = 0.0f;
      ab[k][j] = 0.0f;
    }
#pragma unroll
  for (int s = 0; s < S; ++s) issue(w0 + s * nw, s);
  int s = 0;
  for (int64_t r = w0; r < rows; r += nw) {
    cp_async_wait_group<S - 1>();
    const float mean = kLN ? stat(s)[0] : 0.0f, rstd = stat(s)[1];
    auto ld = [&](int b) { return [&, b](int k) { return *reinterpret_cast<const Pack8<T>*>(slot(s, b, k)); }; };
    norm_bwd_row<kLN, NC, T, G>(ld(0), ld(1), ld(2), dres != nullptr, gamma, mean, rstd, gofs, h, lane, ag, ab,
                                dx + r * h);
    issue(r + S * nw, s);
    s = s + 1 == S ? 0 : s + 1;
  }
  cp_async_wait_group<0>();
  __syncthreads();  // every warp is done with its stages: the block partials reuse them
  // 4 h floats fit in the block's stages: 16 h <= 4 S (2 NC + 1) 512 bytes.
  norm_bwd_block_partials<kLN, NC>(reinterpret_cast<float*>(norm_pipe_smem), ag, ab, part_g, part_b, h, lane, warp);
}

constexpr int kRowThreads = 256;  // norm_fwd_row_kernel: one block of 8 warps per row
constexpr int kRowChunks = 4;      // h <= 4 * 256 * 8 = 8192 columns, held in registers

// Norm forward for few rows (rows <= the SM count: decode, batch-1 generation) with
// 1024 < h <= 8192, h % 8 == 0, 16-byte aligned rows, x and y of one dtype. norm_fwd_kernel puts
// one warp on a row, so a single 4096-column row is 16 serial 16-byte loads per lane, read twice
// (three times for LayerNorm), on one SM: ~13.5 us on an H200 for what is a 8 KiB read. Here one
// block of 256 threads owns the row: thread t loads columns 8t + 2048k (k < 4) once into
// registers, the sums are a warp_sum per warp then the 8 warp partials added in warp order
// (deterministic, but a different summation order than norm_fwd_kernel, so the last bits of
// mean/rstd differ from it; the dispatch keeps the many-row shapes of training on the old
// kernels). y == nullptr: statistics only (rmsnorm_rstd), as norm_fwd_kernel.
template <bool kLN, class T, class G>
__global__ void __launch_bounds__(kRowThreads)
    norm_fwd_row_kernel(const T* __restrict__ x, const G* __restrict__ gamma, const G* __restrict__ beta,
                        T* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out, int h,
                        float eps, float gofs) {
  __shared__ float red[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* xr = x + r * h;
  // gamma/beta are loaded with x, before the reductions: one memory round trip per call.
  float f[kRowChunks][8], g[kRowChunks][8], b[kRowChunks][8];
#pragma unroll
  for (int k = 0; k < kRowChunks; ++k) {
    const int c = threadIdx.x * 8 + kRowThreads * 8 * k;
    if (c < h) {
      ld8(xr, c, h, true, f[k]);
      if (y) ld8(gamma, c, h, true, g[k]);
      if (kLN && y) ld8(beta, c, h, true, b[k]);
    }
  }
  // The block-wide sum of v, the same value in every thread.
  auto block_sum = [&](float v) {
    v = warp_sum(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) t += red[w];
    __syncthreads();  // red is reused by the next sum
    return t;
  };
  float mean = 0.0f;
  if (kLN) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowChunks; ++k)
      if (threadIdx.x * 8 + kRowThreads * 8 * k < h)
#pragma unroll
        for (int j = 0; j < 8; ++j) s += f[k][j];
    mean = block_sum(s) / h;
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kRowChunks; ++k)
    if (threadIdx.x * 8 + kRowThreads * 8 * k < h)
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += (f[k][j] - mean) * (f[k][j] - mean);
  const float rstd = rsqrtf(block_sum(ss) / h + eps);
  if (y) {
#pragma unroll
    for (int k = 0; k < kRowChunks; ++k) {
      const int c = threadIdx.x * 8 + kRowThreads * 8 * k;
      if (c >= h) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) f[k][j] = (f[k][j] - mean) * rstd * (g[k][j] + gofs) + (kLN ? b[k][j] : 0.0f);
      st8(y + r * h, c, h, true, f[k]);
    }
  }
  if (threadIdx.x == 0) {
    if (kLN) mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

// ---- norm_bwd_rowblk begin (cut out by tests/gpu/host_emulation/norm_rowblk_run.sh)
// Norm backward for the large rows of LLaMA-class models (Session 12, normrow): 1024 < h <= 8192,
// h % 8 == 0, 16-byte aligned rows, bfloat16 x/dy/dx (and dres), bfloat16 or float32 gamma.
// norm_bwd_kernel puts one warp on such a row (16 dependent 16-byte loads per lane at h = 4096,
// then a second pass re-reading x, gamma and dy, dgamma through shared-memory float atomics):
// ~1 TB/s on an H200. Here one block of kRbThreads(h) threads owns a row at a time: thread t
// holds the columns 8t + 8 blockDim.x k + j (k < kRbChunks, j < 8) of x, dy (and dres) from one
// 16-byte load each, and its gamma columns (+ gofs) for the whole kernel. The blocks are
// persistent (one wave, launched by norm_backward): block b visits rows b, b + gridDim.x, ...
// and loads the next row into registers before it does the current row's arithmetic, so every
// block has a row's loads in flight while it reduces and stores. The row sums (sum dxhat,
// sum dxhat xhat) are a warp_sum per warp, then the warps' values added in warp order (one
// barrier per row; the partials alternate between two shared-memory slots so the next row's
// writes cannot overtake this row's reads). Every (thread, column) pair is fixed, so dgamma/dbeta
// accumulate in registers in row order and each block writes one partial row at the end: no
// atomics, the same bits every run (this kernel also serves deterministic mode). The per-element
// formulas are norm_bwd_row's; only the order of the row and column sums differs from
// norm_bwd_kernel's.
constexpr int kRbChunks = 2;                  // 16-byte chunks per thread and tensor
constexpr int kRbMaxThreads = 512;            // h <= 512 * 8 * 2 = 8192
constexpr int kRbMaxH = kRbMaxThreads * 8 * kRbChunks;

// Threads of the row block for h columns: h / 16 rounded up to whole warps (256 at h = 4096).
constexpr int rowblk_threads(int64_t h) {
  return static_cast<int>((h + 8 * kRbChunks * 32 - 1) / (8 * kRbChunks * 32)) * 32;
}

template <bool kLN, bool kRes, class T, class G>
__global__ void __launch_bounds__(kRbMaxThreads, 1)
    norm_bwd_rowblk_kernel(const T* __restrict__ dy, const T* __restrict__ x, const G* __restrict__ gamma,
                           const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                           T* __restrict__ dx, float* __restrict__ part_g, float* __restrict__ part_b,
                           int64_t rows, int h, float gofs, const T* __restrict__ dres) {
  static_assert(sizeof(T) == 2, "one 16-byte load per 8-element chunk: bfloat16 rows");
  constexpr int NC = kRbChunks;
  __shared__ float red[2][kRbMaxThreads / 32][2];  // [row parity][warp][sum dxhat, sum dxhat xhat]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  auto col = [&](int k) { return static_cast<int>(threadIdx.x) * 8 + static_cast<int>(blockDim.x) * 8 * k; };
  float gg[NC][8], ag[NC][8], ab[NC][8];
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = col(k);
    Pack8<G> gp;
    if (c < h) gp = *reinterpret_cast<const Pack8<G>*>(gamma + c);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      gg[k][j] = c < h ? to_f(gp.v[j]) + gofs : 0.0f;
      ag[k][j] = 0.0f;
      ab[k][j] = 0.0f;
    }
  }
  struct Row {
    Pack8<T> x[NC], d[NC], r[NC];
    float mean, rstd;
  };
  auto load = [&](int64_t r, Row& o) {
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = col(k);
      if (c < h) {
        o.x[k] = *reinterpret_cast<const Pack8<T>*>(x + r * h + c);
        o.d[k] = *reinterpret_cast<const Pack8<T>*>(dy + r * h + c);
        if (kRes) o.r[k] = *reinterpret_cast<const Pack8<T>*>(dres + r * h + c);
      }
    }
    o.mean = kLN ? mean_in[r] : 0.0f;
    o.rstd = rstd_in[r];
  };
  Row cur, nxt;
  int64_t r = blockIdx.x;
  if (r < rows) load(r, cur);
  int par = 0;
  for (; r < rows; r += gridDim.x) {
    if (r + gridDim.x < rows) load(r + gridDim.x, nxt);  // in flight during this row's work
    const float mean = cur.mean, rstd = cur.rstd;
    float a = 0.0f, b = 0.0f;  // sum(dxhat), sum(dxhat * xhat)
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      if (col(k) >= h) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xh = (to_f(cur.x[k].v[j]) - mean) * rstd, d = to_f(cur.d[k].v[j]);
        const float dxh = d * gg[k][j];
        a += dxh;
        b += dxh * xh;
        ag[k][j] += d * xh;
        if (kLN) ab[k][j] += d;
      }
    }
    a = warp_sum(a);
    b = warp_sum(b);
    if (lane == 0) {
      red[par][warp][0] = a;
      red[par][warp][1] = b;
    }
    __syncthreads();
    a = 0.0f;
    b = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
      a += red[par][w][0];
      b += red[par][w][1];
    }
    a /= h;
    b /= h;
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int c = col(k);
      if (c >= h) continue;
      Pack8<T> out;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xh = (to_f(cur.x[k].v[j]) - mean) * rstd, dxh = to_f(cur.d[k].v[j]) * gg[k][j];
        // norm_bwd_row's formula: one explicit fused multiply-add (+0 without dres).
        out.v[j] = from_f<T>(__fmaf_rn(rstd, dxh - (kLN ? a : 0.0f) - xh * b, kRes ? to_f(cur.r[k].v[j]) : 0.0f));
      }
      *reinterpret_cast<Pack8<T>*>(dx + r * h + c) = out;
    }
    cur = nxt;
    par ^= 1;
  }
  // The block's partial row: every column is written by the one thread that owns it.
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int c = col(k);
    if (c >= h) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      part_g[(int64_t)blockIdx.x * h + c + j] = ag[k][j];
      if (kLN) part_b[(int64_t)blockIdx.x * h + c + j] = ab[k][j];
    }
  }
}
// ---- norm_bwd_rowblk end

// The register kernels are instantiated for float32 and bfloat16 only; other dtypes take the
// general kernels.
bool f32_or_bf16(DType d) { return d == DType::kFloat32 || d == DType::kBFloat16; }

// Forced by the dev/cuda drivers only (variants.h): always norm_fwd_kernel.
bool norm_fwd_v1_forced() { return variants::forced().norm_fwd_v1; }

// Forced by the dev/cuda drivers only (variants.h): always the shared-memory-atomics kernel.
bool norm_bwd_v1_forced() { return variants::forced().norm_bwd_v1; }

// MEGATRON_NORM_PIPELINE=0 (A/B runs, docs/environment.md) or a dev/cuda driver (variants.h):
// the register kernels without the cp.async row pipeline (same bits, slower).
bool norm_pipe_env() {
  static const bool on = env_switch("MEGATRON_NORM_PIPELINE", true);
  return on;
}
bool norm_fwd_pipe() { return norm_pipe_env() && !variants::forced().norm_fwd_no_pipe; }
bool norm_bwd_pipe() { return norm_pipe_env() && !variants::forced().norm_bwd_no_pipe; }

// MEGATRON_NORM_BWD_ROW=0 (A/B runs, docs/environment.md) or a dev/cuda driver / gpu_ops_test
// (variants.h norm_bwd_no_row, or norm_bwd_v1): 1024 < h <= 8192 takes norm_bwd_kernel (shared-
// memory atomics; per-warp partials in deterministic mode) instead of norm_bwd_rowblk_kernel.
bool norm_bwd_row_on() {
  static const bool on = env_switch("MEGATRON_NORM_BWD_ROW", true);
  return on && !variants::forced().norm_bwd_no_row && !variants::forced().norm_bwd_v1;
}

// One wave of norm_bwd_rowblk_kernel<kLN, kRes, T, G> at `threads` per block: the SM count times
// the blocks that fit per SM (the occupancy calculator, cached per thread count), never more
// blocks than rows. The grid fixes which rows each block sums into its partial row.
template <bool kLN, bool kRes, class T, class G>
unsigned rowblk_grid(int threads, int64_t rows) {
  static int per_sm[kRbMaxThreads / 32 + 1] = {};
  int& n = per_sm[threads / 32];
  if (n == 0) {
    int b = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, norm_bwd_rowblk_kernel<kLN, kRes, T, G>, threads, 0));
    n = std::max(b, 1);
  }
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t)sm_count() * n)));
}

// NC = the number of 256-column chunks of a row (h <= 256 * NC), 1..4, as a constant.
#define NORM_NC_SWITCH(nc, NC, ...)   \
  switch (nc) {                       \
    case 1: {                         \
      constexpr int NC = 1;           \
      __VA_ARGS__;                    \
    } break;                          \
    case 2: {                         \
      constexpr int NC = 2;           \
      __VA_ARGS__;                    \
    } break;                          \
    case 3: {                         \
      constexpr int NC = 3;           \
      __VA_ARGS__;                    \
    } break;                          \
    default: {                        \
      constexpr int NC = 4;           \
      __VA_ARGS__;                    \
    }                                 \
  }

// Shared memory as the pipelined kernels need it: `bytes` of dynamic shared memory and the whole
// unified L1/shared array offered as shared memory (3-4 blocks per SM).
template <class K>
void pipe_smem_attrs(K kern, size_t bytes) {
  if (bytes > 48 * 1024)
    CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared)));
}

template <bool kLN>
void norm_forward(const char* name, const Tensor& x, const Tensor& gamma, const Tensor* beta, float eps, bool zc,
                  Tensor& y, Tensor* mean, Tensor& rstd) {
  check_cuda(x, name);
  const int64_t h = x.size(-1), rows = h ? x.numel() / h : 0;
  const bool has_y = y.defined();  // undefined: only the statistics (mean/rstd) are written
  MEGATRON_CHECK(gamma.numel() == h && (!has_y || y.numel() == x.numel()) && rstd.numel() == rows &&
                 rstd.dtype() == DType::kFloat32 && (!kLN || (beta->numel() == h && beta->dtype() == gamma.dtype() &&
                                                             mean->numel() == rows && mean->dtype() == DType::kFloat32)))
      << name << ": x " << x.str() << " gamma " << gamma.str() << " y " << y.str() << " rstd " << rstd.str();
  if (rows == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = h % 8 == 0 && aligned16(x.data_ptr()) && (!has_y || aligned16(y.data_ptr())) &&
             aligned16(gamma.data_ptr()) && (!kLN || aligned16(beta->data_ptr()));
  const DType ydt = has_y ? y.dtype() : x.dtype();
  const bool one_dtype = x.dtype() == ydt && f32_or_bf16(x.dtype()) && f32_or_bf16(gamma.dtype());
  // Few rows of a wide row (decode): a block per row. Training's many-row shapes (rows > the SM
  // count) keep the warp-per-row kernels below and their bits (variants.h norm_fwd_row_many: the
  // block-per-row kernel for them too, for dev/cuda/norm_fwd's timing only).
  if (vec && one_dtype && (rows <= sm_count() || variants::forced().norm_fwd_row_many) && h > 256 * kRegMaxChunks &&
      h <= kRowThreads * 8 * kRowChunks && !norm_fwd_v1_forced()) {
    MCU_F32_BF16_SWITCH(x.dtype(), T, MCU_F32_BF16_SWITCH(gamma.dtype(), G, {
                          norm_fwd_row_kernel<kLN, T, G><<<static_cast<unsigned>(rows), kRowThreads, 0, st>>>(
                              static_cast<const T*>(x.data_ptr()), static_cast<const G*>(gamma.data_ptr()),
                              kLN ? static_cast<const G*>(beta->data_ptr()) : nullptr,
                              has_y ? static_cast<T*>(y.data_ptr()) : nullptr,
                              kLN ? static_cast<float*>(mean->data_ptr()) : nullptr,
                              static_cast<float*>(rstd.data_ptr()), (int)h, eps, zc ? 1.0f : 0.0f);
                        }));
    CUDA_CHECK_LAUNCH();
    return;
  }
  unsigned grid = static_cast<unsigned>(std::min<int64_t>((rows + kWarps - 1) / kWarps, (int64_t)sm_count() * 8));
  // The register kernel always writes y: statistics-only calls (rmsnorm_rstd, y undefined) take the
  // general kernel below, which skips the store.
  if (vec && has_y && h <= 256 * kRegMaxChunks && x.dtype() == y.dtype() && f32_or_bf16(x.dtype()) &&
      f32_or_bf16(gamma.dtype()) && !norm_fwd_v1_forced()) {
    if (norm_fwd_pipe() && x.dtype() == DType::kBFloat16) {
      // Rows split evenly over the warps of one wave of 4 blocks per SM (every row is one warp's
      // independent computation, so the split does not change any bit).
      const int64_t wave = (int64_t)sm_count() * 4 * kFwdPipeWarps, per_warp = (rows + wave - 1) / wave;
      const unsigned pg = static_cast<unsigned>((rows + per_warp * kFwdPipeWarps - 1) / (per_warp * kFwdPipeWarps));
      const int nc = static_cast<int>((h + 255) / 256);
      const size_t smem = sizeof(uint4) * kFwdPipeWarps * kPipeStages * nc * 32;
      using T = bf16_t;
      MCU_F32_BF16_SWITCH(gamma.dtype(), G, NORM_NC_SWITCH(nc, NC, {
                            auto kern = norm_fwd_pipe_kernel<kLN, NC, T, G>;
                            pipe_smem_attrs(kern, smem);
                            kern<<<pg, kFwdPipeWarps * 32, smem, st>>>(
                                static_cast<const T*>(x.data_ptr()), static_cast<const G*>(gamma.data_ptr()),
                                kLN ? static_cast<const G*>(beta->data_ptr()) : nullptr,
                                static_cast<T*>(y.data_ptr()), kLN ? static_cast<float*>(mean->data_ptr()) : nullptr,
                                static_cast<float*>(rstd.data_ptr()), rows, (int)h, eps, zc ? 1.0f : 0.0f);
                          }));
      CUDA_CHECK_LAUNCH();
      return;
    }
    MCU_F32_BF16_SWITCH(x.dtype(), T, MCU_F32_BF16_SWITCH(gamma.dtype(), G, {
                          norm_fwd_reg_kernel<kLN, T, G><<<grid, kWarps * 32, 0, st>>>(
                              static_cast<const T*>(x.data_ptr()), static_cast<const G*>(gamma.data_ptr()),
                              kLN ? static_cast<const G*>(beta->data_ptr()) : nullptr, static_cast<T*>(y.data_ptr()),
                              kLN ? static_cast<float*>(mean->data_ptr()) : nullptr,
                              static_cast<float*>(rstd.data_ptr()), rows, (int)h, eps, zc ? 1.0f : 0.0f);
                        }));
    CUDA_CHECK_LAUNCH();
    return;
  }
  NORM_TYPE_SWITCH(name, x.dtype(), gamma.dtype(), ydt, X, G, Y,
                   norm_fwd_kernel<kLN, X, G, Y><<<grid, kWarps * 32, 0, st>>>(
                       static_cast<const X*>(x.data_ptr()), static_cast<const G*>(gamma.data_ptr()),
                       kLN ? static_cast<const G*>(beta->data_ptr()) : nullptr,
                       has_y ? static_cast<Y*>(y.data_ptr()) : nullptr,
                       kLN ? static_cast<float*>(mean->data_ptr()) : nullptr, static_cast<float*>(rstd.data_ptr()),
                       rows, (int)h, eps, zc ? 1.0f : 0.0f, vec));
  CUDA_CHECK_LAUNCH();
}

template <bool kLN>
void norm_backward(const char* name, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor* mean,
                   const Tensor& rstd, bool zc, Tensor& dx, Tensor& dgamma, Tensor* dbeta, bool accumulate,
                   const Tensor* dres = nullptr) {
  check_cuda(x, name);
  MEGATRON_CHECK(!dres || (dres->numel() == dy.numel() && dres->dtype() == dy.dtype()))
      << name << ": residual gradient " << dres->str() << " for dy " << dy.str();
  const int64_t h = x.size(-1), rows = h ? x.numel() / h : 0;
  MEGATRON_CHECK(gamma.numel() == h && dy.numel() == x.numel() && dx.numel() == x.numel() && dx.dtype() == dy.dtype() &&
                 rstd.numel() == rows && dgamma.numel() == h && (!kLN || (mean->numel() == rows && dbeta->numel() == h &&
                                                                         dbeta->dtype() == dgamma.dtype())))
      << name << ": dy " << dy.str() << " x " << x.str() << " gamma " << gamma.str() << " dx " << dx.str()
      << " dgamma " << dgamma.str();
  if (h == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  bool vec = h % 8 == 0 && aligned16(x.data_ptr()) && aligned16(dy.data_ptr()) && aligned16(dx.data_ptr()) &&
             aligned16(gamma.data_ptr()) && (!dres || aligned16(dres->data_ptr()));
  // Register kernel: h <= 1024, 16-byte rows, x/dy/dx (and dres) of one dtype.
  const bool reg = vec && h <= 256 * kRegMaxChunks && x.dtype() == dy.dtype() && f32_or_bf16(x.dtype()) &&
                   f32_or_bf16(gamma.dtype()) && !norm_bwd_v1_forced();
  // Row-block kernel: 1024 < h <= 8192, 16-byte rows, bf16 x/dy/dx (and dres); deterministic.
  const bool rowblk = vec && h > 256 * kRegMaxChunks && h <= kRbMaxH && x.dtype() == DType::kBFloat16 &&
                      dy.dtype() == DType::kBFloat16 && f32_or_bf16(gamma.dtype()) && norm_bwd_row_on();
  const int rb_threads = rowblk ? rowblk_threads(h) : 0;
  unsigned grid = 0;
  if (rowblk) {
    MCU_F32_BF16_SWITCH(gamma.dtype(), G, {
      grid = dres ? rowblk_grid<kLN, true, bf16_t, G>(rb_threads, rows) : rowblk_grid<kLN, false, bf16_t, G>(rb_threads, rows);
    });
  } else {
    const int wpb = reg ? kRegWarps : kWarps;  // warps per block
    grid = static_cast<unsigned>(std::max<int64_t>(
        1, std::min<int64_t>((rows + wpb - 1) / wpb, (int64_t)sm_count() * (reg ? 3 : 2))));  // reg: one wave of 3 blocks per SM
  }
  const int nparts = kLN ? 2 : 1;
  // Partial rows: one per block (the register and row-block kernels sum their rows in order), or
  // one per warp for the general kernel in deterministic mode (zeroed: the warps accumulate into them).
  const bool det = !reg && !rowblk && megatron::cuda::deterministic();
  const int64_t prow = det ? (int64_t)grid * kWarps : (int64_t)grid;
  float* part = nullptr;
  CUDA_CHECK(cudaMallocAsync(&part, sizeof(float) * prow * h * nparts, st));
  if (det) CUDA_CHECK(cudaMemsetAsync(part, 0, sizeof(float) * prow * h * nparts, st));
  if (rowblk) {
    using T = bf16_t;
    MCU_F32_BF16_SWITCH(gamma.dtype(), G, {
      auto launch = [&](auto res_tag) {
        constexpr bool kRes = decltype(res_tag)::value;
        norm_bwd_rowblk_kernel<kLN, kRes, T, G><<<grid, rb_threads, 0, st>>>(
            static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
            static_cast<const G*>(gamma.data_ptr()), kLN ? static_cast<const float*>(mean->data_ptr()) : nullptr,
            static_cast<const float*>(rstd.data_ptr()), static_cast<T*>(dx.data_ptr()), part,
            part + (int64_t)grid * h, rows, (int)h, zc ? 1.0f : 0.0f,
            kRes ? static_cast<const T*>(dres->data_ptr()) : nullptr);
      };
      if (dres) launch(std::true_type{});
      else launch(std::false_type{});
    });
  } else if (reg && norm_bwd_pipe() && x.dtype() == DType::kBFloat16) {
    const int nc = static_cast<int>((h + 255) / 256);
    const size_t smem = bwd_pipe_smem(nc, dres != nullptr);
    using T = bf16_t;
    MCU_F32_BF16_SWITCH(gamma.dtype(), G, NORM_NC_SWITCH(nc, NC, {
          auto kern = norm_bwd_pipe_kernel<kLN, NC, T, G>;
          pipe_smem_attrs(kern, smem);
          kern<<<grid, kRegWarps * 32, smem, st>>>(
              static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
              static_cast<const G*>(gamma.data_ptr()), kLN ? static_cast<const float*>(mean->data_ptr()) : nullptr,
              static_cast<const float*>(rstd.data_ptr()), static_cast<T*>(dx.data_ptr()), part,
              part + (int64_t)grid * h, rows, (int)h, zc ? 1.0f : 0.0f,
              dres ? static_cast<const T*>(dres->data_ptr()) : nullptr);
        }));
  } else if (reg) {
    MCU_F32_BF16_SWITCH(
        x.dtype(), T, MCU_F32_BF16_SWITCH(gamma.dtype(), G, {
          norm_bwd_reg_kernel<kLN, T, G><<<grid, kRegWarps * 32, 0, st>>>(
              static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
              static_cast<const G*>(gamma.data_ptr()), kLN ? static_cast<const float*>(mean->data_ptr()) : nullptr,
              static_cast<const float*>(rstd.data_ptr()), static_cast<T*>(dx.data_ptr()), part,
              part + (int64_t)grid * h, rows, (int)h, zc ? 1.0f : 0.0f,
              dres ? static_cast<const T*>(dres->data_ptr()) : nullptr);
        }));
  } else {
    size_t smem = det ? 0 : sizeof(float) * h * nparts;
    NORM_TYPE_SWITCH(name, x.dtype(), gamma.dtype(), dy.dtype(), X, G, D, {
      auto kern = det ? norm_bwd_kernel<kLN, true, X, G, D> : norm_bwd_kernel<kLN, false, X, G, D>;
      if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
      kern<<<grid, kWarps * 32, smem, st>>>(
          static_cast<const D*>(dy.data_ptr()), static_cast<const X*>(x.data_ptr()),
          static_cast<const G*>(gamma.data_ptr()), kLN ? static_cast<const float*>(mean->data_ptr()) : nullptr,
          static_cast<const float*>(rstd.data_ptr()), static_cast<D*>(dx.data_ptr()), part, part + prow * h, rows,
          (int)h, zc ? 1.0f : 0.0f, vec, h % 8 == 0, dres ? static_cast<const D*>(dres->data_ptr()) : nullptr);
    });
  }
  CUDA_CHECK_LAUNCH();
  dim3 cg(static_cast<unsigned>((h + 31) / 32), static_cast<unsigned>(nparts));
  MCU_FLOAT_SWITCH(dgamma.dtype(), G, {
    colsum_kernel<G><<<cg, dim3(32, 8), 0, st>>>(part, (int)prow, (int)h, static_cast<G*>(dgamma.data_ptr()),
                                                 kLN ? static_cast<G*>(dbeta->data_ptr()) : nullptr, accumulate);
  });
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(part, st));
}
}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma,
                       Tensor& y, Tensor& mean, Tensor& rstd) {
  norm_forward<true>("layernorm_forward", x, gamma, &beta, eps, zero_centered_gamma, y, &mean, rstd);
}
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  norm_backward<true>("layernorm_backward", dy, x, gamma, &mean, rstd, zero_centered_gamma, dx, dgamma, &dbeta,
                      accumulate);
}
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y,
                     Tensor& rstd) {
  norm_forward<false>("rmsnorm_forward", x, gamma, nullptr, eps, zero_centered_gamma, y, nullptr, rstd);
}
void rmsnorm_rstd(const Tensor& x, const Tensor& gamma, float eps, Tensor& rstd) {
  Tensor none;
  norm_forward<false>("rmsnorm_rstd", x, gamma, nullptr, eps, false, none, nullptr, rstd);
}
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, bool accumulate) {
  norm_backward<false>("rmsnorm_backward", dy, x, gamma, nullptr, rstd, zero_centered_gamma, dx, dgamma, nullptr,
                       accumulate);
}

// Whether the residual gradient can be added inside the backward kernel (else the op composes
// the backward and add_, the same kernels the caller ran before the op existed).
bool residual_fused(const Tensor& dy, const Tensor& dresidual) {
  return dy.is_cuda() && dresidual.is_cuda() && dresidual.dtype() == dy.dtype() && dresidual.numel() == dy.numel() &&
         dy.dtype() != DType::kFloat16;
}

void layernorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  if (!residual_fused(dy, dresidual)) {
    layernorm_backward(dy, x, gamma, mean, rstd, zero_centered_gamma, dx, dgamma, dbeta, accumulate);
    add_(dx, dresidual, 1.0f);
    return;
  }
  norm_backward<true>("layernorm_backward_residual", dy, x, gamma, &mean, rstd, zero_centered_gamma, dx, dgamma,
                      &dbeta, accumulate, &dresidual);
}
void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                               bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx, Tensor& dgamma,
                               bool accumulate) {
  if (!residual_fused(dy, dresidual)) {
    rmsnorm_backward(dy, x, gamma, rstd, zero_centered_gamma, dx, dgamma, accumulate);
    add_(dx, dresidual, 1.0f);
    return;
  }
  norm_backward<false>("rmsnorm_backward_residual", dy, x, gamma, nullptr, rstd, zero_centered_gamma, dx, dgamma,
                       nullptr, accumulate, &dresidual);
}

}  // namespace megatron::ops::cuda
