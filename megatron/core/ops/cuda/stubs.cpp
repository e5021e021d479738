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
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start) {
  MEGATRON_CHECK(false) << "embedding_forward: not implemented on CUDA yet";
}
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start) {
  MEGATRON_CHECK(false) << "embedding_backward: not implemented on CUDA yet";
}
void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v) {
  MEGATRON_CHECK(false) << "qkv_split_rope_forward: not implemented on CUDA yet";
}
void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv) {
  MEGATRON_CHECK(false) << "qkv_split_rope_backward: not implemented on CUDA yet";
}
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse) {
  MEGATRON_CHECK(false) << "attention_forward: not implemented on CUDA yet";
}
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv) {
  MEGATRON_CHECK(false) << "attention_backward: not implemented on CUDA yet";
}
void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max, Tensor& row_sumexp, Tensor& pred) {
  MEGATRON_CHECK(false) << "cross_entropy_stats: not implemented on CUDA yet";
}
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse, const Tensor& dloss, Tensor& dlogits) {
  MEGATRON_CHECK(false) << "cross_entropy_backward: not implemented on CUDA yet";
}
}  // namespace megatron::ops::cuda
