// The distributed optimizer's parameter ranges (Megatron's DistributedOptimizer,
// megatron/core/optimizer/distrib_optimizer.py; docs/megatron-reference.md#distributed-optimizer): each DP rank optimizes only
// the elements of its slice of every gradient bucket. Parameters straddling a slice boundary are
// split at element level. The returned OptimizerParams view the model's param/grad buffers, so
// the (training helper's) MegatronOptimizer keeps fp32 main params and Adam state for the slice
// only; after step() call ddp.start_param_sync() to all-gather the updated parameters.
// Grad norm / clipping: pass the group spanning DP x model-parallel (the world without PP/CP
// duplication) as grad_stats_group: slices are disjoint across DP, so no element counts twice.
#pragma once

#include <vector>

#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/optimizer/optimizer.h"

namespace megatron::optimizer {

/// This rank's slice of every parameter as optimizer parameters (names, weight-decay and
/// TP/shared flags from the whole parameter). A slice of a >= 2-D parameter is viewed as
/// [1, n] so the optimizer's 1-D no-weight-decay rule still sees a matrix. Requires
/// ddp.config().use_distributed_optimizer (else UserError).
std::vector<OptimizerParam> distributed_optimizer_params(distributed::DistributedDataParallel& ddp);

/// The non-sharded counterpart: every parameter whole (plain DDP / single rank).
std::vector<OptimizerParam> optimizer_params(std::vector<Parameter>& params);

}  // namespace megatron::optimizer
