// --split-sentences: ICU sentence segmentation (UAX #29 sentence boundaries).
//
// Megatron-LM splits with NLTK's punkt model (tools/preprocess_data.py); punkt is a trained,
// language-specific abbreviation model that is not available in C++. We use ICU's rule-based
// sentence BreakIterator instead, so sentence boundaries can differ from Megatron's (see
// docs/preprocess_data.md). What we keep from Megatron: text is split in chunks of 1,000,000
// characters first, and each sentence is stripped of surrounding whitespace unless
// --keep-newlines (then trailing whitespace, newlines included, stays with its sentence).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megatron::datasets::preprocess {

/// One instance per thread (ICU break iterators are not thread-safe).
class SentenceSplitter {
 public:
  /// `lang`: Megatron's --lang (a punkt language name such as "english", "german") or an ICU
  /// locale ("en", "de"). Throws UserError if ICU cannot create the iterator.
  SentenceSplitter(const std::string& lang, bool keep_newlines);
  ~SentenceSplitter();
  SentenceSplitter(const SentenceSplitter&) = delete;
  SentenceSplitter& operator=(const SentenceSplitter&) = delete;

  /// Splits UTF-8 `text` into sentences (views into `text`); empty pieces are dropped.
  std::vector<std::string_view> split(std::string_view text);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Maps a punkt language name to an ICU locale id ("english" -> "en"); unknown names pass through.
std::string punkt_lang_to_locale(const std::string& lang);

}  // namespace megatron::datasets::preprocess
