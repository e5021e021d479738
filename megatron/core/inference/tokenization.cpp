#include "megatron/core/inference/tokenization.h"

#include "megatron/core/tokenizers/null_tokenizer.h"
#include "megatron/core/utils/errors.h"

namespace megatron::inference {

std::vector<std::vector<int64_t>> tokenize_prompts(const tokenizers::MegatronTokenizer& tokenizer,
                                                   const std::vector<std::string>& prompts, bool add_BOS) {
  const int64_t eod = tokenizer.eod();
  if (eod < 0) user_error("No eod token found in Tokenizer");
  std::vector<std::vector<int64_t>> out;
  for (const auto& p : prompts) {
    std::vector<int64_t> ids;
    if (add_BOS) ids.push_back(eod);
    if (!p.empty()) tokenizer.tokenize_into(p, ids);
    out.push_back(std::move(ids));
  }
  return out;
}

std::string utf8_replace_invalid(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len == 2) ok = c >= 0xC2;                                             // no overlong form
    if (ok && len == 3) ok = !(c == 0xE0 && p[i + 1] < 0xA0) && !(c == 0xED && p[i + 1] >= 0xA0);  // no surrogates
    if (ok && len == 4) ok = !(c == 0xF0 && p[i + 1] < 0x90) && !(c == 0xF4 && p[i + 1] >= 0x90) && c <= 0xF4;
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

Detokenized detokenize_generation(const tokenizers::MegatronTokenizer& tokenizer, const std::vector<int64_t>& ids,
                                  bool detokenize_segments) {
  Detokenized d;
  d.text = utf8_replace_invalid(tokenizer.detokenize(ids));
  if (!detokenize_segments) return d;
  if (dynamic_cast<const tokenizers::NullTokenizer*>(&tokenizer)) {
    // NullTokenizer.offsets: token i starts at sum_{j<i} (len(str(id_j)) + 1).
    size_t start = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t next = i + 1 < ids.size() ? start + std::to_string(ids[i]).size() + 1 : d.text.size();
      d.segments.push_back(d.text.substr(std::min(start, d.text.size()), next - std::min(start, next)));
      start = next;
    }
    return d;
  }
  for (int64_t id : ids) d.segments.push_back(utf8_replace_invalid(tokenizer.detokenize({id})));
  return d;
}

}  // namespace megatron::inference
