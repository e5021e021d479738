// CUDA-only optimizer entry points that ops.h does not have (called by megatron/core/optimizer
// in CUDA builds). Kept out of cuda_ops.h so that the optimizer does not depend on all ops.
#pragma once

#include <vector>

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

/// ops::adam_step with the gradient multiplied by grad_scale (fp32) as it is read: the same
/// result, bit for bit, as scaling the gradient in place first (Megatron's
/// clip_grad_by_total_norm_fp32 with coefficient grad_scale) and then stepping, without the
/// extra pass over the fp32 gradients. The gradient itself is left unscaled.
void adam_step_scaled(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
                      Tensor* model_param, float grad_scale);

/// One tensor of adam_step_multi: fp32 param (master), grad, exp_avg, exp_avg_sq on the GPU, the
/// optional model param written from the updated param (bf16/fp16/fp32), and its group's lr and
/// weight decay.
struct AdamTensor {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  Tensor* model_param = nullptr;
  float lr = 0.0f;
  float weight_decay = 0.0f;
};

/// adam_step_scaled over many tensors with one kernel launch per model-param dtype (multi-tensor
/// Adam; p.lr / p.weight_decay are taken from each AdamTensor, the rest from p): the same
/// per-element code as adam_step_scaled per tensor (expected bit-identical; checked within 1e-6).
/// The tensor table is copied to the GPU through the asynchronous staged H2D path (no host
/// synchronization). Returns false, doing nothing, if a tensor is not a float32 CUDA tensor of
/// matching sizes or MEGATRON_MULTI_TENSOR_ADAM=0 (callers then step each tensor).
bool adam_step_multi(const std::vector<AdamTensor>& ts, const AdamParams& p, float grad_scale);

}  // namespace megatron::ops::cuda
