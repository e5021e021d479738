#include "megatron/core/transformer/transformer_layer.h"

namespace megatron::transformer {

Tensor dropout_add(const Tensor& x, const Tensor& residual, float p, ForwardContext& fc, Tensor& mask) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (fc.training && p > 0.0f) {
    mask = Tensor::empty(x.shape(), DType::kUInt8, x.device());
    ops::dropout_forward(x, y, mask, p, fc.seed, fc.next_offset());
  } else {
    mask = Tensor();
    y.copy_(x);
  }
  ops::add_(y, residual);
  return y;
}

Tensor dropout_add_backward(const Tensor& dy, const Tensor& mask, float p) {
  if (!mask.defined()) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  ops::dropout_backward(dy, mask, p, dx);
  return dx;
}

TransformerLayer::TransformerLayer(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                                   const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8,
                                   int64_t mtp_layer_number)
    : config_(config) {
  input_layernorm_ = std::make_unique<Norm>(reg, prefix + ".input_layernorm", config.hidden_size, config);
  self_attention_ = std::make_unique<SelfAttention>(reg, prefix + ".self_attention", config, tp, fp8);
  pre_mlp_layernorm_ = std::make_unique<Norm>(reg, prefix + ".pre_mlp_layernorm", config.hidden_size, config);
  // Megatron's get_gpt_decoder_block_spec: an MoE layer where --moe-layer-freq says so; an MTP
  // layer takes the last decoder layer's spec and records its router losses after the decoder's.
  int64_t layer = -1, router_layer_number = 0;
  if (mtp_layer_number > 0) {
    layer = config.num_layers - 1;
    router_layer_number = config.num_layers + mtp_layer_number;
  } else {
    const std::string last = prefix.substr(prefix.rfind('.') + 1);
    if (!last.empty() && last.find_first_not_of("0123456789") == std::string::npos) layer = std::stoll(last);
    router_layer_number = layer + 1;
  }
  if (layer >= 0 && config.is_moe_layer(layer)) {
    moe_ = std::make_unique<moe::MoELayer>(reg, prefix + ".mlp", config, router_layer_number, tp,
                                           moe::default_moe_groups(tp), fp8);
  } else {
    mlp_ = std::make_unique<MLP>(reg, prefix + ".mlp", config, tp, fp8);
  }
}

namespace {
// norm(x) for the sublayer after it: with FP8 where it applies, straight into the sublayer's first
// linear's FP8 input (*q defined, no bf16 output); otherwise the plain norm output.
template <class Sublayer>
Tensor norm_into(const Norm& norm, const Sublayer& next, const Tensor& x, NormCtx& nctx, fp8::Fp8Input* q) {
  int base = -1;
  if (fp8::Fp8State* st = next.fused_fp8_input(x, &base)) {
    *q = norm.forward_fp8(x, nctx, *st, base);
    if (q->defined()) return Tensor();
  }
  return norm.forward(x, nctx);
}
}  // namespace

Tensor TransformerLayer::forward(const Tensor& x, ForwardContext& fc, TransformerLayerCtx& ctx) const {
  ctx.hidden_dropout = config_.hidden_dropout;
  if (moe_) {
    Tensor attn = self_attention_->forward(input_layernorm_->forward(x, ctx.input_layernorm), fc, ctx.attention);
    Tensor x1 = dropout_add(attn, x, config_.hidden_dropout, fc, ctx.attn_dropout_mask);
    Tensor y = moe_->forward(pre_mlp_layernorm_->forward(x1, ctx.pre_mlp_layernorm), fc, ctx.moe);
    return dropout_add(y, x1, config_.hidden_dropout, fc, ctx.mlp_dropout_mask);
  }
  fp8::Fp8Input ln1q, ln2q;
  auto qp = [](const fp8::Fp8Input& q) { return q.defined() ? &q : nullptr; };
  Tensor ln1 = norm_into(*input_layernorm_, *self_attention_, x, ctx.input_layernorm, &ln1q);
  if (!(fc.training && config_.hidden_dropout > 0.0f)) {
    // No hidden dropout: each residual add goes into the sublayer's last GEMM (its epilogue reads
    // the residual as C) instead of a separate pass over the activation.
    ctx.attn_dropout_mask = Tensor();
    ctx.mlp_dropout_mask = Tensor();
    Tensor x1 = self_attention_->forward(ln1, fc, ctx.attention, &x, qp(ln1q));
    Tensor ln2 = norm_into(*pre_mlp_layernorm_, *mlp_, x1, ctx.pre_mlp_layernorm, &ln2q);
    return mlp_->forward(ln2, ctx.mlp, &x1, qp(ln2q));
  }
  Tensor attn = self_attention_->forward(ln1, fc, ctx.attention, nullptr, qp(ln1q));
  Tensor x1 = dropout_add(attn, x, config_.hidden_dropout, fc, ctx.attn_dropout_mask);
  Tensor ln2 = norm_into(*pre_mlp_layernorm_, *mlp_, x1, ctx.pre_mlp_layernorm, &ln2q);
  Tensor mlp = mlp_->forward(ln2, ctx.mlp, nullptr, qp(ln2q));
  return dropout_add(mlp, x1, config_.hidden_dropout, fc, ctx.mlp_dropout_mask);
}

Tensor TransformerLayer::backward(const Tensor& dy, TransformerLayerCtx& ctx) const {
  // y = x1 + drop(mlp(ln2(x1)))
  Tensor dmlp = dropout_add_backward(dy, ctx.mlp_dropout_mask, ctx.hidden_dropout);
  Tensor dln2 = moe_ ? moe_->backward(dmlp, ctx.moe) : mlp_->backward(dmlp, ctx.mlp);
  Tensor dx1 = pre_mlp_layernorm_->backward(dln2, ctx.pre_mlp_layernorm, &dy);  // + dy (residual)
  // x1 = x + drop(attn(ln1(x)))
  Tensor dattn = dropout_add_backward(dx1, ctx.attn_dropout_mask, ctx.hidden_dropout);
  Tensor dln1 = self_attention_->backward(dattn, ctx.attention);
  Tensor dx = input_layernorm_->backward(dln1, ctx.input_layernorm, &dx1);  // + dx1 (residual)
  return dx;
}

}  // namespace megatron::transformer
