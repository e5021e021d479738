// CPU reference: Adam / AdamW steps on fp32 master parameters (Kingma & Ba 2015, Loshchilov &
// Hutter 2019), as Apex/TE FusedAdam with bias correction (op_table.h adam_step). This is what
// CPU training runs (optimizer/optimizer.cpp calls ops::adam_step_multi).
#include <cmath>

#include "megatron/core/ops/cpu/cpu_ops.h"
#include "megatron/core/ops/cpu/cpu_util.h"

namespace megatron::ops::cpu {

void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
               Tensor* model_param) {
  const int64_t n = param.numel();
  MEGATRON_CHECK(param.is_cpu() && param.dtype() == DType::kFloat32 && exp_avg.dtype() == DType::kFloat32 &&
                 exp_avg_sq.dtype() == DType::kFloat32 && grad.numel() == n && exp_avg.numel() == n &&
                 exp_avg_sq.numel() == n && (!model_param || model_param->numel() == n))
      << "adam_step param " << param.str() << " grad " << grad.str() << " exp_avg " << exp_avg.str();
  FloatIn g(grad);
  float *w = param.data<float>(), *m = exp_avg.data<float>(), *v = exp_avg_sq.data<float>();
  // Bias corrections: b^t in fp64, rounded to fp32, then 1 - b^t in fp32 -- what CPU training
  // has always computed (pinned by the refactor invariant). The CUDA kernels round 1 - b^t once
  // from fp64 instead; the two can differ in the last bit of the correction (op_table.h).
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step)));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step)));
  const float gscale = p.grad_scale;
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (gscale != 1.0f) gi *= gscale;  // the clip coefficient, the same fp32 product as scale_
    if (!p.decoupled) gi += p.weight_decay * w[i];
    m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * gi;
    v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * gi * gi;
    float update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + p.eps);
    if (p.decoupled) update += p.weight_decay * w[i];
    w[i] -= p.lr * update;
  }
  if (model_param) cast(param, *model_param);
}

void adam_step_multi(const std::vector<AdamTensor>& ts, const AdamParams& p) {
  for (const auto& t : ts) cpu::adam_step(*t.param, *t.grad, *t.exp_avg, *t.exp_avg_sq, t.params(p), t.model_param);
}

}  // namespace megatron::ops::cpu
