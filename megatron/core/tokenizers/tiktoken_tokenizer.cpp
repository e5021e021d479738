// TikTokenizer: Megatron's tiktoken_tokenizer.py (JSON rank list, shifted ids, v1/v2 patterns).
#include <algorithm>
#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "megatron/core/tokenizers/text_tokenizers.h"
#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

namespace {

bool base64_decode(std::string_view in, std::string& out) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(a[i])] = static_cast<int8_t>(i);
    return t;
  }();
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    int8_t v = table[static_cast<uint8_t>(c)];
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  return true;
}

const std::vector<std::string> kRequiredSpecials = {"<unk>", "<s>", "</s>", "<mask>", "<pad>", "<cls>", "<sep>"};

}  // namespace

std::unique_ptr<MegatronTokenizer> make_tiktokenizer(const TokenizerConfig& cfg) {
  if (!cfg.tokenizer_model) user_error("--tokenizer-type TikTokenizer needs --tokenizer-model (tiktoken JSON vocab)");
  const std::string& path = *cfg.tokenizer_model;
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json")
    user_error("--tokenizer-model ", path, ": TikTokenizer expects a .json rank list");
  const std::string pattern_name = cfg.tiktoken_pattern.value_or("v2");
  PreTokenizerPattern pattern;
  if (pattern_name == "v1") pattern = PreTokenizerPattern::kTiktokenV1;
  else if (pattern_name == "v2") pattern = PreTokenizerPattern::kTiktokenV2;
  else user_error("--tiktoken-pattern must be v1 or v2 (got ", pattern_name, ")");
  const int64_t vocab_size = cfg.vocab_size.value_or(131072);
  const int64_t num_special = cfg.tiktoken_num_special_tokens;
  std::vector<std::string> specials =
      cfg.tokenizer_special_tokens.empty() ? kRequiredSpecials : cfg.tokenizer_special_tokens;
  if (std::set<std::string>(specials.begin(), specials.end()).size() != specials.size())
    user_error("--tokenizer-special-tokens must be unique");
  if (!(static_cast<int64_t>(specials.size()) <= num_special && num_special < vocab_size))
    user_error("TikTokenizer needs len(special tokens) <= --tiktoken-num-special-tokens (", num_special,
               ") < --vocab-size (", vocab_size, ")");
  for (const auto& r : kRequiredSpecials)
    if (std::find(specials.begin(), specials.end(), r) == specials.end())
      user_error("--tokenizer-special-tokens must include ", r, " (TikTokenizer needs <unk> <s> </s> <mask> <pad> <cls> <sep>)");
  for (int64_t i = static_cast<int64_t>(specials.size()); i < num_special; ++i)
    specials.push_back("<SPECIAL_" + std::to_string(i) + ">");

  std::ifstream f(path, std::ios::binary);
  if (!f) user_error("--tokenizer-model: cannot open ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    user_error(path, " is not valid JSON: ", e.what());
  }
  if (!vocab.is_array()) user_error(path, ": TikTokenizer vocab must be a JSON list of {rank, token_bytes, token_str}");
  const int64_t inner = vocab_size - num_special;
  if (static_cast<int64_t>(vocab.size()) < inner)
    user_error(path, " holds ", vocab.size(), " ranks but --vocab-size ", vocab_size, " - ", num_special,
               " special tokens needs ", inner, " (pass --vocab-size ", vocab.size() + num_special, ")");

  BpePipelineSpec spec;
  spec.model = std::make_unique<BytePairModel>();
  std::string bytes;
  for (int64_t i = 0; i < inner; ++i) {
    const auto& x = vocab[i];
    if (!x.is_object() || !x.contains("rank") || !x.contains("token_bytes") || x["rank"].get<int64_t>() != i)
      user_error(path, ": entry ", i, " must be {\"rank\": ", i, ", \"token_bytes\": base64, \"token_str\": ...}");
    if (!base64_decode(x["token_bytes"].get<std::string>(), bytes))
      user_error(path, ": entry ", i, " token_bytes is not base64");
    if (i < 256 && !(bytes.size() == 1 && static_cast<uint8_t>(bytes[0]) == i))
      user_error(path, ": entry ", i, " must be the single byte ", i, " (ranks 0..255 are the bytes)");
    if (spec.model->token_id(bytes) >= 0) user_error(path, ": entry ", i, " repeats the bytes of an earlier rank");
    spec.model->add_token(bytes, static_cast<int32_t>(i + num_special));
  }
  spec.model->add_tiktoken_ranks();
  spec.model->set_ignore_merges(true);
  for (size_t i = 0; i < specials.size(); ++i)
    spec.added_tokens.push_back({specials[i], static_cast<int64_t>(i), true, false, false, false});
  spec.stages = {pattern};
  auto index_of = [&](const std::string& s) {
    return static_cast<int64_t>(std::find(specials.begin(), specials.end(), s) - specials.begin());
  };
  BpeTokenizer::Info info;
  info.vocab_size = vocab_size;
  info.eod = index_of("</s>");
  info.pad = index_of("<pad>");
  info.identifiers = {{"class", "megatron.core.tokenizers.text.text_tokenizer.MegatronTokenizerText"},
                      {"tokenizer_path", path},
                      {"chat_template", "None"}};
  if (cfg.tiktoken_pattern) info.identifiers.emplace_back("pattern", *cfg.tiktoken_pattern);
  if (cfg.vocab_size) info.identifiers.emplace_back("vocab_size", std::to_string(*cfg.vocab_size));
  info.identifiers.emplace_back("num_special_tokens", std::to_string(num_special));
  info.identifiers.emplace_back("special_tokens", cfg.tokenizer_special_tokens.empty()
                                                      ? "None"
                                                      : python_list_repr(cfg.tokenizer_special_tokens));
  return std::make_unique<BpeTokenizer>(std::move(spec), std::move(info));
}

}  // namespace megatron::tokenizers
