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

uint64_t hash_bytes(std::string_view s) {
  // 64-bit FNV-1a over 8-byte words, finished with a multiply-xorshift mix.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  uint64_t w = 0;
  std::memcpy(&w, s.data() + i, s.size() - i);
  h = (h ^ w) * 0x9E3779B97F4A7C15ull;
  return h ^ (h >> 31);
}

namespace {


/// Bounded word -> ids cache of one thread for one model: 4-way set-associative, LRU within a
/// set, 2,560 sets = 10,240 entries at most (HF utils/cache.rs bounds its cache to 10,000 words
/// under 256 bytes; we keep the bound but evict instead of refusing new words, so the frequent
/// words of the current text stay cached). Memory stays bounded whatever the input.
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kWays = 4;
  static constexpr size_t kSets = 2560;

  WordCache() : entries_(kSets * kWays) {}

  bool lookup(std::string_view w, uint64_t h, std::vector<int64_t>& out) {
    // (ids are stored as int64 so that a hit is one memcpy into `out`)
    Entry* set = &entries_[(h % kSets) * kWays];
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
    Entry* set = &entries_[(h % kSets) * kWays];
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
    std::vector<int64_t> ids;
  };
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

struct ThreadCaches {
  uint64_t last_uid = 0;
  WordCache* last = nullptr;
  std::unordered_map<uint64_t, std::unique_ptr<WordCache>> by_model;
  WordCache& get(uint64_t uid) {
    if (uid == last_uid && last) return *last;
    auto& p = by_model[uid];
    if (!p) p = std::make_unique<WordCache>();
    last_uid = uid;
    last = p.get();
    return *p;
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
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<uint64_t> old = std::move(slots_);
  slots_.assign(cap, ~0ull);
  mask_ = cap - 1;
  for (uint64_t s : old) {
    if (s == ~0ull) continue;
    size_t i = slot_of(s >> 24);
    while (slots_[i] != ~0ull) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t result) {
  if (left < 0 || right < 0 || left >= (1 << 20) || right >= (1 << 20) || rank >= (1u << 24))
    user_error("tokenizer: merge (", left, ", ", right, ") rank ", rank,
               " is outside the supported range (ids < 2^20, ranks < 2^24)");
  if ((size_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(size_ + 1, slots_.size()));
  const uint64_t key = (static_cast<uint64_t>(left) << 20) | static_cast<uint64_t>(right);
  size_t i = slot_of(key);
  for (; slots_[i] != ~0ull; i = (i + 1) & mask_)
    if ((slots_[i] >> 24) == key) return;
  slots_[i] = (key << 24) | rank;
  if (rank >= result_.size()) result_.resize(rank + 1, -1);
  result_[rank] = result;
  ++size_;
}

// --- BytesMap ----------------------------------------------------------------------------------
void BytesMap::grow() {
  size_t cap = slots_.empty() ? 1024 : slots_.size() * 2;
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
  if ((size_ + 1) * 2 > slots_.size()) grow();
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

int32_t BytesMap::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  uint64_t h = hash_bytes(key);
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
    int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
    if (id < 0)
      user_error("tokenizer: byte 0x", std::hex, static_cast<int>(static_cast<uint8_t>(word[i])),
                 " has no token in the vocabulary (not a byte-level BPE vocabulary?)");
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
    int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
    if (id < 0)
      user_error("tokenizer: byte 0x", std::hex, static_cast<int>(static_cast<uint8_t>(word[i])),
                 " has no token in the vocabulary (not a byte-level BPE vocabulary?)");
    sym[i] = id;
  }
  auto pair_rank = [&](size_t i) -> uint64_t {
    const uint64_t mv = merges_.lookup(sym[i], sym[i + 1]);
    const uint64_t* m = mv == ~0ull ? nullptr : &mv;
    return m ? *m : ~0ull;
  };
  size_t len = n;
  for (size_t i = 0; i + 1 < len; ++i) rank[i] = pair_rank(i);
  while (len > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < len; ++i)
      if ((rank[i] >> 32) < (rank[best] >> 32)) best = i;
    if (rank[best] == ~0ull) break;
    sym[best] = static_cast<int32_t>(rank[best] & 0xFFFFFFFFu);
    for (size_t i = best + 1; i + 1 < len; ++i) sym[i] = sym[i + 1], rank[i] = rank[i + 1];
    --len;
    if (best + 1 < len) rank[best] = pair_rank(best);
    if (best > 0) rank[best - 1] = pair_rank(best - 1);
  }
  ids.insert(ids.end(), sym, sym + len);
}

void BytePairModel::encode(std::string_view word, std::vector<int64_t>& out) const {
  if (word.size() == 1) {
    int32_t id = byte_ids_[static_cast<uint8_t>(word[0])];
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() < WordCache::kMaxWordBytes;
  WordCache* cache = nullptr;
  uint64_t h = 0;
  if (cacheable) {
    cache = &t_caches.get(uid_);
    h = hash_bytes(word);
    if (cache->lookup(word, h, out)) return;
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  int32_t whole = ignore_merges_ ? token_id(word) : -1;
  if (whole >= 0) ids.push_back(whole);
  else merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache) cache->insert(word, h, ids.data(), ids.size());
}

}  // namespace megatron::tokenizers
