// Hugging Face checkpoints (config.json + model.safetensors, or model-0000k-of-0000n.safetensors
// with model.safetensors.index.json) for LLaMA, GPT-2 and the mixture-of-experts Mixtral,
// Qwen3-MoE and Qwen2-MoE (docs/models.md, "Hugging Face"): the file layer of convert_checkpoint.
//
// Import: read_hf_config() turns config.json into Megatron's model settings (HFModelSpec, field
// names as TransformerConfig / the flags); HFWeights reads the tensors; hf_to_megatron() maps them
// to Megatron parameter names with per-layer indices ("decoder.layers.{i}.self_attention.linear_qkv.weight",
// local-spec names) and Megatron layouts. Export: megatron_to_hf() and save_hf_checkpoint().
// Anything we cannot represent exactly is a UserError naming the config key or tensor: never a
// silently different model.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "megatron/core/tensor/tensor.h"

namespace megatron::dist_checkpointing {
class SafetensorsReader;
}

namespace megatron::hf {

/// Model settings read from config.json, named like Megatron's TransformerConfig / flags.
struct HFModelSpec {
  std::string model_type;                 // "llama" | "gpt2" | "mixtral" | "qwen3_moe" | "qwen2_moe"
  int64_t num_layers = 0;                 // --num-layers
  int64_t hidden_size = 0;                // --hidden-size
  int64_t ffn_hidden_size = 0;            // --ffn-hidden-size
  int64_t num_attention_heads = 0;        // --num-attention-heads
  int64_t num_query_groups = 0;           // --num-query-groups (= heads without GQA)
  int64_t kv_channels = 0;                // --kv-channels (head dim)
  int64_t max_position_embeddings = 0;    // --max-position-embeddings
  int64_t vocab_size = 0;                 // HF vocab (Megatron pads it; see resize_rows)
  std::string normalization;              // "RMSNorm" | "LayerNorm"
  double norm_epsilon = 1e-5;             // --norm-epsilon
  std::string position_embedding_type;    // "rope" | "learned_absolute"
  double rotary_base = 10000.0;           // --rotary-base
  bool use_rope_scaling = false;          // --use-rope-scaling (rope_type "llama3")
  double rope_scaling_factor = 8.0;       // --rope-scaling-factor (llama3 "factor")
  bool swiglu = false;                    // --swiglu
  std::string activation;                 // "silu" (SwiGLU) | "gelu_tanh" (GPT-2 gelu_new) | "gelu" | "relu2" (--squared-relu)
  bool add_bias_linear = false;           // !--disable-bias-linear
  bool add_qkv_bias = false;              // --add-qkv-bias
  bool untie_embeddings_and_output_weights = false;  // --untie-embeddings-and-output-weights
  bool qk_layernorm = false;              // --qk-layernorm (Qwen3-MoE's q_norm / k_norm)
  // Mixture of experts (mixtral, qwen3_moe, qwen2_moe); num_moe_experts 0 = dense.
  int64_t num_moe_experts = 0;            // --num-experts (num_local_experts / num_experts)
  int64_t moe_ffn_hidden_size = 0;        // --moe-ffn-hidden-size (moe_intermediate_size; Mixtral: intermediate_size)
  int64_t moe_router_topk = 0;            // --moe-router-topk (num_experts_per_tok)
  std::vector<int> moe_layer_pattern;     // --moe-layer-freq per layer (1 = MoE); empty = every layer
  bool moe_router_pre_softmax = false;    // --moe-router-pre-softmax (Qwen3-MoE norm_topk_prob = false)
  double moe_aux_loss_coeff = 0.0;        // --moe-aux-loss-coeff (router_aux_loss_coef)
  // Qwen2-MoE's shared expert (shared_expert_intermediate_size) and its sigmoid gate
  // (shared_expert_gate); 0 / false = none.
  int64_t moe_shared_expert_intermediate_size = 0;  // --moe-shared-expert-intermediate-size
  bool moe_shared_expert_gate = false;              // --moe-shared-expert-gate

  bool is_moe() const { return num_moe_experts > 0; }
  /// Whether decoder layer i (0-based) is an MoE layer.
  bool moe_layer(int64_t i) const {
    return is_moe() && (moe_layer_pattern.empty() || moe_layer_pattern.at(static_cast<size_t>(i)) == 1);
  }

  /// --moe-layer-freq's value: "1" (every layer) or the list "[0,1,1]".
  std::string moe_layer_freq() const;
  /// The Megatron flags that describe this model (e.g. {"--num-layers", "32", "--swiglu", ...}).
  std::vector<std::string> megatron_args() const;
};

/// Parses a LLaMA, GPT-2, Mixtral (MixtralForCausalLM), Qwen3-MoE (Qwen3MoeForCausalLM) or
/// Qwen2-MoE (Qwen2MoeForCausalLM) config.json. MoE: num_local_experts / num_experts,
/// num_experts_per_tok, moe_intermediate_size, router_aux_loss_coef, norm_topk_prob (false =
/// --moe-router-pre-softmax), decoder_sparse_step and mlp_only_layers (the --moe-layer-freq
/// pattern); Qwen2-MoE also shared_expert_intermediate_size (a shared expert behind
/// --moe-shared-expert-gate) and qkv_bias (default true: --add-qkv-bias, o_proj without bias).
/// Refused with the key named: a sliding window (use_sliding_window, layer_types other than
/// full_attention), router_jitter_noise != 0, attention_bias in Qwen3-MoE / Qwen2-MoE. Also throws UserError
/// "<path>: <key> ..." for a missing key, an unsupported model_type, rope_scaling / rope_parameters.rope_type other than default or
/// llama3 (llama3 with low_freq_factor != 1, high_freq_factor != 4 or
/// original_max_position_embeddings != 8192, which Megatron's flags cannot express),
/// hidden_act other than silu (LLaMA), attention_bias without mlp_bias, pretraining_tp != 1,
/// GPT-2 activation_function not gelu/gelu_new/relu2, scale_attn_by_inverse_layer_idx, ...
HFModelSpec read_hf_config(const std::string& config_json_path);
/// config.json content for export (the inverse of read_hf_config for the keys it reads).
nlohmann::json hf_config_json(const HFModelSpec& spec);

/// The tensors of a Hugging Face checkpoint directory (memory-mapped).
class HFWeights {
 public:
  /// Opens dir/model.safetensors.index.json (sharded) or dir/model.safetensors. Throws UserError
  /// naming the file when missing/corrupt, or when the index names a missing shard.
  explicit HFWeights(const std::string& dir);
  ~HFWeights();
  bool has(const std::string& name) const;
  /// CPU copy; UserError "<dir>: missing tensor '<name>'" when absent.
  Tensor get(const std::string& name) const;
  std::vector<std::string> names() const;
  /// File holding `name` (for messages).
  std::string file_of(const std::string& name) const;

 private:
  std::string dir_;
  std::map<std::string, std::string> where_;  // tensor -> file name
  std::map<std::string, std::unique_ptr<dist_checkpointing::SafetensorsReader>> files_;
};

/// HF tensors -> Megatron parameter names (global layer indices) and layouts, shapes checked
/// against `spec` (UserError naming the HF tensor, its file, and both shapes). Every HF tensor
/// must be used (known non-parameters such as rotary inv_freq or GPT-2's attn.bias mask are
/// skipped). Embedding/output rows are padded with zeros to padded_vocab_size (>= vocab_size;
/// 0 = no padding). Result in a fixed order (embedding, layers, final norm, output layer).
std::vector<std::pair<std::string, Tensor>> hf_to_megatron(const HFWeights& w, const HFModelSpec& spec,
                                                           int64_t padded_vocab_size = 0);

/// Megatron parameters (names as hf_to_megatron produces; routed experts as
/// "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc{1,2}.weight") -> HF names and layouts; vocab rows are
/// truncated to spec.vocab_size. UserError naming any missing Megatron tensor.
std::vector<std::pair<std::string, Tensor>> megatron_to_hf(const std::map<std::string, Tensor>& params,
                                                           const HFModelSpec& spec);

/// Writes dir/config.json and the weights: one model.safetensors when they fit in
/// max_shard_bytes, else model-0000k-of-0000n.safetensors + model.safetensors.index.json
/// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}), as save_pretrained does.
void save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const HFModelSpec& spec, uint64_t max_shard_bytes = 5ull << 30);

}  // namespace megatron::hf
