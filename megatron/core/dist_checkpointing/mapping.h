// What a checkpoint is made of (Megatron's megatron/core/dist_checkpointing/mapping.py):
//  * ShardedTensor: this rank's piece of a named global tensor — key, global shape, global offset
//    of the piece, the local data, replica id (only replica 0 is written), and optionally a
//    flattened range (the distributed optimizer holds a flat slice of a parameter);
//  * ShardedObject: a small JSON value that exists once per position of a global grid (e.g. the
//    RNG state per (pp, tp) rank);
//  * common state: JSON written once by rank 0 (args, iteration, scheduler, ...).
// Keys use Megatron's names ("embedding.word_embeddings.weight",
// "decoder.layers.self_attention.linear_qkv.weight" with a leading layer axis, ...).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/tensor/tensor.h"

namespace megatron::dist_checkpointing {

/// Sharding of one axis: this rank holds part `rank` of `num_parts` equal parts of `axis`.
/// (Megatron's rank_offsets tuple (axis, rank_offset, fragments).)
struct AxisFragment {
  int axis = 0;
  int64_t rank = 0;
  int64_t num_parts = 1;
};

/// One rank's piece of a global tensor.
///
/// Box: the piece covers global indices [global_offset[i], global_offset[i] + local_shape[i]) on
/// every axis i. `data` holds the box row-major; when prepended (leading) axes of size 1 exist,
/// `data` may omit them (data.numel() == numel(local_shape)). With `flattened_range` = [b, e),
/// `data` is 1-D with e - b elements and holds only the box's row-major elements b..e-1.
struct ShardedTensor {
  std::string key;
  Tensor data;
  Shape global_shape;
  Shape global_offset;
  Shape local_shape;
  std::optional<std::pair<int64_t, int64_t>> flattened_range;
  /// 0 for the copy that is written; any other value for replicas (e.g. DP copies).
  int replica_id = 0;

  /// The whole tensor (no sharding): offset 0, global shape = data shape.
  static ShardedTensor from_tensor(std::string key, Tensor data, int replica_id = 0);

  /// Megatron's ShardedTensor.from_rank_offsets: `data` is the local piece; each fragment says
  /// that axis `axis` of the global tensor is `num_parts` times the local size and this rank has
  /// part `rank`. `prepend` adds leading axes (offset, global size) that `data` does not have —
  /// e.g. {{layer_index, num_layers}} for the stacked layer layout of docs/megatron-reference.md#distributed-checkpoint.
  static ShardedTensor from_rank_offsets(std::string key, Tensor data, const std::vector<AxisFragment>& fragments,
                                         int replica_id = 0,
                                         const std::vector<std::pair<int64_t, int64_t>>& prepend = {});

  /// Number of elements this rank holds (flat range length, or numel(local_shape)).
  int64_t local_numel() const;
  /// Throws InternalError when shapes/offsets/data size are inconsistent.
  void validate() const;
};

/// A JSON value at position `global_offset` of a grid of shape `global_shape` (Megatron's
/// ShardedObject; e.g. key "rng_state", grid (PP, TP), offset (pp_rank, tp_rank)).
struct ShardedObject {
  std::string key;
  nlohmann::json value;
  Shape global_shape;
  Shape global_offset;
  int replica_id = 0;
  /// Set by load(): whether the checkpoint had this object at this offset.
  bool loaded = false;
};

/// Everything one rank contributes to (or wants from) a checkpoint.
struct ShardedStateDict {
  std::vector<ShardedTensor> tensors;
  std::vector<ShardedObject> objects;
  /// Written by rank 0 only (other ranks' values are ignored on save).
  nlohmann::json common = nlohmann::json::object();
};

}  // namespace megatron::dist_checkpointing
