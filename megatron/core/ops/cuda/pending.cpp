// Placeholders for CUDA ops the model branch introduced after the CUDA backend's last sync
// (transpose01, bias_add_, rope_forward/backward, cross_entropy_rescale_/loss). Each throws
// InternalError naming itself; they move out of this file as their kernels land.
#include "megatron/core/ops/cuda/cuda_ops.h"
#include "megatron/core/utils/errors.h"

namespace megatron::ops::cuda {
void transpose01(const Tensor&, Tensor&) { MEGATRON_CHECK(false) << "transpose01: not implemented on CUDA yet"; }
void bias_add_(Tensor&, const Tensor&) { MEGATRON_CHECK(false) << "bias_add_: not implemented on CUDA yet"; }
void rope_forward(const Tensor&, const RopeParams&, const Tensor*, Tensor&) {
  MEGATRON_CHECK(false) << "rope_forward: not implemented on CUDA yet";
}
void rope_backward(const Tensor&, const RopeParams&, const Tensor*, Tensor&) {
  MEGATRON_CHECK(false) << "rope_backward: not implemented on CUDA yet";
}
void cross_entropy_rescale_(Tensor&, const Tensor&, const Tensor&) {
  MEGATRON_CHECK(false) << "cross_entropy_rescale_: not implemented on CUDA yet";
}
void cross_entropy_loss(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) {
  MEGATRON_CHECK(false) << "cross_entropy_loss: not implemented on CUDA yet";
}
}  // namespace megatron::ops::cuda
