// Capacity dropping of the device MoE permutation (moe_router.cu; docs/moe.md "Kernels").
// Internal CUDA entry point declared outside the op table (op_table.h) on purpose: the op table
// is included by every backend object, and the caller (TokenDispatcher::dispatch_device) only
// reaches it with CUDA tensors. Include only under MEGATRON_WITH_CUDA.
#pragma once

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

/// Rows the permutation of moe_permute_capacity can produce: T k without padding (every kept row
/// is a choice), E min(capacity, T) with it.
int64_t moe_capacity_max_rows(int64_t T, int64_t k, int64_t E, int64_t capacity, bool pad_to_capacity);

/// ops::moe_permute_map followed by Megatron's apply_router_token_dropping (moe_utils.py; the
/// host reference is moe_utils.cpp apply_router_token_dropping) on the device, for the top-k
/// choice topk_idx int64 [T, k] / topk_probs float32 [T, k] of E experts and capacity =
/// get_capacity(T k, E, --moe-expert-capacity-factor) (> 0). Per expert e the capacity mask keeps
/// the min(capacity, T) tokens with the largest key, key = the routing prob of (t, e) (0 where t
/// did not choose e) for drop policy "probs" (by_position false), key = 1 / 0 (chose e or not) for
/// "position"; equal keys go to the lower token index (the host's stable sort). The final map is
/// the mask (pad_to_capacity) or the mask AND the choice. Writes, in Megatron's permute() order
/// (expert-major, tokens ascending within an expert):
///   row_token int64 [>= R] and permuted_probs float32 [>= R] (R = moe_capacity_max_rows(...); the
///     first Σ counts rows are written: the token of each row and its prob, 0 for padding rows of
///     tokens that did not choose the expert),
///   row_of int64 [T, k]: the row of choice (t, j), or -1 when the choice was dropped,
///   counts int64 [E]: rows per expert (min(capacity, T) each with pad_to_capacity).
/// Padding rows of tokens that did not choose the expert have no entry in row_of: their prob is 0,
/// so (experts without bias) their expert output and input gradient are exactly 0 and
/// moe_unpermute may skip them. Deterministic (block scans in token order, no atomics); a
/// bitwise 64-bit radix select per over-full expert. Returns false when not fused (E > 65535).
bool moe_permute_capacity(const Tensor& topk_idx, const Tensor& topk_probs, int64_t num_experts, int64_t capacity,
                          bool by_position, bool pad_to_capacity, Tensor& row_token, Tensor& row_of,
                          Tensor& permuted_probs, Tensor& counts);

}  // namespace megatron::ops::cuda
