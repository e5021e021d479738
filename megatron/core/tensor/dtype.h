// Element types and exact software conversions for the reduced-precision formats.
//
// The CPU backend stores bf16/fp16/fp8 tensors in their real bit layout and converts with
// round-to-nearest-even, exactly as CUDA's __float2bfloat16_rn / __float2half_rn /
// __nv_cvt_float_to_fp8(..., __NV_SATFINITE, ...) do, so mixed-precision logic is testable on CPU.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace megatron {

/// Element type of a Tensor. Codes are ours (the .idx dtype codes live in indexed_dataset.h).
enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kFloat64,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kInt64,
  kBool,
};

/// Size in bytes of one element.
size_t dtype_size(DType t);
/// Short lowercase name ("float32", "bfloat16", ...), as PyTorch prints them.
const char* dtype_name(DType t);
/// Parses dtype_name() output back; throws UserError on an unknown name.
DType dtype_from_name(const std::string& name);
/// True for float32/float16/bfloat16/fp8/float64.
bool is_floating(DType t);

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }
/// Rounds a float to the nearest bfloat16 value (returned as float).
inline float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

/// float -> IEEE binary16 bits, round to nearest even, overflow to inf.
uint16_t float_to_fp16_bits(float f);
float fp16_bits_to_float(uint16_t h);
inline float round_fp16(float f) { return fp16_bits_to_float(float_to_fp16_bits(f)); }

/// float -> FP8 E4M3 (OCP "fn": no inf, max 448) with saturation to +-448, RNE. NaN -> 0x7f.
uint8_t float_to_e4m3_bits(float f);
float e4m3_bits_to_float(uint8_t b);
/// float -> FP8 E5M2 with saturation to +-57344 (finite), RNE. NaN -> 0x7f.
uint8_t float_to_e5m2_bits(float f);
float e5m2_bits_to_float(uint8_t b);

/// Storage wrapper types, so templates can tell them apart from integers.
struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};

}  // namespace megatron
