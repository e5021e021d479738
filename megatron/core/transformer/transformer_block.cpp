#include "megatron/core/transformer/transformer_block.h"

namespace megatron::transformer {

TransformerBlock::TransformerBlock(ParamRegistry& reg, const TransformerConfig& config,
                                   const tensor_parallel::TPContext& tp, int64_t layer_offset,
                                   int64_t num_local_layers, bool post_process) {
  for (int64_t i = 0; i < num_local_layers; ++i)
    layers_.push_back(std::make_unique<TransformerLayer>(
        reg, "decoder.layers." + std::to_string(layer_offset + i), config, tp));
  if (post_process) final_layernorm_ = std::make_unique<Norm>(reg, "decoder.final_layernorm", config.hidden_size, config);
}

Tensor TransformerBlock::forward(const Tensor& x, ForwardContext& fc, TransformerBlockCtx& ctx) const {
  ctx.layers.resize(layers_.size());
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) h = layers_[i]->forward(h, fc, ctx.layers[i]);
  if (final_layernorm_) h = final_layernorm_->forward(h, ctx.final_layernorm);
  return h;
}

Tensor TransformerBlock::backward(const Tensor& dy, TransformerBlockCtx& ctx) const {
  Tensor d = final_layernorm_ ? final_layernorm_->backward(dy, ctx.final_layernorm) : dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    d = layers_[i]->backward(d, ctx.layers[i]);
    ctx.layers[i] = {};  // release activations as soon as they are used
  }
  return d;
}

}  // namespace megatron::transformer
