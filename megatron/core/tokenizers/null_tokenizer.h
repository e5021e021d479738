// NullTokenizer: text is whitespace-separated integer ids (Megatron's null-text library).
#pragma once

#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::tokenizers {

/// Megatron's NullTokenizer (megatron/core/tokenizers/text/libraries/null_tokenizer.py, current
/// semantics): vocab_size = --vocab-size V, eod = --null-tokenizer-eod-id or V-1,
/// pad = --null-tokenizer-pad-id (default -1). tokenize("1 2 3") = {1, 2, 3}: the text is split on
/// single spaces and each piece parsed as an integer (throws UserError on a non-integer piece).
class NullTokenizer final : public MegatronTokenizer {
 public:
  NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id, int64_t pad_id);
  std::vector<int64_t> tokenize(std::string_view text) const override;
  std::string detokenize(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  int64_t eod() const override { return eod_; }
  std::optional<int64_t> pad() const override { return pad_; }
  std::vector<std::pair<std::string, std::string>> unique_identifiers() const override;

 private:
  int64_t vocab_size_;
  int64_t eod_;
  std::optional<int64_t> eod_given_;
  int64_t pad_;
};

}  // namespace megatron::tokenizers
