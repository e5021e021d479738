// Device-side helpers shared by the CUDA kernels (not part of the public API).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::ops::cuda::detail {

using bf16_t = __nv_bfloat16;
using fp16_t = __half;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(fp16_t x) { return __half2float(x); }
template <class T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16_t from_f<bf16_t>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ fp16_t from_f<fp16_t>(float x) { return __float2half_rn(x); }

/// Loads 8 consecutive elements p[i..i+8) as float; a 16-byte (or 2x16) load when `vec`
/// (all pointers 16-byte aligned) and the 8 lie inside n, else element loads (0 past n).
template <class T>
__device__ __forceinline__ void ld8(const T* p, int64_t i, int64_t n, bool vec, float (&f)[8]) {
  if (vec && i + 8 <= n) {
    if constexpr (sizeof(T) == 2) {
      uint4 u = *reinterpret_cast<const uint4*>(p + i);
      const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = to_f(h[j]);
    } else {
      float4 a = *reinterpret_cast<const float4*>(p + i);
      float4 b = *reinterpret_cast<const float4*>(p + i + 4);
      f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
      f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = (i + j < n) ? to_f(p[i + j]) : 0.0f;
  }
}

/// Stores 8 floats to p[i..i+8) (rounded to T), the counterpart of ld8.
template <class T>
__device__ __forceinline__ void st8(T* p, int64_t i, int64_t n, bool vec, const float (&f)[8]) {
  if (vec && i + 8 <= n) {
    if constexpr (sizeof(T) == 2) {
      uint4 u;
      T* h = reinterpret_cast<T*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) h[j] = from_f<T>(f[j]);
      *reinterpret_cast<uint4*>(p + i) = u;
    } else {
      *reinterpret_cast<float4*>(p + i) = make_float4(f[0], f[1], f[2], f[3]);
      *reinterpret_cast<float4*>(p + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (i + j < n) p[i + j] = from_f<T>(f[j]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// Number of multiprocessors of the current device (cached).
int sm_count();
/// Blocks for a grid-stride loop over `work` items with `threads` per block.
inline unsigned grid_for(int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads;
  int64_t cap = static_cast<int64_t>(sm_count()) * 16;
  if (b > cap) b = cap;
  return static_cast<unsigned>(b < 1 ? 1 : b);
}

/// Throws InternalError unless t is a CUDA tensor.
inline void check_cuda(const Tensor& t, const char* op) {
  MEGATRON_CHECK(t.is_cuda()) << op << ": expected a CUDA tensor, got " << t.str();
}

}  // namespace megatron::ops::cuda::detail

/// Runs the statement with `T` bound to the device type of a float32/bfloat16/float16 dtype.
#define MCU_FLOAT_SWITCH(dtype, T, ...)                                                       \
  switch (dtype) {                                                                           \
    case ::megatron::DType::kFloat32: {                                                      \
      using T = float;                                                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::megatron::DType::kBFloat16: {                                                     \
      using T = ::megatron::ops::cuda::detail::bf16_t;                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::megatron::DType::kFloat16: {                                                      \
      using T = ::megatron::ops::cuda::detail::fp16_t;                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    default:                                                                                 \
      MEGATRON_CHECK(false) << "unsupported dtype " << ::megatron::dtype_name(dtype);        \
  }

/// Like MCU_FLOAT_SWITCH for float32 and bfloat16 only (keeps multi-type kernels' instantiation
/// count, and nvcc time, down).
#define MCU_F32_BF16_SWITCH(dtype, T, ...)                                                    \
  switch (dtype) {                                                                           \
    case ::megatron::DType::kFloat32: {                                                      \
      using T = float;                                                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    case ::megatron::DType::kBFloat16: {                                                     \
      using T = ::megatron::ops::cuda::detail::bf16_t;                                       \
      __VA_ARGS__;                                                                           \
      break;                                                                                 \
    }                                                                                        \
    default:                                                                                 \
      MEGATRON_CHECK(false) << "unsupported dtype " << ::megatron::dtype_name(dtype)         \
                            << " (float32 and bfloat16 only)";                               \
  }
