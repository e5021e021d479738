// Reduced-precision conversions. Expected bit patterns are the IEEE/OCP encodings worked out by
// hand from the format definitions (not from our code): e.g. bf16(1+2^-8) ties to even -> 1.0.
#include "megatron/core/tensor/dtype.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace megatron;

TEST(DType, BFloat16RoundNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);   // tie -> even (down)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
}

TEST(DType, Float16) {
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(fp16_bits_to_float(0x3555), 0.333251953125f);
}

TEST(DType, Fp8E4M3AndE5M2) {
  EXPECT_EQ(float_to_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3_bits(1000.0f), 0x7e);   // saturates
  EXPECT_EQ(float_to_e4m3_bits(-1.0f), 0xb8);
  EXPECT_EQ(float_to_e4m3_bits(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(float_to_e5m2_bits(57344.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2_bits(1.0f), 0x3c);
  EXPECT_EQ(e5m2_bits_to_float(0x3c), 1.0f);
  EXPECT_EQ(float_to_e4m3_bits(1.0625f), 0x38);  // tie (1 + 1/16) -> even 1.0
}
