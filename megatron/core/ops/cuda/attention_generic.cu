// Generic attention forward and backward on CUDA (attention_generic.h): any head dim 1..256,
// float32, bfloat16 or float16, causal / explicit mask / none, grouped-query K/V, attention dropout with the
// CPU reference's stream. Correctness first, reasonable speed for small heads:
//   forward   one warp per (batch, head, query row); the 32 lanes take 32 keys at a time (one
//             score each: a dot product over d with the query row held in shared memory), the
//             warp keeps a running max and sum (online softmax, Milakov & Gimelshein 2018) and
//             lane l accumulates output channels l, l+32, ... in fp32 registers.
//   backward  (FlashAttention-2's equations, Dao 2023) kernel 1: one warp per query row:
//             D = rowsum(dO * O), then dq = scale * sum_j P_ij (F_ij dO.v_j - D) k_j;
//             kernel 2: one warp per (batch, K/V group, key row): dv_j = sum_{h,i} P_ij F_ij dO_i,
//             dk_j = scale * sum_{h,i} P_ij (F_ij dO_i.v_j - D_i) q_i over the group's heads.
// F is the dropout keep-scale (mask / (1 - p)), regenerated from the counter-based stream.
// Layouts (ops.h): q, out [s, b, np, d]; k, v [sk, b, ng, d]; lse float32 [b, np, s].
#include <cmath>
#include <initializer_list>
#include <type_traits>

#include "megatron/core/ops/cuda/attention_generic.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/dropout_stream.cuh"

namespace megatron::ops::cuda::generic_attention {
using namespace megatron::ops::cuda::detail;

namespace {
constexpr int kWarps = 4;  // warps (rows) per block
constexpr unsigned kFull = 0xffffffffu;

struct Args {
  int S, SK, B, NP, NG, D;
  float scale;
  bool causal;
  const uint8_t* mask;  // [B, S, SK] (true = masked) or null
  float drop_p;         // 0 = no dropout
  float drop_scale;     // 1 / (1 - p)
  uint64_t stream;      // dropout stream key
};

__device__ __forceinline__ bool visible(const Args& a, int b, int i, int j) {
  if (a.mask) return a.mask[((int64_t)b * a.S + i) * a.SK + j] == 0;
  return !a.causal || j <= i;
}

// Dropout keep-scale of probability (bh, i, j): element (bh*S + i)*SK + j of the stream.
__device__ __forceinline__ float drop_factor(const Args& a, int64_t bh, int i, int j) {
  if (a.drop_p <= 0.0f) return 1.0f;
  const uint64_t idx = static_cast<uint64_t>((bh * a.S + i) * a.SK + j);
  return ddropout_uniform(a.stream, idx) >= a.drop_p ? a.drop_scale : 0.0f;
}

// sum_c x[c] * to_f(y[c]) over c < D, x in shared memory (broadcast reads).
template <class T>
__device__ __forceinline__ float dot_row(const float* x, const T* y, int D) {
  float acc = 0.0f;
#pragma unroll 4
  for (int c = 0; c < D; ++c) acc = fmaf(x[c], to_f(y[c]), acc);
  return acc;
}

// ---------------------------------------------------------------------------------------------
// Forward. NPL = output channels per lane (D <= 32 * NPL).
// ---------------------------------------------------------------------------------------------
template <class T, int NPL>
__global__ void __launch_bounds__(kWarps * 32) fwd_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                         const T* __restrict__ v, T* __restrict__ out,
                                                         float* __restrict__ lse, Args a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;  // (bi * NP + h) * S + i
  if (row >= (int64_t)a.B * a.NP * a.S) return;             // whole warp
  const int D = a.D, i = (int)(row % a.S);
  const int64_t bh = row / a.S;
  const int h = (int)(bh % a.NP), bi = (int)(bh / a.NP), g = h / (a.NP / a.NG);
  float* sq = smem + warp * D;
  const T* qrow = q + (((int64_t)i * a.B + bi) * a.NP + h) * D;
  for (int c = lane; c < D; c += 32) sq[c] = to_f(qrow[c]);
  __syncwarp();
  const int64_t kstride = (int64_t)a.B * a.NG * D;
  const T* kb = k + ((int64_t)bi * a.NG + g) * D;
  const T* vb = v + ((int64_t)bi * a.NG + g) * D;
  const int kend = (a.causal && !a.mask) ? min(a.SK, i + 1) : a.SK;

  float m = -INFINITY, l = 0.0f, acc[NPL];
#pragma unroll
  for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;
  for (int j0 = 0; j0 < kend; j0 += 32) {
    const int j = j0 + lane;
    float s = -INFINITY;
    if (j < kend && visible(a, bi, i, j)) s = dot_row(sq, kb + j * kstride, D) * a.scale;
    const float mnew = fmaxf(m, warp_max(s));
    if (mnew == -INFINITY) continue;  // nothing visible yet (warp-uniform)
    const float alpha = expf(m - mnew);  // m = -inf -> 0
    const float pj = s == -INFINITY ? 0.0f : expf(s - mnew);
    l = l * alpha + warp_sum(pj);
    m = mnew;
    const float pv = pj == 0.0f ? 0.0f : pj * drop_factor(a, bh, i, j);
#pragma unroll
    for (int e = 0; e < NPL; ++e) acc[e] *= alpha;
    const int nj = min(32, kend - j0);
    for (int t = 0; t < nj; ++t) {
      const float pt = __shfl_sync(kFull, pv, t);
      if (pt == 0.0f) continue;  // warp-uniform
      const T* vr = vb + (int64_t)(j0 + t) * kstride;
#pragma unroll
      for (int e = 0; e < NPL; ++e) {
        const int c = lane + 32 * e;
        if (c < D) acc[e] = fmaf(pt, to_f(vr[c]), acc[e]);
      }
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  T* orow = out + (((int64_t)i * a.B + bi) * a.NP + h) * D;
#pragma unroll
  for (int e = 0; e < NPL; ++e) {
    const int c = lane + 32 * e;
    if (c < D) orow[c] = from_f<T>(acc[e] * inv);
  }
  if (lane == 0) lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

// ---------------------------------------------------------------------------------------------
// Backward kernel 1: D_i = dO_i . O_i (written to dvec [B, NP, S]) and dq.
// ---------------------------------------------------------------------------------------------
template <class T, int NPL>
__global__ void __launch_bounds__(kWarps * 32) bwd_dq_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                                                            const T* __restrict__ k, const T* __restrict__ v,
                                                            const T* __restrict__ out, const float* __restrict__ lse,
                                                            float* __restrict__ dvec, T* __restrict__ dq, Args a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;
  if (row >= (int64_t)a.B * a.NP * a.S) return;
  const int D = a.D, i = (int)(row % a.S);
  const int64_t bh = row / a.S;
  const int h = (int)(bh % a.NP), bi = (int)(bh / a.NP), g = h / (a.NP / a.NG);
  float* sq = smem + warp * 2 * D;
  float* sdo = sq + D;
  const int64_t qoff = (((int64_t)i * a.B + bi) * a.NP + h) * D;
  float dsum = 0.0f;
  for (int c = lane; c < D; c += 32) {
    sq[c] = to_f(q[qoff + c]);
    const float d = to_f(dout[qoff + c]);
    sdo[c] = d;
    dsum = fmaf(d, to_f(out[qoff + c]), dsum);
  }
  dsum = warp_sum(dsum);
  __syncwarp();
  const float L = lse[row];
  const int64_t kstride = (int64_t)a.B * a.NG * D;
  const T* kb = k + ((int64_t)bi * a.NG + g) * D;
  const T* vb = v + ((int64_t)bi * a.NG + g) * D;
  const int kend = (a.causal && !a.mask) ? min(a.SK, i + 1) : a.SK;
  float acc[NPL];
#pragma unroll
  for (int e = 0; e < NPL; ++e) acc[e] = 0.0f;
  if (L != -INFINITY) {  // a row with no visible key has P = 0: dq = 0
    for (int j0 = 0; j0 < kend; j0 += 32) {
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j < kend && visible(a, bi, i, j)) {
        const float p = expf(dot_row(sq, kb + j * kstride, D) * a.scale - L);
        const float dpd = dot_row(sdo, vb + j * kstride, D);
        ds = p * (dpd * drop_factor(a, bh, i, j) - dsum) * a.scale;
      }
      const int nj = min(32, kend - j0);
      for (int t = 0; t < nj; ++t) {
        const float dt = __shfl_sync(kFull, ds, t);
        if (dt == 0.0f) continue;
        const T* kr = kb + (int64_t)(j0 + t) * kstride;
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
          const int c = lane + 32 * e;
          if (c < D) acc[e] = fmaf(dt, to_f(kr[c]), acc[e]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < NPL; ++e) {
    const int c = lane + 32 * e;
    if (c < D) dq[qoff + c] = from_f<T>(acc[e]);
  }
  if (lane == 0) dvec[row] = dsum;
}

// ---------------------------------------------------------------------------------------------
// Backward kernel 2: dk, dv of key row j of group g (summed over the group's query heads).
// ---------------------------------------------------------------------------------------------
template <class T, int NPL>
__global__ void __launch_bounds__(kWarps * 32) bwd_dkdv_kernel(const T* __restrict__ dout, const T* __restrict__ q,
                                                              const T* __restrict__ k, const T* __restrict__ v,
                                                              const float* __restrict__ lse,
                                                              const float* __restrict__ dvec, T* __restrict__ dk,
                                                              T* __restrict__ dv, Args a) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * kWarps + warp;  // (bi * NG + g) * SK + j
  if (row >= (int64_t)a.B * a.NG * a.SK) return;
  const int D = a.D, j = (int)(row % a.SK);
  const int64_t bg = row / a.SK;
  const int g = (int)(bg % a.NG), bi = (int)(bg / a.NG), npg = a.NP / a.NG;
  float* sk = smem + warp * 2 * D;
  float* sv = sk + D;
  const int64_t koff = (((int64_t)j * a.B + bi) * a.NG + g) * D;
  for (int c = lane; c < D; c += 32) {
    sk[c] = to_f(k[koff + c]);
    sv[c] = to_f(v[koff + c]);
  }
  __syncwarp();
  const int64_t qstride = (int64_t)a.B * a.NP * D;
  const int i_start = (a.causal && !a.mask) ? j : 0;
  float adk[NPL], adv[NPL];
#pragma unroll
  for (int e = 0; e < NPL; ++e) adk[e] = adv[e] = 0.0f;
  for (int hh = 0; hh < npg; ++hh) {
    const int h = g * npg + hh;
    const int64_t bh = (int64_t)bi * a.NP + h;
    const T* qb = q + ((int64_t)bi * a.NP + h) * D;
    const T* dob = dout + ((int64_t)bi * a.NP + h) * D;
    for (int i0 = i_start; i0 < a.S; i0 += 32) {
      const int i = i0 + lane;
      float pd = 0.0f, ds = 0.0f;
      if (i < a.S && visible(a, bi, i, j)) {
        const float L = lse[bh * a.S + i];
        if (L != -INFINITY) {
          const float p = expf(dot_row(sk, qb + i * qstride, D) * a.scale - L);
          const float dpd = dot_row(sv, dob + i * qstride, D);
          const float f = drop_factor(a, bh, i, j);
          pd = p * f;
          ds = p * (dpd * f - dvec[bh * a.S + i]) * a.scale;
        }
      }
      const int ni = min(32, a.S - i0);
      for (int t = 0; t < ni; ++t) {
        const float pt = __shfl_sync(kFull, pd, t), dt = __shfl_sync(kFull, ds, t);
        if (pt == 0.0f && dt == 0.0f) continue;
        const T* qr = qb + (int64_t)(i0 + t) * qstride;
        const T* dor = dob + (int64_t)(i0 + t) * qstride;
#pragma unroll
        for (int e = 0; e < NPL; ++e) {
          const int c = lane + 32 * e;
          if (c < D) {
            adv[e] = fmaf(pt, to_f(dor[c]), adv[e]);
            adk[e] = fmaf(dt, to_f(qr[c]), adk[e]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < NPL; ++e) {
    const int c = lane + 32 * e;
    if (c < D) {
      dk[koff + c] = from_f<T>(adk[e]);
      dv[koff + c] = from_f<T>(adv[e]);
    }
  }
}

Args make_args(const Tensor& q, const Tensor& k, const AttentionParams& p) {
  Args a{};
  a.S = (int)q.size(0);
  a.B = (int)q.size(1);
  a.NP = (int)q.size(2);
  a.D = (int)q.size(3);
  a.SK = (int)k.size(0);
  a.NG = (int)k.size(2);
  a.scale = p.softmax_scale;
  a.causal = p.causal;
  a.mask = p.attention_mask ? static_cast<const uint8_t*>(p.attention_mask->data_ptr()) : nullptr;
  a.drop_p = p.dropout_p;
  a.drop_scale = p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f;
  a.stream = ddropout_stream(p.seed, p.offset);
  return a;
}

void check(const char* name, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
           std::initializer_list<const Tensor*> same_dtype) {
  check_cuda(q, name);
  MEGATRON_CHECK(q.dim() == 4 && k.dim() == 4 && v.shape() == k.shape() && k.size(1) == q.size(1) &&
                 k.size(3) == q.size(3) && k.size(2) > 0 && q.size(2) % k.size(2) == 0)
      << name << ": q " << q.str() << " k " << k.str() << " v " << v.str();
  MEGATRON_CHECK(q.size(3) >= 1 && q.size(3) <= kMaxHeadDim)
      << name << ": head dim " << q.size(3) << " (the CUDA attention takes 1.." << kMaxHeadDim << ")";
  MEGATRON_CHECK(q.dtype() == DType::kFloat32 || q.dtype() == DType::kBFloat16 || q.dtype() == DType::kFloat16)
      << name << ": q " << q.str() << " (CUDA attention: float32, bfloat16 or float16)";
  for (const Tensor* t : same_dtype)
    MEGATRON_CHECK(t->dtype() == q.dtype() && t->is_cuda())
        << name << ": " << t->str() << " must be a CUDA tensor of q's dtype (q " << q.str() << ")";
  MEGATRON_CHECK(p.dropout_p >= 0.0f && p.dropout_p < 1.0f) << name << ": dropout p " << p.dropout_p;
  if (p.attention_mask)
    MEGATRON_CHECK(p.attention_mask->is_cuda() && dtype_size(p.attention_mask->dtype()) == 1 &&
                   p.attention_mask->numel() == q.size(1) * q.size(0) * k.size(0))
        << name << ": attention_mask " << p.attention_mask->str() << " must be a bool [b, 1, s, sk] CUDA tensor";
}

// Calls fn(std::integral_constant<int, NPL>) with the channels-per-lane count for head dim d.
template <class F>
void with_npl(int d, F&& fn) {
  if (d <= 32) fn(std::integral_constant<int, 1>{});
  else if (d <= 64) fn(std::integral_constant<int, 2>{});
  else if (d <= 128) fn(std::integral_constant<int, 4>{});
  else fn(std::integral_constant<int, 8>{});
}

unsigned blocks_for(int64_t rows) { return static_cast<unsigned>((rows + kWarps - 1) / kWarps); }
}  // namespace

void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  check("attention_forward (generic)", q, k, v, p, {&k, &v, &out});
  MEGATRON_CHECK(out.shape() == q.shape() && lse.dtype() == DType::kFloat32 && lse.is_cuda() &&
                 lse.numel() == q.size(1) * q.size(2) * q.size(0))
      << "attention_forward (generic): out " << out.str() << " lse " << lse.str();
  const Args a = make_args(q, k, p);
  const int64_t rows = (int64_t)a.B * a.NP * a.S;
  if (rows == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  const size_t smem = sizeof(float) * kWarps * a.D;
  MCU_FLOAT_SWITCH(q.dtype(), T, with_npl(a.D, [&](auto npl) {
    fwd_kernel<T, decltype(npl)::value><<<blocks_for(rows), kWarps * 32, smem, st>>>(
        static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()),
        static_cast<T*>(out.data_ptr()), static_cast<float*>(lse.data_ptr()), a);
  }));
  CUDA_CHECK_LAUNCH();
}

void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  check("attention_backward (generic)", q, k, v, p, {&k, &v, &out, &dout, &dq, &dk, &dv});
  MEGATRON_CHECK(dout.shape() == q.shape() && out.shape() == q.shape() && dq.shape() == q.shape() &&
                 dk.shape() == k.shape() && dv.shape() == v.shape() && lse.dtype() == DType::kFloat32 &&
                 lse.is_cuda() && lse.numel() == q.size(1) * q.size(2) * q.size(0))
      << "attention_backward (generic): dout " << dout.str() << " dq " << dq.str() << " dk " << dk.str() << " lse "
      << lse.str();
  const Args a = make_args(q, k, p);
  const int64_t rows = (int64_t)a.B * a.NP * a.S, krows = (int64_t)a.B * a.NG * a.SK;
  if (rows == 0 && krows == 0) return;
  cudaStream_t st = megatron::cuda::current_stream();
  float* dvec = nullptr;
  CUDA_CHECK(cudaMallocAsync(&dvec, sizeof(float) * (rows > 0 ? rows : 1), st));
  const size_t smem = sizeof(float) * kWarps * 2 * a.D;
  MCU_FLOAT_SWITCH(q.dtype(), T, with_npl(a.D, [&](auto npl) {
    constexpr int N = decltype(npl)::value;
    auto* qp = static_cast<const T*>(q.data_ptr());
    auto* kp = static_cast<const T*>(k.data_ptr());
    auto* vp = static_cast<const T*>(v.data_ptr());
    auto* dop = static_cast<const T*>(dout.data_ptr());
    if (rows > 0)
      bwd_dq_kernel<T, N><<<blocks_for(rows), kWarps * 32, smem, st>>>(
          dop, qp, kp, vp, static_cast<const T*>(out.data_ptr()), static_cast<const float*>(lse.data_ptr()), dvec,
          static_cast<T*>(dq.data_ptr()), a);
    if (krows > 0)
      bwd_dkdv_kernel<T, N><<<blocks_for(krows), kWarps * 32, smem, st>>>(
          dop, qp, kp, vp, static_cast<const float*>(lse.data_ptr()), dvec, static_cast<T*>(dk.data_ptr()),
          static_cast<T*>(dv.data_ptr()), a);
  }));
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(dvec, st));
}

}  // namespace megatron::ops::cuda::generic_attention
