#pragma once
// The device hook of parameter initialization (tensor_parallel::initialize_parameter): the shard
// layout a backend needs to draw N(0, std) values of a parameter itself.

#include <cstdint>

#include "megatron/core/tensor/tensor.h"

namespace megatron::ops {

/// What a device backend needs to draw a parameter shard's N(0, std) values itself: the stream
/// key splitmix64(seed ^ hash_name(name)), the std, and the shard layout (local/global shapes,
/// partitioned dim or -1 when the local index is the global one, partition stride, TP rank).
struct NormalInitSpec {
  static constexpr int kMaxDims = 4;
  uint64_t key = 0;
  float std = 0.0f;
  int nd = 0;
  int64_t local[kMaxDims] = {};
  int64_t global[kMaxDims] = {};
  int partition_dim = -1;
  int64_t stride = 1;
  int64_t tp_rank = 0;
};
/// A device initializer: fills `out` (a device tensor) with std * normal_at(key, global index),
/// rounded to out's dtype; returns false when it cannot (then the host path runs).
using DeviceNormalInit = bool (*)(Tensor& out, const NormalInitSpec& spec);
/// Registered by the CUDA backend at start-up (megatron/core/ops/cuda/init.cu).
void register_device_normal_init(DeviceNormalInit fn);
/// The registered device initializer, or nullptr (CPU-only build, or before registration).
DeviceNormalInit device_normal_init();
}  // namespace megatron::ops
