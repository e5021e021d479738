#include "megatron/core/tokenizers/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "megatron/core/utils/errors.h"

namespace megatron::tokenizers {

namespace {

struct ByteTables {
  uint32_t to_cp[256];
  std::unordered_map<uint32_t, uint8_t> from_cp;
  ByteTables() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? b : next++;
      from_cp[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables t;
  return t;
}

inline uint64_t hash_bytes(std::string_view s) {
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

inline uint64_t mix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

/// Bounded word -> ids cache of one thread for one model (HF utils/cache.rs: 10,000 entries,
/// words under 256 bytes). When full it is emptied and refilled, so memory stays bounded.
class WordCache {
 public:
  static constexpr size_t kCapacity = 10000;
  static constexpr size_t kMaxWordBytes = 256;
  static constexpr size_t kSlots = 16384;

  WordCache() : slots_(kSlots) {}

  bool lookup(std::string_view w, std::vector<int64_t>& out) const {
    uint64_t h = hash_bytes(w);
    for (size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.key_len == 0) return false;
      if (s.hash == h && s.key_len == w.size() && std::memcmp(keys_.data() + s.key_off, w.data(), w.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
        return true;
      }
    }
  }
  void insert(std::string_view w, const int32_t* ids, size_t n) {
    if (count_ >= kCapacity) clear();
    uint64_t h = hash_bytes(w);
    size_t i = h & (kSlots - 1);
    while (slots_[i].key_len != 0) i = (i + 1) & (kSlots - 1);
    Slot& s = slots_[i];
    s.hash = h;
    s.key_off = static_cast<uint32_t>(keys_.size());
    s.key_len = static_cast<uint16_t>(w.size());
    s.ids_off = static_cast<uint32_t>(ids_.size());
    s.ids_len = static_cast<uint16_t>(n);
    keys_.append(w);
    ids_.insert(ids_.end(), ids, ids + n);
    ++count_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_off = 0, ids_off = 0;
    uint16_t key_len = 0, ids_len = 0;
  };
  void clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    keys_.clear();
    ids_.clear();
    count_ = 0;
  }
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int64_t> ids_;
  size_t count_ = 0;
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
    auto it = t.from_cp.find(cp);
    if (it == t.from_cp.end()) return false;
    out.push_back(static_cast<char>(it->second));
  }
  return true;
}

// --- U64Map ------------------------------------------------------------------------------------
void U64Map::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  std::vector<uint64_t> ok = std::move(keys_), ov = std::move(values_);
  keys_.assign(cap, ~0ull);
  values_.assign(cap, 0);
  mask_ = cap - 1;
  size_ = 0;
  for (size_t i = 0; i < ok.size(); ++i)
    if (ok[i] != ~0ull) insert(ok[i], ov[i]);
}

void U64Map::insert(uint64_t key, uint64_t value) {
  if ((size_ + 1) * 2 > keys_.size()) reserve(std::max<size_t>(size_ + 1, keys_.size()));
  for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return;
    if (keys_[i] == ~0ull) {
      keys_[i] = key;
      values_[i] = value;
      ++size_;
      return;
    }
  }
}

const uint64_t* U64Map::find(uint64_t key) const {
  if (keys_.empty()) return nullptr;
  for (size_t i = mix64(key) & mask_;; i = (i + 1) & mask_) {
    if (keys_[i] == key) return &values_[i];
    if (keys_[i] == ~0ull) return nullptr;
  }
}

// --- BytePairModel ----------------------------------------------------------------------------
BytePairModel::BytePairModel() : uid_(g_next_uid.fetch_add(1)) { std::fill(byte_ids_, byte_ids_ + 256, -1); }
BytePairModel::~BytePairModel() = default;

void BytePairModel::add_token(std::string_view bytes, int32_t id) {
  if (by_bytes_.count(bytes)) return;
  storage_.push_back(std::make_unique<std::string>(bytes));
  std::string_view v = *storage_.back();
  by_bytes_.emplace(v, id);
  if (id >= 0) {
    if (static_cast<size_t>(id) >= by_id_.size()) by_id_.resize(id + 1);
    by_id_[id] = v;
  }
  if (v.size() == 1) byte_ids_[static_cast<uint8_t>(v[0])] = id;
}

void BytePairModel::add_merge(int32_t left, int32_t right, uint32_t rank, int32_t result) {
  merges_.insert((static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right),
                 (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(result));
}

void BytePairModel::add_tiktoken_ranks() {
  merges_.reserve(by_bytes_.size() * 4);
  for (const auto& [bytes, id] : by_bytes_) {
    for (size_t k = 1; k < bytes.size(); ++k) {
      auto l = by_bytes_.find(bytes.substr(0, k));
      if (l == by_bytes_.end()) continue;
      auto r = by_bytes_.find(bytes.substr(k));
      if (r == by_bytes_.end()) continue;
      add_merge(l->second, r->second, static_cast<uint32_t>(id), id);
    }
  }
}

int32_t BytePairModel::token_id(std::string_view bytes) const {
  auto it = by_bytes_.find(bytes);
  return it == by_bytes_.end() ? -1 : it->second;
}

std::string_view BytePairModel::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= by_id_.size()) return {};
  return by_id_[id];
}

void BytePairModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  const size_t n = word.size();
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
    const uint64_t* m = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(sym[pos])) << 32) |
                                     static_cast<uint32_t>(sym[r]));
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
    const uint64_t* m = merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(e.left)) << 32) |
                                     static_cast<uint32_t>(e.right));
    sym[pos] = static_cast<int32_t>(*m & 0xFFFFFFFFu);
    sym[r] = -1;  // dead
    next[pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = pos;
    if (prev[pos] >= 0) push_pair(prev[pos]);
    push_pair(pos);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) ids.push_back(sym[i]);
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
  if (cacheable) {
    cache = &t_caches.get(uid_);
    if (cache->lookup(word, out)) return;
  }
  thread_local std::vector<int32_t> ids;
  ids.clear();
  int32_t whole = ignore_merges_ ? token_id(word) : -1;
  if (whole >= 0) ids.push_back(whole);
  else merge_word(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache) cache->insert(word, ids.data(), ids.size());
}

}  // namespace megatron::tokenizers
