#include "megatron/training/hf/hf_model.h"

#include "megatron/core/utils/errors.h"
#include "megatron/core/dist_checkpointing/serialization.h"
#include "megatron/training/checkpointing.h"

namespace megatron::hf {

transformer::TransformerConfig transformer_config_from_hf(const HFModelSpec& s) {
  transformer::TransformerConfig c;
  c.num_layers = s.num_layers;
  c.hidden_size = s.hidden_size;
  c.ffn_hidden_size = s.ffn_hidden_size;
  c.num_attention_heads = s.num_attention_heads;
  c.num_query_groups = s.num_query_groups;
  c.kv_channels = s.kv_channels;
  c.hidden_dropout = 0.0f;
  c.attention_dropout = 0.0f;
  c.normalization = s.normalization == "RMSNorm" ? transformer::Normalization::kRMSNorm : transformer::Normalization::kLayerNorm;
  c.layernorm_epsilon = static_cast<float>(s.norm_epsilon);
  c.gated_linear_unit = s.swiglu;
  c.add_bias_linear = s.add_bias_linear;
  c.add_qkv_bias = s.add_qkv_bias;
  c.bias_activation_fusion = s.activation == "gelu_tanh";
  c.squared_relu = s.activation == "relu2";
  c.position_embedding_type =
      s.position_embedding_type == "rope" ? transformer::PositionEmbeddingType::kRope : transformer::PositionEmbeddingType::kLearnedAbsolute;
  c.rotary_base = static_cast<float>(s.rotary_base);
  c.rope_scaling = s.use_rope_scaling;
  c.rope_scaling_factor = static_cast<float>(s.rope_scaling_factor);
  c.share_embeddings_and_output_weights = !s.untie_embeddings_and_output_weights;
  c.qk_layernorm = s.qk_layernorm;
  if (s.is_moe()) {
    c.num_moe_experts = s.num_moe_experts;
    c.moe_ffn_hidden_size = s.moe_ffn_hidden_size;
    c.moe_router_topk = s.moe_router_topk;
    c.moe_layer_pattern = s.moe_layer_pattern;
    // --moe-layer-freq as a list: Megatron's non_homogeneous_layers (per-layer checkpoint keys).
    c.moe_non_homogeneous_layers = !s.moe_layer_pattern.empty();
    c.moe_router_pre_softmax = s.moe_router_pre_softmax;
    c.moe_router_load_balancing_type = {"aux_loss"};
    c.moe_aux_loss_coeff = {s.moe_aux_loss_coeff};
    c.moe_shared_expert_intermediate_size = s.moe_shared_expert_intermediate_size;
    c.moe_shared_expert_gate = s.moe_shared_expert_gate;
  }
  return c;
}

void load_into_model(models::gpt::GPTModel& model, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  // Save-free path: describe the full tensors as whole ShardedTensors and let the resharding
  // copier cut each parameter's TP piece (same code as checkpoint loading).
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [n, t] : tensors) by_name[n] = &t;
  const int64_t L = model.config().num_layers;
  for (auto& p : model.parameters()) {
    if (p.shared) continue;
    auto it = by_name.find(p.name);
    if (it == by_name.end()) user_error("HF import: no tensor for model parameter '", p.name, "'");
    const Tensor& full = *it->second;
    if (full.shape() != Shape(p.global_shape.begin(), p.global_shape.end()))
      user_error("HF import: '", p.name, "' has shape ", shape_str(full.shape()), ", the model expects ",
                 shape_str(Shape(p.global_shape.begin(), p.global_shape.end())));
    for (auto& piece : training::parameter_sharded_tensors(p, L)) {
      // piece box: drop the leading checkpoint-only axes for the copy (the stacked layer axis
      // and a routed expert's expert axis, each of local size 1)
      const size_t extra = piece.global_shape.size() - full.shape().size();
      for (size_t k = 0; k < extra; ++k)
        MEGATRON_CHECK(piece.local_shape[k] == 1) << p.name << ": checkpoint axis " << k << " of local size " << piece.local_shape[k];
      Shape go(piece.global_offset.begin() + extra, piece.global_offset.end());
      Shape ls(piece.local_shape.begin() + extra, piece.local_shape.end());
      Tensor src = full.to(piece.data.dtype());
      Tensor dst = piece.data.is_cpu() ? piece.data : Tensor::empty(piece.data.shape(), piece.data.dtype());
      const int64_t n = dist_checkpointing::copy_box_overlap(
          static_cast<const uint8_t*>(src.data_ptr()), src.dtype(), Shape(go.size(), 0), full.shape(), 0, full.numel(),
          static_cast<uint8_t*>(dst.data_ptr()), dst.dtype(), go, ls, 0, shape_numel(ls));
      MEGATRON_CHECK(n == shape_numel(ls)) << p.name << ": copied " << n << " of " << shape_numel(ls);
      if (!piece.data.is_cpu()) piece.data.copy_(dst);
    }
  }
}

}  // namespace megatron::hf
