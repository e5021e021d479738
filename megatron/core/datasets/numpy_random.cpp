#include "megatron/core/datasets/numpy_random.h"

#include <array>

namespace megatron::datasets {

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1;
  mask |= mask >> 2;
  mask |= mask >> 4;
  mask |= mask >> 8;
  mask |= mask >> 16;
  mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffULL) {
    while ((value = (next_uint32() & mask)) > max) {
    }
  } else {
    while ((value = (next_uint64() & mask)) > max) {
    }
  }
  return value;
}

namespace {
// SeedSequence constants (numpy/random/bit_generator.pyx).
constexpr uint32_t kInitA = 0x43b0d7e5u;
constexpr uint32_t kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu;
constexpr uint32_t kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu;
constexpr uint32_t kMixMultR = 0x4973f715u;
constexpr int kXShift = 16;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}
uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// SeedSequence(entropy).generate_state(n_words, uint32)
std::vector<uint32_t> seed_sequence_state(uint64_t entropy, int n_words) {
  std::vector<uint32_t> ent;
  if (entropy == 0) ent.push_back(0);
  while (entropy > 0) {
    ent.push_back(static_cast<uint32_t>(entropy & 0xffffffffu));
    entropy >>= 32;
  }
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hc = kInitA;
  for (int i = 0; i < kPoolSize; ++i)
    pool[i] = hashmix(i < static_cast<int>(ent.size()) ? ent[i] : 0u, hc);
  for (int s = 0; s < kPoolSize; ++s)
    for (int d = 0; d < kPoolSize; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
  for (size_t s = kPoolSize; s < ent.size(); ++s)
    for (int d = 0; d < kPoolSize; ++d) pool[d] = mix(pool[d], hashmix(ent[s], hc));
  std::vector<uint32_t> out(n_words);
  uint32_t hb = kInitB;
  for (int i = 0; i < n_words; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> kXShift;
    out[i] = v;
  }
  return out;
}

constexpr unsigned __int128 kPcgMult =
    (static_cast<unsigned __int128>(0x2360ED051FC65DA4ULL) << 64) | 0x4385DF649FCCF645ULL;
}  // namespace

NumpyDefaultRng::NumpyDefaultRng(uint64_t seed) {
  // PCG64 seeds from generate_state(4, uint64): words pairwise little-endian.
  std::vector<uint32_t> w = seed_sequence_state(seed, 8);
  uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = static_cast<uint64_t>(w[2 * i]) | (static_cast<uint64_t>(w[2 * i + 1]) << 32);
  const unsigned __int128 initstate = (static_cast<unsigned __int128>(v[0]) << 64) | v[1];
  const unsigned __int128 initseq = (static_cast<unsigned __int128>(v[2]) << 64) | v[3];
  state_ = 0;
  inc_ = (initseq << 1) | 1;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyDefaultRng::next_uint64() {
  state_ = state_ * kPcgMult + inc_;
  const uint64_t x = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyDefaultRng::next_uint32() {
  if (has_uint32_) {
    has_uint32_ = false;
    return uinteger_;
  }
  const uint64_t next = next_uint64();
  has_uint32_ = true;
  uinteger_ = static_cast<uint32_t>(next >> 32);
  return static_cast<uint32_t>(next & 0xffffffffu);
}

std::vector<int32_t> NumpyDefaultRng::integers_int32(int32_t low, int32_t high, int64_t n) {
  std::vector<int32_t> out(static_cast<size_t>(n));
  const uint32_t rng = static_cast<uint32_t>(static_cast<int64_t>(high) - 1 - low);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t r;
    if (rng == 0) {
      r = 0;
    } else if (rng == 0xffffffffu) {
      r = next_uint32();
    } else {
      // Lemire's nearly-divisionless bounded draw (bounded_lemire_uint32).
      const uint32_t rng_excl = rng + 1;
      uint64_t m = static_cast<uint64_t>(next_uint32()) * rng_excl;
      uint32_t leftover = static_cast<uint32_t>(m);
      if (leftover < rng_excl) {
        const uint32_t threshold = (0xffffffffu - rng) % rng_excl;
        while (leftover < threshold) {
          m = static_cast<uint64_t>(next_uint32()) * rng_excl;
          leftover = static_cast<uint32_t>(m);
        }
      }
      r = static_cast<uint32_t>(m >> 32);
    }
    out[i] = static_cast<int32_t>(static_cast<uint32_t>(low) + r);
  }
  return out;
}

}  // namespace megatron::datasets
