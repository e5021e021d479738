// Device dispatch for megatron/core/ops/ops.h: every op runs on the device of its first tensor
// argument; CPU tensors go to ops/cpu (reference kernels), CUDA tensors to ops/cuda when the
// build has the CUDA backend (MEGATRON_WITH_CUDA), else a UserError says to rebuild with it.
#include "megatron/core/ops/ops.h"

#include "megatron/core/ops/cpu/cpu_ops.h"
#ifdef MEGATRON_WITH_CUDA
#include "megatron/core/ops/cuda/cuda_ops.h"
#endif

namespace megatron::ops {

namespace {
[[noreturn, maybe_unused]] void no_cuda(const char* op) {
  user_error("ops::", op, ": a CUDA tensor reached a build without the CUDA backend; rebuild with -DMEGATRON_CUDA=ON");
}
}  // namespace

#ifdef MEGATRON_WITH_CUDA
#define MEGATRON_DISPATCH(dev_tensor, name, ...) \
  return (dev_tensor).is_cuda() ? cuda::name(__VA_ARGS__) : cpu::name(__VA_ARGS__)
#else
#define MEGATRON_DISPATCH(dev_tensor, name, ...)   \
  do {                                              \
    if ((dev_tensor).is_cuda()) no_cuda(#name);     \
    return cpu::name(__VA_ARGS__);                  \
  } while (0)
#endif

void cast(const Tensor& src, Tensor& dst) {
  MEGATRON_DISPATCH(src, cast, src, dst);
}

void fill(Tensor& x, float value) {
  MEGATRON_DISPATCH(x, fill, x, value);
}

void add_(Tensor& y, const Tensor& x, float alpha) {
  MEGATRON_DISPATCH(y, add_, y, x, alpha);
}

void scale_(Tensor& x, float alpha) {
  MEGATRON_DISPATCH(x, scale_, x, alpha);
}

double sum_of_squares(const Tensor& x) {
  MEGATRON_DISPATCH(x, sum_of_squares, x);
}

int64_t count_zeros(const Tensor& x) {
  MEGATRON_DISPATCH(x, count_zeros, x);
}

bool has_inf_or_nan(const Tensor& x) {
  MEGATRON_DISPATCH(x, has_inf_or_nan, x);
}

void transpose01(const Tensor& x, Tensor& y) {
  MEGATRON_DISPATCH(x, transpose01, x, y);
}

void bias_add_(Tensor& y, const Tensor& bias) {
  MEGATRON_DISPATCH(y, bias_add_, y, bias);
}

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  MEGATRON_DISPATCH(a, gemm, a, trans_a, b, trans_b, c, alpha, beta);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  MEGATRON_DISPATCH(x, linear_forward, x, w, bias, y);
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias, bool accumulate) {
  MEGATRON_DISPATCH(dy, linear_backward, dy, x, w, dx, dw, dbias, accumulate);
}

void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  MEGATRON_DISPATCH(ids, embedding_forward, ids, table, out, vocab_start);
}

void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start) {
  MEGATRON_DISPATCH(dout, embedding_backward, dout, ids, dtable, vocab_start);
}

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma, Tensor& y, Tensor& mean, Tensor& rstd) {
  MEGATRON_DISPATCH(x, layernorm_forward, x, gamma, beta, eps, zero_centered_gamma, y, mean, rstd);
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  MEGATRON_DISPATCH(dy, layernorm_backward, dy, x, gamma, mean, rstd, zero_centered_gamma, dx, dgamma, dbeta, accumulate);
}

void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y, Tensor& rstd) {
  MEGATRON_DISPATCH(x, rmsnorm_forward, x, gamma, eps, zero_centered_gamma, y, rstd);
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, bool accumulate) {
  MEGATRON_DISPATCH(dy, rmsnorm_backward, dy, x, gamma, rstd, zero_centered_gamma, dx, dgamma, accumulate);
}

void gelu_forward(const Tensor& x, Tensor& y, bool approximate_tanh) {
  MEGATRON_DISPATCH(x, gelu_forward, x, y, approximate_tanh);
}

void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh) {
  MEGATRON_DISPATCH(dy, gelu_backward, dy, x, dx, approximate_tanh);
}

void swiglu_forward(const Tensor& x, Tensor& y) {
  MEGATRON_DISPATCH(x, swiglu_forward, x, y);
}

void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx) {
  MEGATRON_DISPATCH(dy, swiglu_backward, dy, x, dx);
}

void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset) {
  MEGATRON_DISPATCH(x, dropout_forward, x, y, mask, p, seed, offset);
}

void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx) {
  MEGATRON_DISPATCH(dy, dropout_backward, dy, mask, p, dx);
}

void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v) {
  MEGATRON_DISPATCH(qkv, qkv_split_rope_forward, qkv, num_heads, num_query_groups, rope, position_ids, q, k, v);
}

void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv) {
  MEGATRON_DISPATCH(dq, qkv_split_rope_backward, dq, dk, dv, num_heads, num_query_groups, rope, position_ids, dqkv);
}

void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y) {
  MEGATRON_DISPATCH(x, rope_forward, x, rope, position_ids, y);
}

void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx) {
  MEGATRON_DISPATCH(dy, rope_backward, dy, rope, position_ids, dx);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  MEGATRON_DISPATCH(q, attention_forward, q, k, v, p, out, lse);
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  MEGATRON_DISPATCH(dout, attention_backward, dout, q, k, v, out, lse, p, dq, dk, dv);
}

void attention_merge_(Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse) {
  MEGATRON_DISPATCH(acc_out, attention_merge_, acc_out, acc_lse, part_out, part_lse);
}

void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max, Tensor& row_sumexp, Tensor& pred) {
  MEGATRON_DISPATCH(logits, cross_entropy_stats, logits, labels, vocab_start, row_max, row_sumexp, pred);
}

void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  MEGATRON_DISPATCH(row_sumexp, cross_entropy_rescale_, row_sumexp, row_max, global_max);
}

void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss, Tensor& lse) {
  MEGATRON_DISPATCH(global_max, cross_entropy_loss, global_max, global_sumexp, pred, loss, lse);
}

void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse, const Tensor& dloss, Tensor& dlogits) {
  MEGATRON_DISPATCH(logits, cross_entropy_backward, logits, labels, vocab_start, lse, dloss, dlogits);
}

void cross_entropy_fused_(Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse) {
  MEGATRON_DISPATCH(logits, cross_entropy_fused_, logits, labels, vocab_start, loss, lse);
}

void scale_rows(const Tensor& x, const Tensor& scale, Tensor& out) {
  MEGATRON_DISPATCH(x, scale_rows, x, scale, out);
}

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p, Tensor* model_param) {
  MEGATRON_DISPATCH(param, adam_step, param, grad, exp_avg, exp_avg_sq, p, model_param);
}

#undef MEGATRON_DISPATCH

}  // namespace megatron::ops
