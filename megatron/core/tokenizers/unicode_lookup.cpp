// Builds the two-stage lookup table behind unicode::class_of() from the generated ranges.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "megatron/core/tokenizers/unicode_table.h"

namespace megatron::tokenizers::unicode::detail {

namespace {
struct Tables {
  std::vector<uint8_t> stage2;
  std::vector<uint16_t> stage1;
  Tables() {
    std::vector<uint8_t> flat(0x110000, 0);
    for (size_t i = 0; i < kNumCodePointRanges; ++i)
      for (uint32_t cp = kCodePointRanges[i].first; cp <= kCodePointRanges[i].last; ++cp)
        flat[cp] = kCodePointRanges[i].cls;
    std::map<std::string, uint16_t> seen;
    stage1.resize(0x1100);
    for (size_t b = 0; b < 0x1100; ++b) {
      std::string block(reinterpret_cast<const char*>(&flat[b * 256]), 256);
      auto [it, inserted] = seen.emplace(block, static_cast<uint16_t>(stage2.size() / 256));
      if (inserted) stage2.insert(stage2.end(), flat.begin() + b * 256, flat.begin() + (b + 1) * 256);
      stage1[b] = it->second;
    }
  }
};
Tables& tables() {
  static Tables t;
  return t;
}
}  // namespace

const Lookup& lookup() {
  static const Lookup l{tables().stage1.data(), tables().stage2.data()};
  return l;
}

}  // namespace megatron::tokenizers::unicode::detail
