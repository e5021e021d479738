// The tokenizer interface every --tokenizer-type implements, and the factory.
//
// Semantics follow Megatron-LM's megatron/core/tokenizers (MegatronTokenizerText and its
// "library" tokenizers): tokenize() is the library's text_to_ids, vocab_size is the unpadded
// size that picks the .bin dtype, eod/pad as documented per type in docs/tokenizers.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::tokenizers {

/// Tokenizer options, named after Megatron's TokenizerConfig fields (flag --x-y <-> field x_y).
struct TokenizerConfig {
  std::string tokenizer_type;                    // --tokenizer-type
  std::optional<std::string> tokenizer_model;    // --tokenizer-model (file or folder)
  std::optional<std::string> vocab_file;         // --vocab-file
  std::optional<std::string> merge_file;         // --merge-file
  std::optional<int64_t> vocab_size;             // --vocab-size
  int64_t vocab_extra_ids = 0;                   // --vocab-extra-ids
  std::optional<std::string> tiktoken_pattern;   // --tiktoken-pattern (v1|v2)
  int64_t tiktoken_num_special_tokens = 1000;    // --tiktoken-num-special-tokens
  std::vector<std::string> tokenizer_special_tokens;  // --tokenizer-special-tokens
  bool tokenizer_hf_include_special_tokens = true;    // --tokenizer-hf-no-include-special-tokens
  bool tokenizer_sentencepiece_legacy = false;        // --tokenizer-sentencepiece-legacy
  std::optional<int64_t> null_tokenizer_eod_id;       // --null-tokenizer-eod-id
  int64_t null_tokenizer_pad_id = -1;                 // --null-tokenizer-pad-id
};

/// A text tokenizer. Thread-compatible: tokenize() is const and may be called from several
/// threads at once (implementations keep per-thread caches).
class MegatronTokenizer {
 public:
  virtual ~MegatronTokenizer() = default;
  /// Text -> ids, exactly as Megatron's tokenizer.tokenize(text) for this type.
  virtual std::vector<int64_t> tokenize(std::string_view text) const = 0;
  /// Same ids, appended to `out` (no allocation per call where the type supports it).
  virtual void tokenize_into(std::string_view text, std::vector<int64_t>& out) const {
    std::vector<int64_t> ids = tokenize(text);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  /// Ids -> text (best effort; used by tests and tools).
  virtual std::string detokenize(const std::vector<int64_t>& ids) const = 0;
  /// Unpadded vocabulary size (Megatron's tokenizer.vocab_size).
  virtual int64_t vocab_size() const = 0;
  /// End-of-document id appended by --append-eod; -1 if the tokenizer has none.
  virtual int64_t eod() const = 0;
  /// Pad id; nullopt when the tokenizer has no pad token (Megatron's None).
  virtual std::optional<int64_t> pad() const = 0;
  /// Megatron's "unique_identifiers" of the tokenizer, as (key, value-as-string) pairs in
  /// Megatron's order, used in the dataset cache description (docs/megatron-reference.md#cache-files). The first two
  /// entries are "class" and "tokenizer_path" (value "null" means JSON null).
  virtual std::vector<std::pair<std::string, std::string>> unique_identifiers() const = 0;
};

/// Builds the tokenizer named by cfg.tokenizer_type; throws UserError naming the flag on a bad
/// or missing option or file.
std::unique_ptr<MegatronTokenizer> build_tokenizer(const TokenizerConfig& cfg);

/// Megatron's vocab padding (docs/megatron-reference.md#vocab-padding): ceil(V / (divisor*tp)) * (divisor*tp).
int64_t padded_vocab_size(int64_t vocab_size, int64_t make_vocab_size_divisible_by, int64_t tp);

}  // namespace megatron::tokenizers
