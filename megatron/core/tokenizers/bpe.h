// Byte-level byte-pair encoding: the merge kernel shared by the HF BPE, GPT-2 and tiktoken paths.
//
// Symbols are raw bytes; a merge table maps an adjacent pair (left id, right id) to (rank, merged
// id). encode() repeatedly merges the lowest-rank adjacent pair, leftmost on ties, using a binary
// heap over a linked list of symbols (O(n log n) per word), which is Hugging Face's
// models/bpe/word.rs::merge_all and, for merge tables derived from tiktoken ranks
// (add_tiktoken_rank), tiktoken's byte_pair_encode. Results for words shorter than 256 bytes go
// into a bounded per-thread cache (131,072 inline entries for words of up to 24 bytes, 4,096 for
// longer words; HF's utils/cache.rs caps its cache at 10,000 words under 256 bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megatron::tokenizers {

/// GPT-2's bytes_to_unicode() table: byte -> code point of the printable stand-in character
/// (OpenAI encoder.py, HF pre_tokenizers/byte_level.rs).
uint32_t byte_to_unicode(uint8_t b);

/// Decodes a byte-level vocabulary string (UTF-8 of stand-in characters) to raw bytes.
/// Returns false when a character is not one of the 256 stand-ins.
bool byte_level_decode(std::string_view s, std::string& out);

/// The merge table: (left id, right id) -> (rank, merged id). Open addressing (linear probing,
/// load <= 0.6) over 16-byte slots {left:right, rank, merged id}, so a lookup touches one cache
/// line (lookups on word-cache misses are memory-latency bound). Ids must be non-negative.
class MergeTable {
 public:
  void reserve(size_t n);
  /// Adds a merge; a pair already present keeps its first rank.
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t result);
  /// (rank << 32 | merged id), or ~0 when the pair does not merge.
  uint64_t lookup(int32_t left, int32_t right) const {
    if (slots_.empty()) return ~0ull;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return (static_cast<uint64_t>(s.rank) << 32) | static_cast<uint32_t>(s.result);
      if (s.key == kEmpty) return ~0ull;
    }
  }
  /// Hints the cache line of a later lookup(left, right).
  void prefetch(int32_t left, int32_t right) const {
    if (slots_.empty()) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    __builtin_prefetch(&slots_[slot_of(key)]);
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t result = -1;
  };
  size_t slot_of(uint64_t key) const {
    key *= 0x9E3779B97F4A7C15ull;
    return (key ^ (key >> 29)) & mask_;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

/// Open-addressing hash map bytes -> int32 id with the keys in one arena (vocabulary lookup).
class BytesMap {
 public:
  /// Makes room for n entries without rehashing.
  void reserve(size_t n);
  /// Inserts (bytes, id) unless present; returns false if already present.
  bool insert(std::string_view key, int32_t id);
  /// Id or -1.
  int32_t find(std::string_view key) const;
  /// Same, with h = hash_bytes(key) computed by the caller.
  int32_t find(std::string_view key, uint64_t h) const;
  size_t size() const { return size_; }
  /// Calls f(bytes, id) for every entry.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& s : slots_)
      if (s.len != kEmpty) f(std::string_view(arena_.data() + s.off, s.len), s.id);
  }

 private:
  static constexpr uint32_t kEmpty = ~0u;
  struct Slot {
    uint64_t hash = 0;
    uint32_t off = 0, len = kEmpty;
    int32_t id = -1;
  };
  void grow(size_t cap);
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0, size_ = 0;
};

/// Hash of a byte string (used by the vocabulary map and the word cache).
uint64_t hash_bytes(std::string_view s);

/// A byte-level BPE model: vocabulary (bytes <-> id) and merge table.
class BytePairModel {
 public:
  BytePairModel();
  ~BytePairModel();
  BytePairModel(const BytePairModel&) = delete;
  BytePairModel& operator=(const BytePairModel&) = delete;

  /// Adds a token (raw bytes) with its id. A later add with the same bytes is ignored.
  void add_token(std::string_view bytes, int32_t id);
  /// Makes room for n tokens and m merges (optional; speeds up loading).
  void reserve(size_t n, size_t m) {
    by_bytes_.reserve(n);
    merges_.reserve(m);
  }
  /// Adds merge `rank`: (left, right) -> result (ids). Lower rank merges first; a repeated pair
  /// keeps its first rank (HF keeps the first occurrence).
  void add_merge(int32_t left, int32_t right, uint32_t rank, int32_t result);
  /// Derives the merges of a tiktoken rank table: for every token, every split into two tokens
  /// becomes a merge whose rank is the token's rank. Call after all add_token calls.
  void add_tiktoken_ranks();
  /// HF BPE ignore_merges (LLaMA-3), also tiktoken's rule: a word that is a token is emitted as is.
  void set_ignore_merges(bool v) { ignore_merges_ = v; }

  /// Id of the token with these bytes, or -1.
  int32_t token_id(std::string_view bytes) const;
  /// Bytes of token id (empty if unknown).
  std::string_view token_bytes(int32_t id) const;
  /// Number of distinct tokens.
  size_t num_tokens() const { return by_bytes_.size(); }

  /// Appends the ids of one pre-tokenized word (raw bytes, non-empty) to `out`. Uses the calling
  /// thread's word cache. Throws UserError if a byte has no token.
  void encode(std::string_view word, std::vector<int64_t>& out) const;
  /// encode() of n consecutive words, appending in order (cache lookups are prefetched ahead).
  void encode_words(const std::string_view* words, size_t n, std::vector<int64_t>& out) const;

 private:
  static constexpr size_t kSmallWord = 32;
  void merge_word(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_small(std::string_view word, std::vector<int32_t>& ids) const;
  void encode_short(std::string_view word, const uint64_t w[3], uint64_t h, void* cache,
                    std::vector<int64_t>& out) const;
  void encode_long(std::string_view word, std::vector<int64_t>& out) const;

  BytesMap by_bytes_;
  std::vector<std::string> by_id_;
  int32_t byte_ids_[256];
  MergeTable merges_;
  bool ignore_merges_ = false;
  uint64_t uid_;   // identifies this model's per-thread cache
};

}  // namespace megatron::tokenizers
