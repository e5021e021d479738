// The byte-level BPE text pipeline behind HuggingFaceTokenizer, GPT2BPETokenizer and TikTokenizer:
//   added/special-token split -> normalizer (none | NFC) -> pre-tokenizer scanner(s) -> byte-level
//   BPE -> post-processor (template prefix/suffix ids).
// This is Hugging Face tokenizers' encode order (tokenizer/mod.rs) restricted to what byte-level
// BPE tokenizer.json files use, and tiktoken's encode(text, allowed_special="all").
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megatron/core/tokenizers/bpe.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"
#include "megatron/core/tokenizers/pretokenizer.h"

namespace megatron::tokenizers {

/// An added token (HF tokenizer.json "added_tokens" entry, or a tiktoken special token).
struct AddedToken {
  std::string content;
  int64_t id = -1;
  bool special = true;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
};

/// Everything the pipeline needs; filled by the per-type loaders.
struct BpePipelineSpec {
  std::unique_ptr<BytePairModel> model;
  std::vector<AddedToken> added_tokens;
  bool nfc = false;                              // NFC normalizer (Qwen2/3)
  std::vector<PreTokenizerPattern> stages;       // applied in order to each piece
  bool add_prefix_space = false;                 // ByteLevel add_prefix_space
  std::vector<int64_t> prefix_ids, suffix_ids;   // TemplateProcessing "single" around $A
  bool add_special_tokens = true;                // false: no template ids
};

/// Byte-level BPE tokenizer core; subclasses supply Megatron's vocab_size/eod/pad/identifiers.
class BpePipeline {
 public:
  explicit BpePipeline(BpePipelineSpec spec);
  ~BpePipeline();
  /// Encodes `text` (UTF-8). Thread-safe.
  std::vector<int64_t> encode(std::string_view text) const;
  /// Same, appending to `out`.
  void encode_into(std::string_view text, std::vector<int64_t>& out) const;
  /// Concatenated bytes of the ids (added tokens by content); unknown ids are skipped.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// Id of a token string as transformers' convert_tokens_to_ids sees it (added tokens first,
  /// then the model vocabulary in raw bytes); -1 if unknown.
  int64_t token_to_id(std::string_view token_bytes) const;
  const BytePairModel& model() const { return *spec_.model; }
  const std::vector<AddedToken>& added_tokens() const { return spec_.added_tokens; }

 private:
  struct Trie;
  void encode_segment(std::string_view seg, std::vector<int64_t>& out) const;
  void encode_normalized(std::string_view seg, std::vector<int64_t>& out) const;
  BpePipelineSpec spec_;
  std::unique_ptr<Trie> trie_;
};

}  // namespace megatron::tokenizers
