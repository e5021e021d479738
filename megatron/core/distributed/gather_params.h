// Reassembling tensor-parallel shards into the global tensor (used by the parallel-equivalence
// tests and by tools that need the unsharded weights).
#pragma once

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/parameter.h"

namespace megatron::distributed {

/// The global tensor of `p` (shape p.global_shape, dtype of `local`) from every TP rank's
/// `local` shard (p's data or main_grad). Collective over `tp_group` (an all-gather). Follows
/// Megatron's layout: along p.partition_dim the global extent G is cut into partition_stride
/// blocks and rank r holds piece r of every block. A parameter that is not TP-partitioned is
/// returned as a copy of `local`.
Tensor gather_tensor_parallel(const Parameter& p, const Tensor& local, comm::ProcessGroup& tp_group);

}  // namespace megatron::distributed
