#include "megatron/core/tensor/dtype.h"

#include <cmath>

#include "megatron/core/utils/errors.h"

namespace megatron {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3: return 1;
    case DType::kFloat8E5M2: return 1;
    case DType::kFloat64: return 8;
    case DType::kInt8: return 1;
    case DType::kUInt8: return 1;
    case DType::kInt16: return 2;
    case DType::kUInt16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
    case DType::kFloat64: return "float64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kInt16: return "int16";
    case DType::kUInt16: return "uint16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(DType::kBool); ++i) {
    auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  user_error("unknown dtype '", name, "'");
}

bool is_floating(DType t) {
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kFloat64: return true;
    default: return false;
  }
}

uint16_t float_to_fp16_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x33000001u) return static_cast<uint16_t>(sign);            // rounds to zero
  int exp = static_cast<int>(absx >> 23) - 127;
  uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
  if (exp < -14) {
    // subnormal half: value = mant * 2^(exp-23); half ulp = 2^-24
    int shift = -exp - 14 + 13;  // bits to drop from the 24-bit mantissa
    uint32_t kept = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (kept & 1u))) ++kept;
    return static_cast<uint16_t>(sign | kept);
  }
  uint32_t kept = mant >> 13;
  uint32_t rem = mant & 0x1fffu;
  uint32_t h = (static_cast<uint32_t>(exp + 15) << 10) | (kept & 0x3ffu);
  if (rem > 0x1000u || (rem == 0x1000u && (kept & 1u))) ++h;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | h);
}

float fp16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

namespace {
// Generic saturating RNE conversion to a small float format with `ebits` exponent bits and
// `mbits` mantissa bits, exponent bias `bias`, largest finite magnitude `maxval`.
uint8_t float_to_small(float f, int mbits, int bias, float maxval, uint8_t nan_bits) {
  if (std::isnan(f)) return nan_bits;
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= maxval) {
    // saturate (also for inf): encode maxval
    a = maxval;
  }
  if (a == 0.0f) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;    // a = 1.x * 2^exp
  int min_normal_exp = 1 - bias;
  int q_exp = exp < min_normal_exp ? min_normal_exp : exp;
  // quantum (ulp) at this binade
  float ulp = std::ldexp(1.0f, q_exp - mbits);
  float q = a / ulp;  // exact (power-of-two scaling)
  float fl = std::floor(q);
  float rem = q - fl;
  uint32_t n = static_cast<uint32_t>(fl);
  if (rem > 0.5f || (rem == 0.5f && (n & 1u))) ++n;
  // n * ulp is the rounded value; re-encode
  float r = static_cast<float>(n) * ulp;
  if (r > maxval) r = maxval;
  if (r == 0.0f) return sign;
  std::frexp(r, &e);
  exp = e - 1;
  uint32_t bits;
  if (exp < min_normal_exp) {
    uint32_t m = static_cast<uint32_t>(r / std::ldexp(1.0f, min_normal_exp - mbits));
    bits = m;
  } else {
    uint32_t m = static_cast<uint32_t>(r / std::ldexp(1.0f, exp - mbits)) - (1u << mbits);
    bits = (static_cast<uint32_t>(exp + bias) << mbits) | m;
  }
  return static_cast<uint8_t>(sign | bits);
}

float small_to_float(uint8_t b, int mbits, int bias, bool e4m3fn) {
  bool neg = b & 0x80;
  int ebits = 7 - mbits;
  uint32_t exp = (b >> mbits) & ((1u << ebits) - 1u);
  uint32_t mant = b & ((1u << mbits) - 1u);
  float v;
  if (e4m3fn && exp == 15 && mant == 7) return std::nanf("");
  if (!e4m3fn && exp == 31) {
    if (mant) return std::nanf("");
    return neg ? -INFINITY : INFINITY;
  }
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), 1 - bias - mbits);
  else
    v = std::ldexp(static_cast<float>(mant + (1u << mbits)), static_cast<int>(exp) - bias - mbits);
  return neg ? -v : v;
}
}  // namespace

uint8_t float_to_e4m3_bits(float f) { return float_to_small(f, 3, 7, 448.0f, 0x7f); }
float e4m3_bits_to_float(uint8_t b) { return small_to_float(b, 3, 7, true); }
uint8_t float_to_e5m2_bits(float f) { return float_to_small(f, 2, 15, 57344.0f, 0x7f); }
float e5m2_bits_to_float(uint8_t b) { return small_to_float(b, 2, 15, false); }

}  // namespace megatron
