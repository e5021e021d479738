// Test-only readers for the Hugging Face fixtures in tests/reference/hf/ (written by
// transformers on the GPU machine): float32 .safetensors files and inputs.json.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "megatron/core/datasets/gpt_batch.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::testing {

/// All tensors of a float32 safetensors file (8-byte LE header length, JSON header with
/// dtype/shape/data_offsets, raw data), as CPU float32 tensors by name.
std::map<std::string, Tensor> read_safetensors_f32(const std::string& path);

/// The micro-batch of a fixture's inputs.json ({"tokens": [b][s], "labels": [b][s]}): tokens,
/// labels, position_ids 0..s-1 (int64 [b, s]) and an all-ones loss_mask (float32 [b, s]).
datasets::GPTBatch read_hf_inputs(const std::string& inputs_json);

/// Test assertion: f() must throw UserError whose message contains `needle` (gtest failure otherwise).
void expect_user_error(const std::function<void()>& f, const std::string& needle);

}  // namespace megatron::testing
