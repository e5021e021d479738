#include "megatron/core/transformer/transformer_block.h"

#include <algorithm>

#include "megatron/core/fp8/fp8_state.h"

namespace megatron::transformer {

TransformerBlock::TransformerBlock(ParamRegistry& reg, const TransformerConfig& config,
                                   const tensor_parallel::TPContext& tp, int64_t layer_offset,
                                   int64_t num_local_layers, bool post_process, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config), fp8_(std::move(fp8)) {
  for (int64_t i = 0; i < num_local_layers; ++i)
    layers_.push_back(std::make_unique<TransformerLayer>(
        reg, "decoder.layers." + std::to_string(layer_offset + i), config, tp, fp8_));
  if (post_process) final_layernorm_ = std::make_unique<Norm>(reg, "decoder.final_layernorm", config.hidden_size, config);
}

std::vector<std::pair<size_t, size_t>> TransformerBlock::recompute_ranges() const {
  std::vector<std::pair<size_t, size_t>> r;
  if (config_.recompute_granularity != RecomputeGranularity::kFull) return r;
  const size_t n = layers_.size(), k = static_cast<size_t>(config_.recompute_num_layers);
  if (config_.recompute_method == RecomputeMethod::kUniform) {
    for (size_t b = 0; b < n; b += k) r.emplace_back(b, std::min(n, b + k));  // chunks of k layers
  } else {
    for (size_t b = 0; b < std::min(n, k); ++b) r.emplace_back(b, b + 1);  // first k layers
  }
  return r;
}

Tensor TransformerBlock::forward(const Tensor& x, ForwardContext& fc, TransformerBlockCtx& ctx,
                                 const std::function<void(size_t)>& before_layer) const {
  ctx.layers.assign(layers_.size(), TransformerLayerCtx{});
  ctx.chunks.clear();
  const auto ranges = recompute_ranges();
  Tensor h = x;
  size_t next = 0;
  auto layer_forward = [&](size_t i) {
    if (before_layer) before_layer(i);
    return layers_[i]->forward(h, fc, ctx.layers[i]);
  };
  for (const auto& [b, e] : ranges) {
    for (; next < b; ++next) h = layer_forward(next);
    RecomputeChunk chunk{b, e, h, fc};
    // As Megatron's CheckpointFunction.forward: no autograd state (grad_enabled false) now, the
    // replay in backward runs with the saved context (grad_enabled as the caller's).
    const bool grad_enabled = fc.grad_enabled;
    fc.grad_enabled = false;
    for (; next < e; ++next) {
      h = layer_forward(next);
      ctx.layers[next] = {};  // dropped; rebuilt in backward
    }
    fc.grad_enabled = grad_enabled;
    ctx.chunks.push_back(std::move(chunk));
  }
  for (; next < layers_.size(); ++next) h = layer_forward(next);
  if (final_layernorm_) {
    if (before_layer) before_layer(layers_.size());
    h = final_layernorm_->forward(h, ctx.final_layernorm);
  }
  return h;
}

Tensor TransformerBlock::backward(const Tensor& dy, TransformerBlockCtx& ctx,
                                  const std::function<void(size_t)>& layer_done) const {
  Tensor d = final_layernorm_ ? final_layernorm_->backward(dy, ctx.final_layernorm) : dy;
  size_t chunk = ctx.chunks.size();
  for (size_t i = layers_.size(); i-- > 0;) {
    if (chunk > 0 && i + 1 == ctx.chunks[chunk - 1].end) {
      // Re-run the chunk's forward from its saved input with the same dropout streams. The
      // collectives of the forward (TP/SP gathers, CP ring exchanges) run again, in the same
      // order on every rank of the group. FP8: the scales cannot have changed since the
      // original forward (they are updated once per step, after every backward), so the
      // replay quantizes identically; like Transformer Engine's recompute phase it records no
      // amax (the original forward already did) and reuses the step's cached weight casts.
      RecomputeChunk& c = ctx.chunks[--chunk];
      fp8::ScopedNoAmaxRecording no_amax(fp8_.get());
      Tensor h = c.input;
      for (size_t j = c.begin; j < c.end; ++j) h = layers_[j]->forward(h, c.fc, ctx.layers[j]);
      c.input = Tensor();
    }
    d = layers_[i]->backward(d, ctx.layers[i]);
    ctx.layers[i] = {};  // release activations as soon as they are used
    if (layer_done) layer_done(i);
  }
  return d;
}

}  // namespace megatron::transformer
