// CUDA backend registration: a stream-ordered memory pool allocator (cudaMallocAsync with a
// high release threshold, DESIGN.md §6) registered for DeviceType::kCUDA at start-up.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

#include "megatron/core/ops/cuda/cuda_utils.h"
#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::cuda {

namespace {
class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, int device_index) override {
    ensure_pool(device_index);
    void* p = nullptr;
    if (bytes == 0) bytes = 256;
    CUDA_CHECK(cudaMallocAsync(&p, bytes, current_stream()));
    return p;
  }
  void deallocate(void* p, size_t, int) override { cudaFreeAsync(p, current_stream()); }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    if (!bytes) return;
    cudaMemcpyKind kind = cudaMemcpyDefault;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, current_stream()));
    if (dd.is_cpu() || sd.is_cpu()) CUDA_CHECK(cudaStreamSynchronize(current_stream()));
  }
  void memzero(void* p, size_t bytes, int) override {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
  }

 private:
  void ensure_pool(int dev) {
    std::call_once(once_, [dev] {
      cudaMemPool_t pool;
      CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
      uint64_t threshold = UINT64_MAX;
      CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    });
  }
  std::once_flag once_;
};

CudaAllocator g_cuda_alloc;

// The default pool's reserved bytes (what the driver handed the pool; freed blocks stay in it
// with our UINT64_MAX release threshold) = torch's memory_reserved / max_memory_reserved.
bool pool_reserved(int dev, int64_t* current, int64_t* high) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  uint64_t cur = 0, hi = 0;
  if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &cur) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &hi) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *current = static_cast<int64_t>(cur);
  *high = static_cast<int64_t>(hi);
  return true;
}

void reset_pool_peak(int dev) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, dev) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  uint64_t zero = 0;  // the only value the driver accepts: resets the high-water mark to the current value
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
  cudaGetLastError();
}

struct Registrar {
  Registrar() {
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
      register_allocator(DeviceType::kCUDA, &g_cuda_alloc);
      register_pool_stats(DeviceType::kCUDA, {pool_reserved, reset_pool_peak});
    } else {
      cudaGetLastError();  // clear the error: no GPU is fine, the CPU backend is used
    }
  }
} g_registrar;
}  // namespace

thread_local cudaStream_t t_stream = nullptr;
cudaStream_t current_stream() { return t_stream; }
void set_current_stream(cudaStream_t s) { t_stream = s; }

}  // namespace megatron::cuda
