// Test-only readers for the Hugging Face fixtures in tests/reference/hf/ (written by
// transformers on the GPU machine): float32 .safetensors files and inputs.json.
#pragma once

#include <map>
#include <string>

#include "megatron/core/tensor/tensor.h"

namespace megatron::testing {

/// All tensors of a float32 safetensors file (8-byte LE header length, JSON header with
/// dtype/shape/data_offsets, raw data), as CPU float32 tensors by name.
std::map<std::string, Tensor> read_safetensors_f32(const std::string& path);

}  // namespace megatron::testing
