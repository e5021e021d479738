#include "megatron/core/tensor/memory_stats.h"

#include <algorithm>
#include <atomic>
#include <mutex>

namespace megatron {

namespace {
// Index = DeviceType. Relaxed atomics: counters, not synchronization.
std::atomic<int64_t> g_live[2] = {0, 0};
std::atomic<int64_t> g_peak[2] = {0, 0};
std::atomic<int64_t> g_count[2] = {0, 0};
std::mutex g_hooks_mu;  // constant-initialized
// Function-local: the CUDA backend registers from a static initializer of another library.
PoolStatsHooks* hooks() {
  static PoolStatsHooks h[2];
  return h;
}
}  // namespace

namespace detail {
void count_alloc(DeviceType type, size_t bytes) {
  const int k = static_cast<int>(type);
  const int64_t b = static_cast<int64_t>(bytes);
  const int64_t now = g_live[k].fetch_add(b, std::memory_order_relaxed) + b;
  if (bytes > 0) g_count[k].fetch_add(1, std::memory_order_relaxed);  // 0-byte storages hold no pointer to free
  int64_t peak = g_peak[k].load(std::memory_order_relaxed);
  while (now > peak && !g_peak[k].compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}
void count_free(DeviceType type, size_t bytes) {
  g_live[static_cast<int>(type)].fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  if (bytes > 0) g_count[static_cast<int>(type)].fetch_sub(1, std::memory_order_relaxed);
}
}  // namespace detail

void register_pool_stats(DeviceType type, PoolStatsHooks h) {
  std::lock_guard<std::mutex> l(g_hooks_mu);
  hooks()[static_cast<int>(type)] = std::move(h);
}

MemoryStats memory_stats(DeviceType type, int device_index) {
  const int k = static_cast<int>(type);
  MemoryStats s;
  s.allocated = g_live[k].load(std::memory_order_relaxed);
  s.max_allocated = std::max(s.allocated, g_peak[k].load(std::memory_order_relaxed));
  s.allocation_count = g_count[k].load(std::memory_order_relaxed);
  PoolStatsHooks h;
  {
    std::lock_guard<std::mutex> l(g_hooks_mu);
    h = hooks()[k];
  }
  int64_t cur = 0, high = 0;
  if (h.query && h.query(device_index, &cur, &high)) {
    s.reserved = cur;
    s.max_reserved = std::max(cur, high);
  }
  return s;
}

void reset_peak_memory_stats(DeviceType type, int device_index) {
  const int k = static_cast<int>(type);
  g_peak[k].store(g_live[k].load(std::memory_order_relaxed), std::memory_order_relaxed);
  PoolStatsHooks h;
  {
    std::lock_guard<std::mutex> l(g_hooks_mu);
    h = hooks()[k];
  }
  if (h.reset) h.reset(device_index);
}

}  // namespace megatron
