// CRC-32C check values from RFC 3720 appendix B.4 (iSCSI) and the standard "123456789" check.
#include "megatron/core/utils/crc32c.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace megatron;

TEST(Crc32c, StandardVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<uint8_t>(i);
    dec[i] = static_cast<uint8_t>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(dec.data(), 32), 0x113FDB5Cu);
}

TEST(Crc32c, ExtendEqualsWholeAndMask) {
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7 + 3);
  for (size_t cut : {0, 1, 7, 13, 500, 999}) {
    uint32_t a = crc32c(s.data(), cut);
    EXPECT_EQ(crc32c_extend(a, s.data() + cut, s.size() - cut), crc32c(s.data(), s.size())) << cut;
  }
  // masked CRC by the TFRecord formula, computed by hand for crc = 0:
  // rotr(0,15) + 0xa282ead8 = 0xa282ead8
  EXPECT_EQ(crc32c_mask(0), 0xa282ead8u);
  EXPECT_EQ(crc32c_mask(0x00008000u), 0x00000001u + 0xa282ead8u);  // bit 15 rotates to bit 0
}
