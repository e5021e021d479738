// CUDA backend registration: a stream-ordered memory pool allocator (cudaMallocAsync with a
// high release threshold, docs/architecture.md#gpu-memory) registered for DeviceType::kCUDA at start-up.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

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
  // Device-to-host copies synchronize the stream (the host reads the result next). Host-to-device
  // copies up to kMaxStaged bytes go through a pinned staging block and do NOT synchronize: the
  // host data is copied into the block at once (so the caller may free or reuse its buffer), the
  // DMA is stream-ordered, and the block is reused only after an event recorded behind its DMA
  // has completed. Before this, every H2D copy (batch tokens, labels, position ids, the loss
  // seed, every scalar) drained the GPU queue. Larger H2D copies (weights at start-up) stay
  // synchronous. Device-to-device copies are stream-ordered as before.
  void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) override {
    if (!bytes) return;
    cudaStream_t st = current_stream();
    if (st && (dd.is_cpu() || sd.is_cpu())) {
      // A host copy inside a CUDA graph capture would replay stale staging memory (or
      // synchronize): fail the capture instead (ops/device.h graph_capture reports it).
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      MEGATRON_CHECK(cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs == cudaStreamCaptureStatusNone)
          << "a host<->device copy of " << bytes << " bytes inside a CUDA graph capture";
    }
    if (dd.is_cuda() && sd.is_cpu() && bytes <= kMaxStaged) {
      int cur = -1;
      CUDA_CHECK(cudaGetDevice(&cur));
      // Events and the stream belong to the current device.
      if (cur == dd.index && staged_h2d(dst, dd.index, src, bytes, st)) return;
    }
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st));
    if (dd.is_cpu() || sd.is_cpu()) sync_stream(st);
  }
  void memzero(void* p, size_t bytes, int) override {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, current_stream()));
  }

 private:
  static constexpr size_t kMaxStaged = size_t{64} << 20;  // 64 MiB
  static constexpr size_t kMaxBlocks = 64;
  static constexpr size_t kMaxPinned = size_t{512} << 20;  // all staging blocks together
  struct StagingBlock {
    void* host = nullptr;  // pinned (cudaHostAlloc)
    size_t capacity = 0;
    int device = -1;
    cudaEvent_t done = nullptr;  // recorded behind the block's last DMA
    uint64_t last_use = 0;
  };

  // Returns false (nothing done) when the pinned staging memory would exceed kMaxPinned.
  bool staged_h2d(void* dst, int dev, const void* src, size_t bytes, cudaStream_t st) {
    std::lock_guard<std::mutex> g(staging_mu_);
    StagingBlock* pick = nullptr;
    // 1. A free block of this device that is large enough (smallest first).
    for (auto& b : blocks_) {
      if (b.device != dev || b.capacity < bytes) continue;
      if (pick && pick->capacity <= b.capacity) continue;
      const cudaError_t q = cudaEventQuery(b.done);
      if (q == cudaErrorNotReady) continue;
      CUDA_CHECK(q);
      pick = &b;
    }
    // 2. Else a new block, or (at the block limit) wait for the least recently used one and grow it.
    if (!pick) {
      size_t cap = size_t{1} << 16;
      while (cap < bytes) cap <<= 1;
      if (pinned_bytes_ + cap > kMaxPinned) return false;
      if (blocks_.size() < kMaxBlocks) {
        blocks_.emplace_back();
        pick = &blocks_.back();
        pick->device = dev;
        CUDA_CHECK(cudaEventCreateWithFlags(&pick->done, cudaEventDisableTiming));
      } else {
        for (auto& b : blocks_)
          if (b.device == dev && (!pick || b.last_use < pick->last_use)) pick = &b;
        MEGATRON_CHECK(pick) << "no staging block for device " << dev;
        CUDA_CHECK(cudaEventSynchronize(pick->done));
      }
      if (pick->capacity < bytes) {
        if (pick->host) CUDA_CHECK(cudaFreeHost(pick->host));
        pinned_bytes_ -= pick->capacity;
        CUDA_CHECK(cudaHostAlloc(&pick->host, cap, cudaHostAllocDefault));
        pick->capacity = cap;
        pinned_bytes_ += cap;
      }
    }
    std::memcpy(pick->host, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, pick->host, bytes, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaEventRecord(pick->done, st));
    pick->last_use = ++use_counter_;
    return true;
  }

  void ensure_pool(int dev) {
    std::call_once(once_, [dev] {
      cudaMemPool_t pool;
      CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, dev));
      uint64_t threshold = UINT64_MAX;
      CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    });
  }
  std::once_flag once_;
  std::mutex staging_mu_;
  std::vector<StagingBlock> blocks_;  // kMaxBlocks reserved: pointers stay valid
  uint64_t use_counter_ = 0;
  size_t pinned_bytes_ = 0;

 public:
  CudaAllocator() { blocks_.reserve(kMaxBlocks); }
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

namespace {
std::atomic<unsigned long long> g_host_syncs{0};
}
void sync_stream(cudaStream_t s) {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  CUDA_CHECK(cudaStreamSynchronize(s));
}
unsigned long long host_sync_count() { return g_host_syncs.load(std::memory_order_relaxed); }

}  // namespace megatron::cuda
