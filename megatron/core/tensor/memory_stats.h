// Tensor memory statistics per device type: the counterpart of torch.cuda.memory_allocated /
// max_memory_allocated / memory_reserved / max_memory_reserved that Megatron's report_memory
// (megatron/training/utils.py) prints. Counted by this library: Tensor::empty adds the storage's
// bytes, the storage's release subtracts them (from_blob views are not counted); "reserved" is
// what the device's pool holds from the driver (CUDA: the stream-ordered pool's
// ReservedMemCurrent/High), reported by the backend that registered a pool-stats hook.
#pragma once

#include <cstdint>
#include <functional>

#include "megatron/core/tensor/tensor.h"

namespace megatron {

struct MemoryStats {
  int64_t allocated = 0;      // bytes held by live tensor storages now
  int64_t max_allocated = 0;  // high-water mark of `allocated` since start / reset_peak_memory_stats
  int64_t reserved = -1;      // bytes the device pool holds; -1 when the backend has no pool (CPU)
  int64_t max_reserved = -1;  // high-water mark of `reserved`; -1 without a pool
  int64_t allocation_count = 0;  // live tensor storages now (torch's "allocation.all.current")
};

/// Current statistics of `type` (allocated: all device indices of the type together, as each
/// rank uses one device); `device_index` selects the pool for reserved / max_reserved.
MemoryStats memory_stats(DeviceType type, int device_index = 0);
/// Sets max_allocated (and the pool's high-water marks) to the current values.
void reset_peak_memory_stats(DeviceType type, int device_index = 0);

/// What a backend with a memory pool registers (the CUDA backend at start-up): `query(dev, cur,
/// high)` fills the pool's reserved bytes and returns true; `reset(dev)` resets its high marks.
struct PoolStatsHooks {
  std::function<bool(int, int64_t*, int64_t*)> query;
  std::function<void(int)> reset;
};
void register_pool_stats(DeviceType type, PoolStatsHooks hooks);

namespace detail {
/// Called by Tensor/Storage (tensor.cpp) on every owned allocation / release.
void count_alloc(DeviceType type, size_t bytes);
void count_free(DeviceType type, size_t bytes);
}  // namespace detail

}  // namespace megatron
