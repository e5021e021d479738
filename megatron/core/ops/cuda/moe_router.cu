// MoE router and token permutation on the device (op_table.h, moerouter block; docs/moe.md
// "Kernels"). The host float64 router of megatron/core/transformer/moe/moe_utils.cpp is the
// reference (gpu_ops_test --only moe_router):
//  * moe_router_forward: one warp per token (4 per block); the row's scores and selection keys
//    in shared memory; the top-k by k warp arg-max rounds (larger key wins, ties the lower expert
//    index: the host's stable sort); scores in float32 with expf / logf (no fast math), as
//    Megatron computes them (torch.softmax(..., dtype=float32), torch.sigmoid(logits.float())).
//    float64 logits (--moe-router-dtype fp64) run the same kernels in double (exp / log, RC<L>);
//    the outputs keep their types (probs float32, the backward's dlogits float32; op_table.h
//    lists the float logit dtypes, float64 is accepted here as well).
//    The statistics: one block per column (fixed-order float64 block sums, so reproducible).
//  * moe_permute_map: one block per expert scans the tokens in order (ballot + warp prefix sums),
//    giving each (token, choice) its rank inside the expert; a second kernel adds the expert's
//    offset (prefix sum of the counts) and writes the row map and the permuted probabilities.
//  * moe_unpermute: one block per token sums its k rows in choice order in float32 (a row -1, a
//    choice dropped by the capacity, is skipped).
//  * moe_router_backward: one warp per token, the same recomputed scores as the forward (a
//    dropped choice, row -1, gets no gradient: its prob was zeroed).
//  * moe_gating_f64_forward / _backward (moe_gating_f64.h, outside the op table): the float64
//    gating GEMM of the fp64 router, one thread per output, in the host fp64 router's order.
//  * moe_permute_capacity (moe_capacity.h, outside the op table): the dropless permutation, then
//    one block per expert finds its capacity threshold (a bitwise radix select over the
//    (prob desc, token asc) keys of its routed tokens) and a second writes the kept (and padding)
//    rows in token order by block scans.
#include <algorithm>
#include <type_traits>

#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/ops/cuda/moe_capacity.h"
#include "megatron/core/ops/cuda/moe_gating_f64.h"

namespace megatron::ops::cuda {
using namespace detail;
namespace {

constexpr int kWarps = 4;       // tokens per block in the per-token kernels
constexpr int kMaxExperts = 1024;

// MCU_FLOAT_SWITCH plus float64 logits (--moe-router-dtype fp64; the only float64 kernels here).
#define ROUTER_LOGITS_SWITCH(dtype, L, ...)              \
  if ((dtype) == ::megatron::DType::kFloat64) {          \
    using L = double;                                    \
    __VA_ARGS__;                                         \
  } else {                                               \
    MCU_FLOAT_SWITCH(dtype, L, __VA_ARGS__);             \
  }

// The router's compute type: double for float64 logits (--moe-router-dtype fp64), float otherwise
// (float32 / bf16 / fp16 logits are widened to float, as Megatron's torch.softmax(..., dtype=float32)).
template <class L>
using RC = std::conditional_t<std::is_same_v<L, double>, double, float>;
template <class C>
__device__ __forceinline__ C ld(float x) { return x; }
template <class C>
__device__ __forceinline__ C ld(bf16_t x) { return to_f(x); }
template <class C>
__device__ __forceinline__ C ld(fp16_t x) { return to_f(x); }
template <class C>
__device__ __forceinline__ C ld(double x) { return x; }
// The math functions in the compute type (no fast math).
__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }
__device__ __forceinline__ float log1p_(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p_(double x) { return log1p(x); }
__device__ __forceinline__ float expm1_(float x) { return expm1f(x); }
__device__ __forceinline__ double expm1_(double x) { return expm1(x); }
__device__ __forceinline__ float sqrt_(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt_(double x) { return sqrt(x); }
__device__ __forceinline__ float max_(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double max_(double a, double b) { return fmax(a, b); }
// The normalization epsilon of the scores (Megatron's 1e-20, in the compute type).
template <class C>
__device__ __forceinline__ C eps20() { return C(1e-20); }

template <class C>
__device__ __forceinline__ C warp_max(C v) {
  for (int o = 16; o > 0; o >>= 1) v = max_(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
template <class C>
__device__ __forceinline__ C warp_sum(C v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// a beats b: larger key, or equal key and lower index; NaN keys (taken) never win. Keys are
// stored through clean_key, so a NaN score competes as -inf and the k <= E rounds always find one.
template <class C>
__device__ __forceinline__ C clean_key(C v) { return isnan(v) ? C(-INFINITY) : v; }
template <class C>
__device__ __forceinline__ bool key_better(C va, int ia, C vb, int ib) {
  if (isnan(va)) return false;
  if (isnan(vb) || ib < 0) return true;
  return va > vb || (va == vb && ia < ib);
}
// Arg-max of key[0..E) over the warp (every lane gets the result); -1 if all are taken.
template <class C>
__device__ __forceinline__ int warp_argmax(const C* key, int E, int lane) {
  C bv = C(NAN);
  int bi = -1;
  for (int e = lane; e < E; e += 32)
    if (key_better(key[e], e, bv, bi)) bv = key[e], bi = e;
  for (int o = 16; o > 0; o >>= 1) {
    const C ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && key_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  return bi;
}
template <class C>
__device__ __forceinline__ C sigmoid_(C x) { return C(1) / (C(1) + exp_(-x)); }
template <class C>
__device__ __forceinline__ C softplus_(C x) { return x > C(20) ? x : log1p_(exp_(x)); }
// Score of a logit for score function 1 (sigmoid) / 2 (sqrtsoftplus).
template <class C>
__device__ __forceinline__ C score_of(int sf, C x) { return sf == 1 ? sigmoid_(x) : sqrt_(softplus_(x)); }
// Its derivative from the logit (aux-loss scores) ...
template <class C>
__device__ __forceinline__ C score_grad_x(int sf, C x) {
  if (sf == 1) {
    const C s = sigmoid_(x);
    return s * (C(1) - s);
  }
  const C r = sqrt_(softplus_(x));
  return r > C(0) ? sigmoid_(x) / (C(2) * r) : C(0);
}
// ... and from the score itself (routing probs; the host's topk_routing_backward).
template <class C>
__device__ __forceinline__ C score_grad_s(int sf, C s) {
  if (sf == 1) return s * (C(1) - s);
  return s > C(0) ? -expm1_(-s * s) / (C(2) * s) : C(0);
}
// A routing prob as probs.type_as(logits), then stored in float32 (topk_probs): bf16 / fp16
// logits round it to their type; float64 ones keep it as the nearest float.
template <class L>
__device__ __forceinline__ float round_to(RC<L> p) {
  if constexpr (std::is_same_v<L, double>) return static_cast<float>(p);
  else return to_f(from_f<L>(p));
}

// Row max and Σ exp(x - max) of logits row x over the warp, in the compute type C.
template <class C, class L>
__device__ __forceinline__ void row_lse(const L* x, int E, int lane, C& m, C& sum) {
  m = C(-INFINITY);
  for (int e = lane; e < E; e += 32) m = max_(m, ld<C>(x[e]));
  m = warp_max(m);
  sum = C(0);
  for (int e = lane; e < E; e += 32) sum += exp_(ld<C>(x[e]) - m);
  sum = warp_sum(sum);
}

// Shared memory per warp (warp_bytes, moe_router_forward): s[E] scores, key[E] selection keys,
// gs[G] group scores in the compute type C, then sel[E] chosen experts (int).
template <class L>
__global__ void __launch_bounds__(kWarps * 32)
    router_fwd_kernel(const L* __restrict__ logits, const float* __restrict__ bias, int T, int E, int k, int sf,
                      bool pre, float scale, int G, int gtopk, int64_t* __restrict__ tidx, float* __restrict__ tprob,
                      RC<L>* __restrict__ aux_scores, uint8_t* __restrict__ aux_map, RC<L>* __restrict__ lse_out,
                      size_t warp_bytes) {
  using C = RC<L>;
  extern __shared__ __align__(16) unsigned char router_sh[];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + w;
  if (t >= T) return;  // whole warps only; no block barrier below
  C* s = reinterpret_cast<C*>(router_sh + (size_t)w * warp_bytes);
  C* key = s + E;
  C* gs = key + E;  // [G] group scores (group-limited routing)
  int* sel = reinterpret_cast<int*>(gs + G);
  const L* x = logits + (int64_t)t * E;
  C m, sum;
  row_lse(x, E, lane, m, sum);
  if (lse_out && lane == 0) lse_out[t] = m + log_(sum);
  for (int e = lane; e < E; e += 32) {
    const C xe = ld<C>(x[e]);
    if (sf == 0) {
      s[e] = exp_(xe - m) / sum;
      key[e] = clean_key(pre ? s[e] : xe);
    } else {
      s[e] = score_of(sf, xe);
      key[e] = clean_key(bias ? s[e] + bias[e] : s[e]);
    }
  }
  __syncwarp();
  if (gtopk > 0) {
    // Megatron's group_limited_topk: a group's score is the sum of its top (k / group_topk) keys;
    // the group_topk best groups (ties: lower group index) stay, the other experts' keys become
    // -inf (as the host's masked_fill), then the top-k below.
    const int per = E / G, take = k / gtopk;
    for (int g = lane; g < G; g += 32) {
      C acc = C(0), pv = C(INFINITY);
      int pi = -1;
      for (int r = 0; r < take; ++r) {  // the next key after (pv, pi) in (key desc, index asc) order
        C bv = C(NAN);
        int bi = -1;
        for (int e = g * per; e < (g + 1) * per; ++e) {
          const C v = key[e];
          if ((v < pv || (v == pv && e > pi)) && key_better(v, e, bv, bi)) bv = v, bi = e;
        }
        acc += bv;
        pv = bv, pi = bi;
      }
      gs[g] = clean_key(acc);
    }
    __syncwarp();
    for (int j = 0; j < gtopk; ++j) {
      const int b = warp_argmax(gs, G, lane);
      if (lane == 0) gs[b] = C(NAN);  // chosen
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32)
      if (!isnan(gs[e / per])) key[e] = C(-INFINITY);
    __syncwarp();
  }
  for (int j = 0; j < k; ++j) {
    const int b = warp_argmax(key, E, lane);
    if (lane == 0) {
      sel[j] = b;
      key[b] = C(NAN);
    }
    __syncwarp();
  }
  // Probabilities of the chosen experts (as the host's topk_routing_with_score_function).
  if (sf == 0 && !pre) {
    const C mx = ld<C>(x[sel[0]]);  // the largest chosen logit
    C den = C(0);
    for (int j = lane; j < k; j += 32) den += exp_(ld<C>(x[sel[j]]) - mx);
    den = warp_sum(den);
    for (int j = lane; j < k; j += 32)
      tprob[(int64_t)t * k + j] = round_to<L>(exp_(ld<C>(x[sel[j]]) - mx) / den * C(scale));
  } else if (sf == 0) {
    for (int j = lane; j < k; j += 32) tprob[(int64_t)t * k + j] = round_to<L>(s[sel[j]] * C(scale));
  } else {
    C ssum = C(0);
    for (int j = lane; j < k; j += 32) ssum += s[sel[j]];
    ssum = warp_sum(ssum);
    for (int j = lane; j < k; j += 32) {
      const C p = k > 1 ? s[sel[j]] / (ssum + eps20<C>()) : s[sel[j]];
      tprob[(int64_t)t * k + j] = round_to<L>(p * C(scale));
    }
  }
  for (int j = lane; j < k; j += 32) tidx[(int64_t)t * k + j] = sel[j];
  if (!aux_scores) return;
  // compute_routing_scores_for_aux_loss: softmax, or the scores normalized per token; its top-k map.
  __syncwarp();
  C nsum = C(0);
  if (sf != 0) {
    for (int e = lane; e < E; e += 32) nsum += s[e];
    nsum = warp_sum(nsum);
  }
  for (int e = lane; e < E; e += 32) {
    const C a = sf == 0 ? s[e] : s[e] / (nsum + eps20<C>());
    aux_scores[(int64_t)t * E + e] = a;
    key[e] = clean_key(a);
    aux_map[(int64_t)t * E + e] = 0;
  }
  __syncwarp();
  for (int j = 0; j < k; ++j) {
    const int b = warp_argmax(key, E, lane);
    if (lane == 0) {
      key[b] = C(NAN);
      aux_map[(int64_t)t * E + b] = 1;
    }
    __syncwarp();
  }
}

// Fixed-order float64 block sum (blockDim.x = 256).
__device__ __forceinline__ double block_sum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  double r = 0;
  if (threadIdx.x == 0)
    for (int i = 0; i < (int)blockDim.x / 32; ++i) r += red[i];
  return r;  // valid in thread 0
}

// Blocks [0, B E): column sums of the aux scores / map of sequence b = c / E; [B E, B E + E):
// tokens routed to e; the last: Σ lse². stats layout of moe_router_forward.
template <class C>
__global__ void router_stats_kernel(const C* __restrict__ aux_scores, const uint8_t* __restrict__ aux_map,
                                    const int64_t* __restrict__ tidx, const C* __restrict__ lse, int T, int E, int k,
                                    int B, double* __restrict__ stats) {
  __shared__ double red[32];
  const int c = blockIdx.x, BE = B * E;
  double a = 0, n = 0;
  if (c < BE) {
    const int b = c / E, e = c % E;
    if (aux_scores)
      for (int t = b + B * (int)threadIdx.x; t < T; t += B * (int)blockDim.x) {
        a += aux_scores[(int64_t)t * E + e];
        n += aux_map[(int64_t)t * E + e];
      }
    a = block_sum(a, red);
    n = block_sum(n, red);
    if (threadIdx.x == 0) stats[c] = a, stats[BE + c] = n;
  } else if (c < BE + E) {
    const int e = c - BE;
    for (int64_t i = threadIdx.x; i < (int64_t)T * k; i += blockDim.x) n += tidx[i] == e ? 1.0 : 0.0;
    n = block_sum(n, red);
    if (threadIdx.x == 0) stats[2 * BE + e] = n;
  } else {
    if (lse)
      for (int t = threadIdx.x; t < T; t += blockDim.x) a += (double)lse[t] * (double)lse[t];
    a = block_sum(a, red);
    if (threadIdx.x == 0) stats[2 * BE + E] = a;
  }
}

// ---- the float64 gating GEMM (moe_gating_f64.h) ----
// Σ_i a[i sa] b[i sb] for i ascending in float64 with __dmul_rn / __dadd_rn (no contraction into
// an FMA: the host loop's rounding).
template <class A, class B>
__device__ __forceinline__ double dot_f64(const A* a, int64_t sa, const B* b, int64_t sb, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc = __dadd_rn(acc, __dmul_rn((double)to_f(a[i * sa]), (double)to_f(b[i * sb])));
  return acc;
}
// out[t, e] = Σ_j x[t, j] w[e, j]; one thread per (t, e), e fastest (a warp shares x's row).
template <class X>
__global__ void gating_f64_fwd_kernel(const X* __restrict__ x, const X* __restrict__ w, int64_t T, int64_t E,
                                      int64_t h, double* __restrict__ out) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < T * E) out[i] = dot_f64(x + (i / E) * h, 1, w + (i % E) * h, 1, h);
}
// dx[t, j] = Σ_e dl[t, e] w[e, j]; one thread per (t, j), j fastest (coalesced).
template <class X>
__global__ void gating_f64_dx_kernel(const float* __restrict__ dl, const X* __restrict__ w, int64_t T, int64_t E,
                                     int64_t h, X* __restrict__ dx) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < T * h) dx[i] = from_f<X>((float)dot_f64(dl + (i / h) * E, 1, w + i % h, h, E));
}
// dw[e, j] += Σ_t dl[t, e] x[t, j]; one thread per (e, j), j fastest (coalesced).
template <class X, class G>
__global__ void gating_f64_dw_kernel(const float* __restrict__ dl, const X* __restrict__ x, int64_t T, int64_t E,
                                     int64_t h, G* __restrict__ dw) {
  const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < E * h) dw[i] = from_f<G>(to_f(dw[i]) + to_f(from_f<G>((float)dot_f64(dl + i / h, E, x + i % h, h, T))));
}

// ---- block scans (permutation and capacity kernels) ----
// Block-wide (every thread calls) exclusive prefix count of `flag` in thread order; *total gets
// the block's count. warp_tot: 32 ints of shared memory.
__device__ __forceinline__ int block_scan_flag(bool flag, int* warp_tot, int* total) {
  const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
  const unsigned bal = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_tot[wid] = __popc(bal);
  __syncthreads();
  int off = 0, tot = 0;
  for (int i = 0; i < nw; ++i) {
    if (i < wid) off += warp_tot[i];
    tot += warp_tot[i];
  }
  __syncthreads();
  *total = tot;
  return off + __popc(bal & ((1u << lane) - 1u));
}
// Block-wide sum (every thread calls; every thread gets it). red: 32 long longs of shared memory.
__device__ __forceinline__ long long block_sum_ll(long long v, long long* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  long long r = 0;
  for (int i = 0; i < (int)blockDim.x / 32; ++i) r += red[i];
  __syncthreads();
  return r;
}
// Σ_{i < e} c[i] over the block.
__device__ __forceinline__ long long block_prefix(const int64_t* c, int e, long long* red) {
  long long v = 0;
  for (int i = threadIdx.x; i < e; i += blockDim.x) v += c[i];
  return block_sum_ll(v, red);
}
// One block (1024 threads) per expert e: scans tokens in order; rank_out[t k + j] = the rank of
// token t among the tokens choosing e (for the j with topk_idx[t, j] == e); counts[e].
__global__ void __launch_bounds__(1024)
    permute_rank_kernel(const int64_t* __restrict__ tidx, int T, int k, int64_t* __restrict__ rank_out,
                        int64_t* __restrict__ counts) {
  __shared__ int warp_tot[32];
  const int e = blockIdx.x;
  int64_t base = 0;  // the same in every thread
  for (int t0 = 0; t0 < T; t0 += blockDim.x) {
    const int t = t0 + threadIdx.x;
    int jj = -1;
    if (t < T)
      for (int j = 0; j < k; ++j)
        if (tidx[(int64_t)t * k + j] == e) jj = j;
    int tot;
    const int before = block_scan_flag(jj >= 0, warp_tot, &tot);
    if (jj >= 0) rank_out[(int64_t)t * k + jj] = base + before;
    base += tot;
  }
  if (threadIdx.x == 0) counts[e] = base;
}

// row = offset[e] + rank; the row map and the permuted probabilities.
__global__ void permute_scatter_kernel(const int64_t* __restrict__ tidx, const float* __restrict__ tprob,
                                       const int64_t* __restrict__ counts, int E, int k, int64_t n,
                                       int64_t* __restrict__ row_token, int64_t* __restrict__ row_of,
                                       float* __restrict__ pprobs) {
  extern __shared__ int64_t offs[];
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    for (int e = 0; e < E; ++e) offs[e] = acc, acc += counts[e];
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t row = offs[tidx[i]] + row_of[i];  // row_of holds the rank here
    row_of[i] = row;
    row_token[row] = i / k;
    pprobs[row] = tprob[i];
  }
}

template <class X, class O>
__global__ void unpermute_kernel(const X* __restrict__ rows, const int64_t* __restrict__ row_of, int k, int64_t h,
                                 O* __restrict__ out) {
  const int64_t t = blockIdx.x;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) {
      const int64_t r = row_of[t * k + j];
      if (r >= 0) acc += to_f(rows[r * h + c]);  // -1: a choice dropped by the capacity
    }
    out[t * h + c] = from_f<O>(acc);
  }
}

// Shared memory per warp, in the compute type C: sm[E] softmax, d[E] dlogits accumulator, dp[E].
template <class L>
__global__ void __launch_bounds__(kWarps * 32)
    router_bwd_kernel(const L* __restrict__ logits, const int64_t* __restrict__ tidx, const float* __restrict__ dprobs,
                      const int64_t* __restrict__ row_of, int T, int E, int k, int sf, bool pre, float scale, int B,
                      const float* __restrict__ aux_coef, float z_coef, float* __restrict__ dlogits) {
  using C = RC<L>;
  extern __shared__ __align__(16) unsigned char router_sh[];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = blockIdx.x * kWarps + w;
  if (t >= T) return;
  C* sm = reinterpret_cast<C*>(router_sh) + (size_t)w * 3 * E;  // softmax of the row
  C* d = sm + E;
  C* dp = d + E;                    // dp[j] = d prob_j * scale (k <= E)
  const L* x = logits + (int64_t)t * E;
  C m, sum;
  row_lse(x, E, lane, m, sum);
  const C lse = m + log_(sum);
  for (int e = lane; e < E; e += 32) {
    sm[e] = exp_(ld<C>(x[e]) - m) / sum;
    d[e] = C(0);
  }
  for (int j = lane; j < k; j += 32) {
    const int64_t r = row_of[(int64_t)t * k + j];
    dp[j] = r >= 0 ? C(dprobs[r]) * C(scale) : C(0);  // a dropped choice: its prob was zeroed
  }
  __syncwarp();
  const int64_t* sel = tidx + (int64_t)t * k;
  if (sf == 0 && !pre) {
    // p = softmax(x[sel]): dx[sel_j] = p_j (dp_j - <p, dp>).
    const C mx = ld<C>(x[sel[0]]);
    C den = C(0);
    for (int j = lane; j < k; j += 32) den += exp_(ld<C>(x[sel[j]]) - mx);
    den = warp_sum(den);
    C dot = C(0);
    for (int j = lane; j < k; j += 32) dot += exp_(ld<C>(x[sel[j]]) - mx) / den * dp[j];
    dot = warp_sum(dot);
    for (int j = lane; j < k; j += 32) {
      const C p = exp_(ld<C>(x[sel[j]]) - mx) / den;
      d[sel[j]] += p * (dp[j] - dot);  // distinct experts: no two lanes write one entry
    }
  } else if (sf == 0) {
    // p = softmax(x)[sel]: dx_e = s_e (dtmp_e - Σ_j s_sel_j dp_j).
    C dot = C(0);
    for (int j = lane; j < k; j += 32) dot += sm[sel[j]] * dp[j];
    dot = warp_sum(dot);
    for (int e = lane; e < E; e += 32) d[e] -= sm[e] * dot;
    __syncwarp();
    for (int j = lane; j < k; j += 32) d[sel[j]] += sm[sel[j]] * dp[j];
  } else {
    C D = C(0), dot = C(0);
    for (int j = lane; j < k; j += 32) {
      const C sc = score_of(sf, ld<C>(x[sel[j]]));
      D += sc;
      dot += dp[j] * sc;
    }
    D = warp_sum(D) + eps20<C>();
    dot = warp_sum(dot);
    for (int j = lane; j < k; j += 32) {
      const C sc = score_of(sf, ld<C>(x[sel[j]]));
      const C ds = k > 1 ? dp[j] / D - dot / (D * D) : dp[j];
      d[sel[j]] += ds * score_grad_s(sf, sc);
    }
  }
  __syncwarp();
  if (aux_coef) {
    const float* c = aux_coef + (int64_t)(t % B) * E;
    if (sf == 0) {
      C dot = C(0);
      for (int e = lane; e < E; e += 32) dot += sm[e] * C(c[e]);
      dot = warp_sum(dot);
      for (int e = lane; e < E; e += 32) d[e] += sm[e] * (C(c[e]) - dot);
    } else {
      C D = C(0), dot = C(0);
      for (int e = lane; e < E; e += 32) {
        const C r = score_of(sf, ld<C>(x[e]));
        D += r;
        dot += C(c[e]) * r;
      }
      D = warp_sum(D) + eps20<C>();
      dot = warp_sum(dot);
      for (int e = lane; e < E; e += 32) d[e] += (C(c[e]) / D - dot / (D * D)) * score_grad_x(sf, ld<C>(x[e]));
    }
  }
  for (int e = lane; e < E; e += 32)
    dlogits[(int64_t)t * E + e] = static_cast<float>(d[e] + C(z_coef) * lse * sm[e]);
}


// ---- capacity dropping (moe_capacity.h) ----
// The capacity key of a routed (token, expert): its prob ("probs") or 1 ("position"). Keys > 0
// form the ranked set P; every other token (key 0: not routed, or routed with prob 0) ranks
// after P in token order.
__device__ __forceinline__ float cap_key(float p, bool by_position) { return by_position ? 1.0f : p; }
// (key desc, token asc) as one unsigned order: a positive float's bits order as the float.
__device__ __forceinline__ unsigned long long cap_rank_key(float key, int64_t t) {
  return ((unsigned long long)__float_as_uint(key) << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)t);
}

// One block (1024 threads) per expert e over its segment of the dropless permutation (tokens
// ascending; row_token0 / pprobs0 / counts0 of moe_permute_map): np[e] = |P|; thr[e] = the
// cap-th largest cap_rank_key of P when |P| > cap (bitwise radix select: keys are distinct, so
// exactly cap keys are >= it), else 0 (all of P kept); rows[e] = the expert's final rows.
// cap = min(capacity, T). A token outside P is kept iff its rank among the non-P tokens (its index
// minus the P tokens before it) is below need = cap - min(|P|, cap).
__global__ void __launch_bounds__(1024)
    capacity_select_kernel(const int64_t* __restrict__ row_token0, const float* __restrict__ pprobs0,
                           const int64_t* __restrict__ counts0, int64_t cap, bool by_position, bool pad,
                           unsigned long long* __restrict__ thr_out, int64_t* __restrict__ np_out,
                           int64_t* __restrict__ rows_out) {
  __shared__ long long red[32];
  __shared__ int wt[32];
  const int e = blockIdx.x;
  const long long off0 = block_prefix(counts0, e, red);
  const int64_t c = counts0[e];
  const int64_t* tok = row_token0 + off0;
  const float* pr = pprobs0 + off0;
  long long np = 0;
  for (int64_t i = threadIdx.x; i < c; i += blockDim.x) np += cap_key(pr[i], by_position) > 0.f ? 1 : 0;
  np = block_sum_ll(np, red);
  unsigned long long thr = 0;
  if (np > cap) {
    for (int b = 62; b >= 0; --b) {  // bit 63 is a positive float's sign bit
      const unsigned long long cand = thr | (1ull << b);
      long long n = 0;
      for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
        const float kk = cap_key(pr[i], by_position);
        n += kk > 0.f && cap_rank_key(kk, tok[i]) >= cand ? 1 : 0;
      }
      if (block_sum_ll(n, red) >= cap) thr = cand;
    }
  }
  const long long need = cap - (np < cap ? np : cap);
  long long rows = pad ? cap : (np < cap ? np : cap);
  if (!pad && need > 0) {  // routed tokens with prob 0 ranked among the non-P tokens
    long long pbase = 0, z = 0;
    for (int64_t i0 = 0; i0 < c; i0 += blockDim.x) {
      const int64_t i = i0 + threadIdx.x;
      const bool valid = i < c, inp = valid && cap_key(pr[i], by_position) > 0.f;
      int ptot;
      const int pb = block_scan_flag(inp, wt, &ptot);
      if (valid && !inp && tok[i] - (pbase + pb) < need) ++z;
      pbase += ptot;
    }
    rows += block_sum_ll(z, red);
  }
  if (threadIdx.x == 0) thr_out[e] = thr, np_out[e] = np, rows_out[e] = rows;
}

// One block per expert: writes its final rows (tokens ascending) at offset Σ_{e' < e} rows[e'],
// and row_of of its choices (-1: dropped). Without padding it scans its dropless segment; with
// padding all T tokens (non-P tokens join as padding rows, prob 0 unless routed).
__global__ void __launch_bounds__(1024)
    capacity_scatter_kernel(const int64_t* __restrict__ tidx, const float* __restrict__ tprob,
                            const int64_t* __restrict__ row_token0, const float* __restrict__ pprobs0,
                            const int64_t* __restrict__ counts0, int T, int k, int64_t cap, bool by_position,
                            bool pad, const unsigned long long* __restrict__ thr_in, const int64_t* __restrict__ np_in,
                            const int64_t* __restrict__ rows_in, int64_t* __restrict__ row_token,
                            float* __restrict__ pprobs, int64_t* __restrict__ row_of) {
  __shared__ long long red[32];
  __shared__ int wt[32];
  const int e = blockIdx.x;
  const long long off0 = block_prefix(counts0, e, red), off = block_prefix(rows_in, e, red);
  const int64_t c = counts0[e], np = np_in[e];
  const unsigned long long thr = thr_in[e];
  const long long need = cap - (np < cap ? np : cap);
  const int64_t n_scan = pad ? T : c;
  long long pbase = 0, rbase = 0;
  for (int64_t i0 = 0; i0 < n_scan; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x;
    const bool valid = i < n_scan;
    int64_t t = 0;
    int jj = -1;
    float p = 0.f;
    if (valid) {
      t = pad ? i : row_token0[off0 + i];
      for (int j = 0; j < k; ++j)
        if (tidx[t * k + j] == e) jj = j;
      if (jj >= 0) p = pad ? tprob[t * k + jj] : pprobs0[off0 + i];
    }
    const float kk = jj >= 0 ? cap_key(p, by_position) : 0.f;
    const bool inp = kk > 0.f;
    int ptot, ktot;
    const int pb = block_scan_flag(inp, wt, &ptot);
    const bool keep = valid && (inp ? cap_rank_key(kk, t) >= thr : t - (pbase + pb) < need);
    const int kb = block_scan_flag(keep, wt, &ktot);
    const int64_t r = off + rbase + kb;
    if (keep) row_token[r] = t, pprobs[r] = p;
    if (jj >= 0) row_of[t * k + jj] = keep ? r : -1;
    pbase += ptot;
    rbase += ktot;
  }
}

}  // namespace

bool moe_router_forward(const Tensor& logits, const Tensor* expert_bias, int64_t topk, int64_t score_function,
                        bool pre_softmax, float scaling, int64_t num_groups, int64_t group_topk, int64_t bsz,
                        Tensor& topk_idx, Tensor& topk_probs, Tensor* stats) {
  check_cuda(logits, "moe_router_forward");
  const int64_t E = logits.size(-1), T = E ? logits.numel() / E : 0, k = topk;
  const int64_t G = group_topk > 0 ? num_groups : 0;
  if (E > kMaxExperts || k < 1 || k > E) return false;
  const bool f64 = logits.dtype() == DType::kFloat64;
  // Per warp: s, key (E each) and the G group scores in the compute type, then sel[E] ints
  // (8-byte multiples, so every warp's block stays aligned for double).
  const size_t csize = f64 ? sizeof(double) : sizeof(float);
  const size_t warp_bytes = ((2 * E + G) * csize + E * sizeof(int) + 7) / 8 * 8;
  // ... and the backward's rows (3 E in the compute type: more than the forward's for double),
  // so that a routed forward always has its backward.
  if ((size_t)kWarps * warp_bytes > 48 * 1024 || (size_t)kWarps * 3 * E * csize > 48 * 1024) return false;
  if (G > 0 && (E % G != 0 || group_topk > G || k % group_topk != 0 || k / group_topk > E / G ||
                k > group_topk * (E / G)))
    return false;
  MEGATRON_CHECK(topk_idx.dtype() == DType::kInt64 && topk_idx.numel() == T * k &&
                 topk_probs.dtype() == DType::kFloat32 && topk_probs.numel() == T * k && bsz >= 1 && T % bsz == 0 &&
                 score_function >= 0 && score_function <= 2 &&
                 (!expert_bias || (expert_bias->dtype() == DType::kFloat32 && expert_bias->numel() == E &&
                                   expert_bias->is_cuda())) &&
                 (!stats || (stats->dtype() == DType::kFloat64 && stats->numel() == 2 * bsz * E + E + 1)))
      << "moe_router_forward: logits " << logits.str() << " topk " << k << " idx " << topk_idx.str() << " probs "
      << topk_probs.str() << " bsz " << bsz;
  if (T == 0) return true;
  MEGATRON_CHECK(T * E < (1ll << 31)) << "moe_router_forward: " << T << " x " << E;
  cudaStream_t st = megatron::cuda::current_stream();
  const DType ct = f64 ? DType::kFloat64 : DType::kFloat32;  // the compute type's
  Tensor aux_scores, aux_map, lse;
  if (stats) {
    aux_scores = Tensor::empty({T, E}, ct, logits.device());
    aux_map = Tensor::empty({T, E}, DType::kUInt8, logits.device());
    lse = Tensor::empty({T}, ct, logits.device());
  }
  const size_t shm = (size_t)kWarps * warp_bytes;
  const unsigned blocks = (unsigned)((T + kWarps - 1) / kWarps);
  ROUTER_LOGITS_SWITCH(
      logits.dtype(), L, using C = RC<L>;
      router_fwd_kernel<L><<<blocks, kWarps * 32, shm, st>>>(
          static_cast<const L*>(logits.data_ptr()),
          expert_bias ? static_cast<const float*>(expert_bias->data_ptr()) : nullptr, (int)T, (int)E, (int)k,
          (int)score_function, pre_softmax, scaling, (int)G, (int)group_topk, static_cast<int64_t*>(topk_idx.data_ptr()),
          static_cast<float*>(topk_probs.data_ptr()), stats ? static_cast<C*>(aux_scores.data_ptr()) : nullptr,
          stats ? static_cast<uint8_t*>(aux_map.data_ptr()) : nullptr,
          stats ? static_cast<C*>(lse.data_ptr()) : nullptr, warp_bytes);
      CUDA_CHECK_LAUNCH();
      if (stats) {
        router_stats_kernel<C><<<(unsigned)(bsz * E + E + 1), 256, 0, st>>>(
            static_cast<const C*>(aux_scores.data_ptr()), static_cast<const uint8_t*>(aux_map.data_ptr()),
            static_cast<const int64_t*>(topk_idx.data_ptr()), static_cast<const C*>(lse.data_ptr()), (int)T, (int)E,
            (int)k, (int)bsz, static_cast<double*>(stats->data_ptr()));
        CUDA_CHECK_LAUNCH();
      });
  return true;
}

bool moe_permute_map(const Tensor& topk_idx, const Tensor& topk_probs, int64_t num_experts, Tensor& row_token,
                     Tensor& row_of, Tensor& permuted_probs, Tensor& counts) {
  check_cuda(topk_idx, "moe_permute_map");
  const int64_t E = num_experts, n = topk_idx.numel(), k = topk_idx.dim() == 2 ? topk_idx.size(1) : 0;
  if (E > 65535) return false;
  MEGATRON_CHECK(topk_idx.dtype() == DType::kInt64 && k > 0 && topk_probs.dtype() == DType::kFloat32 &&
                 topk_probs.numel() == n && row_token.dtype() == DType::kInt64 && row_token.numel() == n &&
                 row_of.dtype() == DType::kInt64 && row_of.numel() == n &&
                 permuted_probs.dtype() == DType::kFloat32 && permuted_probs.numel() == n &&
                 counts.dtype() == DType::kInt64 && counts.numel() == E)
      << "moe_permute_map: topk_idx " << topk_idx.str() << " probs " << topk_probs.str() << " E " << E;
  const int64_t T = n / k;
  MEGATRON_CHECK(n < (1ll << 31)) << "moe_permute_map: " << n << " choices";
  cudaStream_t st = megatron::cuda::current_stream();
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(counts.data_ptr(), 0, (size_t)E * sizeof(int64_t), st));
    return true;
  }
  permute_rank_kernel<<<(unsigned)E, 1024, 0, st>>>(static_cast<const int64_t*>(topk_idx.data_ptr()), (int)T, (int)k,
                                                    static_cast<int64_t*>(row_of.data_ptr()),
                                                    static_cast<int64_t*>(counts.data_ptr()));
  CUDA_CHECK_LAUNCH();
  permute_scatter_kernel<<<grid_for(n, 256), 256, (size_t)E * sizeof(int64_t), st>>>(
      static_cast<const int64_t*>(topk_idx.data_ptr()), static_cast<const float*>(topk_probs.data_ptr()),
      static_cast<const int64_t*>(counts.data_ptr()), (int)E, (int)k, n, static_cast<int64_t*>(row_token.data_ptr()),
      static_cast<int64_t*>(row_of.data_ptr()), static_cast<float*>(permuted_probs.data_ptr()));
  CUDA_CHECK_LAUNCH();
  return true;
}

int64_t moe_capacity_max_rows(int64_t T, int64_t k, int64_t E, int64_t capacity, bool pad_to_capacity) {
  return pad_to_capacity ? E * std::min(capacity, T) : T * k;
}

bool moe_permute_capacity(const Tensor& topk_idx, const Tensor& topk_probs, int64_t num_experts, int64_t capacity,
                          bool by_position, bool pad_to_capacity, Tensor& row_token, Tensor& row_of,
                          Tensor& permuted_probs, Tensor& counts) {
  check_cuda(topk_idx, "moe_permute_capacity");
  const int64_t E = num_experts, n = topk_idx.numel(), k = topk_idx.dim() == 2 ? topk_idx.size(1) : 0;
  if (E > 65535) return false;
  const int64_t T = k ? n / k : 0, R = moe_capacity_max_rows(T, k, E, capacity, pad_to_capacity);
  MEGATRON_CHECK(topk_idx.dtype() == DType::kInt64 && k > 0 && capacity > 0 && topk_probs.dtype() == DType::kFloat32 &&
                 topk_probs.numel() == n && row_token.dtype() == DType::kInt64 && row_token.numel() >= R &&
                 row_of.dtype() == DType::kInt64 && row_of.numel() == n &&
                 permuted_probs.dtype() == DType::kFloat32 && permuted_probs.numel() >= R &&
                 counts.dtype() == DType::kInt64 && counts.numel() == E)
      << "moe_permute_capacity: topk_idx " << topk_idx.str() << " probs " << topk_probs.str() << " E " << E
      << " capacity " << capacity << " rows " << row_token.str() << " / " << permuted_probs.str() << " for " << R;
  MEGATRON_CHECK(n < (1ll << 31) && R < (1ll << 62)) << "moe_permute_capacity: " << n << " choices";
  cudaStream_t st = megatron::cuda::current_stream();
  if (n == 0) {
    CUDA_CHECK(cudaMemsetAsync(counts.data_ptr(), 0, (size_t)E * sizeof(int64_t), st));
    return true;
  }
  const Device dev = topk_idx.device();
  // The dropless permutation first: each expert's routed tokens in order, with their probs.
  Tensor row_token0 = Tensor::empty({n}, DType::kInt64, dev), pprobs0 = Tensor::empty({n}, DType::kFloat32, dev),
         counts0 = Tensor::empty({E}, DType::kInt64, dev), scratch = Tensor::empty({3 * E}, DType::kInt64, dev);
  MEGATRON_CHECK(moe_permute_map(topk_idx, topk_probs, E, row_token0, row_of, pprobs0, counts0))
      << "moe_permute_capacity: moe_permute_map declined";
  int64_t* sc = static_cast<int64_t*>(scratch.data_ptr());
  auto* thr = reinterpret_cast<unsigned long long*>(sc);
  const int64_t cap = std::min(capacity, T);
  capacity_select_kernel<<<(unsigned)E, 1024, 0, st>>>(static_cast<const int64_t*>(row_token0.data_ptr()),
                                                       static_cast<const float*>(pprobs0.data_ptr()),
                                                       static_cast<const int64_t*>(counts0.data_ptr()), cap,
                                                       by_position, pad_to_capacity, thr, sc + E,
                                                       static_cast<int64_t*>(counts.data_ptr()));
  CUDA_CHECK_LAUNCH();
  capacity_scatter_kernel<<<(unsigned)E, 1024, 0, st>>>(
      static_cast<const int64_t*>(topk_idx.data_ptr()), static_cast<const float*>(topk_probs.data_ptr()),
      static_cast<const int64_t*>(row_token0.data_ptr()), static_cast<const float*>(pprobs0.data_ptr()),
      static_cast<const int64_t*>(counts0.data_ptr()), (int)T, (int)k, cap, by_position, pad_to_capacity, thr, sc + E,
      static_cast<const int64_t*>(counts.data_ptr()), static_cast<int64_t*>(row_token.data_ptr()),
      static_cast<float*>(permuted_probs.data_ptr()), static_cast<int64_t*>(row_of.data_ptr()));
  CUDA_CHECK_LAUNCH();
  return true;
}

bool moe_unpermute(const Tensor& rows, const Tensor& row_of, Tensor& out) {
  check_cuda(rows, "moe_unpermute");
  const int64_t h = out.dim() ? out.size(-1) : 0, T = h ? out.numel() / h : 0;
  const int64_t k = T ? row_of.numel() / T : 0;
  MEGATRON_CHECK(row_of.dtype() == DType::kInt64 && row_of.numel() == T * k && rows.size(-1) == h && out.is_cuda() &&
                 row_of.is_cuda())
      << "moe_unpermute: rows " << rows.str() << " row_of " << row_of.str() << " out " << out.str();
  if (T == 0 || h == 0) return true;
  MEGATRON_CHECK(T < (1ll << 31)) << "moe_unpermute: " << T << " tokens";
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_FLOAT_SWITCH(rows.dtype(), X,
                   MCU_FLOAT_SWITCH(out.dtype(), O,
                                    unpermute_kernel<X, O><<<(unsigned)T, 256, 0, st>>>(
                                        static_cast<const X*>(rows.data_ptr()),
                                        static_cast<const int64_t*>(row_of.data_ptr()), (int)k, h,
                                        static_cast<O*>(out.data_ptr()))));
  CUDA_CHECK_LAUNCH();
  return true;
}

bool moe_router_backward(const Tensor& logits, const Tensor& topk_idx, const Tensor& dprobs, const Tensor& row_of,
                         int64_t score_function, bool pre_softmax, float scaling, int64_t bsz, const Tensor* aux_coef,
                         float z_coef, Tensor& dlogits) {
  check_cuda(logits, "moe_router_backward");
  const int64_t E = logits.size(-1), T = E ? logits.numel() / E : 0, k = T ? topk_idx.numel() / T : 0;
  if (E > kMaxExperts) return false;
  MEGATRON_CHECK(topk_idx.dtype() == DType::kInt64 && k >= 1 && k <= E && topk_idx.numel() == T * k &&
                 // dprobs: one per permuted row (T k dropless; the kept and padding rows with capacity)
                 dprobs.dtype() == DType::kFloat32 && (dprobs.numel() > 0 || T == 0) &&
                 row_of.dtype() == DType::kInt64 &&
                 row_of.numel() == T * k && dlogits.dtype() == DType::kFloat32 && dlogits.numel() == T * E &&
                 bsz >= 1 && T % bsz == 0 && score_function >= 0 && score_function <= 2 &&
                 (!aux_coef || (aux_coef->dtype() == DType::kFloat32 && aux_coef->numel() == bsz * E)))
      << "moe_router_backward: logits " << logits.str() << " topk_idx " << topk_idx.str() << " dprobs "
      << dprobs.str() << " dlogits " << dlogits.str();
  if (T == 0) return true;
  MEGATRON_CHECK(T * E < (1ll << 31)) << "moe_router_backward: " << T << " x " << E;
  cudaStream_t st = megatron::cuda::current_stream();
  const size_t shm = (size_t)kWarps * 3 * E * (logits.dtype() == DType::kFloat64 ? sizeof(double) : sizeof(float));
  if (shm > 48 * 1024) return false;
  const unsigned blocks = (unsigned)((T + kWarps - 1) / kWarps);
  ROUTER_LOGITS_SWITCH(logits.dtype(), L,
                   router_bwd_kernel<L><<<blocks, kWarps * 32, shm, st>>>(
                       static_cast<const L*>(logits.data_ptr()), static_cast<const int64_t*>(topk_idx.data_ptr()),
                       static_cast<const float*>(dprobs.data_ptr()), static_cast<const int64_t*>(row_of.data_ptr()),
                       (int)T, (int)E, (int)k, (int)score_function, pre_softmax, scaling, (int)bsz,
                       aux_coef ? static_cast<const float*>(aux_coef->data_ptr()) : nullptr, z_coef,
                       static_cast<float*>(dlogits.data_ptr())));
  CUDA_CHECK_LAUNCH();
  return true;
}

void moe_gating_f64_forward(const Tensor& x, const Tensor& w, Tensor& logits) {
  check_cuda(x, "moe_gating_f64_forward");
  const int64_t h = w.dim() == 2 ? w.size(1) : -1, E = w.dim() == 2 ? w.size(0) : 0, T = h > 0 ? x.numel() / h : 0;
  MEGATRON_CHECK(w.is_cuda() && logits.is_cuda() && x.dtype() == w.dtype() &&
                 (x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16) && x.size(-1) == h &&
                 logits.dtype() == DType::kFloat64 && logits.numel() == T * E)
      << "moe_gating_f64_forward: x " << x.str() << " w " << w.str() << " logits " << logits.str();
  if (T * E == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const unsigned blocks = (unsigned)((T * E + 255) / 256);
  MCU_F32_BF16_SWITCH(x.dtype(), X,
                      gating_f64_fwd_kernel<X><<<blocks, 256, 0, st>>>(
                          static_cast<const X*>(x.data_ptr()), static_cast<const X*>(w.data_ptr()), T, E, h,
                          static_cast<double*>(logits.data_ptr())));
  CUDA_CHECK_LAUNCH();
}

void moe_gating_f64_backward(const Tensor& dlogits, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw) {
  check_cuda(dlogits, "moe_gating_f64_backward");
  const int64_t h = w.dim() == 2 ? w.size(1) : -1, E = w.dim() == 2 ? w.size(0) : 0, T = h > 0 ? x.numel() / h : 0;
  MEGATRON_CHECK(x.is_cuda() && w.is_cuda() && dx.is_cuda() && dw.is_cuda() && x.dtype() == w.dtype() &&
                 (x.dtype() == DType::kFloat32 || x.dtype() == DType::kBFloat16) && x.size(-1) == h &&
                 dlogits.dtype() == DType::kFloat32 && dlogits.numel() == T * E && dx.dtype() == x.dtype() &&
                 dx.numel() == T * h && dw.numel() == E * h &&
                 (dw.dtype() == DType::kFloat32 || dw.dtype() == DType::kBFloat16))
      << "moe_gating_f64_backward: dlogits " << dlogits.str() << " x " << x.str() << " w " << w.str() << " dx "
      << dx.str() << " dw " << dw.str();
  if (T * h == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  MCU_F32_BF16_SWITCH(
      x.dtype(), X,
      gating_f64_dx_kernel<X><<<(unsigned)((T * h + 255) / 256), 256, 0, st>>>(
          static_cast<const float*>(dlogits.data_ptr()), static_cast<const X*>(w.data_ptr()), T, E, h,
          static_cast<X*>(dx.data_ptr()));
      CUDA_CHECK_LAUNCH();
      MCU_F32_BF16_SWITCH(dw.dtype(), G,
                          gating_f64_dw_kernel<X, G><<<(unsigned)((E * h + 255) / 256), 256, 0, st>>>(
                              static_cast<const float*>(dlogits.data_ptr()), static_cast<const X*>(x.data_ptr()), T,
                              E, h, static_cast<G*>(dw.data_ptr()))));
  CUDA_CHECK_LAUNCH();
}

}  // namespace megatron::ops::cuda
