// Bridges the Hugging Face file layer (hf_checkpoint.h) and GPTModel: the TransformerConfig a
// config.json describes, and copying converted tensors into / out of a model's parameters.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/transformer/transformer_config.h"
#include "megatron/training/hf/hf_checkpoint.h"

namespace megatron::hf {

/// TransformerConfig of the HF model (dropout 0, fp32; parallel sizes left at 1). GPT-2's
/// gelu_new is the tanh GeLU (bias_activation_fusion, as pretrain_gpt's default). MoE models get
/// the MoE fields the flags of spec.megatron_args() give (a list pattern = non-homogeneous layers).
transformer::TransformerConfig transformer_config_from_hf(const HFModelSpec& spec);

/// Copies converted tensors (hf_to_megatron output; full, unsharded) into the model's parameters
/// (TP rank slices taken for sharded parameters). UserError naming any model parameter without
/// a tensor or with a different global shape.
void load_into_model(models::gpt::GPTModel& model, const std::vector<std::pair<std::string, Tensor>>& tensors);

}  // namespace megatron::hf
