#include "megatron/core/tokenizers/bpe_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>

#include "megatron/core/tokenizers/unicode_table.h"
#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

/// Byte trie over the added tokens' contents (leftmost-longest matching, HF AddedVocabulary).
struct BpePipeline::Trie {
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into added_tokens
  };
  std::vector<Node> nodes{1};
  std::array<bool, 256> first{};

  void add(std::string_view s, int32_t token) {
    if (s.empty()) return;
    first[static_cast<uint8_t>(s[0])] = true;
    int32_t cur = 0;
    for (unsigned char c : s) {
      auto& ch = nodes[cur].children;
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
      if (it != ch.end() && it->first == c) {
        cur = it->second;
      } else {
        int32_t nn = static_cast<int32_t>(nodes.size());
        ch.insert(it, {c, nn});
        nodes.emplace_back();
        cur = nn;
      }
    }
    if (nodes[cur].token < 0) nodes[cur].token = token;
  }
  // Longest token starting at i: (token index, end) or (-1, i).
  std::pair<int32_t, size_t> longest(std::string_view s, size_t i) const {
    int32_t cur = 0, best = -1;
    size_t best_end = i;
    for (size_t k = i; k < s.size(); ++k) {
      const auto& ch = nodes[cur].children;
      uint8_t c = static_cast<uint8_t>(s[k]);
      auto it = std::lower_bound(ch.begin(), ch.end(), std::make_pair(c, int32_t{-1}));
      if (it == ch.end() || it->first != c) break;
      cur = it->second;
      if (nodes[cur].token >= 0) {
        best = nodes[cur].token;
        best_end = k + 1;
      }
    }
    return {best, best_end};
  }
};

namespace {

// Decodes the code point that ends just before byte `end` (end > 0) / starts at `i`.
uint32_t cp_at(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return c;
  int len = (c >= 0xF0) ? 4 : (c >= 0xE0) ? 3 : 2;
  uint32_t cp = c & (0x3F >> (len - 1));
  for (int k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}
size_t prev_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}
bool is_word_char(uint32_t cp) {
  return cp == '_' || (unicode::class_of(cp) & (unicode::kL | unicode::kN));
}
bool is_ws(uint32_t cp) { return unicode::class_of(cp) & unicode::kWS; }

// NFC (ICU) unless the text is trivially normalized (no code point >= U+0300).
bool needs_nfc(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0xCC) return true;
  return false;
}
std::string nfc(std::string_view s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  if (U_FAILURE(err)) user_error("tokenizer: ICU NFC normalizer unavailable: ", u_errorName(err));
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (n->isNormalized(u, err) && U_SUCCESS(err)) return std::string(s);
  err = U_ZERO_ERROR;
  icu::UnicodeString out = n->normalize(u, err);
  if (U_FAILURE(err)) user_error("tokenizer: NFC normalization failed: ", u_errorName(err));
  std::string r;
  out.toUTF8String(r);
  return r;
}

}  // namespace

BpePipeline::BpePipeline(BpePipelineSpec spec) : spec_(std::move(spec)), trie_(std::make_unique<Trie>()) {
  MEGATRON_CHECK(spec_.model) << "BpePipeline needs a model";
  MEGATRON_CHECK(!spec_.stages.empty()) << "BpePipeline needs a pre-tokenizer";
  for (size_t i = 0; i < spec_.added_tokens.size(); ++i)
    trie_->add(spec_.added_tokens[i].content, static_cast<int32_t>(i));
}

BpePipeline::~BpePipeline() = default;

void BpePipeline::encode_normalized(std::string_view seg, std::vector<int64_t>& out) const {
  thread_local std::vector<std::string_view> a, b;
  std::string prefixed;
  if (spec_.add_prefix_space && !seg.empty() && seg[0] != ' ') {
    prefixed.reserve(seg.size() + 1);
    prefixed = " ";
    prefixed.append(seg);
    seg = prefixed;
  }
  a.clear();
  pretokenize(spec_.stages[0], seg, a);
  for (size_t st = 1; st < spec_.stages.size(); ++st) {
    b.clear();
    for (auto piece : a) pretokenize(spec_.stages[st], piece, b);
    std::swap(a, b);
  }
  spec_.model->encode_words(a.data(), a.size(), out);
}

void BpePipeline::encode_segment(std::string_view seg, std::vector<int64_t>& out) const {
  if (seg.empty()) return;
  if (spec_.nfc && needs_nfc(seg)) {
    std::string n = nfc(seg);
    encode_normalized(n, out);
  } else {
    encode_normalized(seg, out);
  }
}

std::vector<int64_t> BpePipeline::encode(std::string_view text) const {
  std::vector<int64_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_into(text, out);
  return out;
}

void BpePipeline::encode_into(std::string_view text, std::vector<int64_t>& out) const {
  if (spec_.add_special_tokens) out.insert(out.end(), spec_.prefix_ids.begin(), spec_.prefix_ids.end());
  size_t seg_start = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    if (!trie_->first[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    auto [tok, end] = trie_->longest(text, i);
    if (tok < 0) {
      ++i;
      continue;
    }
    const AddedToken& at = spec_.added_tokens[tok];
    if (at.single_word) {
      bool ok = (i == 0 || !is_word_char(cp_at(text, prev_start(text, i)))) &&
                (end >= n || !is_word_char(cp_at(text, end)));
      if (!ok) {
        ++i;
        continue;
      }
    }
    size_t start = i;
    if (at.lstrip)
      while (start > seg_start && is_ws(cp_at(text, prev_start(text, start)))) start = prev_start(text, start);
    size_t stop = end;
    if (at.rstrip)
      while (stop < n && is_ws(cp_at(text, stop))) {
        auto c = static_cast<unsigned char>(text[stop]);
        stop += c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      }
    encode_segment(text.substr(seg_start, start - seg_start), out);
    out.push_back(at.id);
    seg_start = i = std::min(stop, n);
  }
  encode_segment(text.substr(seg_start), out);
  if (spec_.add_special_tokens) out.insert(out.end(), spec_.suffix_ids.begin(), spec_.suffix_ids.end());
}

std::string BpePipeline::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids) {
    auto it = std::find_if(spec_.added_tokens.begin(), spec_.added_tokens.end(),
                           [&](const AddedToken& a) { return a.id == id; });
    if (it != spec_.added_tokens.end()) {
      s += it->content;
      continue;
    }
    if (id >= 0 && id <= INT32_MAX) s += spec_.model->token_bytes(static_cast<int32_t>(id));
  }
  return s;
}

int64_t BpePipeline::token_to_id(std::string_view token) const {
  for (const auto& a : spec_.added_tokens)
    if (a.content == token) return a.id;
  return spec_.model->token_id(token);
}

}  // namespace megatron::tokenizers
