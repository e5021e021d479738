#include "megatron/core/tokenizers/null_tokenizer.h"

#include <charconv>

#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

NullTokenizer::NullTokenizer(int64_t vocab_size, std::optional<int64_t> eod_id, int64_t pad_id)
    : vocab_size_(vocab_size), eod_(eod_id ? *eod_id : vocab_size - 1), eod_given_(eod_id), pad_(pad_id) {
  if (vocab_size <= 0) user_error("--vocab-size must be positive for NullTokenizer (got ", vocab_size, ")");
}

std::vector<int64_t> NullTokenizer::tokenize(std::string_view text) const {
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view piece = text.substr(start, end - start);
    int64_t v = 0;
    auto [p, ec] = std::from_chars(piece.data(), piece.data() + piece.size(), v);
    if (ec != std::errc() || p != piece.data() + piece.size())
      user_error("NullTokenizer: '", std::string(piece), "' is not an integer token id");
    ids.push_back(v);
    start = end + 1;
  }
  return ids;
}

std::string NullTokenizer::detokenize(const std::vector<int64_t>& ids) const {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) s += ' ';
    s += std::to_string(ids[i]);
  }
  return s;
}

std::vector<std::pair<std::string, std::string>> NullTokenizer::unique_identifiers() const {
  std::vector<std::pair<std::string, std::string>> ids = {
      {"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
      {"tokenizer_path", "null"},
      {"vocab_size", std::to_string(vocab_size_)}};
  if (eod_given_) ids.emplace_back("eod_id", std::to_string(*eod_given_));
  ids.emplace_back("pad_id", std::to_string(pad_));
  return ids;
}

}  // namespace megatron::tokenizers
