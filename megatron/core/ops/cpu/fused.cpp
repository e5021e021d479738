// CPU reference of the fused ops of the op table (op_table.h). The CPU backend fuses nothing:
// the bool ops answer "not fused here" (false, nothing written) and the caller composes the
// documented fallback from other ops; the void ones compose those ops themselves, in the order
// the op's documentation gives, so CPU results do not depend on which form a caller uses.
#include "megatron/core/ops/cpu/cpu_ops.h"

namespace megatron::ops::cpu {

bool linear_forward_residual(const Tensor&, const Tensor&, const Tensor*, const Tensor&, Tensor&) { return false; }

bool linear_bias_gelu_forward(const Tensor&, const Tensor&, const Tensor&, Tensor&, Tensor&) { return false; }

bool gelu_backward_bgrad(const Tensor&, const Tensor&, Tensor&, Tensor*, bool) { return false; }

void layernorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                 const Tensor& rstd, bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx,
                                 Tensor& dgamma, Tensor& dbeta, bool accumulate) {
  layernorm_backward(dy, x, gamma, mean, rstd, zero_centered_gamma, dx, dgamma, dbeta, accumulate);
  add_(dx, dresidual, 1.0f);
}

void rmsnorm_backward_residual(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                               bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx, Tensor& dgamma,
                               bool accumulate) {
  rmsnorm_backward(dy, x, gamma, rstd, zero_centered_gamma, dx, dgamma, accumulate);
  add_(dx, dresidual, 1.0f);
}

void rmsnorm_rstd(const Tensor& x, const Tensor& gamma, float eps, Tensor& rstd) {
  Tensor y = Tensor::empty(x.shape(), DType::kFloat32);  // the normalized rows are not needed
  rmsnorm_forward(x, gamma, eps, /*zero_centered_gamma=*/false, y, rstd);
}

bool attention_forward_packed_qkv(const Tensor&, int64_t, const AttentionParams&, Tensor&, Tensor&) { return false; }

bool attention_backward_packed_qkv(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&,
                                   const AttentionParams&, Tensor&) {
  return false;
}

bool normal_init(Tensor&, const NormalInitSpec&) { return false; }

}  // namespace megatron::ops::cpu
