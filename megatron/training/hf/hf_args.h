// Checkpoint args <-> Hugging Face model settings for convert_checkpoint: what an HF import
// records as the checkpoint's args (Megatron dest names, so pretrain_gpt's check_checkpoint_args
// compares them with the training flags), the HFModelSpec an export derives from a checkpoint's
// args, and the refusal of anything the target HF architecture cannot represent.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "megatron/training/hf/hf_checkpoint.h"

namespace megatron::hf {

/// The checkpoint args of an imported HF model: the architecture arguments under Megatron's
/// argparse dests (num_layers, ..., swiglu, squared_relu, bias_gelu_fusion, normalization,
/// layernorm_epsilon, position_embedding_type, qk_layernorm, ...) with the values the flags of
/// spec.megatron_args() give, plus hf_model_type / hf_activation / vocab_size / padded_vocab_size.
nlohmann::json spec_to_args(const HFModelSpec& spec, int64_t padded_vocab_size, int64_t make_vocab_size_divisible_by);

/// The HF model a checkpoint's args describe (no --hf-config). model_type: the args'
/// hf_model_type, else for an MoE model (num_experts > 0) "qwen2_moe" with a shared expert and
/// --moe-shared-expert-gate, "qwen3_moe" with qk_layernorm and "mixtral" otherwise, else "llama" for a SwiGLU / RMSNorm / rope model and "gpt2" otherwise.
/// Throws UserError "<where>: checkpoint args lack '<key>'; pass --hf-config ..." for a missing
/// size, and whatever check_hf_export refuses.
HFModelSpec spec_from_args(const nlohmann::json& args, const std::string& where);

/// Refuses (UserError, one line naming the argument and the HF architecture) a checkpoint whose
/// args the HF architecture spec.model_type cannot represent: LLaMA needs SwiGLU, RMSNorm, plain
/// rope (rotary_percent 1, not interleaved), QKV bias iff linear bias; GPT-2 needs LayerNorm,
/// learned absolute positions, biases, no grouped-query attention, GeLU (exact or tanh) or
/// squared ReLU ("relu2"); neither has qk_layernorm, apply_layernorm_1p or rope scaling. Mixtral,
/// Qwen3-MoE and Qwen2-MoE are LLaMA's rules plus the MoE ones (softmax scores, no top-k scaling /
/// expert bias / group routing; Mixtral and Qwen3-MoE: no shared expert; Mixtral: every layer MoE,
/// no pre-softmax, no qk_layernorm; Qwen3-MoE: qk_layernorm; Qwen2-MoE: a shared expert with
/// --moe-shared-expert-gate, no qk_layernorm, QKV bias without linear bias allowed); experts in
/// LLaMA / GPT-2 are refused. When
/// `hf_config` names the --hf-config file, also refuses a config.json whose settings differ from
/// the args the checkpoint was trained with (activation, sizes, normalization, epsilon, rope base,
/// bias, tying; Qwen2-MoE: shared expert size, qkv_bias). Keys the args lack (checkpoints that recorded only ~15 keys) are not checked.
void check_hf_export(const nlohmann::json& args, const HFModelSpec& spec, const std::string& where,
                     const std::string& hf_config = "");

}  // namespace megatron::hf
