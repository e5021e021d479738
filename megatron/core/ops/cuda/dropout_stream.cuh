// The dropout random stream of the CUDA kernels: the same counter-based SplitMix64 stream as the
// CPU reference (megatron/core/ops/cpu/cpu_util.h: mix64, dropout_stream, dropout_uniform), so a
// given (seed, offset, element) keeps or drops the same element on both devices and a GPU run
// reproduces a CPU run's dropout masks bit for bit (internal header, not public API).
#pragma once

#include <cstdint>

namespace megatron::ops::cuda::detail {

/// SplitMix64 finalizer (Steele, Lea & Flood 2014, "Fast splittable pseudorandom number
/// generators"), identical to cpu::mix64.
__host__ __device__ __forceinline__ uint64_t dmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Key of the stream (seed, offset), identical to cpu::dropout_stream.
__host__ __device__ __forceinline__ uint64_t ddropout_stream(uint64_t seed, uint64_t offset) {
  return dmix64(seed ^ dmix64(offset));
}
/// Uniform number `i` of a stream in [0, 1) with 24 random bits (exact in float), identical to
/// cpu::dropout_uniform.
__host__ __device__ __forceinline__ float ddropout_uniform(uint64_t stream, uint64_t i) {
  return static_cast<float>(dmix64(stream + i) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace megatron::ops::cuda::detail
