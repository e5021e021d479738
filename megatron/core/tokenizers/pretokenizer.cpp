#include "megatron/core/tokenizers/pretokenizer.h"

#include <array>
#include <cstdint>

#include "megatron/core/tokenizers/unicode_table.h"

namespace megatron::tokenizers {

namespace u = unicode;

namespace {

// --- pattern strings -------------------------------------------------------------------------
const std::string kGpt2Re = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kCl100kRe =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2Re =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kO200kRe =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kTiktokenV1Re =
    R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
const std::string kTiktokenV2Re =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tiktoken's possessive rewrites (tiktoken_ext/openai_public.py), equivalent to the above.
const std::string kGpt2TiktokenRe =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
const std::string kCl100kTiktokenRe =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";

// --- scanner configuration ---------------------------------------------------------------------
enum class Contractions { kNone, kCaseSensitive, kCaseInsensitive, kSuffix };
enum class Letters { kGpt2, kCl100k, kO200k };
struct Scanner {
  Contractions contractions;
  Letters letters;
  int max_digits;          // 0: GPT-2's " ?\p{N}+"
  int punct_trailer;       // 0: none, 1: [\r\n]*, 2: [\r\n/]*
  bool newline_alt;        // \s*[\r\n]+
};

constexpr Scanner scanner_for(PreTokenizerPattern p) {
  switch (p) {
    case PreTokenizerPattern::kGpt2: return {Contractions::kCaseSensitive, Letters::kGpt2, 0, 0, false};
    case PreTokenizerPattern::kCl100k: return {Contractions::kCaseInsensitive, Letters::kCl100k, 3, 1, true};
    case PreTokenizerPattern::kQwen2: return {Contractions::kCaseInsensitive, Letters::kCl100k, 1, 1, true};
    case PreTokenizerPattern::kO200k: return {Contractions::kSuffix, Letters::kO200k, 3, 2, true};
    case PreTokenizerPattern::kTiktokenV1: return {Contractions::kNone, Letters::kCl100k, 1, 1, true};
    case PreTokenizerPattern::kTiktokenV2: return {Contractions::kNone, Letters::kO200k, 1, 2, true};
  }
  return {Contractions::kNone, Letters::kGpt2, 0, 0, false};
}

// Extra pseudo-class bits beyond unicode_table.h's byte (kept in a uint16).
constexpr uint16_t kCR_LF = 0x100;  // '\r' or '\n'
constexpr uint16_t kUpperSet = u::kLu | u::kLt | u::kLm | u::kLo | u::kM;  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
constexpr uint16_t kLowerSet = u::kLl | u::kLm | u::kLo | u::kM;           // [\p{Ll}\p{Lm}\p{Lo}\p{M}]

constexpr std::array<uint16_t, 128> make_ascii() {
  std::array<uint16_t, 128> t{};
  for (int c = 'A'; c <= 'Z'; ++c) t[c] = u::kLu;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = u::kLl;
  for (int c = '0'; c <= '9'; ++c) t[c] = u::kN;
  for (int c : {'\t', '\n', '\v', '\f', '\r', ' '}) t[c] = u::kWS;
  t['\r'] |= kCR_LF;
  t['\n'] |= kCR_LF;
  return t;
}
constexpr std::array<uint16_t, 128> kAscii = make_ascii();

/// Decoded code point at a byte position.
struct Cp {
  uint32_t cp;
  uint16_t cls;
  uint32_t len;  // bytes; 0 at end of text
};

class Text {
 public:
  explicit Text(std::string_view s) : s_(reinterpret_cast<const unsigned char*>(s.data())), n_(s.size()) {}
  size_t size() const { return n_; }
  unsigned char byte(size_t i) const { return i < n_ ? s_[i] : 0; }
  __attribute__((always_inline)) Cp at(size_t i) const {
    if (i >= n_) return {0, 0, 0};
    unsigned char c = s_[i];
    if (c < 0x80) return {c, kAscii[c], 1};
    return at_multibyte(i, c);
  }
  __attribute__((noinline)) Cp at_multibyte(size_t i, unsigned char c) const {
    uint32_t cp;
    uint32_t len;
    if ((c & 0xE0) == 0xC0 && i + 1 < n_ && (s_[i + 1] & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (s_[i + 1] & 0x3Fu);
      len = 2;
      if (cp < 0x80) return {0xFFFD, 0, 1};
    } else if ((c & 0xF0) == 0xE0 && i + 2 < n_ && (s_[i + 1] & 0xC0) == 0x80 && (s_[i + 2] & 0xC0) == 0x80) {
      cp = ((c & 0x0Fu) << 12) | ((s_[i + 1] & 0x3Fu) << 6) | (s_[i + 2] & 0x3Fu);
      len = 3;
      if (cp < 0x800) return {0xFFFD, 0, 1};
    } else if ((c & 0xF8) == 0xF0 && i + 3 < n_ && (s_[i + 1] & 0xC0) == 0x80 && (s_[i + 2] & 0xC0) == 0x80 &&
               (s_[i + 3] & 0xC0) == 0x80) {
      cp = ((c & 0x07u) << 18) | ((s_[i + 1] & 0x3Fu) << 12) | ((s_[i + 2] & 0x3Fu) << 6) | (s_[i + 3] & 0x3Fu);
      len = 4;
      if (cp < 0x10000 || cp > 0x10FFFF) return {0xFFFD, 0, 1};
    } else {
      return {0xFFFD, 0, 1};  // invalid byte: a code point of no class
    }
    return {cp, u::class_of(cp), len};
  }

 private:
  const unsigned char* s_;
  size_t n_;
};

inline bool is_letter(uint16_t c) { return c & u::kL; }
inline bool is_number(uint16_t c) { return c & u::kN; }
inline bool is_space(uint16_t c) { return c & u::kWS; }
// [^\r\n\p{L}\p{N}]
inline bool is_prefix(const Cp& c) { return c.len && !(c.cls & (u::kL | u::kN | kCR_LF)); }
// [^\s\p{L}\p{N}]
inline bool is_other(const Cp& c) { return c.len && !(c.cls & (u::kL | u::kN | u::kWS)); }

// Length of a contraction 's 't 're 've 'm 'll 'd at i (0 if none).
size_t contraction(const Text& t, size_t i, bool case_insensitive) {
  if (t.byte(i) != '\'') return 0;
  Cp a = t.at(i + 1);
  if (!a.len) return 0;
  uint32_t c = a.cp;
  if (case_insensitive) {
    if (c >= 'A' && c <= 'Z') c += 32;
    if (c == 0x17F) c = 's';  // U+017F LATIN SMALL LETTER LONG S case-folds to 's'
  }
  if (c == 's' || c == 't' || c == 'm' || c == 'd') return 1 + a.len;
  if (c == 'r' || c == 'v' || c == 'l') {
    Cp b = t.at(i + 1 + a.len);
    if (!b.len) return 0;
    uint32_t d = b.cp;
    if (case_insensitive && d >= 'A' && d <= 'Z') d += 32;
    if ((c == 'l' && d == 'l') || (c != 'l' && d == 'e')) return 1 + a.len + b.len;
  }
  return 0;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at j; returns end or 0 (j > 0 always).
size_t upper_star_lower_plus(const Text& t, size_t j) {
  size_t k = j;
  size_t last_lower = SIZE_MAX;  // start of the last char of the upper run that is also lower
  Cp c = t.at(k);
  while (c.len && (c.cls & kUpperSet)) {
    if (c.cls & kLowerSet) last_lower = k;
    k += c.len;
    c = t.at(k);
  }
  if (c.len && (c.cls & kLowerSet)) {  // lower+ right after the whole upper run
    while (c.len && (c.cls & kLowerSet)) {
      k += c.len;
      c = t.at(k);
    }
    return k;
  }
  if (last_lower == SIZE_MAX) return 0;
  return last_lower + t.at(last_lower).len;  // backtracked: the last lower-capable char of the run
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at j; returns end or 0.
size_t upper_plus_lower_star(const Text& t, size_t j) {
  Cp c = t.at(j);
  if (!(c.len && (c.cls & kUpperSet))) return 0;
  size_t k = j;
  while (c.len && (c.cls & kUpperSet)) {
    k += c.len;
    c = t.at(k);
  }
  while (c.len && (c.cls & kLowerSet)) {
    k += c.len;
    c = t.at(k);
  }
  return k;
}

// One match of scanner `s` starting at i (< size); returns its end (> i).
// The end of the run of code points with a class that `in_class` accepts, starting at byte j (j
// when the code point at j is not in the class).
inline size_t run_end(const Text& t, size_t j, bool (*in_class)(uint16_t)) {
  Cp c = t.at(j);
  while (c.len && in_class(c.cls)) {
    j += c.len;
    c = t.at(j);
  }
  return j;
}

size_t next_match(const Scanner& s, const Text& t, size_t i) {
  const Cp c0 = t.at(i);
  const size_t n = t.size();
  // 1. standalone contractions
  if (s.contractions == Contractions::kCaseSensitive || s.contractions == Contractions::kCaseInsensitive) {
    if (size_t len = contraction(t, i, s.contractions == Contractions::kCaseInsensitive)) return i + len;
  }
  // 2. letters
  switch (s.letters) {
    case Letters::kGpt2: {  // " ?\p{L}+"
      const size_t j = (c0.cp == ' ') ? i + 1 : i;
      if (is_letter(t.at(j).cls)) return run_end(t, j, is_letter);
      break;
    }
    case Letters::kCl100k: {  // "[^\r\n\p{L}\p{N}]?\p{L}+"
      size_t j = i;
      if (is_prefix(c0)) j += c0.len;
      if (is_letter(t.at(j).cls)) return run_end(t, j, is_letter);
      break;
    }
    case Letters::kO200k: {
      size_t end = 0;
      const bool pre = is_prefix(c0);
      if (pre) end = upper_star_lower_plus(t, i + c0.len);
      if (!end && (c0.cls & (kUpperSet | kLowerSet))) end = upper_star_lower_plus(t, i);
      if (!end && pre) end = upper_plus_lower_star(t, i + c0.len);
      if (!end) end = upper_plus_lower_star(t, i);
      if (end) {
        if (s.contractions == Contractions::kSuffix) end += contraction(t, end, true);
        return end;
      }
      break;
    }
  }
  // 3. digits
  if (s.max_digits == 0) {  // " ?\p{N}+"
    const size_t j = (c0.cp == ' ') ? i + 1 : i;
    if (is_number(t.at(j).cls)) return run_end(t, j, is_number);
  } else if (is_number(c0.cls)) {
    size_t j = i;
    Cp c = c0;
    for (int k = 0; k < s.max_digits && c.len && is_number(c.cls); ++k) {
      j += c.len;
      c = t.at(j);
    }
    return j;
  }
  // 4. " ?[^\s\p{L}\p{N}]+" + trailer
  {
    size_t j = (c0.cp == ' ') ? i + 1 : i;
    Cp c = t.at(j);
    if (is_other(c)) {
      while (is_other(c)) {
        j += c.len;
        c = t.at(j);
      }
      if (s.punct_trailer) {
        while (j < n) {
          unsigned char b = t.byte(j);
          if (b == '\r' || b == '\n' || (s.punct_trailer == 2 && b == '/')) ++j;
          else break;
        }
      }
      return j;
    }
  }
  // 5-7. whitespace
  if (is_space(c0.cls)) {
    size_t j = i;
    size_t last_start = i;
    size_t after_crlf = 0;
    Cp c = c0;
    while (c.len && is_space(c.cls)) {
      last_start = j;
      j += c.len;
      if (c.cls & kCR_LF) after_crlf = j;
      c = t.at(j);
    }
    if (s.newline_alt && after_crlf) return after_crlf;  // \s*[\r\n]+
    if (j >= n) return j;                               // \s+(?!\S) at the end
    if (last_start > i) return last_start;              // \s+(?!\S): give back the last char
    return j;                                           // \s+ (a single char)
  }
  return i + (c0.len ? c0.len : 1);  // unreachable for the patterns above; keep progress
}

}  // namespace

const std::string& regex_of(PreTokenizerPattern p) {
  switch (p) {
    case PreTokenizerPattern::kGpt2: return kGpt2Re;
    case PreTokenizerPattern::kCl100k: return kCl100kRe;
    case PreTokenizerPattern::kQwen2: return kQwen2Re;
    case PreTokenizerPattern::kO200k: return kO200kRe;
    case PreTokenizerPattern::kTiktokenV1: return kTiktokenV1Re;
    case PreTokenizerPattern::kTiktokenV2: return kTiktokenV2Re;
  }
  return kGpt2Re;
}

std::optional<PreTokenizerPattern> pattern_from_regex(std::string_view re) {
  for (auto p : {PreTokenizerPattern::kGpt2, PreTokenizerPattern::kCl100k, PreTokenizerPattern::kQwen2,
                 PreTokenizerPattern::kO200k, PreTokenizerPattern::kTiktokenV1, PreTokenizerPattern::kTiktokenV2})
    if (re == regex_of(p)) return p;
  if (re == kGpt2TiktokenRe) return PreTokenizerPattern::kGpt2;
  if (re == kCl100kTiktokenRe) return PreTokenizerPattern::kCl100k;
  return std::nullopt;
}

void pretokenize(PreTokenizerPattern p, std::string_view text, std::vector<std::string_view>& out) {
  const Scanner s = scanner_for(p);
  const Text t(text);
  size_t i = 0;
  while (i < text.size()) {
    size_t e = next_match(s, t, i);
    out.push_back(text.substr(i, e - i));
    i = e;
  }
}

}  // namespace megatron::tokenizers
