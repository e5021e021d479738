#include "megatron/core/dist_checkpointing/mapping.h"

#include "megatron/core/utils/errors.h"

namespace megatron::dist_checkpointing {

ShardedTensor ShardedTensor::from_tensor(std::string key, Tensor data, int replica_id) {
  ShardedTensor t;
  t.key = std::move(key);
  t.global_shape = data.shape();
  t.global_offset = Shape(data.shape().size(), 0);
  t.local_shape = data.shape();
  t.data = std::move(data);
  t.replica_id = replica_id;
  return t;
}

ShardedTensor ShardedTensor::from_rank_offsets(std::string key, Tensor data, const std::vector<AxisFragment>& fragments,
                                               int replica_id,
                                               const std::vector<std::pair<int64_t, int64_t>>& prepend) {
  ShardedTensor t;
  t.key = std::move(key);
  for (const auto& [off, size] : prepend) {
    MEGATRON_CHECK(off >= 0 && off < size) << t.key << ": prepended offset " << off << " outside " << size;
    t.global_shape.push_back(size);
    t.global_offset.push_back(off);
    t.local_shape.push_back(1);
  }
  const size_t np = prepend.size();
  for (auto d : data.shape()) {
    t.global_shape.push_back(d);
    t.global_offset.push_back(0);
    t.local_shape.push_back(d);
  }
  for (const auto& f : fragments) {
    size_t a = np + static_cast<size_t>(f.axis);
    MEGATRON_CHECK(f.axis >= 0 && a < t.global_shape.size() && f.rank >= 0 && f.rank < f.num_parts)
        << t.key << ": bad fragment axis " << f.axis << " rank " << f.rank << "/" << f.num_parts;
    t.global_offset[a] = t.local_shape[a] * f.rank;
    t.global_shape[a] = t.local_shape[a] * f.num_parts;
  }
  t.data = std::move(data);
  t.replica_id = replica_id;
  return t;
}

int64_t ShardedTensor::local_numel() const {
  if (flattened_range) return flattened_range->second - flattened_range->first;
  return shape_numel(local_shape);
}

void ShardedTensor::validate() const {
  MEGATRON_CHECK(global_shape.size() == global_offset.size() && global_shape.size() == local_shape.size())
      << key << ": global shape " << shape_str(global_shape) << ", offset " << shape_str(global_offset)
      << ", local shape " << shape_str(local_shape) << " must have the same rank";
  for (size_t i = 0; i < global_shape.size(); ++i)
    MEGATRON_CHECK(global_offset[i] >= 0 && local_shape[i] >= 0 && global_offset[i] + local_shape[i] <= global_shape[i])
        << key << ": box offset " << shape_str(global_offset) << " + " << shape_str(local_shape) << " outside "
        << shape_str(global_shape);
  if (flattened_range) {
    MEGATRON_CHECK(flattened_range->first >= 0 && flattened_range->first <= flattened_range->second &&
                   flattened_range->second <= shape_numel(local_shape))
        << key << ": flattened range [" << flattened_range->first << ", " << flattened_range->second << ") outside box "
        << shape_str(local_shape);
  }
  MEGATRON_CHECK(data.defined() && data.numel() == local_numel())
      << key << ": data " << (data.defined() ? data.str() : std::string("undefined")) << " holds "
      << (data.defined() ? data.numel() : 0) << " elements, the shard needs " << local_numel();
}

}  // namespace megatron::dist_checkpointing
