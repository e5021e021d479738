// SentencePieceTokenizer / GPTSentencePieceTokenizer / Llama2Tokenizer via libsentencepiece.
#include <sentencepiece_processor.h>

#include <filesystem>

#include "megatron/core/tokenizers/text_tokenizers.h"
#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

namespace {

/// Megatron's sentencepiece_tokenizer.py (non-legacy): encode_as_ids, eod = eos_id.
/// SentencePieceProcessor::Encode is const and the model immutable after Load, so one processor
/// serves all threads.
class SentencePieceTokenizer final : public MegatronTokenizer {
 public:
  explicit SentencePieceTokenizer(const TokenizerConfig& cfg) : path_(*cfg.tokenizer_model) {
    if (!std::filesystem::exists(path_)) user_error("--tokenizer-model ", path_, " does not exist");
    auto st = sp_.Load(path_);
    if (!st.ok()) user_error("--tokenizer-model ", path_, ": not a SentencePiece model (", st.ToString(), ")");
    special_tokens_ = cfg.tokenizer_special_tokens;
  }
  std::vector<int64_t> tokenize(std::string_view text) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) user_error("SentencePiece encode failed: ", st.ToString());
    return std::vector<int64_t>(ids.begin(), ids.end());
  }
  std::string detokenize(const std::vector<int64_t>& ids) const override {
    std::vector<int> v(ids.begin(), ids.end());
    std::string s;
    auto st = sp_.Decode(v, &s);
    if (!st.ok()) user_error("SentencePiece decode failed: ", st.ToString());
    return s;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int64_t eod() const override { return sp_.eos_id(); }
  std::optional<int64_t> pad() const override { return sp_.pad_id(); }
  std::vector<std::pair<std::string, std::string>> unique_identifiers() const override {
    return {{"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
            {"tokenizer_path", path_},
            {"chat_template", "None"},
            {"ignore_extra_whitespaces", "True"},
            {"legacy", "False"},
            {"special_tokens", special_tokens_.empty() ? "None" : python_list_repr(special_tokens_)}};
  }

 private:
  std::string path_;
  std::vector<std::string> special_tokens_;
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<MegatronTokenizer> make_sentencepiece_tokenizer(const TokenizerConfig& cfg) {
  if (!cfg.tokenizer_model) user_error("--tokenizer-type ", cfg.tokenizer_type, " needs --tokenizer-model (SentencePiece .model)");
  if (cfg.tokenizer_sentencepiece_legacy)
    user_error("--tokenizer-sentencepiece-legacy is not supported (Megatron's non-legacy path is implemented)");
  if (!cfg.tokenizer_special_tokens.empty())
    user_error("--tokenizer-special-tokens with ", cfg.tokenizer_type, " is not supported (non-legacy SentencePiece ignores them only in Megatron's legacy mode)");
  return std::make_unique<SentencePieceTokenizer>(cfg);
}

}  // namespace megatron::tokenizers
