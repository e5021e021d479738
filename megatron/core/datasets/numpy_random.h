// NumPy's random streams, bit-for-bit, for the index building that Megatron does with numpy.
//
//  * NumpyRandomState: numpy.random.RandomState(seed) (MT19937, init_genrand seeding) and its
//    1-D shuffle (Fisher-Yates from the end with masked rejection sampling, numpy's
//    random_interval in distributions.c / legacy _shuffle_raw).
//  * NumpyDefaultRng: numpy.random.default_rng(seed) = Generator(PCG64(SeedSequence(seed)))
//    with the buffered 32-bit draws and Lemire's bounded integers of Generator.integers for
//    dtype=int32 (random_bounded_uint32_fill, use_masked=False).
// Written from numpy's documented algorithms; tests compare against numpy itself.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace megatron::datasets {

/// numpy.random.RandomState(seed): the legacy MT19937 stream.
class NumpyRandomState {
 public:
  /// seed: 0 <= seed < 2^32 (numpy's legacy integer seeding = init_genrand(seed)).
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}
  /// 32-bit draw (genrand_int32).
  uint32_t next_uint32() { return static_cast<uint32_t>(mt_()); }
  /// 64-bit draw as numpy's mt19937_next64: (first << 32) | second.
  uint64_t next_uint64() {
    uint64_t hi = next_uint32();
    return (hi << 32) | next_uint32();
  }
  /// Uniform integer in [0, max] by masked rejection (numpy random_interval).
  uint64_t random_interval(uint64_t max);
  /// In-place shuffle of a 1-D array of n elements, exactly as RandomState.shuffle.
  template <class T>
  void shuffle(T* a, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      const uint64_t j = random_interval(static_cast<uint64_t>(i));
      std::swap(a[i], a[j]);
    }
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    shuffle(v.data(), static_cast<int64_t>(v.size()));
  }

 private:
  std::mt19937 mt_;
};

/// numpy.random.default_rng(seed) for a non-negative integer seed (< 2^64).
class NumpyDefaultRng {
 public:
  explicit NumpyDefaultRng(uint64_t seed);
  /// PCG64 (XSL-RR 128/64) next 64-bit output.
  uint64_t next_uint64();
  /// numpy's buffered next_uint32: low half of a fresh 64-bit draw, then its high half.
  uint32_t next_uint32();
  /// Generator.integers(low, high, size=n, dtype=int32) (high exclusive, low < high).
  std::vector<int32_t> integers_int32(int32_t low, int32_t high, int64_t n);

 private:
  unsigned __int128 state_ = 0;
  unsigned __int128 inc_ = 0;
  bool has_uint32_ = false;
  uint32_t uinteger_ = 0;
};

}  // namespace megatron::datasets
