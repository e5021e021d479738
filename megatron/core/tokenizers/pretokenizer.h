// Hand-written pre-tokenizers for the fixed regexes of the byte-level BPE tokenizers.
//
// Each scanner reproduces, match for match, what Hugging Face tokenizers 0.23.2 (Oniguruma) and
// tiktoken produce for one known regex (leftmost-first alternation with backtracking), using the
// Unicode 16.0 classes of unicode_table.h and an ASCII fast path. Patterns (HF tokenizer.json
// forms; tiktoken's possessive rewrites are equivalent):
//   kGpt2:       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kCl100k:     (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+        (cl100k_base, LLaMA-3)
//   kQwen2:      kCl100k with \p{N} (single digits)                          (Qwen2/2.5/3)
//   kO200k:      o200k_base (GPT-4o): case-aware letter chunks with contraction suffixes
//   kTiktokenV1: Megatron TikTokenizer pattern "v1"
//   kTiktokenV2: Megatron TikTokenizer pattern "v2" (o200k without contractions, single digits)
// (full strings: regex_of()).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::tokenizers {

enum class PreTokenizerPattern { kGpt2, kCl100k, kQwen2, kO200k, kTiktokenV1, kTiktokenV2 };

/// The regex string (as written in tokenizer.json / Megatron's tiktoken_tokenizer.py) of `p`.
const std::string& regex_of(PreTokenizerPattern p);

/// The scanner for a regex string, or nullopt when the regex is not one we implement.
/// Accepts the HF forms and tiktoken's possessive forms of the same patterns.
std::optional<PreTokenizerPattern> pattern_from_regex(std::string_view regex);

/// Splits UTF-8 `text` into the consecutive matches of pattern `p` (they cover the whole text;
/// every piece is non-empty). Appends views into `text` to `out`. Invalid UTF-8 bytes are
/// treated as single code points of no class (punctuation-like).
void pretokenize(PreTokenizerPattern p, std::string_view text, std::vector<std::string_view>& out);

}  // namespace megatron::tokenizers
