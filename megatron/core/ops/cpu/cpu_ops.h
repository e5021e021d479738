// CPU reference implementations of every op in megatron/core/ops/ops.h (same signatures, no
// default arguments; the documentation is in ops.h). fp32 math, OpenMP over rows, OpenBLAS
// sgemm for GEMMs; bfloat16/float16 tensors are converted to fp32 on load and rounded to
// nearest even on store. These kernels are the numerical ground truth for the CUDA backend.
// Callers use megatron::ops:: (dispatch.cpp), not these directly.
#pragma once

#include <cstdint>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cpu {

void cast(const Tensor& src, Tensor& dst);
void fill(Tensor& x, float value);
void add_(Tensor& y, const Tensor& x, float alpha);
void scale_(Tensor& x, float alpha);
double sum_of_squares(const Tensor& x);
int64_t count_zeros(const Tensor& x);
bool has_inf_or_nan(const Tensor& x);
void transpose01(const Tensor& x, Tensor& y);
void bias_add_(Tensor& y, const Tensor& bias);
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta);
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias, bool accumulate);
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start);
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start);
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma, Tensor& y, Tensor& mean, Tensor& rstd);
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate);
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

}  // namespace megatron::ops::cpu
