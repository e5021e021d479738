// Placeholders for the CUDA ops not written yet: each throws InternalError naming itself.
// Functions move out of this file as their kernels land (see docs/cuda.md).
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::ops::cuda {
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha, float beta) {
  MEGATRON_CHECK(false) << "gemm: not implemented on CUDA yet";
}
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y) {
  MEGATRON_CHECK(false) << "linear_forward: not implemented on CUDA yet";
}
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias, bool accumulate) {
  MEGATRON_CHECK(false) << "linear_backward: not implemented on CUDA yet";
}
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  MEGATRON_CHECK(false) << "attention_forward: not implemented on CUDA yet";
}
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  MEGATRON_CHECK(false) << "attention_backward: not implemented on CUDA yet";
}
// Added by the lead when the model branch introduced these ops (transpose01, bias_add_,
// rope_forward/backward, cross_entropy_rescale_/loss): placeholders until their kernels land.
void transpose01(const Tensor& x, Tensor& y) { MEGATRON_CHECK(false) << "transpose01: not implemented on CUDA yet"; }
void bias_add_(Tensor& y, const Tensor& bias) { MEGATRON_CHECK(false) << "bias_add_: not implemented on CUDA yet"; }
void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y) {
  MEGATRON_CHECK(false) << "rope_forward: not implemented on CUDA yet";
}
void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx) {
  MEGATRON_CHECK(false) << "rope_backward: not implemented on CUDA yet";
}
void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max) {
  MEGATRON_CHECK(false) << "cross_entropy_rescale_: not implemented on CUDA yet";
}
void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss, Tensor& lse) {
  MEGATRON_CHECK(false) << "cross_entropy_loss: not implemented on CUDA yet";
}
}  // namespace megatron::ops::cuda
