#include "megatron/core/transformer/mlp.h"

#include <cmath>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/ops/ops.h"

namespace megatron::transformer {

MLP::MLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
         const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config) {
  const float out_std = config.init_method_std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  linear_fc1_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
      reg, prefix + ".linear_fc1", config.hidden_size, config.fc1_output_size(), config.add_bias_linear,
      config.init_method_std, tp, config.gated_linear_unit ? 2 : 1);
  linear_fc2_ = std::make_unique<tensor_parallel::RowParallelLinear>(
      reg, prefix + ".linear_fc2", config.ffn_hidden_size, config.hidden_size, config.add_bias_linear, out_std, tp);
  if (fp8) {
    linear_fc1_->enable_fp8(fp8, prefix + ".linear_fc1");
    linear_fc2_->enable_fp8(fp8, prefix + ".linear_fc2");
  }
}

Tensor MLP::forward(const Tensor& x, MLPCtx& ctx, const Tensor* residual, const fp8::Fp8Input* xq) const {
  MEGATRON_CHECK(!xq || config_.gated_linear_unit) << "MLP::forward: a pre-quantized input needs SwiGLU";
  auto fc2 = [&](const Tensor& act) {
    return residual ? linear_fc2_->forward_add(act, ctx.fc2, *residual) : linear_fc2_->forward(act, ctx.fc2);
  };
  if (!config_.gated_linear_unit && config_.gelu_tanh()) {
    // fc1 + bias + tanh GeLU, fused into the GEMM's epilogue where the backend can.
    Tensor act;
    ctx.fc1_out = linear_fc1_->forward_bias_gelu(x, ctx.fc1, act);
    return fc2(act);
  }
  ctx.fc1_out = xq ? linear_fc1_->forward_fp8(*xq, ctx.fc1) : linear_fc1_->forward(x, ctx.fc1);
  if (config_.gated_linear_unit) {
    // FP8: SwiGLU writes fc2's FP8 input (and its transpose) instead of a bf16 activation.
    int base = -1;
    if (fp8::Fp8State* st = linear_fc2_->fused_fp8_input(ctx.fc1_out, &base)) {
      const fp8::Fp8Input aq = fp8::swiglu_fp8(*st, base, ctx.fc1_out);
      if (aq.defined()) return linear_fc2_->forward_fp8(aq, ctx.fc2, residual);
    }
  }
  Shape s = ctx.fc1_out.shape();
  if (config_.gated_linear_unit) s.back() /= 2;
  Tensor act = Tensor::empty(s, ctx.fc1_out.dtype(), ctx.fc1_out.device());
  if (config_.gated_linear_unit) {
    ops::swiglu_forward(ctx.fc1_out, act);
  } else if (config_.squared_relu) {
    ops::squared_relu_forward(ctx.fc1_out, act);
  } else {
    ops::gelu_forward(ctx.fc1_out, act, config_.gelu_tanh());
  }
  return fc2(act);
}

Tensor MLP::backward(const Tensor& dy, MLPCtx& ctx) const {
  if (!config_.gated_linear_unit && config_.gelu_tanh()) {
    // fc2's dgrad GEMM also applies the GeLU backward and yields fc1's bias gradient.
    bool fc1_bias_done = false;
    Tensor dfc1 = linear_fc2_->backward_dgelu(dy, ctx.fc2, ctx.fc1_out, linear_fc1_->bias_grad(), &fc1_bias_done);
    return linear_fc1_->backward(dfc1, ctx.fc1, true, fc1_bias_done);
  }
  Tensor dact = linear_fc2_->backward(dy, ctx.fc2, true);
  if (config_.gated_linear_unit) {
    // FP8: the SwiGLU backward writes fc1's FP8 output gradient (and its transpose) directly.
    int base = -1;
    if (fp8::Fp8State* st = linear_fc1_->fused_fp8_input(ctx.fc1_out, &base)) {
      const fp8::Fp8Input gq = fp8::swiglu_backward_fp8(*st, base, dact, ctx.fc1_out);
      if (gq.defined()) return linear_fc1_->backward_fp8(gq, ctx.fc1, true);
    }
  }
  Tensor dfc1 = Tensor::empty(ctx.fc1_out.shape(), dy.dtype(), dy.device());
  if (config_.gated_linear_unit) {
    ops::swiglu_backward(dact, ctx.fc1_out, dfc1);
  } else if (config_.squared_relu) {
    ops::squared_relu_backward(dact, ctx.fc1_out, dfc1);
  } else {
    ops::gelu_backward(dact, ctx.fc1_out, dfc1, config_.gelu_tanh());
  }
  return linear_fc1_->backward(dfc1, ctx.fc1, true);
}

}  // namespace megatron::transformer
