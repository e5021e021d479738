// Small helpers shared by the CPU reference kernels: fp32 views of tensors of any float dtype.
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/tensor/tensor.h"

namespace megatron::ops::cpu {

/// Read-only fp32 view: points at the data for float32 tensors, else at a converted copy.
class FloatIn {
 public:
  explicit FloatIn(const Tensor& t) {
    MEGATRON_CHECK(t.is_cpu() && is_floating(t.dtype()) && t.dtype() != DType::kFloat64) << "float input expected, got " << t.str();
    if (t.dtype() == DType::kFloat32) {
      p_ = static_cast<const float*>(t.data_ptr());
    } else {
      buf_.resize(static_cast<size_t>(t.numel()));
      cpu_convert_to_float(t.data_ptr(), t.dtype(), buf_.data(), t.numel());
      p_ = buf_.data();
    }
  }
  const float* data() const { return p_; }
  float operator[](int64_t i) const { return p_[i]; }

 private:
  std::vector<float> buf_;
  const float* p_ = nullptr;
};

/// Writable fp32 view of an output tensor; commit() stores (RNE) into reduced-precision tensors.
/// With `load` the current contents are read first (for accumulation).
class FloatOut {
 public:
  explicit FloatOut(Tensor& t, bool load = false) : t_(t) {
    MEGATRON_CHECK(t.is_cpu() && is_floating(t.dtype()) && t.dtype() != DType::kFloat64) << "float output expected, got " << t.str();
    if (t.dtype() == DType::kFloat32) {
      p_ = static_cast<float*>(t.data_ptr());
    } else {
      buf_.assign(static_cast<size_t>(t.numel()), 0.0f);
      if (load) cpu_convert_to_float(t.data_ptr(), t.dtype(), buf_.data(), t.numel());
      p_ = buf_.data();
    }
  }
  float* data() { return p_; }
  float& operator[](int64_t i) { return p_[i]; }
  void commit() {
    if (t_.dtype() != DType::kFloat32) cpu_convert_from_float(buf_.data(), t_.data_ptr(), t_.dtype(), t_.numel());
  }

 private:
  Tensor& t_;
  std::vector<float> buf_;
  float* p_ = nullptr;
};

/// Rows N and row length of a tensor viewed as [N, last_dim].
inline int64_t rows_of(const Tensor& t) { return t.dim() == 0 ? 1 : t.numel() / t.size(-1); }

/// SplitMix64 finalizer (Steele, Lea & Flood 2014), the mixer of the dropout streams.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
/// Key of the counter-based dropout stream (seed, offset).
inline uint64_t dropout_stream(uint64_t seed, uint64_t offset) { return mix64(seed ^ mix64(offset)); }
/// Uniform [0, 1) number `i` of a dropout stream: any element can be regenerated, which the
/// attention kernel uses to rebuild its mask in backward.
inline float dropout_uniform(uint64_t stream, uint64_t i) {
  return static_cast<float>(mix64(stream + i) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace megatron::ops::cpu
