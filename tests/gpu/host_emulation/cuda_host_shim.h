// Host stand-ins for the CUDA keywords and thread indices, shared by the host emulations of this
// folder (fp8_block_emu.cpp, fp8_cast_emu.cpp, fp8_param_emu.cpp): a kernel cut out of a .cu
// compiles as C++, each block's threads run as std::threads with their own threadIdx / blockIdx,
// and __syncthreads meets at the block's std::barrier (g_bar, set by the emulation's launcher;
// a single-threaded launch leaves it null and __syncthreads does nothing).
#pragma once
#include <barrier>

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
