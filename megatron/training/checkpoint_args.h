// The arguments a checkpoint records (common state "args") and Megatron's check of them on load
// (megatron/training/checkpointing.py: the args saved in every checkpoint, check_checkpoint_args).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace megatron::training {

struct Arguments;

/// Every argument of the printed arguments block (args_items: each declared flag under its
/// Megatron argparse dest, plus world_size, rank, data_parallel_size, params_dtype,
/// padded_vocab_size, ...) as a JSON object, each value typed from its Python str(): "True" /
/// "False" -> bool, "None" -> null, integer / float text -> number, anything else (lists,
/// enums, paths) -> the string as printed. This is what pretrain_gpt stores as the checkpoint's
/// args (Megatron stores its whole args namespace), so a converter can read the architecture
/// (squared_relu, swiglu, normalization, ...) from the checkpoint. Call after validate_args and
/// set_padded_vocab_size.
nlohmann::json checkpoint_args(const Arguments& args);

/// The value str() printed, as JSON (the typing rule of checkpoint_args).
nlohmann::json py_str_to_json(const std::string& s);

/// Megatron's check_checkpoint_args: compares the arguments that define the model between a
/// checkpoint's args (`ckpt`) and this run's (`current`, from checkpoint_args()). Checked:
/// Megatron's list (num_layers, hidden_size, num_attention_heads, max_position_embeddings,
/// make_vocab_size_divisible_by -- only when the padded_vocab_size of the two differs or is
/// missing, since the divisor matters through it alone) and the choices that would otherwise load into a different
/// model without a shape error: swiglu, squared_relu, normalization, position_embedding_type,
/// add_bias_linear, add_qkv_bias (effective: add_bias_linear or add_qkv_bias), qk_layernorm,
/// untie_embeddings_and_output_weights, apply_layernorm_1p (layernorm_zero_centered_gamma),
/// ffn_hidden_size, kv_channels, mtp_num_layers, group_query_attention / num_query_groups, layernorm_epsilon,
/// rotary_base / rotary_percent / rotary_interleaved / use_rope_scaling (and its factor) /
/// rotary_seq_len_interpolation_factor (rope only). Parallel sizes are not checked:
/// our checkpoints reshard (Megatron's --use-dist-ckpt behaviour). A key absent from either side
/// is skipped, so checkpoints that recorded only the old ~15 keys still load.
/// Throws UserError "<where>: --<flag> is <current> but the checkpoint was saved with <value>
/// (<dest>); ..." naming the first mismatch.
void check_checkpoint_args(const nlohmann::json& ckpt, const nlohmann::json& current, const std::string& where);

/// The MLP activation a model with these checkpoint args computes (what TransformerConfig and
/// MLP do with them): "swiglu", "squared_relu", "gelu_tanh" (GeLU with the tanh approximation:
/// the fused bias-GeLU path, i.e. bias_gelu_fusion and add_bias_linear) or "gelu" (exact erf).
/// Absent keys take pretrain_gpt's defaults (swiglu/squared_relu false, bias_gelu_fusion and
/// add_bias_linear true).
std::string mlp_activation(const nlohmann::json& args);

}  // namespace megatron::training
