// Decode attention: q_len = 1 against the KV cache (attention_decode.h).
//
// Per (batch row, K/V group, key chunk) one block of 4 warps; a warp takes every 4th key of the
// chunk, each lane holds d/32 elements of the group's query heads (pre-scaled by softmax_scale ·
// log2 e, so the softmax runs in exp2) and of the running output; a key's score is a warp sum
// (shuffles). The warps' states are merged in shared memory; with several chunks each writes its
// unnormalized output, max and sum (fp32) and decode_merge_kernel combines them.
// With a device key count (AttentionParams::kv_len, the decode step as a CUDA graph) the grid is
// sized for the cache capacity and each kernel reads the count and re-derives the chunking
// (split_plan) itself. kv_cache_write (the op of that step's K/V append) is at the end.
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
  // Device key count (AttentionParams::kv_len) or null. When set, SK is the cache capacity, the
  // grid has `splits` = split_plan(capacity) blocks per head group, and every kernel re-derives
  // the chunking from the current count with split_plan and `want` (so a block past the current
  // count's chunks exits, and the partition is the one a host call with SK = *kv_len takes).
  const int64_t* kv_len;
  int want;
};

// The split-K partition of SK keys: at most `want` chunks of at least 32 keys (8 per warp), no
// empty chunk. One function for the host launch and the device-length kernels, so both cut the
// keys identically (the same bits for the same count).
__host__ __device__ __forceinline__ void split_plan(int SK, int want, int& chunk, int& splits) {
  int s = max(1, min(want, (SK + 31) / 32));
  chunk = (SK + s - 1) / s;
  splits = (SK + chunk - 1) / chunk;
}

// The key count of this launch (clamped to [1, capacity]) and its chunking.
__device__ __forceinline__ void current_plan(const DecodeArgs& a, int& SK, int& chunk, int& splits) {
  SK = a.SK, chunk = a.chunk, splits = a.splits;
  if (a.kv_len) {
    const int64_t n = *a.kv_len;
    SK = n < 1 ? 1 : n > a.SK ? a.SK : (int)n;
    split_plan(SK, a.want, chunk, splits);
  }
}

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
  int SK, chunk, splits;
  current_plan(a, SK, chunk, splits);
  if (split >= splits) return;  // past the current count's chunks (device count only): the merge skips it
  const int j0 = split * chunk, j1 = min(SK, j0 + chunk);
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
    if (splits == 1) {
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
// With a device count the chunk count comes from it (one chunk: decode_kernel wrote out itself).
template <int D>
__global__ void __launch_bounds__(D) decode_merge_kernel(const float* __restrict__ part_o,
                                                         const float* __restrict__ part_ml, bf16_t* __restrict__ out,
                                                         float* __restrict__ lse, int64_t heads, DecodeArgs a) {
  const int64_t head = blockIdx.x;
  const int c = threadIdx.x;
  int SK, chunk, splits;
  current_plan(a, SK, chunk, splits);
  if (splits == 1) return;
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
  decode_merge_kernel<D><<<(unsigned)heads, D, 0, st>>>(part_o, part_ml, op, lp, heads, a);
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
  if (p.kv_len && (p.causal || !p.kv_len->is_cuda() || p.kv_len->dtype() != DType::kInt64 ||
                   p.kv_len->device() != k.device() || p.kv_len->numel() < 1))
    return false;
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
  // Enough blocks to fill the GPU twice, each chunk at least 32 keys (8 per warp). With a device
  // count SK is the capacity and the grid has min(want, ceil(capacity / 32)) chunks per group:
  // split_plan gives any count <= capacity at most that many.
  const int64_t want = (2 * (int64_t)sm_count() + B * NG - 1) / (B * NG);
  a.want = (int)std::min<int64_t>(want, 1 << 30);
  split_plan(a.SK, a.want, a.chunk, a.splits);
  a.kv_len = p.kv_len ? static_cast<const int64_t*>(p.kv_len->data_ptr()) : nullptr;
  if (a.kv_len) a.splits = std::max(1, std::min(a.want, (a.SK + 31) / 32));  // the grid (a bound)
  cudaStream_t st = megatron::cuda::current_stream();
  return D == 64 ? launch_d<64>((int)G, q, k, v, out, lse, a, st) : launch_d<128>((int)G, q, k, v, out, lse, a, st);
}

}  // namespace megatron::ops::cuda::decode_attention

namespace megatron::ops::cuda {
using detail::aligned16;
namespace {
// k_cache[pos] = k, v_cache[pos] = v for one row of `n` units U (pos = *offset; nothing when pos
// is outside [0, rows)). grid (ceil(n / 256), 2): y picks K or V.
template <typename U>
__global__ void kv_cache_write_kernel(const U* __restrict__ k, const U* __restrict__ v,
                                      const int64_t* __restrict__ offset, U* __restrict__ kc, U* __restrict__ vc,
                                      int64_t n, int64_t rows) {
  const int64_t pos = *offset, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (pos < 0 || pos >= rows || i >= n) return;
  if (blockIdx.y == 0) kc[pos * n + i] = k[i];
  else vc[pos * n + i] = v[i];
}

template <typename U>
void launch_kv_write(const Tensor& k, const Tensor& v, const Tensor& offset, Tensor& kc, Tensor& vc, int64_t bytes) {
  const int64_t n = bytes / (int64_t)sizeof(U);
  const dim3 grid((unsigned)((n + 255) / 256), 2);
  kv_cache_write_kernel<U><<<grid, 256, 0, megatron::cuda::current_stream()>>>(
      static_cast<const U*>(k.data_ptr()), static_cast<const U*>(v.data_ptr()),
      static_cast<const int64_t*>(offset.data_ptr()), static_cast<U*>(kc.data_ptr()), static_cast<U*>(vc.data_ptr()),
      n, kc.size(0));
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void kv_cache_write(const Tensor& k, const Tensor& v, const Tensor& offset, Tensor& k_cache, Tensor& v_cache) {
  MEGATRON_CHECK(k.dim() == 4 && k.size(0) == 1 && v.shape() == k.shape() && k_cache.dim() == 4 &&
                 v_cache.shape() == k_cache.shape() && k_cache.size(1) == k.size(1) && k_cache.size(2) == k.size(2) &&
                 k_cache.size(3) == k.size(3) && k.dtype() == v.dtype() && k_cache.dtype() == k.dtype() &&
                 v_cache.dtype() == k.dtype())
      << "kv_cache_write: k " << k.str() << " v " << v.str() << " caches " << k_cache.str() << " " << v_cache.str();
  MEGATRON_CHECK(offset.is_cuda() && offset.dtype() == DType::kInt64 && offset.numel() >= 1 &&
                 offset.device() == k.device() && k.is_cuda() && k_cache.device() == k.device() &&
                 v.device() == k.device() && v_cache.device() == k.device())
      << "kv_cache_write: offset " << offset.str() << " must be an int64 tensor on " << k.str() << "'s device";
  const int64_t bytes = k.numel() * (int64_t)dtype_size(k.dtype());
  if (bytes == 0 || k_cache.size(0) == 0) return;
  const bool a16 = bytes % 16 == 0 && aligned16(k.data_ptr()) && aligned16(v.data_ptr()) &&
                   aligned16(k_cache.data_ptr()) && aligned16(v_cache.data_ptr());
  if (a16) launch_kv_write<uint4>(k, v, offset, k_cache, v_cache, bytes);
  else launch_kv_write<unsigned char>(k, v, offset, k_cache, v_cache, bytes);
}
}  // namespace megatron::ops::cuda
