// Factories for the text tokenizers behind build_tokenizer() (one per Megatron library), and
// the generic byte-level BPE tokenizer class they return. See docs/tokenizers.md.
#pragma once

#include <memory>

#include "megatron/core/tokenizers/bpe_tokenizer.h"
#include "megatron/core/tokenizers/megatron_tokenizer.h"

namespace megatron::tokenizers {

/// A byte-level BPE tokenizer with Megatron's per-type vocab_size / eod / pad / identifiers.
class BpeTokenizer final : public MegatronTokenizer {
 public:
  struct Info {
    int64_t vocab_size = 0;
    int64_t eod = -1;
    std::optional<int64_t> pad;
    std::vector<std::pair<std::string, std::string>> identifiers;
  };
  BpeTokenizer(BpePipelineSpec spec, Info info) : pipeline_(std::move(spec)), info_(std::move(info)) {}
  std::vector<int64_t> tokenize(std::string_view text) const override { return pipeline_.encode(text); }
  void tokenize_into(std::string_view text, std::vector<int64_t>& out) const override {
    pipeline_.encode_into(text, out);
  }
  std::string detokenize(const std::vector<int64_t>& ids) const override { return pipeline_.decode(ids); }
  int64_t vocab_size() const override { return info_.vocab_size; }
  int64_t eod() const override { return info_.eod; }
  std::optional<int64_t> pad() const override { return info_.pad; }
  std::vector<std::pair<std::string, std::string>> unique_identifiers() const override { return info_.identifiers; }
  const BpePipeline& pipeline() const { return pipeline_; }

 private:
  BpePipeline pipeline_;
  Info info_;
};

/// --tokenizer-type HuggingFaceTokenizer: tokenizer.json (+ tokenizer_config.json) from
/// --tokenizer-model (folder or file), or a folder with vocab.json + merges.txt. Matches
/// Megatron's huggingface_tokenizer.py over transformers AutoTokenizer: tokenize = input_ids with
/// the post-processor template (BOS) unless --tokenizer-hf-no-include-special-tokens; added
/// tokens in the text are recognised; vocab_size = len(tokenizer); eod = id of eos_token (sep_token
/// if no eos; -1 if neither); pad = id of pad_token or none. Throws UserError for missing files
/// and for tokenizer.json components it does not implement (named in the message).
std::unique_ptr<MegatronTokenizer> make_huggingface_tokenizer(const TokenizerConfig& cfg);

/// --tokenizer-type GPT2BPETokenizer: --vocab-file (encoder/vocab.json) + --merge-file
/// (vocab.bpe/merges.txt), as Megatron's MegatronHFTokenizer("GPT2BPETokenizer") = transformers
/// GPT-2: <|endoftext|> in the text is the special token, vocab_size = 50257, eod = 50256, no pad.
std::unique_ptr<MegatronTokenizer> make_gpt2_bpe_tokenizer(const TokenizerConfig& cfg);

/// --tokenizer-type TikTokenizer: Megatron's tiktoken_tokenizer.py. --tokenizer-model is a JSON
/// list of {rank, token_bytes (base64), token_str}; ids = rank + --tiktoken-num-special-tokens;
/// ids below that are <unk>,<s>,</s>,<mask>,<pad>,<cls>,<sep>,<SPECIAL_7>... (or
/// --tokenizer-special-tokens + fillers); --tiktoken-pattern v1|v2 (default v2); vocab_size =
/// --vocab-size (default 131072) and the file must hold exactly vocab_size - num_special ranks
/// after the cut; eod = id of </s>, pad = id of <pad>; special strings in the text are encoded
/// as their ids (allowed_special="all").
std::unique_ptr<MegatronTokenizer> make_tiktokenizer(const TokenizerConfig& cfg);

/// SentencePieceTokenizer / GPTSentencePieceTokenizer / Llama2Tokenizer through Debian's
/// libsentencepiece: tokenize = encode_as_ids (no BOS), vocab_size = piece size, eod = eos_id,
/// pad = pad_id (-1 when the model has none).
std::unique_ptr<MegatronTokenizer> make_sentencepiece_tokenizer(const TokenizerConfig& cfg);

/// Python str() of a list of strings (Megatron's identifiers hold str(list)).
std::string python_list_repr(const std::vector<std::string>& v);
/// Python str() of an optional string: the string or "None".
std::string python_str(const std::optional<std::string>& v);

}  // namespace megatron::tokenizers
