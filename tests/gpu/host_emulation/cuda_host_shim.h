// Host stand-ins for the CUDA keywords and thread indices, shared by the host emulations of this
// folder (fp8_block_emu.cpp, fp8_cast_emu.cpp, fp8_param_emu.cpp, attention_generic_emu.cpp): a kernel cut out of a .cu
// compiles as C++, each block's threads run as std::threads with their own threadIdx / blockIdx,
// and __syncthreads meets at the block's std::barrier (g_bar, set by the emulation's launcher;
// a single-threaded launch leaves it null and __syncthreads does nothing). Also the vector types,
// bit casts and cuda_common.cuh's value helpers (bf16_t, to_f, from_f, ld8) the kernels use.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "megatron/core/tensor/dtype.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
thread_local Dim3 threadIdx, blockIdx;
thread_local std::barrier<>* g_bar = nullptr;
inline void __syncthreads() {
  if (g_bar) g_bar->arrive_and_wait();
}
// The FP8 conversion intrinsics' mode arguments (cuda_fp8.h).
enum { __NV_SATFINITE = 1, __NV_E4M3 = 0, __NV_E5M2 = 1 };

struct alignas(8) uint2 {
  uint32_t x, y;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
inline uint32_t __float_as_uint(float f) { return megatron::float_bits(f); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }  // one rounding
inline float __uint_as_float(uint32_t u) { return megatron::bits_float(u); }

// bf16 as its bits; cuda_common.cuh's conversions and 8-value loads (scalar here).
struct bf16_t {
  uint16_t b;
};
inline float to_f(float x) { return x; }
inline float to_f(bf16_t x) { return __uint_as_float((uint32_t)x.b << 16); }
template <class T>
inline T from_f(float x);
template <>
inline float from_f<float>(float x) { return x; }
template <>
inline bf16_t from_f<bf16_t>(float x) {  // round to nearest even (finite inputs), as __float2bfloat16_rn
  const uint32_t u = __float_as_uint(x) + 0x7fffu + ((__float_as_uint(x) >> 16) & 1u);
  return bf16_t{(uint16_t)(u >> 16)};
}
template <class T>
inline void ld8(const T* p, int64_t i, int64_t n, bool vec, float (&f)[8]) {
  for (int j = 0; j < 8; ++j) f[j] = (i + j < n) ? to_f(p[i + j]) : 0.0f;
  (void)vec;
}
