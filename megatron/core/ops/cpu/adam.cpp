// CPU reference: one Adam / AdamW step on fp32 master parameters (docs/megatron-reference.md#adam;
// Kingma & Ba 2015, Loshchilov & Hutter 2019), as Apex/TE FusedAdam with bias correction.
#include <cmath>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
               Tensor* model_param) {
  const int64_t n = param.numel();
  MEGATRON_CHECK(param.dtype() == DType::kFloat32 && exp_avg.dtype() == DType::kFloat32 &&
                 exp_avg_sq.dtype() == DType::kFloat32 && grad.numel() == n && exp_avg.numel() == n &&
                 exp_avg_sq.numel() == n && (!model_param || model_param->numel() == n))
      << "adam_step param " << param.str() << " grad " << grad.str() << " exp_avg " << exp_avg.str();
  FloatIn g(grad);
  float *w = param.data<float>(), *m = exp_avg.data<float>(), *v = exp_avg_sq.data<float>();
  const float bc1 = 1.0f - std::pow(p.beta1, static_cast<float>(p.step));
  const float bc2 = 1.0f - std::pow(p.beta2, static_cast<float>(p.step));
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (!p.decoupled) gi += p.weight_decay * w[i];
    m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    const float update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + p.eps);
    w[i] -= p.lr * (p.decoupled ? update + p.weight_decay * w[i] : update);
  }
  if (model_param) cast(param, *model_param);
}

}  // namespace megatron::ops::cpu
