#include "megatron/core/transformer/transformer_config.h"

#include <cmath>

#include "megatron/core/utils/errors.h"

namespace megatron::transformer {

const char* normalization_name(Normalization n) { return n == Normalization::kLayerNorm ? "LayerNorm" : "RMSNorm"; }

Normalization parse_normalization(const std::string& s) {
  if (s == "LayerNorm") return Normalization::kLayerNorm;
  if (s == "RMSNorm") return Normalization::kRMSNorm;
  user_error("--normalization: unknown value '", s, "'; use LayerNorm or RMSNorm");
}

const char* position_embedding_type_name(PositionEmbeddingType t) {
  switch (t) {
    case PositionEmbeddingType::kLearnedAbsolute: return "learned_absolute";
    case PositionEmbeddingType::kRope: return "rope";
    case PositionEmbeddingType::kNone: return "none";
  }
  return "?";
}

PositionEmbeddingType parse_position_embedding_type(const std::string& s) {
  if (s == "learned_absolute") return PositionEmbeddingType::kLearnedAbsolute;
  if (s == "rope") return PositionEmbeddingType::kRope;
  if (s == "none") return PositionEmbeddingType::kNone;
  user_error("--position-embedding-type: unknown value '", s, "'; use learned_absolute, rope or none");
}

void TransformerConfig::validate() {
  if (num_layers <= 0) user_error("TransformerConfig.num_layers (--num-layers) must be positive, got ", num_layers);
  if (hidden_size <= 0) user_error("TransformerConfig.hidden_size (--hidden-size) must be positive, got ", hidden_size);
  if (num_attention_heads <= 0)
    user_error("TransformerConfig.num_attention_heads (--num-attention-heads) must be positive, got ", num_attention_heads);
  if (kv_channels == 0) {
    if (hidden_size % num_attention_heads != 0)
      user_error("--hidden-size (", hidden_size, ") must be divisible by --num-attention-heads (", num_attention_heads,
                 ") unless --kv-channels is given");
    kv_channels = hidden_size / num_attention_heads;
  }
  if (kv_channels <= 0) user_error("TransformerConfig.kv_channels (--kv-channels) must be positive, got ", kv_channels);
  if (num_query_groups == 0) num_query_groups = num_attention_heads;
  if (num_query_groups < 0 || num_attention_heads % num_query_groups != 0)
    user_error("--num-attention-heads (", num_attention_heads, ") must be divisible by --num-query-groups (",
               num_query_groups, ")");
  if (ffn_hidden_size == 0) ffn_hidden_size = 4 * hidden_size;
  if (ffn_hidden_size < 0) user_error("--ffn-hidden-size must be positive, got ", ffn_hidden_size);
  if (tensor_model_parallel_size <= 0 || pipeline_model_parallel_size <= 0)
    user_error("--tensor-model-parallel-size and --pipeline-model-parallel-size must be positive");
  const int64_t tp = tensor_model_parallel_size;
  if (num_attention_heads % tp != 0)
    user_error("--num-attention-heads (", num_attention_heads, ") must be divisible by --tensor-model-parallel-size (",
               tp, ")");
  if (num_query_groups % tp != 0)
    user_error("--num-query-groups (", num_query_groups, ") must be divisible by --tensor-model-parallel-size (", tp,
               ")");
  if (ffn_hidden_size % tp != 0)
    user_error("--ffn-hidden-size (", ffn_hidden_size, ") must be divisible by --tensor-model-parallel-size (", tp, ")");
  if (sequence_parallel && tp == 1)
    user_error("--sequence-parallel requires --tensor-model-parallel-size > 1 (Megatron turns it off otherwise)");
  if (!(hidden_dropout >= 0.0f && hidden_dropout < 1.0f))
    user_error("--hidden-dropout must be in [0, 1), got ", hidden_dropout);
  if (!(attention_dropout >= 0.0f && attention_dropout < 1.0f))
    user_error("--attention-dropout must be in [0, 1), got ", attention_dropout);
  if (!(init_method_std > 0.0f)) user_error("--init-method-std must be positive, got ", init_method_std);
  if (!(layernorm_epsilon > 0.0f)) user_error("--norm-epsilon must be positive, got ", layernorm_epsilon);
  if (position_embedding_type == PositionEmbeddingType::kRope) {
    if (!(rotary_percent > 0.0f && rotary_percent <= 1.0f))
      user_error("--rotary-percent must be in (0, 1], got ", rotary_percent);
    const auto rot = static_cast<int64_t>(static_cast<float>(kv_channels) * rotary_percent);
    if (rot < 2 || rot % 2 != 0)
      user_error("--rotary-percent ", rotary_percent, " of --kv-channels ", kv_channels,
                 " gives rotary dim ", rot, "; it must be even and at least 2");
    if (!(rotary_base > 0.0f)) user_error("--rotary-base must be positive, got ", rotary_base);
    if (rope_scaling && !(rope_scaling_factor > 0.0f))
      user_error("--rope-scaling-factor must be positive, got ", rope_scaling_factor);
    if (seq_len_interpolation_factor < 0.0)
      user_error("--rotary-seq-len-interpolation-factor must be positive, got ", seq_len_interpolation_factor);
  }
  if (squared_relu && gated_linear_unit)
    user_error("TransformerConfig: squared_relu (--squared-relu) and gated_linear_unit (--swiglu) cannot be used together");
  if (recompute_granularity == RecomputeGranularity::kFull) {
    if (recompute_method == RecomputeMethod::kNone)
      user_error("--recompute-granularity full needs --recompute-method uniform or block");
    if (recompute_num_layers <= 0)
      user_error("--recompute-granularity full needs a positive --recompute-num-layers, got ", recompute_num_layers);
    // More layers than a model chunk holds: uniform makes one chunk of all of them, block
    // recomputes every layer (Megatron's TransformerBlock slices the same way; no error there).
  } else if (recompute_method != RecomputeMethod::kNone) {
    user_error("--recompute-method needs --recompute-granularity full");
  }
  if (mtp_num_layers < 0) user_error("--mtp-num-layers must be >= 0, got ", mtp_num_layers);
  if (mtp_num_layers > 0) {
    if (position_embedding_type == PositionEmbeddingType::kLearnedAbsolute)
      user_error("Multi-Token Prediction (MTP) is not supported with learned_absolute position embedding type "
                 "(--mtp-num-layers needs --position-embedding-type rope or none, as in Megatron)");
    if (recompute_granularity == RecomputeGranularity::kFull && recompute_method == RecomputeMethod::kUniform &&
        recompute_num_layers != 1)
      user_error("--mtp-num-layers with --recompute-method uniform needs --recompute-num-layers 1 (Megatron: "
                 "'recompute_num_layers must be 1 for MTP recompute'), got ", recompute_num_layers);
  }
  auto float_ok = [](DType t) { return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16; };
  if (!float_ok(params_dtype)) user_error("TransformerConfig.params_dtype must be float32, bfloat16 or float16");
  if (!float_ok(main_grads_dtype)) user_error("TransformerConfig.main_grads_dtype must be float32, bfloat16 or float16");
  validate_moe();
}

}  // namespace megatron::transformer
