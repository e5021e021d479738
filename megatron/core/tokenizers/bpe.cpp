#include "megatron/core/tokenizers/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

namespace {

struct ByteTables {
  uint32_t to_cp[256];
  int16_t from_cp[324];  // stand-in code point (< U+0144) -> byte, -1 if none
  ByteTables() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t{-1});
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? b : next++;
      from_cp[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

}  // namespace

namespace {

inline uint64_t load8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}
inline uint64_t load4(const char* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

/// The first min(n, 24) bytes of p as three little-endian words, zero padded, without reading
/// outside [p, p + n).
inline void load_padded24(const char* p, size_t n, uint64_t w[3]) {
  w[0] = w[1] = w[2] = 0;
  if (n >= 8) {
    w[0] = load8(p);
    if (n > 16) {
      w[1] = load8(p + 8);
      w[2] = n >= 24 ? load8(p + 16) : load8(p + n - 8) >> (8 * (24 - n));
    } else if (n > 8) {
      w[1] = load8(p + n - 8) >> (8 * (16 - n));
    }
  } else if (n >= 4) {
    w[0] = load4(p) | (load4(p + n - 4) << (8 * (n - 4)));
  } else if (n > 0) {
    const auto* u = reinterpret_cast<const unsigned char*>(p);
    w[0] = u[0] | (static_cast<uint64_t>(u[n / 2]) << (8 * (n / 2))) | (static_cast<uint64_t>(u[n - 1]) << (8 * (n - 1)));
  }
}

inline uint64_t mix64(uint64_t h) {
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

/// Hash of a word given its first 24 bytes as padded words (words of up to 24 bytes).
inline uint64_t hash_words(const uint64_t w[3], size_t n) {
  uint64_t h = (w[0] ^ 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  h ^= (w[1] + n) * 0x94D049BB133111EBull;
  h ^= (w[2] ^ (h >> 29)) * 0x9E3779B97F4A7C15ull;
  return mix64(h);
}

}  // namespace

uint64_t hash_bytes(std::string_view s) {
  const size_t n = s.size();
  if (n <= 24) {
    uint64_t w[3];
    load_padded24(s.data(), n, w);
    return hash_words(w, n);
  }
  // Longer words: 64-bit FNV-1a over 8-byte words, finished with a multiply-xorshift mix.
  uint64_t h = 0xcbf29ce484222325ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    h = (h ^ load8(s.data() + i)) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, n - i);
  h = (h ^ w) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 31);
}

namespace {


/// Level 1 of a thread's word cache: words of 2..24 bytes whose encoding has at most 8 ids
/// (nearly every word of real text), kept inline in 64-byte entries (key, hash tag, ids; no
/// pointers), 4-way set associative with exact LRU inside a set (a hit moves its entry to the
/// front, an insert drops the last). A lookup is one hash, one cache line set, three word compares.
class InlineWordCache {
 public:
  static constexpr size_t kMaxBytes = 24, kMaxIds = 8, kWays = 4;
  struct alignas(64) Entry {
    uint64_t key[3];
    uint32_t tag;   // hash >> 32
    uint8_t len;    // word bytes; 0 = empty
    uint8_t nids;
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 64);

  explicit InlineWordCache(size_t sets) : mask_(sets - 1), entries_(sets * kWays) {
    MEGATRON_CHECK((sets & (sets - 1)) == 0) << "sets must be a power of two";
  }

  /// Hints the first way of the word's set (a later find()).
  void prefetch(uint64_t h) const { __builtin_prefetch(&entries_[(h & mask_) * kWays]); }

  /// The entry of the word, or nullptr.
  const Entry* find(const uint64_t w[3], size_t n, uint64_t h) {
    Entry* set = &entries_[(h & mask_) * kWays];
    const uint32_t tag = static_cast<uint32_t>(h >> 32);
    for (size_t k = 0; k < kWays; ++k) {
      const Entry& e = set[k];
      if (e.len == n && e.tag == tag && e.key[0] == w[0] && e.key[1] == w[1] && e.key[2] == w[2]) {
        if (k == 0) return set;
        Entry hit = e;
        std::memmove(set + 1, set, k * sizeof(Entry));
        set[0] = hit;
        return set;
      }
    }
    return nullptr;
  }
  void insert(const uint64_t w[3], size_t n, uint64_t h, const int32_t* ids, size_t nids) {
    Entry* set = &entries_[(h & mask_) * kWays];
    std::memmove(set + 1, set, (kWays - 1) * sizeof(Entry));
    Entry& e = set[0];
    e.key[0] = w[0], e.key[1] = w[1], e.key[2] = w[2];
    e.tag = static_cast<uint32_t>(h >> 32);
    e.len = static_cast<uint8_t>(n);
    e.nids = static_cast<uint8_t>(nids);
    std::memcpy(e.ids, ids, nids * sizeof(int32_t));
  }

 private:
  size_t mask_;
  std::vector<Entry> entries_;
};

/// Level 2: words of 25..255 bytes (and short words with more than 8 ids are not cached):
/// 4-way set-associative, LRU within a set, 1,024 sets.
class LongWordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kWays = 4;
  static constexpr size_t kSets = 1024;

  LongWordCache() : entries_(kSets * kWays) {}

  bool lookup(std::string_view w, uint64_t h, std::vector<int64_t>& out) {
    Entry* set = &entries_[(h & (kSets - 1)) * kWays];
    for (size_t k = 0; k < kWays; ++k) {
      Entry& e = set[k];
      if (e.hash == h && e.key == w) {
        e.stamp = ++clock_;
        out.insert(out.end(), e.ids.begin(), e.ids.end());
        return true;
      }
    }
    return false;
  }
  void insert(std::string_view w, uint64_t h, const int32_t* ids, size_t n) {
    Entry* set = &entries_[(h & (kSets - 1)) * kWays];
    Entry* victim = set;
    for (size_t k = 1; k < kWays; ++k)
      if (set[k].stamp < victim->stamp) victim = &set[k];
    victim->hash = h;
    victim->key.assign(w.data(), w.size());
    victim->ids.assign(ids, ids + n);
    victim->stamp = ++clock_;
  }

 private:
  struct Entry {
    uint64_t hash = 0;
    uint64_t stamp = 0;
    std::string key;
    std::vector<int32_t> ids;
  };
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

/// The word cache of one thread for one model. Bounded: 32,768 x 4 inline entries (8 MiB) plus
/// 4,096 long-word entries, whatever the input size. (HF tokenizers bounds its cache to 10,000
/// words under 256 bytes, utils/cache.rs; ours is larger, and evicts instead of refusing new
/// words, so the frequent words of the current text stay cached.)
struct WordCache {
  static constexpr size_t kInlineSets = 32768;
  InlineWordCache small{kInlineSets};
  LongWordCache large;
};

/// Per-thread caches of the last few models used on this thread (bounded: older ones are freed).
struct ThreadCaches {
  static constexpr size_t kMaxModels = 4;
  std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> by_model;  // most recent first
  WordCache& get(uint64_t uid) {
    if (!by_model.empty() && by_model[0].first == uid) return *by_model[0].second;
    for (size_t i = 1; i < by_model.size(); ++i)
      if (by_model[i].first == uid) {
        std::rotate(by_model.begin(), by_model.begin() + i, by_model.begin() + i + 1);
        return *by_model[0].second;
      }
    if (by_model.size() == kMaxModels) by_model.pop_back();
    by_model.insert(by_model.begin(), {uid, std::make_unique<WordCache>()});
    return *by_model[0].second;
  }
};
thread_local ThreadCaches t_caches;

std::atomic<uint64_t> g_next_uid{1};

struct HeapEntry {
  uint32_t rank;
  uint32_t pos;  // index of the left symbol
  int32_t left, right;
  bool operator>(const HeapEntry& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// The token of one byte (the merges' starting symbol); UserError if the vocabulary has none.
inline int32_t byte_token(const int32_t (&byte_ids)[256], char c) {
  const int32_t id = byte_ids[static_cast<uint8_t>(c)];
  if (id < 0)
    user_error("tokenizer: byte 0x", std::hex, static_cast<int>(static_cast<uint8_t>(c)),
               " has no token in the vocabulary (not a byte-level BPE vocabulary?)");
  return id;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_tables().to_cp[b]; }

bool byte_level_decode(std::string_view s, std::string& out) {
  const auto& t = byte_tables();
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    uint32_t cp;
    unsigned char c = p[i];
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < n) {
      cp = ((c & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
      i += 2;
    } else {
      return false;  // stand-ins are all below U+0800
    }
    if (cp >= 324 || t.from_cp[cp] < 0) return false;
    out.push_back(static_cast<char>(t.from_cp[cp]));
  }
  return true;
}

// --- MergeTable --------------------------------------------------------------------------------
void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  while (cap * 3 < n * 5) cap <<= 1;  // load <= 0.6
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = slot_of(s.key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t result) {
  if (left < 0 || right < 0)
    user_error("tokenizer: merge (", left, ", ", right, ") rank ", rank, " uses a negative token id");
  if ((size_ + 1) * 5 > slots_.size() * 3) reserve(std::max<size_t>(size_ + 1, slots_.size()));
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  size_t i = slot_of(key);
  for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
    if (slots_[i].key == key) return;
  slots_[i] = {key, rank, result};
  ++size_;
}

// --- BytesMap ----------------------------------------------------------------------------------
void BytesMap::reserve(size_t n) {
  size_t cap = 1024;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) grow(cap);
}

void BytesMap::grow(size_t cap) {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (const auto& s : old) {
    if (s.len == kEmpty) continue;
    size_t i = s.hash & mask_;
    while (slots_[i].len != kEmpty) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

bool BytesMap::insert(std::string_view key, int32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow(slots_.empty() ? 1024 : slots_.size() * 2);
  uint64_t h = hash_bytes(key);
  size_t i = h & mask_;
  for (;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.len == kEmpty) break;
    if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
      return false;
  }
  slots_[i] = {h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id};
  arena_.append(key);
  ++size_;
  return true;
}

int32_t BytesMap::find(std::string_view key) const { return find(key, hash_bytes(key)); }

int32_t BytesMap::find(std::string_view key, uint64_t h) const {
  if (slots_.empty()) return -1;
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.len == kEmpty) return -1;
    if (s.hash == h && s.len == key.size() && std::memcmp(arena_.data() + s.off, key.data(), key.size()) == 0)
      return s.id;
  }
}

// --- BytePairModel ----------------------------------------------------------------------------
BytePairModel::BytePairModel() : uid_(g_next_uid.fetch_add(1)) { std::fill(byte_ids_, byte_ids_ + 256, -1); }
BytePairModel::~BytePairModel() = default;

void BytePairModel::add_token(std::string_view bytes, int32_t id) {
  if (!by_bytes_.insert(bytes, id)) return;
  if (id >= 0) {
    if (static_cast<size_t>(id) >= by_id_.size()) by_id_.resize(id + 1);
    by_id_[id] = std::string(bytes);
  }
  if (bytes.size() == 1) byte_ids_[static_cast<uint8_t>(bytes[0])] = id;
}

void BytePairModel::add_merge(int32_t left, int32_t right, uint32_t rank, int32_t result) {
  merges_.insert(left, right, rank, result);
}

void BytePairModel::add_tiktoken_ranks() {
  merges_.reserve(by_bytes_.size() * 4);
  by_bytes_.for_each([&](std::string_view bytes, int32_t id) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      int32_t l = by_bytes_.find(bytes.substr(0, k));
      if (l < 0) continue;
      int32_t r = by_bytes_.find(bytes.substr(k));
      if (r < 0) continue;
      add_merge(l, r, static_cast<uint32_t>(id), id);
    }
  });
}

int32_t BytePairModel::token_id(std::string_view bytes) const { return by_bytes_.find(bytes); }

std::string_view BytePairModel::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= by_id_.size()) return {};
  return by_id_[id];
}

void BytePairModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  const size_t n = word.size();
  if (n <= kSmallWord) {
    merge_small(word, ids);
    return;
  }
  thread_local std::vector<int32_t> sym, next, prev;
  thread_local std::vector<HeapEntry> heap;
  sym.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_token(byte_ids_, word[i]);
    sym[i] = id;
    next[i] = (i + 1 < n) ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  auto push_pair = [&](int32_t pos) {
    if (pos < 0) return;
    int32_t r = next[pos];
    if (r < 0) return;
    const uint64_t mv = merges_.lookup(sym[pos], sym[r]);
    const uint64_t* m = mv == ~0ull ? nullptr : &mv;
    if (!m) return;
    heap.push_back({static_cast<uint32_t>(*m >> 32), static_cast<uint32_t>(pos), sym[pos], sym[r]});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    HeapEntry e = heap.back();
    heap.pop_back();
    int32_t pos = static_cast<int32_t>(e.pos);
    if (sym[pos] != e.left) continue;  // stale: the left symbol changed (or was merged away)
    int32_t r = next[pos];
    if (r < 0 || sym[r] != e.right) continue;
    const uint64_t mv = merges_.lookup(e.left, e.right);
    const uint64_t* m = mv == ~0ull ? nullptr : &mv;
    sym[pos] = static_cast<int32_t>(*m & 0xFFFFFFFFu);
    sym[r] = -1;  // dead
    next[pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = pos;
    if (prev[pos] >= 0) push_pair(prev[pos]);
    push_pair(pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) ids.push_back(sym[i]);
}

// Words of up to kSmallWord bytes: the same lowest-rank-leftmost merge order as the heap version,
// with the pair ranks kept in an array and a linear scan for the minimum (tiktoken does the same
// for short pieces); n finds to start and 2 per merge.
void BytePairModel::merge_small(std::string_view word, std::vector<int32_t>& ids) const {
  const size_t n = word.size();
  int32_t sym[kSmallWord];
  uint64_t rank[kSmallWord];  // rank << 32 | result of pair (i, i+1); ~0 = no merge
  for (size_t i = 0; i < n; ++i) {
    const int32_t id = byte_token(byte_ids_, word[i]);
    sym[i] = id;
  }
  auto pair_rank = [&](size_t i) -> uint64_t {
    const uint64_t mv = merges_.lookup(sym[i], sym[i + 1]);
    const uint64_t* m = mv == ~0ull ? nullptr : &mv;
    return m ? *m : ~0ull;
  };
  size_t len = n;
  for (size_t i = 0; i + 1 < len; ++i) merges_.prefetch(sym[i], sym[i + 1]);
  for (size_t i = 0; i + 1 < len; ++i) rank[i] = pair_rank(i);
  while (len > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < len; ++i)
      if ((rank[i] >> 32) < (rank[best] >> 32)) best = i;
    if (rank[best] == ~0ull) break;
    sym[best] = static_cast<int32_t>(rank[best] & 0xFFFFFFFFu);
    for (size_t i = best + 1; i + 1 < len; ++i) sym[i] = sym[i + 1], rank[i] = rank[i + 1];
    --len;
    // the two new pairs are independent: start both memory accesses before using either
    if (best + 1 < len) merges_.prefetch(sym[best], sym[best + 1]);
    if (best > 0) merges_.prefetch(sym[best - 1], sym[best]);
    if (best + 1 < len) rank[best] = pair_rank(best);
    if (best > 0) rank[best - 1] = pair_rank(best - 1);
  }
  ids.insert(ids.end(), sym, sym + len);
}

void BytePairModel::encode_short(std::string_view word, const uint64_t w[3], uint64_t h, void* cache_ptr,
                                 std::vector<int64_t>& out) const {
  auto& cache = *static_cast<InlineWordCache*>(cache_ptr);
  if (const auto* e = cache.find(w, word.size(), h)) {
    const size_t k = out.size();
    out.resize(k + e->nids);
    for (size_t i = 0; i < e->nids; ++i) out[k + i] = e->ids[i];
    return;
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  int32_t whole = ignore_merges_ ? by_bytes_.find(word, h) : -1;
  if (whole >= 0) ids.push_back(whole);
  else merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (ids.size() <= InlineWordCache::kMaxIds) cache.insert(w, word.size(), h, ids.data(), ids.size());
}

void BytePairModel::encode_long(std::string_view word, std::vector<int64_t>& out) const {
  const size_t n = word.size();
  thread_local std::vector<int32_t> ids;
  const bool cacheable = n < LongWordCache::kMaxWordBytes;
  LongWordCache* cache = nullptr;
  uint64_t h = 0;
  if (cacheable) {
    cache = &t_caches.get(uid_).large;
    h = hash_bytes(word);
    if (cache->lookup(word, h, out)) return;
  }
  ids.clear();
  int32_t whole = ignore_merges_ ? (cacheable ? by_bytes_.find(word, h) : token_id(word)) : -1;
  if (whole >= 0) ids.push_back(whole);
  else merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache) cache->insert(word, h, ids.data(), ids.size());
}

void BytePairModel::encode(std::string_view word, std::vector<int64_t>& out) const { encode_words(&word, 1, out); }

void BytePairModel::encode_words(const std::string_view* words, size_t n, std::vector<int64_t>& out) const {
  // Software pipeline: the cache set of word i + kAhead is hashed and prefetched while word i is
  // encoded, so the (mostly L2-missing) cache lookups overlap instead of stalling one by one.
  constexpr size_t kAhead = 8;
  struct Prepared {
    uint64_t w[3];
    uint64_t h;
  };
  Prepared ring[kAhead];
  InlineWordCache& cache = t_caches.get(uid_).small;
  auto prepare = [&](size_t i) {
    const size_t len = words[i].size();
    if (len < 2 || len > InlineWordCache::kMaxBytes) return;
    Prepared& p = ring[i % kAhead];
    load_padded24(words[i].data(), len, p.w);
    p.h = hash_words(p.w, len);
    cache.prefetch(p.h);
  };
  for (size_t i = 0; i < n && i < kAhead; ++i) prepare(i);
  for (size_t i = 0; i < n; ++i) {
    const std::string_view word = words[i];
    const Prepared p = ring[i % kAhead];
    if (i + kAhead < n) prepare(i + kAhead);
    const size_t len = word.size();
    if (len == 1) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      std::vector<int32_t> ids;
      merge_word(word, ids);  // throws: the byte has no token
      out.insert(out.end(), ids.begin(), ids.end());
      continue;
    }
    if (len <= InlineWordCache::kMaxBytes) encode_short(word, p.w, p.h, &cache, out);
    else encode_long(word, out);
  }
}

}  // namespace megatron::tokenizers
