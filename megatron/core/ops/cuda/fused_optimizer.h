// CUDA-only optimizer entry points that ops.h does not have (called by megatron/core/optimizer
// in CUDA builds). Kept out of cuda_ops.h so that the optimizer does not depend on all ops.
#pragma once

#include "megatron/core/ops/ops.h"

namespace megatron::ops::cuda {

/// ops::adam_step with the gradient multiplied by grad_scale (fp32) as it is read: the same
/// result, bit for bit, as scaling the gradient in place first (Megatron's
/// clip_grad_by_total_norm_fp32 with coefficient grad_scale) and then stepping, without the
/// extra pass over the fp32 gradients. The gradient itself is left unscaled.
void adam_step_scaled(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
                      Tensor* model_param, float grad_scale);

}  // namespace megatron::ops::cuda
