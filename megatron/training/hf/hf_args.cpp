#include "megatron/training/hf/hf_args.h"

#include <algorithm>

#include "megatron/core/transformer/moe/moe_config.h"
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

/// Refuses (through `refuse`) the MoE settings the HF architecture spec.model_type cannot
/// represent: experts in LLaMA / GPT-2; for Mixtral / Qwen3-MoE a shared expert; for Qwen2-MoE
/// no shared expert or one without --moe-shared-expert-gate (Qwen2MoeSparseMoeBlock always has
/// both); for all three a score function other than softmax, top-k scaling, expert bias,
/// group-limited routing, a dense layer in Mixtral and pre-softmax routing in Mixtral (its top-k
/// probabilities are always renormalized).
template <class Refuse>
void check_moe_export(const json& a, const HFModelSpec& s, const Refuse& refuse) {
  const bool moe = a.contains("num_experts") && a["num_experts"].is_number() && a["num_experts"].get<int64_t>() > 0;
  if (s.model_type != "mixtral" && s.model_type != "qwen3_moe" && s.model_type != "qwen2_moe") {
    if (moe)
      refuse("--num-experts " + show(a["num_experts"]) + " (mixture of experts; export as mixtral, qwen3_moe or qwen2_moe)");
    return;
  }
  if (!moe) refuse("no --num-experts (a dense model)");
  auto set = [&](const char* k) { return a.contains(k) && !a[k].is_null() && !(a[k].is_number() && a[k].get<double>() == 0); };
  const bool gate = a.value("moe_shared_expert_gate", false);
  if (s.model_type != "qwen2_moe" && set("moe_shared_expert_intermediate_size"))
    refuse("--moe-shared-expert-intermediate-size " + show(a["moe_shared_expert_intermediate_size"]) +
           (gate ? " --moe-shared-expert-gate (export as qwen2_moe)" : ""));
  if (s.model_type == "qwen2_moe") {
    if (!set("moe_shared_expert_intermediate_size"))
      refuse("no --moe-shared-expert-intermediate-size (Qwen2-MoE always has a shared expert)");
    if (!gate) refuse("a shared expert without --moe-shared-expert-gate (Qwen2-MoE's shared expert is always gated)");
  }
  if (a.value("moe_router_score_function", std::string("softmax")) != "softmax")
    refuse("--moe-router-score-function " + a.value("moe_router_score_function", std::string()));
  if (set("moe_router_topk_scaling_factor") && a["moe_router_topk_scaling_factor"].get<double>() != 1.0)
    refuse("--moe-router-topk-scaling-factor " + show(a["moe_router_topk_scaling_factor"]));
  if (a.value("moe_router_enable_expert_bias", false)) refuse("--moe-router-enable-expert-bias");
  if (set("moe_router_num_groups")) refuse("--moe-router-num-groups " + show(a["moe_router_num_groups"]));
  if (s.model_type == "mixtral") {
    if (!s.moe_layer_pattern.empty()) refuse("--moe-layer-freq " + s.moe_layer_freq() + " (Mixtral has no dense layers)");
    if (s.moe_router_pre_softmax) refuse("--moe-router-pre-softmax (Mixtral renormalizes the top-k probabilities)");
  }
}

}  // namespace

json spec_to_args(const HFModelSpec& s, int64_t padded, int64_t divisible_by) {
  json a = {{"hf_model_type", s.model_type},
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
          {"qk_layernorm", s.qk_layernorm},
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
  if (s.is_moe()) {
    // Megatron's dests; moe_layer_freq as Megatron stores it: an int or a list.
    a["num_experts"] = s.num_moe_experts;
    a["moe_ffn_hidden_size"] = s.moe_ffn_hidden_size;
    a["moe_router_topk"] = s.moe_router_topk;
    a["moe_layer_freq"] = s.moe_layer_pattern.empty() ? json(1) : json(s.moe_layer_pattern);
    a["moe_router_pre_softmax"] = s.moe_router_pre_softmax;
    a["moe_router_load_balancing_type"] = "aux_loss";
    a["moe_aux_loss_coeff"] = s.moe_aux_loss_coeff;
    a["moe_router_score_function"] = "softmax";
    a["moe_shared_expert_intermediate_size"] =
        s.moe_shared_expert_intermediate_size > 0 ? json(s.moe_shared_expert_intermediate_size) : json(nullptr);
    a["moe_shared_expert_gate"] = s.moe_shared_expert_gate;
    a["moe_router_topk_scaling_factor"] = nullptr;
    a["moe_router_enable_expert_bias"] = false;
  }
  return a;
}

namespace {

/// The per-layer MoE pattern of a checkpoint's moe_layer_freq (an int N, a JSON list, or the
/// Python list text our args record), num_layers long; empty when every layer is MoE.
std::vector<int> moe_pattern_of(const json& a, int64_t num_layers, const std::string& where) {
  if (!a.contains("moe_layer_freq") || a["moe_layer_freq"].is_null()) return {};
  const json& f = a["moe_layer_freq"];
  std::vector<int> p;
  if (f.is_array()) {
    for (const auto& v : f) p.push_back(v.get<int>());
  } else {
    p = transformer::moe::parse_moe_layer_freq(f.is_string() ? f.get<std::string>() : f.dump(), num_layers);
  }
  if (static_cast<int64_t>(p.size()) != num_layers)
    user_error(where, ": checkpoint args moe_layer_freq ", f.dump(), " does not have num_layers ", num_layers, " entries");
  if (std::all_of(p.begin(), p.end(), [](int v) { return v == 1; })) return {};
  return p;
}

}  // namespace

HFModelSpec spec_from_args(const json& a, const std::string& where) {
  auto need = [&](const char* k) -> const json& {
    if (!a.contains(k) || !a[k].is_number())
      user_error(where, ": checkpoint args lack '", k, "'; pass --hf-config with the model's config.json");
    return a[k];
  };
  const bool rms = a.value("normalization", std::string("LayerNorm")) == "RMSNorm";
  const bool rope = a.value("position_embedding_type", std::string("learned_absolute")) == "rope";
  HFModelSpec s;
  const bool moe = a.contains("num_experts") && a["num_experts"].is_number() && a["num_experts"].get<int64_t>() > 0;
  const bool qk = a.value("qk_layernorm", false);
  const bool gated_shared = a.value("moe_shared_expert_gate", false) && a.contains("moe_shared_expert_intermediate_size") &&
                            a["moe_shared_expert_intermediate_size"].is_number() &&
                            a["moe_shared_expert_intermediate_size"].get<int64_t>() > 0;
  s.model_type = a.value("hf_model_type", moe ? (gated_shared ? "qwen2_moe" : qk ? "qwen3_moe" : "mixtral")
                                              : a.value("swiglu", false) || rms || rope ? "llama" : "gpt2");
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
  s.qk_layernorm = qk;
  if (moe) {
    s.num_moe_experts = a["num_experts"].get<int64_t>();
    s.moe_ffn_hidden_size = a.contains("moe_ffn_hidden_size") && a["moe_ffn_hidden_size"].is_number()
                                ? a["moe_ffn_hidden_size"].get<int64_t>()
                                : s.ffn_hidden_size;
    s.moe_router_topk = a.value("moe_router_topk", int64_t(2));
    s.moe_layer_pattern = moe_pattern_of(a, s.num_layers, where);
    s.moe_router_pre_softmax = a.value("moe_router_pre_softmax", false);
    const json& c = a.value("moe_aux_loss_coeff", json(0.0));
    s.moe_aux_loss_coeff = c.is_number() ? c.get<double>() : 0.0;
    if (s.model_type == "qwen2_moe") {
      const json& f = a.value("moe_shared_expert_intermediate_size", json(nullptr));
      s.moe_shared_expert_intermediate_size = f.is_number() ? f.get<int64_t>() : 0;
      s.moe_shared_expert_gate = a.value("moe_shared_expert_gate", false);
    }
  }
  check_hf_export(a, s, where);
  return s;
}

void check_hf_export(const json& a, const HFModelSpec& s, const std::string& where, const std::string& hf_config) {
  const std::string arch = s.model_type == "llama"       ? "LLaMA (LlamaForCausalLM)"
                           : s.model_type == "mixtral"   ? "Mixtral (MixtralForCausalLM)"
                           : s.model_type == "qwen3_moe" ? "Qwen3-MoE (Qwen3MoeForCausalLM)"
                           : s.model_type == "qwen2_moe" ? "Qwen2-MoE (Qwen2MoeForCausalLM)"
                                                         : "GPT-2 (GPT2LMHeadModel)";
  const bool llama_like = s.model_type != "gpt2";
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
  if (s.model_type == "qwen3_moe") {
    if (a.contains("qk_layernorm") && !flag("qk_layernorm")) refuse("no --qk-layernorm (Qwen3-MoE always has q_norm/k_norm)");
  } else if (flag("qk_layernorm")) {
    refuse("--qk-layernorm");
  }
  check_moe_export(a, s, refuse);
  if (flag("layernorm_zero_centered_gamma")) refuse("--apply-layernorm-1p");
  // Llama-3.1 RoPE scaling is LLaMA's rope_scaling {"rope_type": "llama3", ...}; GPT-2 has no RoPE.
  if (flag("use_rope_scaling") && s.model_type != "llama") refuse("--use-rope-scaling");
  if (num("rotary_seq_len_interpolation_factor", 1.0) != 1.0)
    refuse("--rotary-seq-len-interpolation-factor " + show(a["rotary_seq_len_interpolation_factor"]));
  const std::string act = trained_activation(a);
  if (llama_like) {
    if (!act.empty() && act != "silu")
      refuse(act == "relu2" ? "--squared-relu without --swiglu (LLaMA's MLP is gated: hidden_act * up_proj)"
                                   : "a non-gated GeLU MLP (no --swiglu)");
    if (a.contains("normalization") && str("normalization", "") != "RMSNorm")
      refuse("--normalization " + str("normalization", ""));
    if (a.contains("position_embedding_type") && str("position_embedding_type", "") != "rope")
      refuse("--position-embedding-type " + str("position_embedding_type", ""));
    if (num("rotary_percent", 1.0) != 1.0) refuse("--rotary-percent " + show(a["rotary_percent"]));
    if (flag("rotary_interleaved")) refuse("--rotary-interleaved");
    // (Qwen2-MoE's q/k/v bias without o_proj's is exactly --add-qkv-bias --disable-bias-linear.)
    if (s.model_type != "qwen2_moe" && a.contains("add_qkv_bias") && flag("add_qkv_bias") && !a.value("add_bias_linear", true))
      refuse("--add-qkv-bias with --disable-bias-linear (LLaMA's attention_bias also adds o_proj's bias)");
    if (s.is_moe() && a.value("add_bias_linear", false)) refuse("linear biases (no --disable-bias-linear)");
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
  if (llama_like && a.contains("rotary_base") && a["rotary_base"].is_number() &&
      a["rotary_base"].get<double>() != s.rotary_base)
    differs("rope_theta", json(s.rotary_base).dump(), "rotary_base", a["rotary_base"]);
  if (llama_like && a.contains("use_rope_scaling") && a["use_rope_scaling"].is_boolean() &&
      a["use_rope_scaling"].get<bool>() != s.use_rope_scaling)
    differs("rope_scaling", s.use_rope_scaling ? "llama3" : "none", "use_rope_scaling", a["use_rope_scaling"]);
  if (llama_like && s.use_rope_scaling && a.contains("rope_scaling_factor") &&
      a["rope_scaling_factor"].is_number() && a["rope_scaling_factor"].get<double>() != s.rope_scaling_factor)
    differs("rope_scaling.factor", json(s.rope_scaling_factor).dump(), "rope_scaling_factor", a["rope_scaling_factor"]);
  if (llama_like && a.contains("add_bias_linear") && a["add_bias_linear"].is_boolean() &&
      a["add_bias_linear"].get<bool>() != s.add_bias_linear)
    differs("attention_bias/mlp_bias", s.add_bias_linear ? "true" : "false", "add_bias_linear", a["add_bias_linear"]);
  if (s.is_moe()) {
    cmp_int("num_experts", s.num_moe_experts, s.model_type == "mixtral" ? "num_local_experts" : "num_experts");
    cmp_int("moe_router_topk", s.moe_router_topk, "num_experts_per_tok");
    if (a.contains("moe_ffn_hidden_size") && a["moe_ffn_hidden_size"].is_number())
      cmp_int("moe_ffn_hidden_size", s.moe_ffn_hidden_size, s.model_type == "mixtral" ? "intermediate_size" : "moe_intermediate_size");
    if (moe_pattern_of(a, s.num_layers, where) != s.moe_layer_pattern)
      differs("MoE layers (mlp_only_layers / decoder_sparse_step)", s.moe_layer_freq(), "moe_layer_freq", a["moe_layer_freq"]);
    if (a.value("moe_router_pre_softmax", false) != s.moe_router_pre_softmax)
      differs("norm_topk_prob", s.moe_router_pre_softmax ? "false" : "true", "moe_router_pre_softmax",
              a.value("moe_router_pre_softmax", false));
    if (s.model_type == "qwen2_moe") {
      cmp_int("moe_shared_expert_intermediate_size", s.moe_shared_expert_intermediate_size, "shared_expert_intermediate_size");
      if (a.contains("add_qkv_bias") && a["add_qkv_bias"].is_boolean() && a["add_qkv_bias"].get<bool>() != s.add_qkv_bias)
        differs("qkv_bias", s.add_qkv_bias ? "true" : "false", "add_qkv_bias", a["add_qkv_bias"]);
    }
  } else if (a.contains("num_experts") && a["num_experts"].is_number() && a["num_experts"].get<int64_t>() > 0) {
    differs("a dense model_type", s.model_type, "num_experts", a["num_experts"]);
  }
  if (a.contains("untie_embeddings_and_output_weights") && a["untie_embeddings_and_output_weights"].is_boolean() &&
      a["untie_embeddings_and_output_weights"].get<bool>() != s.untie_embeddings_and_output_weights)
    differs("tie_word_embeddings", s.untie_embeddings_and_output_weights ? "false" : "true",
            "untie_embeddings_and_output_weights", a["untie_embeddings_and_output_weights"]);
}

}  // namespace megatron::hf
