// TransformerConfig: the architecture of a GPT/LLaMA decoder, with Megatron-Core's field names
// and defaults (megatron/core/transformer/transformer_config.py, ModelParallelConfig).
// training/arguments maps Megatron's flags onto these fields (e.g. --swiglu -> gated_linear_unit,
// --disable-bias-linear -> add_bias_linear=false, --apply-layernorm-1p ->
// layernorm_zero_centered_gamma, --untie-embeddings-and-output-weights ->
// share_embeddings_and_output_weights=false, --norm-epsilon -> layernorm_epsilon).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "megatron/core/fp8/fp8_config.h"
#include "megatron/core/tensor/dtype.h"

namespace megatron::transformer {

enum class Normalization { kLayerNorm, kRMSNorm };
enum class PositionEmbeddingType { kLearnedAbsolute, kRope, kNone };
/// --recompute-granularity: none, full (re-run whole layers in backward), selective (core
/// attention only; our attention kernels already keep only the log-sum-exp, so selective
/// recomputation is what they always do).
enum class RecomputeGranularity { kNone, kFull, kSelective };
/// --recompute-method: uniform (checkpoint every recompute_num_layers-layer chunk) or block
/// (recompute the first recompute_num_layers layers of the stage, one by one).
enum class RecomputeMethod { kNone, kUniform, kBlock };

/// "LayerNorm"/"RMSNorm" and "learned_absolute"/"rope"/"none" (Megatron's spellings);
/// parse_* throw UserError naming the field and the accepted values.
const char* normalization_name(Normalization n);
Normalization parse_normalization(const std::string& s);
const char* position_embedding_type_name(PositionEmbeddingType t);
PositionEmbeddingType parse_position_embedding_type(const std::string& s);

struct TransformerConfig {
  // ---- model shape ----
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  /// 0 = derive: 4 * hidden_size (Megatron's default, also with --swiglu unless given).
  int64_t ffn_hidden_size = 0;
  int64_t num_attention_heads = 0;
  /// Per-head channels; 0 = hidden_size / num_attention_heads.
  int64_t kv_channels = 0;
  /// Number of K/V heads (--group-query-attention --num-query-groups); 0 = num_attention_heads.
  int64_t num_query_groups = 0;

  // ---- regularization / init ----
  float hidden_dropout = 0.1f;
  float attention_dropout = 0.1f;
  float init_method_std = 0.02f;
  /// --init-method-xavier-uniform is not supported; output projections (linear_proj,
  /// linear_fc2) use init_method_std / sqrt(2 * num_layers) (Megatron's scaled_init_method).

  // ---- normalization ----
  Normalization normalization = Normalization::kLayerNorm;
  float layernorm_epsilon = 1e-5f;
  /// --apply-layernorm-1p: weights stored zero-centred (init 0), applied as 1 + w.
  bool layernorm_zero_centered_gamma = false;
  /// --qk-layernorm: normalize each query/key head (same norm type) before RoPE.
  bool qk_layernorm = false;

  // ---- MLP / linear layers ----
  /// --swiglu: fc1 produces [gate; up] (2 * ffn_hidden_size rows), activation silu(gate) * up.
  bool gated_linear_unit = false;
  /// --squared-relu: the MLP activation is relu(x)^2 (Megatron's activation_func = squared_relu)
  /// instead of GeLU; not with gated_linear_unit, never fused with the bias.
  bool squared_relu = false;
  /// false with --disable-bias-linear (no bias in any linear layer).
  bool add_bias_linear = true;
  /// --add-qkv-bias: bias in linear_qkv even when add_bias_linear is false.
  bool add_qkv_bias = false;
  /// Megatron's bias_activation_fusion (pretrain_gpt sets it true unless --no-bias-gelu-fusion).
  /// For GeLU with a bias it selects the tanh approximation (Megatron's fused bias_gelu); the
  /// exact erf GeLU otherwise (as the local spec of run_simple_mcore_train_loop). Megatron
  /// disables the fusion when there is no bias.
  bool bias_activation_fusion = false;

  // ---- positions ----
  PositionEmbeddingType position_embedding_type = PositionEmbeddingType::kLearnedAbsolute;
  float rotary_base = 10000.0f;
  float rotary_percent = 1.0f;
  bool rotary_interleaved = false;
  /// Llama-3.1 RoPE frequency scaling (Megatron's GPTModel rope_scaling / rope_scaling_factor,
  /// --use-rope-scaling / --rope-scaling-factor; RotaryEmbedding._apply_scaling with
  /// low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192).
  bool rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  /// GPTModel seq_len_interpolation_factor (--rotary-seq-len-interpolation-factor): RoPE positions
  /// are multiplied by 1 / factor. 0 = None (positions as they are).
  double seq_len_interpolation_factor = 0.0;

  // ---- embeddings ----
  /// false with --untie-embeddings-and-output-weights.
  bool share_embeddings_and_output_weights = true;

  // ---- multi-token prediction (transformer/multi_token_prediction.h) ----
  /// --mtp-num-layers: D sequential MTP modules after the decoder (0 = none, Megatron's None).
  int64_t mtp_num_layers = 0;
  /// --mtp-loss-scaling-factor: the MTP losses' mean over the D modules is scaled by this
  /// before it joins the gradient (Megatron's default 0.1).
  float mtp_loss_scaling_factor = 0.1f;
  /// --calculate-per-token-loss (Megatron's TransformerConfig field): the MTP loss gradient keeps
  /// the token-sum scale the main loss has then (process_mtp_loss), and the MoE aux losses are
  /// scaled by the local token count (attach_and_log_load_balancing_loss).
  bool calculate_per_token_loss = false;

  // ---- activation recomputation (Megatron's --recompute-*) ----
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kNone;
  int64_t recompute_num_layers = 0;
  /// --recompute-modules (Megatron's recompute_modules), read with kSelective only: "moe"
  /// checkpoints each MoELayer, "shared_experts" its shared expert (moe/moe_layer.h), "moe_act"
  /// the grouped experts' activation (moe/experts.h); "core_attn" is what our attention always
  /// does; pretrain_gpt refuses the others.
  std::vector<std::string> recompute_modules;

  // ---- precision ----
  /// Model parameters and activations (--bf16 / --fp16 select bfloat16 / float16).
  DType params_dtype = DType::kFloat32;
  /// Dtype of the main gradients (fp32; bfloat16 with --grad-reduce-in-bf16).
  DType main_grads_dtype = DType::kFloat32;

  // ---- FP8 (docs/megatron-reference.md#fp8-delayed-scaling) ----
  /// Megatron's `fp8` (--fp8-format) with the recipe flags; nullopt = no FP8 GEMMs. The QKV,
  /// attention-output, fc1 and fc2 GEMMs then run in FP8 (fp8/fp8_linear.h). The runtime FP8
  /// state (amax histories, scales) is not configuration: GPTModel owns it (GPTModel::fp8_state).
  std::optional<fp8::Fp8Config> fp8;

  // ---- Mixture of Experts (Megatron-Core's MoE fields; docs/moe.md) ----
  /// --num-experts (Megatron's num_moe_experts); nullopt = dense model (no MoE layer).
  std::optional<int64_t> num_moe_experts;
  /// --moe-ffn-hidden-size: each routed expert's FFN size; 0 = ffn_hidden_size.
  int64_t moe_ffn_hidden_size = 0;
  /// --moe-layer-freq as a per-layer pattern (1 = MoE layer, 0 = dense MLP), num_layers long;
  /// empty = every layer is an MoE layer (Megatron's default 1). See moe/moe_config.h.
  std::vector<int> moe_layer_pattern;
  /// --moe-layer-freq was a list or an integer > 1: Megatron's TransformerBlock then keys its
  /// layers per layer in checkpoints (non_homogeneous_layers; Parameter::stack_layers false).
  bool moe_non_homogeneous_layers = false;
  /// --moe-shared-expert-intermediate-size (0 = no shared expert): FFN size of the shared experts
  /// together (Megatron's SharedExpertMLP, one MLP of this size).
  int64_t moe_shared_expert_intermediate_size = 0;
  /// --moe-shared-expert-gate: the shared expert's output times sigmoid(x @ gate_weight^T), a
  /// [1, hidden] weight "<prefix>.shared_experts.gate_weight" (moe/shared_experts.h); no effect
  /// without a shared expert (Megatron's moe_shared_expert_gate).
  bool moe_shared_expert_gate = false;
  /// --moe-router-topk.
  int64_t moe_router_topk = 2;
  /// --moe-router-load-balancing-type (one or more of aux_loss, seq_aux_loss, global_aux_loss,
  /// none) with --moe-aux-loss-coeff (one coefficient per type).
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  std::vector<double> moe_aux_loss_coeff = {0.0};
  /// --moe-z-loss-coeff (nullopt = no z-loss).
  std::optional<double> moe_z_loss_coeff;
  /// --moe-router-score-function softmax | sigmoid | sqrtsoftplus.
  std::string moe_router_score_function = "softmax";
  bool moe_router_pre_softmax = false;
  std::optional<double> moe_router_topk_scaling_factor;
  /// --moe-router-enable-expert-bias (aux-loss-free balancing) and --moe-router-bias-update-rate.
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  /// Group-limited routing (--moe-router-num-groups, --moe-router-group-topk); 0 = off.
  int64_t moe_router_num_groups = 0;
  int64_t moe_router_group_topk = 0;
  /// --moe-router-dtype: "" (the input dtype), "fp32" or "fp64".
  std::string moe_router_dtype;
  /// --moe-token-dispatcher-type allgather | alltoall.
  std::string moe_token_dispatcher_type = "allgather";
  /// --moe-expert-capacity-factor (nullopt = dropless), --moe-pad-expert-input-to-capacity,
  /// --moe-token-drop-policy probs | position.
  std::optional<double> moe_expert_capacity_factor;
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_drop_policy = "probs";
  /// --moe-grouped-gemm: the experts run as one grouped GEMM per linear (ops::grouped_gemm) and
  /// are named as Megatron's TEGroupedMLP (experts.linear_fc1.weight<i>).
  bool moe_grouped_gemm = false;
  /// --moe-input-jitter-eps (nullopt = none): router input multiplied by U(1 - eps, 1 + eps).
  std::optional<double> moe_input_jitter_eps;
  /// --moe-per-layer-logging: load-balancing / z-loss values per layer as well.
  bool moe_per_layer_logging = false;
  /// --expert-model-parallel-size and --expert-tensor-parallel-size (0 = tensor_model_parallel_size).
  int64_t expert_model_parallel_size = 1;
  int64_t expert_tensor_parallel_size = 0;

  // ---- parallelism (ModelParallelConfig) ----
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  bool sequence_parallel = false;

  /// Fills derived defaults (ffn_hidden_size, kv_channels, num_query_groups) and checks
  /// Megatron's consistency rules; throws UserError naming the field/flag:
  /// hidden_size % num_attention_heads (when kv_channels is derived), num_attention_heads %
  /// num_query_groups, heads and groups divisible by tensor_model_parallel_size,
  /// ffn_hidden_size divisible by TP, positive sizes, dropout in [0, 1), dtypes supported,
  /// rotary_percent in (0, 1] and giving an even rotary dim, sequence_parallel needs TP > 1,
  /// full recomputation needs --recompute-method and a positive --recompute-num-layers;
  /// multi-token prediction: mtp_num_layers >= 0, rope or no position embedding, and
  /// recompute_num_layers 1 with uniform full recomputation (Megatron's MTP asserts).
  void validate();

  int64_t head_dim() const { return kv_channels; }
  /// Rows of the fused QKV projection: (heads + 2 * groups) * kv_channels.
  int64_t qkv_projection_size() const { return (num_attention_heads + 2 * num_query_groups) * kv_channels; }
  /// Rows of fc1: ffn_hidden_size, or 2 * ffn_hidden_size with gated_linear_unit.
  int64_t fc1_output_size() const { return gated_linear_unit ? 2 * ffn_hidden_size : ffn_hidden_size; }
  bool gelu_tanh() const { return !squared_relu && bias_activation_fusion && add_bias_linear; }
  /// Whether decoder layer `layer` (0-based global index) is an MoE layer (moe/moe_config.cpp).
  bool is_moe_layer(int64_t layer) const;
  /// Checks the MoE fields (moe/moe_config.cpp; called by validate()); UserError naming the flag.
  void validate_moe();
};

}  // namespace megatron::transformer
