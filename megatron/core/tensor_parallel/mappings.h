// Tensor- and sequence-parallel communication mappings (Megatron's
// megatron/core/tensor_parallel/mappings.py). Without autograd each mapping is a pair of
// functions: the forward and the backward Megatron's autograd.Function performs. Tensors are
// contiguous; "first dim" = the sequence dim of [s, b, h] activations, "last dim" = hidden.
// Every function is the identity (or a copy) when the group has one rank.
#pragma once

#include "megatron/core/comm/process_group.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::tensor_parallel {

using comm::ProcessGroup;

/// all-reduce (SUM) across the group; returns a new tensor (input untouched).
/// = reduce_from_tensor_model_parallel_region forward, copy_to_... backward.
Tensor all_reduce_copy(const Tensor& x, ProcessGroup& g);

/// Concatenation along dim 0 of every rank's x ([s/TP, ...] -> [s, ...]).
/// = gather_from_sequence_parallel_region forward; scatter_to_sequence_parallel_region backward;
///   reduce_scatter_to_sequence_parallel_region backward.
Tensor gather_along_first_dim(const Tensor& x, ProcessGroup& g);
/// Sum over ranks, each rank keeping its 1/TP slice along dim 0 ([s, ...] -> [s/TP, ...]).
/// Throws UserError when dim 0 is not divisible by the group size.
/// = reduce_scatter_to_sequence_parallel_region forward; gather_from_sequence_parallel_region backward.
Tensor reduce_scatter_along_first_dim(const Tensor& x, ProcessGroup& g);
/// This rank's 1/TP slice along dim 0 (no communication; a copy).
/// = scatter_to_sequence_parallel_region forward.
Tensor split_along_first_dim(const Tensor& x, ProcessGroup& g);

/// Concatenation along the last dim ([..., h/TP] -> [..., h]).
/// = gather_from_tensor_model_parallel_region forward; scatter_to_... backward.
Tensor gather_along_last_dim(const Tensor& x, ProcessGroup& g);
/// This rank's 1/TP slice along the last dim (a copy). Throws UserError when not divisible.
/// = scatter_to_tensor_model_parallel_region forward; gather_from_... backward.
Tensor split_along_last_dim(const Tensor& x, ProcessGroup& g);

}  // namespace megatron::tensor_parallel
