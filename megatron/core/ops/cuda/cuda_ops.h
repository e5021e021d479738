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
void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p, Tensor* model_param);

}  // namespace megatron::ops::cuda
