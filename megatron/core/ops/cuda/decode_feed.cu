// CUDA side of the pipelined decode loop's helpers (ops/decode_feed.h; the dispatch and the CPU
// reference are in ops/decode_feed.cpp): the self-fed step's advance kernel, and the page-locked
// buffer + event of the ids' asynchronous readback.
#include <cuda_runtime.h>

#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::ops::cuda {

namespace {
// One block: ids[i] = clamp(sampled[i], 0, max_id) for i < b, positions[j] += 1 for j < n.
__global__ void decode_feed_kernel(const int64_t* __restrict__ sampled, int64_t max_id, int64_t* __restrict__ ids,
                                   int64_t b, int64_t* __restrict__ positions, int64_t n) {
  for (int64_t i = threadIdx.x; i < b; i += blockDim.x) {
    const int64_t s = sampled[i];
    ids[i] = s < 0 ? 0 : (s > max_id ? max_id : s);
  }
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) positions[j] += 1;
}
}  // namespace

void decode_feed(const Tensor& sampled, int64_t max_id, Tensor& ids, Tensor& positions) {
  const int64_t b = ids.numel(), n = positions.numel();
  if (b == 0 && n == 0) return;
  decode_feed_kernel<<<1, 256, 0, megatron::cuda::current_stream()>>>(
      sampled.data<int64_t>(), max_id, ids.data<int64_t>(), b, positions.data<int64_t>(), n);
  CUDA_CHECK_LAUNCH();
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}

void pinned_free(void* p) {
  if (p) cudaFreeHost(p);
}

void* readback_event_create() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void readback_event_destroy(void* event) {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void readback_copy(void* dst, const void* src, size_t bytes, void* event) {
  cudaStream_t st = megatron::cuda::current_stream();
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), st));
}

void readback_event_wait(void* event) { CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event))); }

}  // namespace megatron::ops::cuda
