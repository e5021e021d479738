// Streaming 16-byte global accesses of adam_multi.cu's multi-tensor Adam kernels, which touch
// every byte once: `ld.global.cs` / `st.global.cs` ("cache streaming", evict-first in L1 and L2,
// PTX ISA "Cache operators") when kCs, plain accesses otherwise (the comparison variants,
// docs/cuda.md "Kernel variants").
// Included by .cu files of the CUDA backend only; no arithmetic here, so the kernels using these
// compute the same bits as with plain loads.
#pragma once

#include "megatron/core/ops/cuda/cuda_common.cuh"

namespace megatron::ops::cuda::detail {

/// Loads the 16-byte-aligned float4 at p (evict-first when kCs).
template <bool kCs>
__device__ __forceinline__ float4 ld_f4(const float* p) {
  if constexpr (kCs) return __ldcs(reinterpret_cast<const float4*>(p));
  else return *reinterpret_cast<const float4*>(p);
}

/// Stores f[0..4) to the 16-byte-aligned p (evict-first when kCs).
template <bool kCs>
__device__ __forceinline__ void st_f4(float* p, const float* f) {
  const float4 a = make_float4(f[0], f[1], f[2], f[3]);
  if constexpr (kCs) __stcs(reinterpret_cast<float4*>(p), a);
  else *reinterpret_cast<float4*>(p) = a;
}

/// Loads 4 consecutive floats x[i..i+4): one 16-byte access when `vec` (x 16-byte aligned) and
/// all 4 lie inside n, else element loads (0 past n). kFull: the caller guarantees the first case.
template <bool kCs, bool kFull = false>
__device__ __forceinline__ void ld4(const float* x, int64_t i, int64_t n, bool vec, float* f) {
  if (kFull || (vec && i + 4 <= n)) {
    const float4 a = ld_f4<kCs>(x + i);
    f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = (i + j < n) ? x[i + j] : 0.0f;
  }
}

/// Stores f[0..4) to x[i..i+4) rounded to T (fp32: one 16-byte store, bf16/fp16: one 8-byte
/// store when `vec` (x 16-byte aligned at element 0, i a multiple of 4) and all 4 lie inside n,
/// else element stores), the counterpart of ld4 (kFull likewise).
template <bool kCs, bool kFull = false, class T>
__device__ __forceinline__ void st4(T* x, int64_t i, int64_t n, bool vec, const float* f) {
  if (kFull || (vec && i + 4 <= n)) {
    if constexpr (sizeof(T) == 4) {
      st_f4<kCs>(reinterpret_cast<float*>(x + i), f);
    } else {
      uint2 u;
      T* h = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int j = 0; j < 4; ++j) h[j] = from_f<T>(f[j]);
      if constexpr (kCs) __stcs(reinterpret_cast<uint2*>(x + i), u);
      else *reinterpret_cast<uint2*>(x + i) = u;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (i + j < n) x[i + j] = from_f<T>(f[j]);
  }
}

}  // namespace megatron::ops::cuda::detail
