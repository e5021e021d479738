// Attention through cuDNN's SDPA (the cuDNN 9 backend graph API), used by attention.cu.
//
// libcudnn is opened with dlopen at first use (libcudnn.so.9, or the path in MEGATRON_CUDNN_LIB),
// so binaries start and run on machines without cuDNN or without a GPU; every function here then
// returns false and attention.cu runs our own flash-attention kernels.
#pragma once

#include <string>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda::cudnn_sdpa {

/// True when libcudnn (>= 9) was loaded and a handle created on the current device.
/// The first call tries once; the reason for a failure is in last_error().
bool available();

/// Why cuDNN is unavailable or why the last graph was rejected ("" if none).
std::string last_error();

/// Forward SDPA for ops.h's attention contract: q [s, b, np, d], k, v [sk, b, ng, d] bf16,
/// out [s, b, np, d] bf16, lse float32 [b, np, s] (natural-log log-sum-exp of the scaled,
/// masked scores: cuDNN's softmax "stats"). Causal (top-left aligned: key j visible to query i
/// iff j <= i) or no mask; no explicit mask, no dropout. Runs on megatron::cuda::current_stream().
/// Returns false (nothing launched) if cuDNN is unavailable or rejects this shape; the
/// execution plan for each shape is built once and cached.
bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse);

/// Backward SDPA: dq, dk, dv (overwritten) from dout, q, k, v, out and the forward's lse.
/// Same conditions and return value as forward().
bool backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
              const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv);

/// forward() on the fused QKV GEMM output without splitting it: qkv [s, b, 3·h·d] bf16 in
/// Megatron's interleaved layout with one query head per group ([s, b, h, (q, k, v), d]: MHA
/// without RoPE), out [s, b, h, d], lse [b, h, s]. Q, K and V are passed to cuDNN as strided views
/// (token stride 3·h·d, head stride 3·d). Same conditions and return value as forward().
bool forward_packed(const Tensor& qkv, int64_t heads, const AttentionParams& p, Tensor& out, Tensor& lse);

/// backward() writing dQ, dK, dV strided into dqkv (qkv's shape and layout; every element is
/// written). Same conditions and return value as forward().
bool backward_packed(const Tensor& dout, const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& lse,
                     const AttentionParams& p, Tensor& dqkv);

}  // namespace megatron::ops::cuda::cudnn_sdpa
