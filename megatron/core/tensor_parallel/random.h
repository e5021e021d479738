// Deterministic random numbers for initialization and dropout seeds.
//
// Initialization draws element i of a GLOBAL weight from a counter-based generator keyed by
// (seed, parameter name, i), so a rank computes exactly its shard's values and the model is
// the same whatever the tensor/pipeline-parallel layout (Megatron gets the same property from
// --use-cpu-initialization; its values differ from ours since they come from torch's RNG).
#pragma once

#include <cstdint>
#include <string>

#include "megatron/core/ops/normal_init.h"
#include "megatron/core/tensor/parameter.h"

namespace megatron::tensor_parallel {

using ops::NormalInitSpec;

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
void initialize_parameter(Parameter& p, uint64_t seed);

/// --use-cpu-initialization: draw on the host and copy (bit-identical to a CPU run) even for
/// device parameters. Default false: device parameters are drawn on the device (Megatron also
/// initializes on the GPU unless --use-cpu-initialization).
void set_use_cpu_initialization(bool on);

/// Global flat index of local element `local_index` of a shard (see Parameter).
int64_t global_index_of(const Parameter& p, const Shape& local_shape, int64_t local_index);

/// Megatron's TP-region dropout seed: seed + 2718 + tp_rank (model_parallel_cuda_manual_seed).
inline uint64_t model_parallel_seed(uint64_t seed, int tp_rank) { return seed + 2718 + static_cast<uint64_t>(tp_rank); }

}  // namespace megatron::tensor_parallel
