// TransformerBlock (Megatron's megatron/core/transformer/transformer_block.py): the decoder's
// layers followed by final_layernorm (on the last pipeline stage).
#pragma once

#include <functional>

#include <memory>
#include <vector>

#include "megatron/core/transformer/transformer_layer.h"

namespace megatron::transformer {

/// A run of layers whose activations are dropped in forward and rebuilt in backward from the
/// saved input and dropout-stream state (full activation recomputation).
struct RecomputeChunk {
  size_t begin = 0, end = 0;  // local layer indices [begin, end)
  Tensor input;
  ForwardContext fc;  // as at the chunk's start (replays the same dropout masks)
};

struct TransformerBlockCtx {
  std::vector<TransformerLayerCtx> layers;
  std::vector<RecomputeChunk> chunks;  // full recomputation only
  NormCtx final_layernorm;
};

class TransformerBlock {
 public:
  /// Layers [layer_offset, layer_offset + num_local_layers) named "decoder.layers.<global i>";
  /// final_layernorm only when post_process.
  /// `fp8`: the model's runtime FP8 state (amax histories, scales; owned by the model, not part
  /// of the config) when config.fp8 is set, else null: the linear layers then run in FP8.
  TransformerBlock(ParamRegistry& reg, const TransformerConfig& config, const tensor_parallel::TPContext& tp,
                   int64_t layer_offset, int64_t num_local_layers, bool post_process,
                   std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// `before_layer` (optional) is called with the local layer index before that layer's forward
  /// first reads its parameters, and with num_layers() before final_layernorm (Megatron's
  /// forward pre-hooks; the overlapped optimizer step waits there for the layer's update). Not
  /// called again by the recomputation replay in backward.
  Tensor forward(const Tensor& x, ForwardContext& fc, TransformerBlockCtx& ctx,
                 const std::function<void(size_t)>& before_layer = nullptr) const;
  /// `layer_done` (optional) is called with the local layer index as soon as that layer's
  /// parameter gradients are complete (for --overlap-grad-reduce), last layer first.
  Tensor backward(const Tensor& dy, TransformerBlockCtx& ctx,
                  const std::function<void(size_t)>& layer_done = nullptr) const;
  size_t num_layers() const { return layers_.size(); }
  /// The routers of this block's MoE layers, in layer order (empty for a dense model).
  std::vector<moe::TopKRouter*> moe_routers() const {
    std::vector<moe::TopKRouter*> out;
    for (const auto& l : layers_)
      if (moe::TopKRouter* r = l->moe_router()) out.push_back(r);
    return out;
  }

 private:
  /// Layer ranges [begin, end) that are recomputed, per the config's recompute settings.
  std::vector<std::pair<size_t, size_t>> recompute_ranges() const;
  const TransformerConfig& config_;
  std::shared_ptr<fp8::Fp8State> fp8_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;
  std::unique_ptr<Norm> final_layernorm_;
};

}  // namespace megatron::transformer
