// TransformerLayer (Megatron's megatron/core/transformer/transformer_layer.py), pre-norm:
//   x1 = x  + dropout(self_attention(input_layernorm(x)))
//   y  = x1 + dropout(mlp(pre_mlp_layernorm(x1)))
// with hidden_dropout (Megatron's bias-dropout-add; the bias is added inside the linear layer).
#pragma once

#include <memory>
#include <string>

#include "megatron/core/transformer/attention.h"
#include "megatron/core/transformer/mlp.h"
#include "megatron/core/transformer/moe/moe_layer.h"

namespace megatron::transformer {

struct TransformerLayerCtx {
  NormCtx input_layernorm, pre_mlp_layernorm;
  AttentionCtx attention;
  MLPCtx mlp;
  moe::MoELayerCtx moe;  // MoE layers (--num-experts, --moe-layer-freq)
  Tensor attn_dropout_mask, mlp_dropout_mask;  // undefined when no dropout was applied
  float hidden_dropout = 0.0f;
};

class TransformerLayer {
 public:
  /// prefix = "decoder.layers.<global layer index>" (a decoder layer: MoE where
  /// config.is_moe_layer(index) says so), or with `mtp_layer_number` k >= 1 the transformer layer
  /// of MTP module k (Megatron's is_mtp_layer; prefix "mtp.layers.<k-1>.transformer_layer"): built
  /// from the last decoder layer's spec (gpt_layer_specs.py get_gpt_mtp_block_spec), so an MoE
  /// layer when layer num_layers - 1 is one, whose router records its aux / z losses at layer
  /// num_layers + k of a num_layers + mtp_num_layers tracker (Megatron's router.py).
  /// `fp8`: the model's runtime FP8 state (amax histories, scales; owned by the model, not part
  /// of the config) when config.fp8 is set, else null: the linear layers then run in FP8.
  TransformerLayer(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                   const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr,
                   int64_t mtp_layer_number = 0);
  /// x [s, b, h] -> [s, b, h].
  Tensor forward(const Tensor& x, ForwardContext& fc, TransformerLayerCtx& ctx) const;
  /// dy -> dx; accumulates all parameter gradients.
  Tensor backward(const Tensor& dy, TransformerLayerCtx& ctx) const;
  /// The MoE layer's router, or nullptr for a dense layer.
  moe::TopKRouter* moe_router() const { return moe_ ? &moe_->router() : nullptr; }

 private:
  const TransformerConfig& config_;
  std::unique_ptr<Norm> input_layernorm_;
  std::unique_ptr<SelfAttention> self_attention_;
  std::unique_ptr<Norm> pre_mlp_layernorm_;
  std::unique_ptr<MLP> mlp_;             // dense layers
  std::unique_ptr<moe::MoELayer> moe_;  // MoE layers (TransformerConfig::is_moe_layer)
};

/// y = residual + dropout(x) (training with p > 0: mask written) else residual + x.
Tensor dropout_add(const Tensor& x, const Tensor& residual, float p, ForwardContext& fc, Tensor& mask);
/// Gradient of dropout_add with respect to x (dy passes unchanged to the residual).
Tensor dropout_add_backward(const Tensor& dy, const Tensor& mask, float p);

}  // namespace megatron::transformer
