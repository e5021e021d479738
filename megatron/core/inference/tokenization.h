// Prompt tokenization and output detokenization of text generation (Megatron's
// megatron/inference/text_generation/tokenization.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::inference {

/// Megatron's _tokenize_prompts_and_batch before padding: tokenizer.tokenize(prompt) per prompt,
/// with EOD prepended when add_BOS. Throws UserError when the tokenizer has no EOD ("No eod token
/// found in Tokenizer") or rejects a prompt.
std::vector<std::vector<int64_t>> tokenize_prompts(const tokenizers::MegatronTokenizer& tokenizer,
                                                   const std::vector<std::string>& prompts, bool add_BOS);

/// Megatron's detokenize_generations for one sequence (ids already cut to its length): the text
/// (tokenizer.detokenize) and, with segments, one string per token. Segments follow Megatron's
/// tokenizer.offsets where we know them (NullTokenizer: each id followed by its separating space,
/// "1 2 3" -> ["1 ", "2 ", "3"]); for the other tokenizers each token detokenized alone (Megatron's
/// fallback for tokenizers without offsets). Invalid UTF-8 in either is replaced by U+FFFD
/// (Python's errors="replace"), so the strings are valid JSON.
struct Detokenized {
  std::string text;
  std::vector<std::string> segments;
};
Detokenized detokenize_generation(const tokenizers::MegatronTokenizer& tokenizer, const std::vector<int64_t>& ids,
                                  bool detokenize_segments);

/// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string utf8_replace_invalid(const std::string& s);

}  // namespace megatron::inference
