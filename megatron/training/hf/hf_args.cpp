#include "megatron/training/hf/hf_args.h"

#include "megatron/core/utils/errors.h"
#include "megatron/training/checkpoint_args.h"

namespace megatron::hf {

using nlohmann::json;

namespace {

/// HFModelSpec::activation of a Megatron MLP activation (training::mlp_activation).
std::string hf_activation_of(const std::string& mlp) {
  if (mlp == "swiglu") return "silu";
  if (mlp == "squared_relu") return "relu2";
  return mlp;  // gelu_tanh | gelu
}

/// The HF activation the checkpoint was trained with ("silu", "relu2", "gelu_tanh", "gelu"), or ""
/// when its args do not say (checkpoints that recorded only ~15 keys). HF imports written before
/// the full args recorded hf_activation without squared_relu / bias_gelu_fusion.
std::string trained_activation(const json& a) {
  if (!a.contains("squared_relu") && a.contains("hf_activation") && a["hf_activation"].is_string())
    return a["hf_activation"].get<std::string>();
  if (a.contains("swiglu") || a.contains("squared_relu")) return hf_activation_of(training::mlp_activation(a));
  return "";
}

std::string show(const json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

}  // namespace

json spec_to_args(const HFModelSpec& s, int64_t padded, int64_t divisible_by) {
  return {{"hf_model_type", s.model_type},
          {"num_layers", s.num_layers},
          {"hidden_size", s.hidden_size},
          {"ffn_hidden_size", s.ffn_hidden_size},
          {"num_attention_heads", s.num_attention_heads},
          {"num_query_groups", s.num_query_groups},
          {"group_query_attention", s.num_query_groups != s.num_attention_heads},
          {"kv_channels", s.kv_channels},
          {"max_position_embeddings", s.max_position_embeddings},
          {"vocab_size", s.vocab_size},
          {"padded_vocab_size", padded},
          {"make_vocab_size_divisible_by", divisible_by},
          {"normalization", s.normalization},
          {"layernorm_epsilon", s.norm_epsilon},
          {"norm_epsilon", s.norm_epsilon},  // the key written before layernorm_epsilon (readers)
          {"layernorm_zero_centered_gamma", false},
          {"qk_layernorm", false},
          {"position_embedding_type", s.position_embedding_type},
          {"rotary_base", s.rotary_base},
          {"use_rope_scaling", s.use_rope_scaling},
          {"rope_scaling_factor", s.rope_scaling_factor},
          {"rotary_percent", 1.0},
          {"rotary_interleaved", false},
          {"swiglu", s.swiglu},
          {"squared_relu", s.activation == "relu2"},
          {"bias_gelu_fusion", s.activation != "gelu" && s.activation != "relu2"},
          {"hf_activation", s.activation},
          {"add_bias_linear", s.add_bias_linear},
          {"add_qkv_bias", s.add_qkv_bias},
          {"untie_embeddings_and_output_weights", s.untie_embeddings_and_output_weights},
          {"tensor_model_parallel_size", 1},
          {"pipeline_model_parallel_size", 1}};
}

HFModelSpec spec_from_args(const json& a, const std::string& where) {
  auto need = [&](const char* k) -> const json& {
    if (!a.contains(k) || !a[k].is_number())
      user_error(where, ": checkpoint args lack '", k, "'; pass --hf-config with the model's config.json");
    return a[k];
  };
  const bool rms = a.value("normalization", std::string("LayerNorm")) == "RMSNorm";
  const bool rope = a.value("position_embedding_type", std::string("learned_absolute")) == "rope";
  HFModelSpec s;
  s.model_type = a.value("hf_model_type", a.value("swiglu", false) || rms || rope ? "llama" : "gpt2");
  s.num_layers = need("num_layers").get<int64_t>();
  s.hidden_size = need("hidden_size").get<int64_t>();
  s.ffn_hidden_size = need("ffn_hidden_size").get<int64_t>();
  s.num_attention_heads = need("num_attention_heads").get<int64_t>();
  s.num_query_groups = a.value("group_query_attention", true) && a.contains("num_query_groups") &&
                               a["num_query_groups"].is_number()
                           ? a["num_query_groups"].get<int64_t>()
                           : s.num_attention_heads;
  s.kv_channels = a.contains("kv_channels") && a["kv_channels"].is_number() ? a["kv_channels"].get<int64_t>()
                                                                            : s.hidden_size / s.num_attention_heads;
  s.max_position_embeddings = need("max_position_embeddings").get<int64_t>();
  s.vocab_size = need("vocab_size").get<int64_t>();
  s.normalization = a.value("normalization", std::string("LayerNorm"));
  s.norm_epsilon = a.value("layernorm_epsilon", a.value("norm_epsilon", 1e-5));
  s.position_embedding_type = a.value("position_embedding_type", std::string("learned_absolute"));
  s.rotary_base = a.value("rotary_base", 10000.0);
  s.use_rope_scaling = a.value("use_rope_scaling", false);
  s.rope_scaling_factor = a.value("rope_scaling_factor", 8.0);
  s.swiglu = a.value("swiglu", false);
  s.activation = trained_activation(a);
  if (s.activation.empty()) s.activation = s.swiglu ? "silu" : "gelu_tanh";
  s.add_bias_linear = a.value("add_bias_linear", true);
  s.add_qkv_bias = a.value("add_qkv_bias", false) || s.add_bias_linear;
  s.untie_embeddings_and_output_weights = a.value("untie_embeddings_and_output_weights", false);
  check_hf_export(a, s, where);
  return s;
}

void check_hf_export(const json& a, const HFModelSpec& s, const std::string& where, const std::string& hf_config) {
  const std::string arch = s.model_type == "llama" ? "LLaMA (LlamaForCausalLM)" : "GPT-2 (GPT2LMHeadModel)";
  auto refuse = [&](const std::string& what) {
    user_error(where, ": the checkpoint was trained with ", what, ", which ", arch,
               " cannot represent; not exported (a silently different model)");
  };
  auto flag = [&](const char* k) { return a.contains(k) && a[k].is_boolean() && a[k].get<bool>(); };
  auto str = [&](const char* k, const char* def) {
    return a.contains(k) && a[k].is_string() ? a[k].get<std::string>() : std::string(def);
  };
  auto num = [&](const char* k, double def) { return a.contains(k) && a[k].is_number() ? a[k].get<double>() : def; };

  // --- representable at all? ---
  if (flag("qk_layernorm")) refuse("--qk-layernorm");
  if (flag("layernorm_zero_centered_gamma")) refuse("--apply-layernorm-1p");
  // Llama-3.1 RoPE scaling is LLaMA's rope_scaling {"rope_type": "llama3", ...}; GPT-2 has no RoPE.
  if (flag("use_rope_scaling") && s.model_type != "llama") refuse("--use-rope-scaling");
  if (num("rotary_seq_len_interpolation_factor", 1.0) != 1.0)
    refuse("--rotary-seq-len-interpolation-factor " + show(a["rotary_seq_len_interpolation_factor"]));
  const std::string act = trained_activation(a);
  if (s.model_type == "llama") {
    if (!act.empty() && act != "silu")
      refuse(act == "relu2" ? "--squared-relu without --swiglu (LLaMA's MLP is gated: hidden_act * up_proj)"
                                   : "a non-gated GeLU MLP (no --swiglu)");
    if (a.contains("normalization") && str("normalization", "") != "RMSNorm")
      refuse("--normalization " + str("normalization", ""));
    if (a.contains("position_embedding_type") && str("position_embedding_type", "") != "rope")
      refuse("--position-embedding-type " + str("position_embedding_type", ""));
    if (num("rotary_percent", 1.0) != 1.0) refuse("--rotary-percent " + show(a["rotary_percent"]));
    if (flag("rotary_interleaved")) refuse("--rotary-interleaved");
    if (a.contains("add_qkv_bias") && flag("add_qkv_bias") && !a.value("add_bias_linear", true))
      refuse("--add-qkv-bias with --disable-bias-linear (LLaMA's attention_bias also adds o_proj's bias)");
  } else {
    if (act == "silu") refuse("--swiglu");
    if (a.contains("normalization") && str("normalization", "") != "LayerNorm")
      refuse("--normalization " + str("normalization", ""));
    if (a.contains("position_embedding_type") && str("position_embedding_type", "") != "learned_absolute")
      refuse("--position-embedding-type " + str("position_embedding_type", ""));
    if (a.contains("add_bias_linear") && !a.value("add_bias_linear", true)) refuse("--disable-bias-linear");
    if (flag("group_query_attention") && a.contains("num_query_groups") && a["num_query_groups"].is_number() &&
        a["num_query_groups"].get<int64_t>() != a.value("num_attention_heads", int64_t(0)))
      refuse("--group-query-attention --num-query-groups " + show(a["num_query_groups"]));
  }
  if (hf_config.empty()) return;

  // --- --hf-config must describe the trained model ---
  auto differs = [&](const std::string& what, const std::string& cfg_value, const std::string& dest, const json& v) {
    user_error(where, ": --hf-config ", hf_config, " gives ", what, " ", cfg_value, " but the checkpoint was trained with ",
               dest, " ", show(v), "; fix the config or omit --hf-config to take the architecture from the checkpoint");
  };
  auto cmp_int = [&](const char* dest, int64_t cfg_v, const char* what) {
    if (a.contains(dest) && a[dest].is_number() && a[dest].get<double>() != static_cast<double>(cfg_v))
      differs(what, std::to_string(cfg_v), dest, a[dest]);
  };
  cmp_int("num_layers", s.num_layers, "num_layers");
  cmp_int("hidden_size", s.hidden_size, "hidden_size");
  cmp_int("ffn_hidden_size", s.ffn_hidden_size, "ffn_hidden_size");
  cmp_int("num_attention_heads", s.num_attention_heads, "num_attention_heads");
  cmp_int("kv_channels", s.kv_channels, "head_dim");
  if (s.model_type == "gpt2") cmp_int("max_position_embeddings", s.max_position_embeddings, "n_positions");
  if (flag("group_query_attention")) cmp_int("num_query_groups", s.num_query_groups, "num_key_value_heads");
  if (!act.empty() && act != s.activation) {
    const std::string cfg_act = s.activation == "gelu_tanh" ? "gelu_new" : s.activation;
    const json trained = act == "relu2" ? json("--squared-relu (HF 'relu2')")
                         : act == "silu"     ? json("--swiglu (HF 'silu')")
                         : act == "gelu"     ? json("exact GeLU: --no-bias-gelu-fusion or --disable-bias-linear (HF 'gelu')")
                                               : json("tanh GeLU: bias_gelu_fusion (HF 'gelu_new')");
    differs(s.model_type == "gpt2" ? "activation_function" : "hidden_act", "'" + cfg_act + "'", "MLP activation",
            trained);
  }
  if (a.contains("layernorm_epsilon") && a["layernorm_epsilon"].is_number() &&
      a["layernorm_epsilon"].get<double>() != s.norm_epsilon)
    differs(s.model_type == "gpt2" ? "layer_norm_epsilon" : "rms_norm_eps", json(s.norm_epsilon).dump(),
            "layernorm_epsilon", a["layernorm_epsilon"]);
  if (s.model_type == "llama" && a.contains("rotary_base") && a["rotary_base"].is_number() &&
      a["rotary_base"].get<double>() != s.rotary_base)
    differs("rope_theta", json(s.rotary_base).dump(), "rotary_base", a["rotary_base"]);
  if (s.model_type == "llama" && a.contains("use_rope_scaling") && a["use_rope_scaling"].is_boolean() &&
      a["use_rope_scaling"].get<bool>() != s.use_rope_scaling)
    differs("rope_scaling", s.use_rope_scaling ? "llama3" : "none", "use_rope_scaling", a["use_rope_scaling"]);
  if (s.model_type == "llama" && s.use_rope_scaling && a.contains("rope_scaling_factor") &&
      a["rope_scaling_factor"].is_number() && a["rope_scaling_factor"].get<double>() != s.rope_scaling_factor)
    differs("rope_scaling.factor", json(s.rope_scaling_factor).dump(), "rope_scaling_factor", a["rope_scaling_factor"]);
  if (s.model_type == "llama" && a.contains("add_bias_linear") && a["add_bias_linear"].is_boolean() &&
      a["add_bias_linear"].get<bool>() != s.add_bias_linear)
    differs("attention_bias/mlp_bias", s.add_bias_linear ? "true" : "false", "add_bias_linear", a["add_bias_linear"]);
  if (a.contains("untie_embeddings_and_output_weights") && a["untie_embeddings_and_output_weights"].is_boolean() &&
      a["untie_embeddings_and_output_weights"].get<bool>() != s.untie_embeddings_and_output_weights)
    differs("tie_word_embeddings", s.untie_embeddings_and_output_weights ? "false" : "true",
            "untie_embeddings_and_output_weights", a["untie_embeddings_and_output_weights"]);
}

}  // namespace megatron::hf
