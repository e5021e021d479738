// Global gradient norm, clipping and zero counting (megatron/core/optimizer/clip_grads.py;
// docs/training.md). Grads are float32 tensors on any device: the statistics run as the
// multi-tensor ops of ops/op_table.h (sum_of_squares_many, count_zeros_many, has_inf_or_nan_many).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::optimizer {

/// L2 norm of all `grads` together: local sum of squares (fp64 accumulation), all-reduced SUM over
/// `grad_stats_group` (nullptr = this rank only), square root. The caller passes only the grads that
/// count (not `shared`, TP-duplicates only on TP rank 0).
double get_grad_norm_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* grad_stats_group);

/// Scales every grad by clip_coeff = max_norm / (total_norm + 1e-6) if clip_coeff < 1.
void clip_grad_by_total_norm_fp32(const std::vector<Tensor>& grads, double max_norm, double total_norm);

/// Number of zero elements over `grads`, all-reduced SUM over `group` (nullptr = this rank only).
int64_t count_zeros_fp32(const std::vector<Tensor>& grads, comm::ProcessGroup* group);

/// True if any element of any tensor is inf or NaN (all-reduced MAX over `group`).
bool found_inf_or_nan(const std::vector<Tensor>& grads, comm::ProcessGroup* group);

}  // namespace megatron::optimizer
