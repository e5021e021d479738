// Device-side asynchronous copies into shared memory (not part of the public API): the per-thread
// cp.async of 4/16 bytes (sm_80+) with its commit/wait groups, and the sm_90 bulk copy
// (cp.async.bulk, the TMA engine's non-tensor form) completed on an mbarrier. PTX ISA, "Data
// Movement and Conversion Instructions: cp.async / cp.async.bulk" and "mbarrier".
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace megatron::ops::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared, bypassing L1 (both 16-byte aligned).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
/// 4 bytes global -> shared (both 4-byte aligned).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}
/// Closes this thread's current group of cp.async copies (an empty group is allowed).
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/// Waits until at most N of this thread's committed groups are still in flight; the completed
/// copies are then visible to this thread (other threads need a barrier).
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/// Initialises the shared-memory mbarrier `bar` for `count` arriving threads (one thread; then a
/// __syncthreads before any other thread uses it).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n"
      "fence.mbarrier_init.release.cluster;\n"
      "fence.proxy.async.shared::cta;\n" ::"r"(smem_addr(bar)),
      "r"(count)
      : "memory");
}
/// This thread's arrival on `bar`, announcing `bytes` of bulk copies that complete on it.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
/// Blocks until phase `parity` of `bar` has completed (all arrivals and all announced bytes).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}
/// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> shared,
/// completing on `bar` (whose expected transaction count must include it).
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, unsigned bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

}  // namespace megatron::ops::cuda::detail
