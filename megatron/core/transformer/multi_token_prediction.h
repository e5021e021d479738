// Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 §2.2), Megatron-Core's
// megatron/core/transformer/multi_token_prediction.py: D = --mtp-num-layers sequential
// MultiTokenPredictionLayer modules after the decoder. Module k (0-based) takes the previous
// hidden states h_{k-1} [s, b, h] (h_{-1} = the decoder output after its final_layernorm) and
// the shared embedding of the input ids rolled left k+1 times, and computes
//   x   = eh_proj(concat[enorm(embedding), hnorm(h_{k-1})])     (2h -> h, no bias)
//   h_k = final_layernorm(transformer_layer(x))
// The GPT model (models/gpt/gpt_model.h) owns the shared embedding and output layer, rolls the
// ids / labels / loss mask (roll_tensor below) and computes each module's loss (process_mtp_loss).
#pragma once

#include <memory>
#include <string>

#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/norm.h"
#include "megatron/core/transformer/transformer_layer.h"

namespace megatron::transformer {

/// Megatron's roll_tensor(x, shifts=-1, dims=-1, cp_group): x batch-first [b, s] on the host
/// (int64 or float32) rolled left by one along s with the vacated last position set to 0.
/// With context parallelism (cp_group of size > 1) x holds this rank's two sequence chunks
/// (transformer::get_batch_on_this_cp_rank: global chunks r and 2·CP-1-r, each s/2 long) and
/// the position each chunk vacates receives the first element of the chunk that follows it
/// globally (from the neighbouring CP rank; one all-gather of the 2·b boundary values), the
/// global last position 0. Collective over cp_group (every CP rank calls it in the same order);
/// comm_device = where the group's buffers live (the model's device: an NCCL group needs CUDA).
/// Throws InternalError for another dtype, or an odd local length with CP.
Tensor roll_tensor(const Tensor& x, comm::ProcessGroup* cp_group = nullptr, Device comm_device = Device::cpu());

/// Activations of one MTP module kept for backward.
struct MultiTokenPredictionLayerCtx {
  NormCtx enorm, hnorm, final_layernorm;
  tensor_parallel::LinearCtx eh_proj;
  TransformerLayerCtx transformer_layer;
  // Full recomputation (--recompute-granularity full --recompute-method uniform): only the
  // inputs and the dropout-stream state are kept; backward re-runs the module first.
  bool recompute = false;
  Tensor hidden_in, decoder_in;
  ForwardContext fc;
};

/// One MTP module (Megatron's MultiTokenPredictionLayer with the GPT decoder's layer spec).
/// Parameters, in Megatron's order, under `prefix` = "mtp.layers.<k>": enorm, hnorm (norms of
/// the config's type), eh_proj.weight [h, 2h] (column-parallel: TP-sharded by output rows, init
/// N(0, init_method_std)), transformer_layer.* (the decoder layer's parameters; Megatron's
/// checkpoint key, its module attribute is mtp_model_layer; an MoE layer when the last decoder
/// layer is one, TransformerLayer's mtp_layer_number), final_layernorm.
class MultiTokenPredictionLayer {
 public:
  /// `fp8`: the model's runtime FP8 state when config.fp8 is set (eh_proj and the layer's linears
  /// then run in FP8), else null.
  MultiTokenPredictionLayer(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                            const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// hidden [s', b, h] (the previous module's output, or the decoder's) and decoder_input
  /// [s', b, h] (the shared embedding's output for the rolled ids, same dtype), where s' = s,
  /// or s/TP with --sequence-parallel -> h_k [s', b, h]. fc: the model forward's context (same
  /// attention mask, RoPE positions, CP group; its dropout offsets advance).
  Tensor forward(const Tensor& hidden, const Tensor& decoder_input, ForwardContext& fc,
                 MultiTokenPredictionLayerCtx& ctx) const;
  /// dL/dh_k -> (dL/dhidden, dL/ddecoder_input), both [s', b, h]; accumulates the module's
  /// parameter gradients. ctx is consumed.
  std::pair<Tensor, Tensor> backward(const Tensor& dy, MultiTokenPredictionLayerCtx& ctx) const;
  /// The router of the module's MoE layer (the last decoder layer is an MoE layer), else nullptr.
  moe::TopKRouter* moe_router() const { return transformer_layer_->moe_router(); }

 private:
  Tensor run(const Tensor& hidden, const Tensor& decoder_input, ForwardContext& fc,
             MultiTokenPredictionLayerCtx& ctx) const;
  const TransformerConfig& config_;
  tensor_parallel::TPContext tp_;
  std::shared_ptr<fp8::Fp8State> fp8_;
  std::unique_ptr<Norm> enorm_, hnorm_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> eh_proj_;
  std::unique_ptr<TransformerLayer> transformer_layer_;
  std::unique_ptr<Norm> final_layernorm_;
};

}  // namespace megatron::transformer
