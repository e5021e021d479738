// MoE configuration helpers: Megatron's --moe-layer-freq parsing (megatron/training/arguments.py
// moe_freq_type / _eval_pattern) and the layer pattern of megatron/core/models/gpt/gpt_layer_specs.py.
// The MoE fields themselves live in TransformerConfig (transformer_config.h), checked by
// TransformerConfig::validate_moe() (moe_config.cpp). docs/moe.md lists the flags.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace megatron::transformer::moe {

/// --moe-layer-freq: an integer N (one MoE layer every N layers, layer i is MoE iff i % N == 0)
/// or a Python list expression over non-negative integers built from list literals `[a, b]`,
/// `*` with an integer, `+` of lists and parentheses, e.g. "([0]*3+[1]*29)" or "([1]*3+[0]*1)*3".
/// Megatron eval()s the expression after allowing only the characters `,0-9[]()+*`; this is a
/// recursive-descent parser of exactly that grammar (no eval). Returns the per-layer pattern for
/// `num_layers` layers (an integer form expands; a list must have num_layers entries, each 0 or 1).
/// Throws UserError naming --moe-layer-freq for a syntax error, a value other than 0/1, N < 1,
/// or a list of the wrong length.
std::vector<int> parse_moe_layer_freq(const std::string& text, int64_t num_layers);

/// The list value of a --moe-layer-freq expression ("[1]*2+[0]" -> {1, 1, 0}); an integer form
/// returns {N} with *is_int set. Same errors as parse_moe_layer_freq (no length check).
std::vector<int64_t> eval_moe_layer_freq(const std::string& text, bool* is_int);

}  // namespace megatron::transformer::moe
