// Generic CUDA attention (attention_generic.cu): the fallback of attention.cu for every call the
// tensor-core paths (cuDNN SDPA, our flash kernels: bfloat16, head dim 64/128 or a multiple of 8,
// no dropout) do not take. Internal header, not public API.
#pragma once

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda::generic_attention {

/// Largest head dim the generic kernels take.
constexpr int64_t kMaxHeadDim = 256;

/// ops.h attention_forward for any head dim 1..256: q [s, b, np, d], k, v [sk, b, ng, d]
/// (np % ng == 0: grouped-query attention, head h reads K/V group h / (np/ng)), all float32 or
/// all bfloat16 or all float16 (out the same dtype), lse float32 [b, np, s] (natural log; -inf for a row with no
/// visible key, whose out is 0). Masks: causal (key j visible to query i iff j <= i), an explicit
/// bool mask [b, 1, s, sk] (true = masked) or none. Attention dropout with the CPU reference's
/// counter-based stream (element ((b*np + h)*s + i)*sk + j of stream (seed, offset)), so CPU and
/// CUDA drop the same probabilities. One warp per (batch, head, query row) with an online softmax
/// (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax"); fp32 accumulation;
/// the score matrix is never stored. Runs on megatron::cuda::current_stream().
/// Throws InternalError (MEGATRON_CHECK) for mismatched shapes or dtypes.
void forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse);

/// ops.h attention_backward for the same calls: dq, dk, dv (overwritten, the dtype of q) from
/// dout, q, k, v, out and the forward's lse (FlashAttention-2's backward: P recomputed from lse,
/// D = rowsum(dout * out)). Deterministic (no atomics): one warp per query row computes D and dq,
/// then one warp per (batch, K/V group, key row) computes dk and dv over the group's heads.
void backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv);

}  // namespace megatron::ops::cuda::generic_attention
