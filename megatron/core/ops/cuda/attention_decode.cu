// Decode attention: q_len = 1 against the KV cache (attention_decode.h).
//
// Per (batch row, K/V group, key chunk) one block of 4 warps; a warp takes every 4th key of the
// chunk, each lane holds d/32 elements of the group's query heads (pre-scaled by softmax_scale ·
// log2 e, so the softmax runs in exp2) and of the running output; a key's score is a warp sum
// (shuffles). The warps' states are merged in shared memory; with several chunks each writes its
// unnormalized output, max and sum (fp32) and decode_merge_kernel combines them.
#include <algorithm>
#include <cmath>

#include "megatron/core/ops/cuda/attention_decode.h"
#include "megatron/core/ops/cuda/cuda_common.cuh"
#include "megatron/core/ops/cuda/cuda_utils.h"

namespace megatron::ops::cuda::decode_attention {
using namespace ::megatron::ops::cuda::detail;

namespace {
constexpr int kWarps = 4;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kLog2e = 1.4426950408889634f;

// E consecutive bf16 (E = 2 or 4, 4- or 8-byte aligned) as floats.
template <int E>
__device__ __forceinline__ void load_e(const bf16_t* p, float (&f)[E]) {
  if constexpr (E == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
  } else {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    f[0] = a.x, f[1] = a.y;
  }
}

struct DecodeArgs {
  int SK, B, NP, NG, chunk, splits;
  float scale_log2;
};

// grid (splits, B * NG), kWarps * 32 threads. G: heads per group, D: head dim.
// splits == 1: writes out and lse; else part_o [splits, B, NP, D] (unnormalized, relative to the
// chunk's max) and part_ml [splits, B, NP, 2] (max in log2 units, sum).
template <int D, int G>
__global__ void __launch_bounds__(kWarps * 32)
    decode_kernel(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
                  bf16_t* __restrict__ out, float* __restrict__ lse, float* __restrict__ part_o,
                  float* __restrict__ part_ml, DecodeArgs a) {
  constexpr int E = D / 32;
  const int split = blockIdx.x, bg = blockIdx.y, b = bg / a.NG, g = bg % a.NG;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int j0 = split * a.chunk, j1 = min(a.SK, j0 + a.chunk);
  float qf[G][E], acc[G][E], m[G], l[G];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    load_e<E>(q + ((int64_t)b * a.NP + g * G + h) * D + lane * E, qf[h]);
#pragma unroll
    for (int e = 0; e < E; ++e) qf[h][e] *= a.scale_log2, acc[h][e] = 0.0f;
    m[h] = -INFINITY, l[h] = 0.0f;
  }
  const int64_t row = (int64_t)a.B * a.NG * D;  // elements between consecutive keys
  const bf16_t* kp = k + ((int64_t)b * a.NG + g) * D + lane * E;
  const bf16_t* vp = v + ((int64_t)b * a.NG + g) * D + lane * E;
  for (int j = j0 + warp; j < j1; j += kWarps) {
    float kf[E], vf[E];
    load_e<E>(kp + j * row, kf);
    load_e<E>(vp + j * row, vf);
    float s[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float t = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) t = fmaf(qf[h][e], kf[e], t);
      s[h] = t;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int h = 0; h < G; ++h) s[h] += __shfl_xor_sync(0xffffffffu, s[h], o);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float mn = fmaxf(m[h], s[h]), corr = exp2f(m[h] - mn), pr = exp2f(s[h] - mn);
      l[h] = l[h] * corr + pr;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = fmaf(acc[h][e], corr, pr * vf[e]);
      m[h] = mn;
    }
  }
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int e = 0; e < E; ++e) sm_acc[warp][h][lane * E + e] = acc[h][e];
    if (lane == 0) sm_m[warp][h] = m[h], sm_l[warp][h] = l[h];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < G * D; t += kWarps * 32) {
    const int h = t / D, c = t % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, sm_m[w][h]);
    float L = 0.0f, A = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = sm_m[w][h] == -INFINITY ? 0.0f : exp2f(sm_m[w][h] - M);  // a warp without keys adds 0
      L = fmaf(sm_l[w][h], f, L);
      A = fmaf(sm_acc[w][h][c], f, A);
    }
    const int64_t head = (int64_t)b * a.NP + g * G + h;
    if (a.splits == 1) {
      out[head * D + c] = __float2bfloat16_rn(A / L);
      if (c == 0) lse[head] = (M + log2f(L)) * kLn2;
    } else {
      part_o[((int64_t)split * a.B * a.NP + head) * D + c] = A;
      if (c == 0) {
        part_ml[((int64_t)split * a.B * a.NP + head) * 2] = M;
        part_ml[((int64_t)split * a.B * a.NP + head) * 2 + 1] = L;
      }
    }
  }
}

// grid B * NP, D threads: the chunks' log-sum-exp merge (every chunk has at least one key).
template <int D>
__global__ void __launch_bounds__(D) decode_merge_kernel(const float* __restrict__ part_o,
                                                         const float* __restrict__ part_ml, bf16_t* __restrict__ out,
                                                         float* __restrict__ lse, int splits, int64_t heads) {
  const int64_t head = blockIdx.x;
  const int c = threadIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part_ml[(s * heads + head) * 2]);
  float L = 0.0f, A = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float f = exp2f(part_ml[(s * heads + head) * 2] - M);
    L = fmaf(part_ml[(s * heads + head) * 2 + 1], f, L);
    A = fmaf(part_o[(s * heads + head) * D + c], f, A);
  }
  out[head * D + c] = __float2bfloat16_rn(A / L);
  if (c == 0) lse[head] = (M + log2f(L)) * kLn2;
}

template <int D, int G>
void launch(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse, const DecodeArgs& a,
            cudaStream_t st) {
  auto* qp = static_cast<const bf16_t*>(q.data_ptr());
  auto* kp = static_cast<const bf16_t*>(k.data_ptr());
  auto* vp = static_cast<const bf16_t*>(v.data_ptr());
  auto* op = static_cast<bf16_t*>(out.data_ptr());
  auto* lp = static_cast<float*>(lse.data_ptr());
  const dim3 grid(a.splits, a.B * a.NG);
  if (a.splits == 1) {
    decode_kernel<D, G><<<grid, kWarps * 32, 0, st>>>(qp, kp, vp, op, lp, nullptr, nullptr, a);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t heads = (int64_t)a.B * a.NP;
  float* ws = nullptr;
  CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ws), sizeof(float) * a.splits * heads * (D + 2), st));
  float* part_o = ws;
  float* part_ml = ws + (int64_t)a.splits * heads * D;
  decode_kernel<D, G><<<grid, kWarps * 32, 0, st>>>(qp, kp, vp, op, lp, part_o, part_ml, a);
  CUDA_CHECK_LAUNCH();
  decode_merge_kernel<D><<<(unsigned)heads, D, 0, st>>>(part_o, part_ml, op, lp, a.splits, heads);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaFreeAsync(ws, st));
}

template <int D>
bool launch_d(int G, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
              const DecodeArgs& a, cudaStream_t st) {
  switch (G) {
    case 1: launch<D, 1>(q, k, v, out, lse, a, st); return true;
    case 2: launch<D, 2>(q, k, v, out, lse, a, st); return true;
    case 4: launch<D, 4>(q, k, v, out, lse, a, st); return true;
    case 8: launch<D, 8>(q, k, v, out, lse, a, st); return true;
    default: return false;
  }
}
}  // namespace

bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  if (q.dim() != 4 || k.dim() != 4 || q.size(0) != 1 || p.attention_mask || p.dropout_p != 0.0f) return false;
  const int64_t B = q.size(1), NP = q.size(2), D = q.size(3), SK = k.size(0), NG = k.size(2);
  if (p.causal && SK != 1) return false;  // top-left causal: the one query would see key 0 only
  if (D != 64 && D != 128) return false;
  if (NG <= 0 || NP % NG != 0 || SK <= 0 || B <= 0) return false;
  const int64_t G = NP / NG;
  if (G != 1 && G != 2 && G != 4 && G != 8) return false;
  for (const Tensor* t : {&q, &k, &v, const_cast<const Tensor*>(&out)})
    if (t->dtype() != DType::kBFloat16 || !aligned16(t->data_ptr())) return false;
  if (v.shape() != k.shape() || k.size(1) != B || k.size(3) != D || out.shape() != q.shape() ||
      lse.dtype() != DType::kFloat32 || lse.numel() != B * NP)
    return false;
  if (SK >= (1ll << 31) || B * NG >= 65536) return false;
  DecodeArgs a{};
  a.SK = (int)SK, a.B = (int)B, a.NP = (int)NP, a.NG = (int)NG;
  a.scale_log2 = p.softmax_scale * kLog2e;
  // Enough blocks to fill the GPU twice, each chunk at least 32 keys (8 per warp).
  const int64_t want = (2 * (int64_t)sm_count() + B * NG - 1) / (B * NG);
  int64_t splits = std::max<int64_t>(1, std::min<int64_t>(want, (SK + 31) / 32));
  const int64_t chunk = (SK + splits - 1) / splits;
  splits = (SK + chunk - 1) / chunk;  // no empty chunk
  a.chunk = (int)chunk, a.splits = (int)splits;
  cudaStream_t st = megatron::cuda::current_stream();
  return D == 64 ? launch_d<64>((int)G, q, k, v, out, lse, a, st) : launch_d<128>((int)G, q, k, v, out, lse, a, st);
}

}  // namespace megatron::ops::cuda::decode_attention
