// Deterministic random numbers for initialization and dropout seeds.
//
// Initialization draws element i of a GLOBAL weight from a counter-based generator keyed by
// (seed, parameter name, i), so a rank computes exactly its shard's values and the model is
// the same whatever the tensor/pipeline-parallel layout (Megatron gets the same property from
// --use-cpu-initialization; its values differ from ours since they come from torch's RNG).
#pragma once

#include <cstdint>
#include <string>

#include "megatron/core/transformer/module.h"

namespace megatron::tensor_parallel {

/// SplitMix64 finalizer (Steele et al. 2014): a bijective 64-bit mixer.
uint64_t splitmix64(uint64_t x);
/// 64-bit FNV-1a hash of a string (stable across platforms).
uint64_t hash_name(const std::string& s);
/// Standard normal sample number `index` of the stream `key` (Box-Muller on two uniforms
/// derived from splitmix64(key, index)). Pure function of (key, index).
float normal_at(uint64_t key, uint64_t index);

/// Fills p.data (this rank's shard, per p.partition_dim/partition_stride/tp_rank/tp_size and
/// p.global_shape) according to p.init: N(0, p.init_std) drawn for the global element index
/// with key (seed, p.name); zeros; ones. Values are rounded to p.data's dtype. CUDA parameters
/// are drawn on the device when a device initializer is registered (see
/// set_use_cpu_initialization); CPU parameters are written in place by all init threads.
void initialize_parameter(transformer::Parameter& p, uint64_t seed);

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
/// --use-cpu-initialization: draw on the host and copy (bit-identical to a CPU run) even for
/// device parameters. Default false: device parameters are drawn on the device (Megatron also
/// initializes on the GPU unless --use-cpu-initialization).
void set_use_cpu_initialization(bool on);

/// Global flat index of local element `local_index` of a shard (see Parameter).
int64_t global_index_of(const transformer::Parameter& p, const Shape& local_shape, int64_t local_index);

/// Megatron's TP-region dropout seed: seed + 2718 + tp_rank (model_parallel_cuda_manual_seed).
inline uint64_t model_parallel_seed(uint64_t seed, int tp_rank) { return seed + 2718 + static_cast<uint64_t>(tp_rank); }

}  // namespace megatron::tensor_parallel
