// Decode attention (attention_decode.cu): the q_len = 1 case of attention.cu's attention_forward,
// i.e. one new token per sequence attending to its whole KV cache (text generation's decode step,
// megatron/core/inference/, docs/inference.md). Internal header, not public API.
#pragma once

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda::decode_attention {

/// ops.h attention_forward for s == 1 with every key visible: q [1, b, np, d], k, v [sk, b, ng, d]
/// (np / ng <= 8 heads per K/V group, head h reads group h / (np/ng)), out [1, b, np, d], all
/// bfloat16 and 16-byte aligned, d 64 or 128, lse float32 [b, np, 1] (natural log of the scaled
/// scores). Split-K after FlashDecoding (Dao et al. 2023, "Flash-Decoding for long-context
/// inference"): the keys are cut into chunks so that b * ng * chunks blocks fill the GPU; each block
/// reads its chunk's K/V rows of one group once for all the group's heads (no repeated K/V) with an
/// online softmax in fp32, and a second kernel merges the chunks by their log-sum-exp (skipped when
/// one chunk suffices). Returns false, writing nothing, for any other call (s != 1, a mask, causal
/// with sk > 1, dropout, dtype, head dim, alignment): the caller runs its general kernels.
/// With p.kv_len (int64 in device memory, the decode step as a CUDA graph) k, v are whole caches
/// [capacity, b, ng, d] of which the first *kv_len rows take part: the grid is sized for the
/// capacity and the kernels derive the chunking from the count as a host call with those rows
/// would (same bits); no launch argument depends on the count, so a captured call replays at
/// any count in [1, capacity]. Returns false for a kv_len that is not an int64 CUDA tensor on k's
/// device, or with p.causal.
/// Runs on megatron::cuda::current_stream().
bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse);

}  // namespace megatron::ops::cuda::decode_attention
