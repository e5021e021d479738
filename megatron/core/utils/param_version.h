// Process-wide version number of the model parameters' values.
//
// Anything that rewrites model parameters in place between forward passes bumps it: the
// optimizer step (MegatronOptimizer::step) and checkpoint loading (load_checkpoint). Caches of
// values derived from the weights -- the FP8 weight casts of megatron/core/fp8 (docs/fp8.md,
// "Weight cache") -- compare the version they were built at with the current one and rebuild
// when it moved. One counter for the whole process (not per tensor): a bump invalidates every
// cache, which is conservative and cheap (it happens once per optimizer step).
#pragma once

#include <atomic>
#include <cstdint>

namespace megatron {

namespace detail {
inline std::atomic<uint64_t>& param_version_counter() {
  static std::atomic<uint64_t> v{0};
  return v;
}
}  // namespace detail

/// The current parameter version (starts at 0).
inline uint64_t param_version() { return detail::param_version_counter().load(std::memory_order_acquire); }

/// Marks every model parameter as possibly changed (call after writing weights in place).
inline void bump_param_version() { detail::param_version_counter().fetch_add(1, std::memory_order_acq_rel); }

}  // namespace megatron
