#include "megatron/core/datasets/preprocess/sentence_splitter.h"

#include <unicode/brkiter.h>
#include <unicode/locid.h>
#include <unicode/utext.h>

#include <map>

#include "megatron/core/utils/errors.h"

namespace megatron::datasets::preprocess {

std::string punkt_lang_to_locale(const std::string& lang) {
  static const std::map<std::string, std::string> kMap = {
      {"czech", "cs"},   {"danish", "da"},    {"dutch", "nl"},     {"english", "en"},  {"estonian", "et"},
      {"finnish", "fi"}, {"french", "fr"},    {"german", "de"},    {"greek", "el"},    {"italian", "it"},
      {"malayalam", "ml"}, {"norwegian", "nb"}, {"polish", "pl"},  {"portuguese", "pt"}, {"russian", "ru"},
      {"slovene", "sl"}, {"spanish", "es"},   {"swedish", "sv"},   {"turkish", "tr"}};
  auto it = kMap.find(lang);
  return it == kMap.end() ? lang : it->second;
}

struct SentenceSplitter::Impl {
  std::unique_ptr<icu::BreakIterator> it;
  bool keep_newlines = false;
};

SentenceSplitter::SentenceSplitter(const std::string& lang, bool keep_newlines) : impl_(std::make_unique<Impl>()) {
  UErrorCode st = U_ZERO_ERROR;
  icu::Locale loc(punkt_lang_to_locale(lang).c_str());
  impl_->it.reset(icu::BreakIterator::createSentenceInstance(loc, st));
  if (U_FAILURE(st) || !impl_->it)
    user_error("--lang ", lang, ": ICU cannot create a sentence splitter (", u_errorName(st), ")");
  impl_->keep_newlines = keep_newlines;
}

SentenceSplitter::~SentenceSplitter() = default;

namespace {
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Byte length of the first `chars` code points of s (or s.size()).
size_t prefix_bytes(std::string_view s, size_t chars) {
  size_t n = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      if (n == chars) return i;
      ++n;
    }
  }
  return s.size();
}
}  // namespace

std::vector<std::string_view> SentenceSplitter::split(std::string_view text) {
  std::vector<std::string_view> out;
  constexpr size_t kChunkChars = 1000000;  // Megatron splits text[i:i+1000000] chunks first
  while (!text.empty()) {
    size_t nb = prefix_bytes(text, kChunkChars);
    std::string_view chunk = text.substr(0, nb);
    text.remove_prefix(nb);
    UErrorCode st = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, chunk.data(), static_cast<int64_t>(chunk.size()), &st);
    if (U_FAILURE(st)) user_error("ICU cannot read the text for sentence splitting (", u_errorName(st), ")");
    impl_->it->setText(ut, st);
    int32_t start = impl_->it->first();
    for (int32_t end = impl_->it->next(); end != icu::BreakIterator::DONE; start = end, end = impl_->it->next()) {
      size_t a = static_cast<size_t>(start), b = static_cast<size_t>(end);
      size_t first = a;
      while (a < b && is_space(chunk[a])) ++a;
      if (impl_->keep_newlines) {
        // whitespace (e.g. the 2nd newline of a blank line, a segment of its own under UAX #29
        // rule SB4) stays with the sentence before it
        if (a == b) {
          if (!out.empty() && out.back().data() + out.back().size() == chunk.data() + first)
            out.back() = std::string_view(out.back().data(), out.back().size() + (b - first));
          continue;
        }
      } else {
        while (b > a && is_space(chunk[b - 1])) --b;
      }
      if (b > a) out.push_back(chunk.substr(a, b - a));
    }
    utext_close(ut);
  }
  return out;
}

}  // namespace megatron::datasets::preprocess
