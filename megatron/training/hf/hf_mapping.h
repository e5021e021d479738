// Hugging Face <-> Megatron tensor layout conversions (pure functions on CPU tensors, any dtype).
// Facts: docs/megatron-reference.md#distributed-checkpoint (QKV rows grouped per query group, SwiGLU fc1 = [gate; up]); HF LLaMA
// stores q_proj/k_proj/v_proj/o_proj and gate_proj/up_proj/down_proj as [out, in] nn.Linear
// weights in rotate-half RoPE order (the same order as Megatron's non-interleaved RoPE, so no
// permutation); HF GPT-2 uses Conv1D, whose weights are [in, out] (transposed), and fuses q, k, v
// into c_attn ([h, 3h]: columns q | k | v).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace megatron::hf {

/// Concatenates tensors along dim 0 (same dtype and trailing shape).
Tensor cat_rows(const std::vector<Tensor>& parts);
/// Splits along dim 0 into pieces of the given row counts (must sum to size(0)). Copies.
std::vector<Tensor> split_rows(const Tensor& t, const std::vector<int64_t>& rows);
/// 2-D transpose [a, b] -> [b, a] (Conv1D <-> Linear). Copies.
Tensor transpose2d(const Tensor& t);

/// Megatron's grouped QKV from separate projections. q: [nh*d, ...], k, v: [ng*d, ...]
/// (weights [rows, h] or biases [rows]). Result rows: for each group g: the nh/ng query heads of g,
/// then key head g, then value head g (each d rows) -> [(nh + 2 ng) d, ...].
Tensor qkv_to_megatron(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads, int64_t num_query_groups);
/// Inverse of qkv_to_megatron: {q, k, v}.
std::array<Tensor, 3> qkv_from_megatron(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups);

/// SwiGLU fc1: [gate; up] (rows). And back.
Tensor fc1_to_megatron(const Tensor& gate, const Tensor& up);
std::array<Tensor, 2> fc1_from_megatron(const Tensor& fc1);

/// GPT-2 c_attn (Conv1D weight [h, 3h] or bias [3h], columns q | k | v) -> Megatron grouped
/// linear_qkv ([3h, h] or [3h]; multi-head attention: one query group per head).
Tensor gpt2_c_attn_to_megatron(const Tensor& c_attn, int64_t num_heads);
/// Inverse of gpt2_c_attn_to_megatron.
Tensor gpt2_c_attn_from_megatron(const Tensor& qkv, int64_t num_heads);

/// Pads dim 0 with zero rows to `rows` (vocab padding), or truncates (export). Copies.
Tensor resize_rows(const Tensor& t, int64_t rows);

}  // namespace megatron::hf
