// CUDA implementations of every op in megatron/core/ops/ops.h (same signatures, no default
// arguments; the documentation is in ops.h). Declared here, defined by the CUDA backend
// (megatron/core/ops/cuda/*.cu). megatron/core/ops/dispatch.cpp calls them for CUDA tensors
// when the build has MEGATRON_WITH_CUDA; every declaration below must therefore have a
// definition in the CUDA build. Host-returning ops (sum_of_squares, count_zeros,
// has_inf_or_nan) synchronize the current stream.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

void cast(const Tensor& src, Tensor& dst);
void fill(Tensor& x, float value);
void add_(Tensor& y, const Tensor& x, float alpha);
void scale_(Tensor& x, float alpha);
double sum_of_squares(const Tensor& x);
/// Σ of sum_of_squares over CUDA tensors with one host synchronization for the whole list
/// (the global gradient norm); fp64, deterministic. Not in ops.h: called by
/// optimizer/clip_grads.cpp for device grads.
double sum_of_squares_many(const std::vector<Tensor>& xs);
/// Σ count_zeros over CUDA tensors, one host synchronization for the list (--log-num-zeros-in-grad).
int64_t count_zeros_many(const std::vector<Tensor>& xs);
/// Any inf/NaN in any of the CUDA tensors, one host synchronization for the list (the fp16 loss
/// scaler's found_inf check).
bool has_inf_or_nan_many(const std::vector<Tensor>& xs);
int64_t count_zeros(const Tensor& x);
bool has_inf_or_nan(const Tensor& x);
void transpose01(const Tensor& x, Tensor& y);
void bias_add_(Tensor& y, const Tensor& bias);
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta);
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias, bool accumulate);
/// Fused fc1 + GeLU (cuBLASLt GELU_AUX_BIAS epilogue; cuBLASLt's GeLU is the tanh approximation,
/// Megatron's bias_gelu): pre[N,out] = x[N,in] @ w[out,in]^T + bias[out] (the GeLU input, saved
/// for the backward) and act = gelu_tanh(pre). bf16/fp16 x, w, bias, pre, act; out % 8 == 0.
/// Returns false, writing nothing, for fp32 or when cuBLASLt has no kernel for the shapes (callers
/// then run linear_forward + gelu_forward).
bool linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre, Tensor& act);
/// Fused fc2 dgrad + GeLU backward (+ fc1 bias gradient): dpre[N,f] = gelu_tanh'(pre) * (dy[N,h] @
/// w[h,f]) (cuBLASLt DGELU_BGRAD) and, if dbias, dbias[f] (+)= Σ_rows dpre (computed in dpre's
/// type, then added). bf16/fp16; f % 8 == 0. Returns false, writing nothing, when unsupported.
bool linear_dgelu_bgrad_backward(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre, Tensor* dbias,
                                 bool accumulate);
/// Self-attention straight from the fused QKV GEMM output (cudnn_attention.cpp, gpt2perf):
/// qkv [s, b, 3·h·d] bf16 in the interleaved [s, b, h, (q, k, v), d] layout (num_query_groups ==
/// heads, no RoPE, no qk-layernorm), out [s, b, h, d], lse float32 [b, h, s], the same result as
/// qkv_split_rope_forward (no RoPE) followed by attention_forward, without the split copies. The
/// backward writes dQ, dK, dV into dqkv (qkv's layout) like attention_backward followed by
/// qkv_split_rope_backward. cuDNN only: false (nothing written) when cuDNN is unavailable or
/// rejects the call, with a mask or dropout, under MEGATRON_ATTENTION_BACKEND=flash/generic or
/// MEGATRON_PACKED_QKV=0; callers then split and call attention_forward/backward.
bool attention_forward_packed_qkv(const Tensor& qkv, int64_t heads, const AttentionParams& p, Tensor& out,
                                  Tensor& lse);
bool attention_backward_packed_qkv(const Tensor& dout, const Tensor& qkv, int64_t heads, const Tensor& out,
                                   const Tensor& lse, const AttentionParams& p, Tensor& dqkv);
/// GeLU (tanh approximation) backward with the bias gradient in the same pass (gelu_bgrad.cu):
/// dpre[N,f] = dy[N,f] * gelu_tanh'(pre[N,f]) and, if dbias, dbias[f] (+)= Σ_rows dpre (the dpre
/// values as stored, summed in fp32 in a fixed order, rounded once to dpre's dtype, then added:
/// Megatron's bf16 bias .grad accumulated into the main grad). dy, pre, dpre bf16 or fp16 of one
/// dtype, f % 8 == 0, 16-byte aligned. Returns false, writing nothing, otherwise. Replaces the
/// cuBLASLt DGELU_BGRAD epilogue, which runs as a separate slow epilogue kernel at GPT-2 shapes
/// (1.2 ms per call against 0.35 ms for this pass; docs/performance.md, Session 4).
bool gelu_backward_bgrad(const Tensor& dy, const Tensor& pre, Tensor& dpre, Tensor* dbias, bool accumulate);
/// Bias gradient of a linear layer: dbias[f] (+)= Σ_rows dy[rows, f], summed in fp32 in a fixed
/// order (not rounded; fp32 or dy-typed dbias), one 16-byte-load pass over dy (gelu_bgrad.cu).
/// bf16/fp16 dy, f % 8 == 0, 16-byte aligned; false (nothing written) otherwise. linear_backward
/// uses it instead of cuBLASLt's BGRADB epilogue, which runs as a separate 78 µs-per-call kernel
/// at GPT-2 shapes (MEGATRON_BGRADB=1 selects the epilogue again).
bool bias_grad_colsum(const Tensor& dy, Tensor& dbias, bool accumulate);
/// y[N,out] = x[N,in] @ w[out,in]^T (+ bias[out]) + residual[N,out] in one cuBLASLt GEMM (residual
/// read as C with beta 1, y written as D, fp32 accumulation, rounded once). bf16/fp16 y, residual,
/// bias; residual must not alias y. Returns false, writing nothing, when not applicable
/// (fp32, dtype mismatch, empty) so callers run linear_forward + add_.
bool linear_forward_residual(const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual, Tensor& y);
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start);
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start);
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma, Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate);
/// layernorm_backward with the residual branch's gradient added to dx in the same pass:
/// dx = LN-backward(dy) + dresidual (dresidual: dy's shape and dtype; may not alias dx).
void layernorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, bool accumulate);
/// rmsnorm_backward with dx = RMSNorm-backward(dy) + dresidual in the same pass.
void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                               bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx, Tensor& dgamma,
                               bool accumulate);
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, bool accumulate);
void gelu_forward(const Tensor& x, Tensor& y, bool approximate_tanh);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh);
void swiglu_forward(const Tensor& x, Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset);
void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx);
void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v);
void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv);
void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y);
void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx);
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse);
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv);
void attention_merge_(Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse);
void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max, Tensor& row_sumexp, Tensor& pred);
void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max);
void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss, Tensor& lse);
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse, const Tensor& dloss, Tensor& dlogits);
void cross_entropy_fused_(Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse);
void scale_rows(const Tensor& x, const Tensor& scale, Tensor& out);
void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p, Tensor* model_param);

}  // namespace megatron::ops::cuda
