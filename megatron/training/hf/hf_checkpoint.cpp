#include "megatron/training/hf/hf_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "megatron/core/dist_checkpointing/file_utils.h"
#include "megatron/core/dist_checkpointing/safetensors.h"
#include "megatron/core/utils/errors.h"
#include "megatron/core/utils/temp_file.h"
#include "megatron/training/hf/hf_mapping.h"

namespace megatron::hf {

namespace fs = std::filesystem;
namespace dc = megatron::dist_checkpointing;
using nlohmann::json;

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

namespace {

struct Cfg {
  const json& j;
  const std::string& path;
  int64_t req_int(const char* key) const {
    if (!j.contains(key) || !j[key].is_number_integer())
      user_error(path, ": key '", key, "' is missing or not an integer");
    int64_t v = j[key].get<int64_t>();
    if (v <= 0) user_error(path, ": key '", key, "' must be positive, got ", v);
    return v;
  }
  int64_t opt_int(const char* key, int64_t def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number_integer()) user_error(path, ": key '", key, "' is not an integer");
    return j[key].get<int64_t>();
  }
  double opt_num(const char* key, double def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_number()) user_error(path, ": key '", key, "' is not a number");
    return j[key].get<double>();
  }
  bool opt_bool(const char* key, bool def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_boolean()) user_error(path, ": key '", key, "' is not true/false");
    return j[key].get<bool>();
  }
  std::string opt_str(const char* key, const std::string& def) const {
    if (!j.contains(key) || j[key].is_null()) return def;
    if (!j[key].is_string()) user_error(path, ": key '", key, "' is not a string");
    return j[key].get<std::string>();
  }
};

/// Reads a rope_scaling / rope_parameters object into s: rope_type "default" (plain RoPE) or
/// "llama3" (Llama-3.1 scaling = Megatron's --use-rope-scaling --rope-scaling-factor <factor>).
/// Megatron fixes low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192
/// (RotaryEmbedding._apply_scaling), so other values are refused, as are other rope types.
void read_rope_object(const json& r, const std::string& path, const char* key, HFModelSpec& s) {
  if (r.is_null()) return;
  if (!r.is_object()) user_error(path, ": '", key, "' must be an object or null");
  std::string type = r.value("rope_type", r.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "llama3")
    user_error(path, ": ", key, ".rope_type '", type,
               "' is not supported (plain RoPE or llama3 only; scaled variants such as linear/dynamic/yarn would "
               "give a different model)");
  auto num = [&](const char* k, double def, bool required) {
    if (!r.contains(k) || r[k].is_null()) {
      if (required) user_error(path, ": ", key, ".", k, " is missing (rope_type llama3 needs it)");
      return def;
    }
    if (!r[k].is_number()) user_error(path, ": ", key, ".", k, " is not a number");
    return r[k].get<double>();
  };
  const double factor = num("factor", 8.0, true);
  if (!(factor > 0.0)) user_error(path, ": ", key, ".factor must be positive, got ", factor);
  const struct {
    const char* k;
    double megatron;
  } fixed[] = {{"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192.0}};
  for (const auto& f : fixed) {
    const double v = num(f.k, f.megatron, false);
    if (v != f.megatron)
      user_error(path, ": ", key, ".", f.k, " = ", v, " is not supported (Megatron's --use-rope-scaling fixes it to ",
                 f.megatron, ")");
  }
  s.use_rope_scaling = true;
  s.rope_scaling_factor = factor;
}

/// The mixture-of-experts keys of a Mixtral / Qwen3-MoE / Qwen2-MoE config.json (docs/models.md,
/// "Hugging Face"). All route with a softmax over all experts and keep the top k; Mixtral always
/// and the Qwen models with norm_topk_prob renormalize the k probabilities, which is Megatron's
/// softmax over the top-k logits (no --moe-router-pre-softmax); without it they are
/// --moe-router-pre-softmax. Qwen layer i is an MoE layer iff i is not in mlp_only_layers and
/// (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer); their other
/// layers are dense MLPs of intermediate_size. Qwen3's q_norm / k_norm are --qk-layernorm (RMSNorm
/// over the head dim before RoPE, as Megatron's q_layernorm / k_layernorm). Qwen2-MoE adds a
/// shared expert of shared_expert_intermediate_size on every token, scaled by
/// sigmoid(shared_expert_gate(x)): Megatron's --moe-shared-expert-intermediate-size with
/// --moe-shared-expert-gate.
void read_moe_config(const Cfg& c, HFModelSpec& s) {
  const json& j = c.j;
  const std::string& path = c.path;
  s.moe_router_topk = c.req_int("num_experts_per_tok");
  s.moe_aux_loss_coeff = c.opt_num("router_aux_loss_coef", 0.001);
  if (s.model_type == "mixtral") {
    s.num_moe_experts = c.req_int("num_local_experts");
    s.moe_ffn_hidden_size = s.ffn_hidden_size;  // Mixtral's intermediate_size is the experts' size
    if (j.contains("sliding_window") && !j["sliding_window"].is_null())
      user_error(path, ": sliding_window ", j["sliding_window"].dump(),
                 " is not supported (Megatron's attention is full causal; set it to null)");
    if (c.opt_num("router_jitter_noise", 0.0) != 0.0)
      user_error(path, ": router_jitter_noise ", j["router_jitter_noise"].dump(),
                 " is not supported (HF jitters the experts' input too; Megatron's --moe-input-jitter-eps only the "
                 "router's)");
  } else {
    // Qwen3MoeConfig's expert count: `num_experts` (transformers 4) or `num_local_experts`, the
    // name transformers 5 writes (its attribute map makes the two one attribute).
    const bool has_old = j.contains("num_experts") && !j["num_experts"].is_null();
    const bool has_new = j.contains("num_local_experts") && !j["num_local_experts"].is_null();
    if (has_old && has_new && j["num_experts"] != j["num_local_experts"])
      user_error(path, ": num_experts ", j["num_experts"].dump(), " and num_local_experts ",
                 j["num_local_experts"].dump(), " differ (they name the same count; keep one)");
    s.num_moe_experts = c.req_int(has_new && !has_old ? "num_local_experts" : "num_experts");
    s.moe_ffn_hidden_size = c.req_int("moe_intermediate_size");
    s.moe_router_pre_softmax = !c.opt_bool("norm_topk_prob", false);
    s.qk_layernorm = s.model_type == "qwen3_moe";
    if (s.model_type == "qwen2_moe") {
      s.moe_shared_expert_intermediate_size = c.req_int("shared_expert_intermediate_size");
      s.moe_shared_expert_gate = true;  // Qwen2MoeSparseMoeBlock always has shared_expert_gate
    }
    if (c.opt_bool("use_sliding_window", false))
      user_error(path, ": use_sliding_window true is not supported (Megatron's attention is full causal)");
    if (j.contains("layer_types") && !j["layer_types"].is_null()) {
      if (!j["layer_types"].is_array()) user_error(path, ": layer_types must be a list");
      for (const auto& v : j["layer_types"])
        if (v != "full_attention")
          user_error(path, ": layer_types entry ", v.dump(),
                     " is not supported (Megatron's attention is full causal: every entry must be \"full_attention\")");
    }
    if (c.opt_bool("attention_bias", false))
      user_error(path, ": attention_bias true is not supported for ", s.model_type,
                 " (Megatron's MoE experts have no bias", s.model_type == "qwen2_moe" ? "; Qwen2-MoE's q/k/v bias is qkv_bias)" : ")");
    const int64_t step = c.opt_int("decoder_sparse_step", 1);
    if (step < 1) user_error(path, ": decoder_sparse_step must be >= 1, got ", step);
    std::set<int64_t> dense;
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      if (!j["mlp_only_layers"].is_array()) user_error(path, ": mlp_only_layers must be a list of layer indices");
      for (const auto& v : j["mlp_only_layers"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= s.num_layers)
          user_error(path, ": mlp_only_layers entry ", v.dump(), " is not a layer index in [0, ", s.num_layers, ")");
        dense.insert(v.get<int64_t>());
      }
    }
    bool all = true, any = false;
    for (int64_t i = 0; i < s.num_layers; ++i) {
      const int m = !dense.count(i) && (i + 1) % step == 0 ? 1 : 0;
      s.moe_layer_pattern.push_back(m);
      all = all && m;
      any = any || m;
    }
    if (!any)
      user_error(path, ": decoder_sparse_step / mlp_only_layers make no layer a mixture-of-experts layer (a dense "
                 "model; Megatron's --moe-layer-freq needs at least one)");
    if (all) s.moe_layer_pattern.clear();
  }
  if (s.moe_router_topk > s.num_moe_experts)
    user_error(path, ": num_experts_per_tok ", s.moe_router_topk, " exceeds the number of experts ", s.num_moe_experts);
  if (s.moe_router_topk == 1 && !s.moe_router_pre_softmax)
    user_error(path, ": num_experts_per_tok 1 with renormalized top-k probabilities (every weight 1) is not supported "
               "(Megatron refuses top-1 softmax routing without --moe-router-pre-softmax)");
}

}  // namespace

HFModelSpec read_hf_config(const std::string& path) {
  json j;
  try {
    j = json::parse(dc::read_text_file(path));
  } catch (const json::exception& e) {
    user_error(path, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) user_error(path, ": not a JSON object");
  Cfg c{j, path};
  HFModelSpec s;
  s.model_type = c.opt_str("model_type", "");
  const bool moe = s.model_type == "mixtral" || s.model_type == "qwen3_moe" || s.model_type == "qwen2_moe";
  if (s.model_type == "llama" || moe) {
    s.hidden_size = c.req_int("hidden_size");
    s.ffn_hidden_size = c.req_int("intermediate_size");
    s.num_layers = c.req_int("num_hidden_layers");
    s.num_attention_heads = c.req_int("num_attention_heads");
    s.num_query_groups = c.opt_int("num_key_value_heads", s.num_attention_heads);
    if (s.num_query_groups <= 0 || s.num_attention_heads % s.num_query_groups != 0)
      user_error(path, ": num_key_value_heads ", s.num_query_groups, " must divide num_attention_heads ",
                 s.num_attention_heads);
    s.kv_channels = c.opt_int("head_dim", s.hidden_size / s.num_attention_heads);
    s.max_position_embeddings = c.req_int("max_position_embeddings");
    s.vocab_size = c.req_int("vocab_size");
    s.normalization = "RMSNorm";
    s.norm_epsilon = c.opt_num("rms_norm_eps", 1e-6);
    s.position_embedding_type = "rope";
    s.rotary_base = c.opt_num("rope_theta", 10000.0);
    if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
      read_rope_object(j["rope_parameters"], path, "rope_parameters", s);
      if (j["rope_parameters"].contains("rope_theta")) s.rotary_base = j["rope_parameters"]["rope_theta"].get<double>();
      if (j["rope_parameters"].contains("partial_rotary_factor") &&
          j["rope_parameters"]["partial_rotary_factor"].get<double>() != 1.0)
        user_error(path, ": rope_parameters.partial_rotary_factor != 1 is not supported for LLaMA import");
    }
    if (j.contains("rope_scaling")) read_rope_object(j["rope_scaling"], path, "rope_scaling", s);
    std::string act = c.opt_str("hidden_act", "silu");
    if (act != "silu") user_error(path, ": hidden_act '", act, "' is not supported (", s.model_type, " uses silu for SwiGLU)");
    s.swiglu = true;
    s.activation = "silu";
    if (c.opt_int("pretraining_tp", 1) != 1) user_error(path, ": pretraining_tp must be 1");
    if (moe) read_moe_config(c, s);
    const bool ab = c.opt_bool("attention_bias", false), mb = c.opt_bool("mlp_bias", moe ? ab : false);
    if (ab != mb)
      user_error(path, ": attention_bias=", ab ? "true" : "false", " with mlp_bias=", mb ? "true" : "false",
                 " is not supported (Megatron's --add-bias-linear covers attention and MLP together)");
    s.add_bias_linear = ab;
    // Qwen2-MoE: q/k/v have a bias (Qwen2MoeAttention, config qkv_bias, true by default), o_proj
    // none: Megatron's --add-qkv-bias with --disable-bias-linear.
    s.add_qkv_bias = s.model_type == "qwen2_moe" ? c.opt_bool("qkv_bias", true) : ab;
    s.untie_embeddings_and_output_weights = !c.opt_bool("tie_word_embeddings", false);
  } else if (s.model_type == "gpt2") {
    s.hidden_size = c.req_int("n_embd");
    s.num_layers = c.req_int("n_layer");
    s.num_attention_heads = c.req_int("n_head");
    s.num_query_groups = s.num_attention_heads;
    if (s.hidden_size % s.num_attention_heads != 0)
      user_error(path, ": n_embd ", s.hidden_size, " is not a multiple of n_head ", s.num_attention_heads);
    s.kv_channels = s.hidden_size / s.num_attention_heads;
    s.ffn_hidden_size = c.opt_int("n_inner", 4 * s.hidden_size);
    s.max_position_embeddings = c.req_int("n_positions");
    s.vocab_size = c.req_int("vocab_size");
    s.normalization = "LayerNorm";
    s.norm_epsilon = c.opt_num("layer_norm_epsilon", 1e-5);
    s.position_embedding_type = "learned_absolute";
    std::string act = c.opt_str("activation_function", "gelu_new");
    if (act == "gelu_new" || act == "gelu_pytorch_tanh") s.activation = "gelu_tanh";
    else if (act == "gelu") s.activation = "gelu";
    else if (act == "relu2") s.activation = "relu2";  // transformers' ReLUSquaredActivation: relu(x)^2
    else user_error(path, ": activation_function '", act, "' is not supported (gelu_new, gelu or relu2)");
    if (c.opt_bool("scale_attn_by_inverse_layer_idx", false))
      user_error(path, ": scale_attn_by_inverse_layer_idx=true is not supported");
    if (!c.opt_bool("scale_attn_weights", true)) user_error(path, ": scale_attn_weights=false is not supported");
    if (c.opt_bool("add_cross_attention", false)) user_error(path, ": add_cross_attention=true is not supported");
    s.add_bias_linear = true;
    s.add_qkv_bias = true;
    s.untie_embeddings_and_output_weights = !c.opt_bool("tie_word_embeddings", true);
  } else {
    user_error(path, ": model_type '", s.model_type, "' is not supported (llama, gpt2, mixtral, qwen3_moe or qwen2_moe)");
  }
  return s;
}

std::vector<std::string> HFModelSpec::megatron_args() const {
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  std::vector<std::string> a = {"--num-layers", std::to_string(num_layers), "--hidden-size", std::to_string(hidden_size),
                                "--ffn-hidden-size", std::to_string(ffn_hidden_size), "--num-attention-heads",
                                std::to_string(num_attention_heads), "--kv-channels", std::to_string(kv_channels),
                                "--max-position-embeddings", std::to_string(max_position_embeddings),
                                "--normalization", normalization, "--norm-epsilon", num(norm_epsilon),
                                "--position-embedding-type", position_embedding_type};
  if (num_query_groups != num_attention_heads) {
    a.insert(a.end(), {"--group-query-attention", "--num-query-groups", std::to_string(num_query_groups)});
  }
  if (position_embedding_type == "rope") {
    // Megatron's --rotary-base is an int: print the whole number (%g would give 1e+06 for 1000000).
    if (!(rotary_base >= 1.0 && rotary_base < 9.0e15 && std::floor(rotary_base) == rotary_base))
      user_error("config.json rope_theta ", num(rotary_base), " is not a whole number >= 1; Megatron's --rotary-base "
                 "takes an int");
    a.insert(a.end(), {"--rotary-base", std::to_string(static_cast<int64_t>(rotary_base))});
  }
  if (use_rope_scaling) a.insert(a.end(), {"--use-rope-scaling", "--rope-scaling-factor", num(rope_scaling_factor)});
  if (swiglu) a.push_back("--swiglu");
  if (!add_bias_linear) a.push_back("--disable-bias-linear");
  if (add_qkv_bias && !add_bias_linear) a.push_back("--add-qkv-bias");
  if (untie_embeddings_and_output_weights) a.push_back("--untie-embeddings-and-output-weights");
  if (activation == "gelu_tanh") a.push_back("--openai-gelu");
  // Exact (erf) GeLU: pretrain_gpt's fused bias-GeLU is the tanh approximation.
  // Squared ReLU: Megatron fuses only GeLU / SwiGLU with the bias.
  if (activation == "gelu" || activation == "relu2") a.push_back("--no-bias-gelu-fusion");
  if (activation == "relu2") a.push_back("--squared-relu");
  if (qk_layernorm) a.push_back("--qk-layernorm");
  if (is_moe()) {
    a.insert(a.end(), {"--num-experts", std::to_string(num_moe_experts), "--moe-ffn-hidden-size",
                       std::to_string(moe_ffn_hidden_size), "--moe-router-topk", std::to_string(moe_router_topk),
                       "--moe-layer-freq", moe_layer_freq(), "--moe-router-load-balancing-type", "aux_loss",
                       "--moe-aux-loss-coeff", num(moe_aux_loss_coeff)});
    if (moe_router_pre_softmax) a.push_back("--moe-router-pre-softmax");
    if (moe_shared_expert_intermediate_size > 0)
      a.insert(a.end(), {"--moe-shared-expert-intermediate-size", std::to_string(moe_shared_expert_intermediate_size)});
    if (moe_shared_expert_gate) a.push_back("--moe-shared-expert-gate");
  }
  return a;
}

std::string HFModelSpec::moe_layer_freq() const {
  if (moe_layer_pattern.empty()) return "1";
  std::string f = "[";
  for (size_t i = 0; i < moe_layer_pattern.size(); ++i) f += (i ? "," : "") + std::to_string(moe_layer_pattern[i]);
  return f + "]";
}

json hf_config_json(const HFModelSpec& s) {
  if (s.model_type == "llama" || s.model_type == "mixtral" || s.model_type == "qwen3_moe" || s.model_type == "qwen2_moe") {
    const char* arch = s.model_type == "llama"       ? "LlamaForCausalLM"
                       : s.model_type == "mixtral"   ? "MixtralForCausalLM"
                       : s.model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                                                     : "Qwen2MoeForCausalLM";
    json j = {{"architectures", {arch}},
            {"model_type", s.model_type},
            {"hidden_size", s.hidden_size},
            {"intermediate_size", s.ffn_hidden_size},
            {"num_hidden_layers", s.num_layers},
            {"num_attention_heads", s.num_attention_heads},
            {"num_key_value_heads", s.num_query_groups},
            {"head_dim", s.kv_channels},
            {"max_position_embeddings", s.max_position_embeddings},
            {"vocab_size", s.vocab_size},
            {"rms_norm_eps", s.norm_epsilon},
            {"rope_theta", s.rotary_base},
            {"rope_scaling", s.use_rope_scaling ? json{{"rope_type", "llama3"},
                                                        {"factor", s.rope_scaling_factor},
                                                        {"low_freq_factor", 1.0},
                                                        {"high_freq_factor", 4.0},
                                                        {"original_max_position_embeddings", 8192}}
                                                 : json(nullptr)},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", !s.untie_embeddings_and_output_weights},
            {"attention_bias", s.add_bias_linear},
            {"mlp_bias", s.add_bias_linear},
            {"pretraining_tp", 1}};
    if (s.model_type == "llama") return j;
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    j["num_experts_per_tok"] = s.moe_router_topk;
    j["router_aux_loss_coef"] = s.moe_aux_loss_coeff;
    j["output_router_logits"] = false;
    if (s.model_type == "mixtral") {
      j.erase("attention_bias");
      j["num_local_experts"] = s.num_moe_experts;
      j["intermediate_size"] = s.moe_ffn_hidden_size;
      j["sliding_window"] = nullptr;
      j["router_jitter_noise"] = 0.0;
      return j;
    }
    j["num_experts"] = s.num_moe_experts;
    j["moe_intermediate_size"] = s.moe_ffn_hidden_size;
    j["norm_topk_prob"] = !s.moe_router_pre_softmax;
    j["decoder_sparse_step"] = 1;
    json dense = json::array();
    for (int64_t i = 0; i < s.num_layers; ++i)
      if (!s.moe_layer(i)) dense.push_back(i);
    j["mlp_only_layers"] = dense;
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    if (s.model_type == "qwen2_moe") {
      // Qwen2MoeConfig has no attention_bias (its q/k/v bias is qkv_bias, true by default: written
      // only when false) and no head_dim field (its attention reads one when present, else hidden /
      // heads: written only when it differs).
      j.erase("attention_bias");
      if (s.kv_channels == s.hidden_size / s.num_attention_heads) j.erase("head_dim");
      if (!s.add_qkv_bias) j["qkv_bias"] = false;
      j["shared_expert_intermediate_size"] = s.moe_shared_expert_intermediate_size;
    }
    return j;
  }
  MEGATRON_CHECK(s.model_type == "gpt2") << "model_type " << s.model_type;
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", s.hidden_size},
          {"n_layer", s.num_layers},
          {"n_head", s.num_attention_heads},
          {"n_inner", s.ffn_hidden_size == 4 * s.hidden_size ? json(nullptr) : json(s.ffn_hidden_size)},
          {"n_positions", s.max_position_embeddings},
          {"vocab_size", s.vocab_size},
          {"layer_norm_epsilon", s.norm_epsilon},
          {"activation_function", s.activation == "gelu" || s.activation == "relu2" ? s.activation : "gelu_new"},
          {"tie_word_embeddings", !s.untie_embeddings_and_output_weights}};
}

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

HFWeights::HFWeights(const std::string& dir) : dir_(dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::set<std::string> files;
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(dc::read_text_file(index));
    } catch (const json::exception& e) {
      user_error(index, ": not valid JSON (", e.what(), ")");
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object()) user_error(index, ": no 'weight_map' object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      where_[it.key()] = it.value().get<std::string>();
      files.insert(it.value().get<std::string>());
    }
  } else if (fs::exists(dir + "/model.safetensors")) {
    files.insert("model.safetensors");
  } else {
    user_error(dir, ": no model.safetensors or model.safetensors.index.json (is this a Hugging Face model directory?)");
  }
  for (const auto& f : files) {
    const std::string p = dir + "/" + f;
    if (!fs::exists(p)) user_error(index, ": names shard ", f, " which does not exist in ", dir);
    auto rd = std::make_unique<dc::SafetensorsReader>(p);
    if (!fs::exists(index))
      for (const auto& e : rd->entries()) where_[e.name] = f;
    files_[f] = std::move(rd);
  }
  for (const auto& [name, f] : where_)
    if (!files_.at(f)->find(name)) user_error(index, ": tensor '", name, "' is mapped to ", f, " but not stored there");
}

HFWeights::~HFWeights() = default;

bool HFWeights::has(const std::string& name) const { return where_.count(name) > 0; }

Tensor HFWeights::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) user_error(dir_, ": missing tensor '", name, "'");
  return files_.at(it->second)->tensor(name);
}

std::vector<std::string> HFWeights::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : where_) n.push_back(k);
  return n;
}

std::string HFWeights::file_of(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : dir_ + "/" + it->second;
}

// ---------------------------------------------------------------------------------------------
// Name/layout mapping
// ---------------------------------------------------------------------------------------------

namespace {

class Taker {
 public:
  Taker(const HFWeights& w) : w_(w) {}
  Tensor take(const std::string& name, const Shape& shape) {
    if (!w_.has(name)) user_error("Hugging Face checkpoint: missing tensor '", name, "'");
    Tensor t = w_.get(name);
    if (t.shape() != shape)
      user_error(w_.file_of(name), ": tensor '", name, "' has shape ", shape_str(t.shape()), ", config.json implies ",
                 shape_str(shape));
    used_.insert(name);
    return t;
  }
  void check_all_used() const {
    for (const auto& n : w_.names()) {
      if (used_.count(n)) continue;
      auto ends = [&](const std::string& suf) { return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0; };
      if (ends("rotary_emb.inv_freq") || ends(".attn.bias") || ends(".attn.masked_bias")) continue;
      user_error(w_.file_of(n), ": unexpected tensor '", n, "' (not part of the model config.json describes)");
    }
  }
  void mark_used(const std::string& n) { used_.insert(n); }

 private:
  const HFWeights& w_;
  std::set<std::string> used_;
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> hf_to_megatron(const HFWeights& w, const HFModelSpec& s, int64_t padded_vocab) {
  if (padded_vocab == 0) padded_vocab = s.vocab_size;
  if (padded_vocab < s.vocab_size) user_error("padded vocab size ", padded_vocab, " < vocab_size ", s.vocab_size);
  Taker t(w);
  std::vector<std::pair<std::string, Tensor>> out;
  const int64_t h = s.hidden_size, f = s.ffn_hidden_size, nh = s.num_attention_heads, ng = s.num_query_groups,
                d = s.kv_channels, V = s.vocab_size;
  auto L = [](int64_t i) { return "decoder.layers." + std::to_string(i) + "."; };
  if (s.model_type != "gpt2") {
    Tensor emb = t.take("model.embed_tokens.weight", {V, h});
    out.push_back({"embedding.word_embeddings.weight", resize_rows(emb, padded_vocab)});
    for (int64_t i = 0; i < s.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      out.push_back({L(i) + "input_layernorm.weight", t.take(p + "input_layernorm.weight", {h})});
      Tensor q = t.take(p + "self_attn.q_proj.weight", {nh * d, h});
      Tensor k = t.take(p + "self_attn.k_proj.weight", {ng * d, h});
      Tensor v = t.take(p + "self_attn.v_proj.weight", {ng * d, h});
      out.push_back({L(i) + "self_attention.linear_qkv.weight", qkv_to_megatron(q, k, v, nh, ng)});
      if (s.add_qkv_bias)
        out.push_back({L(i) + "self_attention.linear_qkv.bias",
                       qkv_to_megatron(t.take(p + "self_attn.q_proj.bias", {nh * d}), t.take(p + "self_attn.k_proj.bias", {ng * d}),
                                       t.take(p + "self_attn.v_proj.bias", {ng * d}), nh, ng)});
      out.push_back({L(i) + "self_attention.linear_proj.weight", t.take(p + "self_attn.o_proj.weight", {h, nh * d})});
      if (s.add_bias_linear) out.push_back({L(i) + "self_attention.linear_proj.bias", t.take(p + "self_attn.o_proj.bias", {h})});
      if (s.qk_layernorm) {
        out.push_back({L(i) + "self_attention.q_layernorm.weight", t.take(p + "self_attn.q_norm.weight", {d})});
        out.push_back({L(i) + "self_attention.k_layernorm.weight", t.take(p + "self_attn.k_norm.weight", {d})});
      }
      out.push_back({L(i) + "pre_mlp_layernorm.weight", t.take(p + "post_attention_layernorm.weight", {h})});
      if (s.moe_layer(i)) {
        // Router [E, h] and the routed experts: HF's (w1 | gate_proj, w3 | up_proj) -> fc1 = [gate; up],
        // (w2 | down_proj) -> fc2, as the dense SwiGLU MLP.
        const int64_t E = s.num_moe_experts, fe = s.moe_ffn_hidden_size;
        const std::string moe = p + (s.model_type == "mixtral" ? "block_sparse_moe." : "mlp.");
        const bool mx = s.model_type == "mixtral";
        out.push_back({L(i) + "mlp.router.weight", t.take(moe + "gate.weight", {E, h})});
        for (int64_t e = 0; e < E; ++e) {
          const std::string x = moe + "experts." + std::to_string(e) + ".";
          const std::string m = L(i) + "mlp.experts.local_experts." + std::to_string(e) + ".";
          out.push_back({m + "linear_fc1.weight", fc1_to_megatron(t.take(x + (mx ? "w1.weight" : "gate_proj.weight"), {fe, h}),
                                                                  t.take(x + (mx ? "w3.weight" : "up_proj.weight"), {fe, h}))});
          out.push_back({m + "linear_fc2.weight", t.take(x + (mx ? "w2.weight" : "down_proj.weight"), {h, fe})});
        }
        if (const int64_t fs = s.moe_shared_expert_intermediate_size; fs > 0) {
          // Qwen2-MoE's shared_expert (a SwiGLU MLP: fc1 = [gate_proj; up_proj]) and its
          // shared_expert_gate Linear(hidden, 1) = Megatron's shared_experts.gate_weight [1, h].
          out.push_back({L(i) + "mlp.shared_experts.linear_fc1.weight",
                         fc1_to_megatron(t.take(moe + "shared_expert.gate_proj.weight", {fs, h}),
                                         t.take(moe + "shared_expert.up_proj.weight", {fs, h}))});
          out.push_back({L(i) + "mlp.shared_experts.linear_fc2.weight", t.take(moe + "shared_expert.down_proj.weight", {h, fs})});
          if (s.moe_shared_expert_gate)
            out.push_back({L(i) + "mlp.shared_experts.gate_weight", t.take(moe + "shared_expert_gate.weight", {1, h})});
        }
        continue;
      }
      out.push_back({L(i) + "mlp.linear_fc1.weight",
                     fc1_to_megatron(t.take(p + "mlp.gate_proj.weight", {f, h}), t.take(p + "mlp.up_proj.weight", {f, h}))});
      if (s.add_bias_linear)
        out.push_back({L(i) + "mlp.linear_fc1.bias",
                       fc1_to_megatron(t.take(p + "mlp.gate_proj.bias", {f}), t.take(p + "mlp.up_proj.bias", {f}))});
      out.push_back({L(i) + "mlp.linear_fc2.weight", t.take(p + "mlp.down_proj.weight", {h, f})});
      if (s.add_bias_linear) out.push_back({L(i) + "mlp.linear_fc2.bias", t.take(p + "mlp.down_proj.bias", {h})});
    }
    out.push_back({"decoder.final_layernorm.weight", t.take("model.norm.weight", {h})});
    if (s.untie_embeddings_and_output_weights) {
      if (!w.has("lm_head.weight"))
        user_error("Hugging Face checkpoint: tie_word_embeddings is false but lm_head.weight is missing");
      out.push_back({"output_layer.weight", resize_rows(t.take("lm_head.weight", {V, h}), padded_vocab)});
    } else if (w.has("lm_head.weight")) {
      if (!same_bytes(t.take("lm_head.weight", {V, h}), emb))
        user_error(w.file_of("lm_head.weight"),
                   ": tie_word_embeddings is true but lm_head.weight differs from model.embed_tokens.weight");
    }
  } else {
    const std::string pre = w.has("transformer.wte.weight") ? "transformer." : "";
    Tensor wte = t.take(pre + "wte.weight", {V, h});
    out.push_back({"embedding.word_embeddings.weight", resize_rows(wte, padded_vocab)});
    out.push_back({"embedding.position_embeddings.weight", t.take(pre + "wpe.weight", {s.max_position_embeddings, h})});
    for (int64_t i = 0; i < s.num_layers; ++i) {
      const std::string p = pre + "h." + std::to_string(i) + ".";
      out.push_back({L(i) + "input_layernorm.weight", t.take(p + "ln_1.weight", {h})});
      out.push_back({L(i) + "input_layernorm.bias", t.take(p + "ln_1.bias", {h})});
      out.push_back({L(i) + "self_attention.linear_qkv.weight", gpt2_c_attn_to_megatron(t.take(p + "attn.c_attn.weight", {h, 3 * h}), nh)});
      out.push_back({L(i) + "self_attention.linear_qkv.bias", gpt2_c_attn_to_megatron(t.take(p + "attn.c_attn.bias", {3 * h}), nh)});
      out.push_back({L(i) + "self_attention.linear_proj.weight", transpose2d(t.take(p + "attn.c_proj.weight", {h, h}))});
      out.push_back({L(i) + "self_attention.linear_proj.bias", t.take(p + "attn.c_proj.bias", {h})});
      out.push_back({L(i) + "pre_mlp_layernorm.weight", t.take(p + "ln_2.weight", {h})});
      out.push_back({L(i) + "pre_mlp_layernorm.bias", t.take(p + "ln_2.bias", {h})});
      out.push_back({L(i) + "mlp.linear_fc1.weight", transpose2d(t.take(p + "mlp.c_fc.weight", {h, f}))});
      out.push_back({L(i) + "mlp.linear_fc1.bias", t.take(p + "mlp.c_fc.bias", {f})});
      out.push_back({L(i) + "mlp.linear_fc2.weight", transpose2d(t.take(p + "mlp.c_proj.weight", {f, h}))});
      out.push_back({L(i) + "mlp.linear_fc2.bias", t.take(p + "mlp.c_proj.bias", {h})});
    }
    out.push_back({"decoder.final_layernorm.weight", t.take(pre + "ln_f.weight", {h})});
    out.push_back({"decoder.final_layernorm.bias", t.take(pre + "ln_f.bias", {h})});
    if (s.untie_embeddings_and_output_weights) {
      if (!w.has("lm_head.weight"))
        user_error("Hugging Face checkpoint: tie_word_embeddings is false but lm_head.weight is missing");
      out.push_back({"output_layer.weight", resize_rows(t.take("lm_head.weight", {V, h}), padded_vocab)});
    } else if (w.has("lm_head.weight")) {
      if (!same_bytes(t.take("lm_head.weight", {V, h}), wte))
        user_error(w.file_of("lm_head.weight"), ": tie_word_embeddings is true but lm_head.weight differs from wte.weight");
    }
  }
  t.check_all_used();
  return out;
}

std::vector<std::pair<std::string, Tensor>> megatron_to_hf(const std::map<std::string, Tensor>& params,
                                                           const HFModelSpec& s) {
  auto get = [&](const std::string& n) -> const Tensor& {
    auto it = params.find(n);
    if (it == params.end()) user_error("export: missing Megatron tensor '", n, "'");
    return it->second;
  };
  std::vector<std::pair<std::string, Tensor>> out;
  const int64_t nh = s.num_attention_heads, ng = s.num_query_groups, V = s.vocab_size;
  auto L = [](int64_t i) { return "decoder.layers." + std::to_string(i) + "."; };
  if (s.model_type != "gpt2") {
    out.push_back({"model.embed_tokens.weight", resize_rows(get("embedding.word_embeddings.weight"), V)});
    for (int64_t i = 0; i < s.num_layers; ++i) {
      const std::string p = "model.layers." + std::to_string(i) + ".";
      out.push_back({p + "input_layernorm.weight", get(L(i) + "input_layernorm.weight")});
      auto qkv = qkv_from_megatron(get(L(i) + "self_attention.linear_qkv.weight"), nh, ng);
      out.push_back({p + "self_attn.q_proj.weight", qkv[0]});
      out.push_back({p + "self_attn.k_proj.weight", qkv[1]});
      out.push_back({p + "self_attn.v_proj.weight", qkv[2]});
      if (s.add_qkv_bias) {
        auto b = qkv_from_megatron(get(L(i) + "self_attention.linear_qkv.bias"), nh, ng);
        out.push_back({p + "self_attn.q_proj.bias", b[0]});
        out.push_back({p + "self_attn.k_proj.bias", b[1]});
        out.push_back({p + "self_attn.v_proj.bias", b[2]});
      }
      out.push_back({p + "self_attn.o_proj.weight", get(L(i) + "self_attention.linear_proj.weight")});
      if (s.add_bias_linear) out.push_back({p + "self_attn.o_proj.bias", get(L(i) + "self_attention.linear_proj.bias")});
      if (s.qk_layernorm) {
        out.push_back({p + "self_attn.q_norm.weight", get(L(i) + "self_attention.q_layernorm.weight")});
        out.push_back({p + "self_attn.k_norm.weight", get(L(i) + "self_attention.k_layernorm.weight")});
      }
      out.push_back({p + "post_attention_layernorm.weight", get(L(i) + "pre_mlp_layernorm.weight")});
      if (s.moe_layer(i)) {
        const bool mx = s.model_type == "mixtral";
        const std::string moe = p + (mx ? "block_sparse_moe." : "mlp.");
        out.push_back({moe + "gate.weight", get(L(i) + "mlp.router.weight")});
        for (int64_t e = 0; e < s.num_moe_experts; ++e) {
          const std::string x = moe + "experts." + std::to_string(e) + ".";
          const std::string m = L(i) + "mlp.experts.local_experts." + std::to_string(e) + ".";
          auto egu = fc1_from_megatron(get(m + "linear_fc1.weight"));
          out.push_back({x + (mx ? "w1.weight" : "gate_proj.weight"), egu[0]});
          out.push_back({x + (mx ? "w2.weight" : "down_proj.weight"), get(m + "linear_fc2.weight")});
          out.push_back({x + (mx ? "w3.weight" : "up_proj.weight"), egu[1]});
        }
        if (s.moe_shared_expert_intermediate_size > 0) {
          auto sgu = fc1_from_megatron(get(L(i) + "mlp.shared_experts.linear_fc1.weight"));
          out.push_back({moe + "shared_expert.gate_proj.weight", sgu[0]});
          out.push_back({moe + "shared_expert.up_proj.weight", sgu[1]});
          out.push_back({moe + "shared_expert.down_proj.weight", get(L(i) + "mlp.shared_experts.linear_fc2.weight")});
          if (s.moe_shared_expert_gate)
            out.push_back({moe + "shared_expert_gate.weight", get(L(i) + "mlp.shared_experts.gate_weight")});
        }
        continue;
      }
      auto gu = fc1_from_megatron(get(L(i) + "mlp.linear_fc1.weight"));
      out.push_back({p + "mlp.gate_proj.weight", gu[0]});
      out.push_back({p + "mlp.up_proj.weight", gu[1]});
      if (s.add_bias_linear) {
        auto b = fc1_from_megatron(get(L(i) + "mlp.linear_fc1.bias"));
        out.push_back({p + "mlp.gate_proj.bias", b[0]});
        out.push_back({p + "mlp.up_proj.bias", b[1]});
      }
      out.push_back({p + "mlp.down_proj.weight", get(L(i) + "mlp.linear_fc2.weight")});
      if (s.add_bias_linear) out.push_back({p + "mlp.down_proj.bias", get(L(i) + "mlp.linear_fc2.bias")});
    }
    out.push_back({"model.norm.weight", get("decoder.final_layernorm.weight")});
    if (s.untie_embeddings_and_output_weights) out.push_back({"lm_head.weight", resize_rows(get("output_layer.weight"), V)});
  } else {
    out.push_back({"transformer.wte.weight", resize_rows(get("embedding.word_embeddings.weight"), V)});
    out.push_back({"transformer.wpe.weight", get("embedding.position_embeddings.weight")});
    for (int64_t i = 0; i < s.num_layers; ++i) {
      const std::string p = "transformer.h." + std::to_string(i) + ".";
      out.push_back({p + "ln_1.weight", get(L(i) + "input_layernorm.weight")});
      out.push_back({p + "ln_1.bias", get(L(i) + "input_layernorm.bias")});
      out.push_back({p + "attn.c_attn.weight", gpt2_c_attn_from_megatron(get(L(i) + "self_attention.linear_qkv.weight"), nh)});
      out.push_back({p + "attn.c_attn.bias", gpt2_c_attn_from_megatron(get(L(i) + "self_attention.linear_qkv.bias"), nh)});
      out.push_back({p + "attn.c_proj.weight", transpose2d(get(L(i) + "self_attention.linear_proj.weight"))});
      out.push_back({p + "attn.c_proj.bias", get(L(i) + "self_attention.linear_proj.bias")});
      out.push_back({p + "ln_2.weight", get(L(i) + "pre_mlp_layernorm.weight")});
      out.push_back({p + "ln_2.bias", get(L(i) + "pre_mlp_layernorm.bias")});
      out.push_back({p + "mlp.c_fc.weight", transpose2d(get(L(i) + "mlp.linear_fc1.weight"))});
      out.push_back({p + "mlp.c_fc.bias", get(L(i) + "mlp.linear_fc1.bias")});
      out.push_back({p + "mlp.c_proj.weight", transpose2d(get(L(i) + "mlp.linear_fc2.weight"))});
      out.push_back({p + "mlp.c_proj.bias", get(L(i) + "mlp.linear_fc2.bias")});
    }
    out.push_back({"transformer.ln_f.weight", get("decoder.final_layernorm.weight")});
    out.push_back({"transformer.ln_f.bias", get("decoder.final_layernorm.bias")});
    if (s.untie_embeddings_and_output_weights) out.push_back({"lm_head.weight", resize_rows(get("output_layer.weight"), V)});
  }
  return out;
}

void save_hf_checkpoint(const std::string& dir, const std::vector<std::pair<std::string, Tensor>>& tensors,
                        const HFModelSpec& spec, uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) user_error(dir, ": cannot create directory (", ec.message(), ")");
  std::vector<std::vector<std::pair<std::string, Tensor>>> shards(1);
  uint64_t cur = 0, total = 0;
  for (const auto& nt : tensors) {
    const uint64_t nb = nt.second.nbytes();
    if (cur > 0 && cur + nb > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(nt);
    cur += nb;
    total += nb;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  // The files of an export that fails half-way (e.g. a full disk) are removed: a folder with some
  // of the shards and no config.json is not a model.
  std::vector<TempFileGuard> written;
  if (shards.size() == 1) {
    dc::save_safetensors(dir + "/model.safetensors", shards[0], meta);
    written.emplace_back(dir + "/model.safetensors");
  } else {
    json wm = json::object();
    for (size_t k = 0; k < shards.size(); ++k) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
      dc::save_safetensors(dir + "/" + name, shards[k], meta);
      written.emplace_back(dir + "/" + name);
      for (const auto& nt : shards[k]) wm[nt.first] = name;
    }
    dc::write_file_atomic(dir + "/model.safetensors.index.json",
                          json({{"metadata", {{"total_size", total}}}, {"weight_map", wm}}).dump(2) + "\n");
    written.emplace_back(dir + "/model.safetensors.index.json");
  }
  dc::write_file_atomic(dir + "/config.json", hf_config_json(spec).dump(2) + "\n");
  for (auto& g : written) g.release();
}

}  // namespace megatron::hf
