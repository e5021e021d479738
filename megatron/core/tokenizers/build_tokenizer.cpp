#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/tokenizers/text_tokenizers.h"
#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

int64_t padded_vocab_size(int64_t vocab_size, int64_t divisible_by, int64_t tp) {
  int64_t m = divisible_by * tp;
  if (m <= 0) return vocab_size;
  return (vocab_size + m - 1) / m * m;
}

std::unique_ptr<MegatronTokenizer> build_tokenizer(const TokenizerConfig& cfg) {
  const std::string& t = cfg.tokenizer_type;
  if (t == "NullTokenizer") {
    if (!cfg.vocab_size) user_error("--tokenizer-type NullTokenizer needs --vocab-size");
    return std::make_unique<NullTokenizer>(*cfg.vocab_size, cfg.null_tokenizer_eod_id, cfg.null_tokenizer_pad_id);
  }
  if (t.empty()) user_error("--tokenizer-type is required");
  if (t == "HuggingFaceTokenizer") return make_huggingface_tokenizer(cfg);
  if (t == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(cfg);
  if (t == "TikTokenizer") return make_tiktokenizer(cfg);
  if (t == "SentencePieceTokenizer" || t == "GPTSentencePieceTokenizer" || t == "Llama2Tokenizer")
    return make_sentencepiece_tokenizer(cfg);
  user_error("--tokenizer-type ", t, " is not supported (choices: NullTokenizer, GPT2BPETokenizer, ",
             "HuggingFaceTokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer, TikTokenizer)");
}

}  // namespace megatron::tokenizers
