#include "megatron/core/transformer/norm.h"

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/ops/ops.h"

namespace megatron::transformer {

namespace {
ParamRef add_norm_param(ParamRegistry& reg, const std::string& name, int64_t hidden, InitKind init,
                        bool sequence_parallel) {
  Parameter p;
  p.name = name;
  p.global_shape = {hidden};
  p.no_weight_decay = true;
  p.init = init;
  p.sequence_parallel = sequence_parallel;
  return ParamRef(&reg, reg.add(std::move(p), {hidden}));
}
}  // namespace

Norm::Norm(ParamRegistry& reg, const std::string& prefix, int64_t hidden, const TransformerConfig& config,
           bool sequence_sharded_input)
    : rms_(config.normalization == Normalization::kRMSNorm),
      zero_centered_(config.layernorm_zero_centered_gamma),
      eps_(config.layernorm_epsilon) {
  const bool sp = sequence_sharded_input && config.sequence_parallel && config.tensor_model_parallel_size > 1;
  weight_ = add_norm_param(reg, prefix + ".weight", hidden, zero_centered_ ? InitKind::kZeros : InitKind::kOnes, sp);
  if (!rms_) bias_ = add_norm_param(reg, prefix + ".bias", hidden, InitKind::kZeros, sp);
}

Tensor Norm::forward(const Tensor& x, NormCtx& ctx) const {
  const int64_t rows = x.numel() / x.size(-1);
  ctx.input = x;
  ctx.rstd = Tensor::empty({rows}, DType::kFloat32, x.device());
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (rms_) {
    ops::rmsnorm_forward(x, weight_.data(), eps_, zero_centered_, y, ctx.rstd);
  } else {
    ctx.mean = Tensor::empty({rows}, DType::kFloat32, x.device());
    ops::layernorm_forward(x, weight_.data(), bias_.data(), eps_, zero_centered_, y, ctx.mean, ctx.rstd);
  }
  return y;
}

fp8::Fp8Input Norm::forward_fp8(const Tensor& x, NormCtx& ctx, fp8::Fp8State& st, int base) const {
  if (!rms_) return {};
  const int64_t rows = x.numel() / x.size(-1);
  Tensor rstd = Tensor::empty({rows}, DType::kFloat32, x.device());
  fp8::Fp8Input q = fp8::rmsnorm_fp8(st, base, x, weight_.data(), eps_, zero_centered_, rstd);
  if (!q.defined()) return {};
  ctx.input = x;
  ctx.rstd = rstd;
  return q;
}

Tensor Norm::backward(const Tensor& dy, const NormCtx& ctx, const Tensor* dresidual) const {
  Tensor dx = Tensor::empty(ctx.input.shape(), dy.dtype(), dy.device());
  if (dresidual) {
    // The residual branch's gradient added to dx (inside the norm's backward pass where the
    // backend fuses it).
    if (rms_) {
      ops::rmsnorm_backward_residual(dy, ctx.input, weight_.data(), ctx.rstd, zero_centered_, *dresidual, dx,
                                     weight_.grad(), true);
    } else {
      ops::layernorm_backward_residual(dy, ctx.input, weight_.data(), ctx.mean, ctx.rstd, zero_centered_, *dresidual,
                                       dx, weight_.grad(), bias_.grad(), true);
    }
    return dx;
  }
  if (rms_) {
    ops::rmsnorm_backward(dy, ctx.input, weight_.data(), ctx.rstd, zero_centered_, dx, weight_.grad(), true);
  } else {
    ops::layernorm_backward(dy, ctx.input, weight_.data(), ctx.mean, ctx.rstd, zero_centered_, dx, weight_.grad(),
                            bias_.grad(), true);
  }
  return dx;
}

}  // namespace megatron::transformer
