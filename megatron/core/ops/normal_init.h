#pragma once
// The shard layout of a parameter's N(0, std) initialization, for the normal_init op
// (ops/op_table.h): what a backend needs to draw a shard's values itself
// (tensor_parallel::initialize_parameter).

#include <cstdint>

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

}  // namespace megatron::ops
