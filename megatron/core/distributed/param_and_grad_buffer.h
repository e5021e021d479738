// Contiguous parameter and gradient buffers (Megatron's _ParamAndGradBuffer,
// megatron/core/distributed/param_and_grad_buffer.py; megatron.md §9.5).
//
// All parameters of one (param dtype, grad dtype) live in one flat parameter tensor and one
// flat gradient tensor, laid out in REVERSE registration order (≈ the order backward produces
// gradients, so buckets fill front to back). Each Parameter's data/main_grad become views.
// Buckets, padding for the distributed optimizer and overlapped reduction are added by the
// distributed data-parallel wrapper on top of this layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "megatron/core/tensor/tensor.h"
#include "megatron/core/transformer/module.h"

namespace megatron::distributed {

class ParamAndGradBuffer {
 public:
  /// Lays out `params` (local shapes from `shapes`, same order) in reverse order; allocates
  /// param_data [total] of param_dtype and grad_data [total] of grad_dtype (zeroed) on
  /// `device`, and points every Parameter's data/main_grad at its slice. `allocate_grads` false
  /// (evaluation only): no grad_data (undefined tensor) and every main_grad stays undefined.
  ///
  /// --fp8-param-gather: `fp8_weights` (one flag per parameter, or empty) marks the weights kept
  /// as FP8 primary weights. They are laid out after all other parameters (each group in reverse
  /// order; Megatron gives the uint8 params a buffer of their own), so buckets never mix the two;
  /// an FP8 buffer fp8_data [total - fp8_start] (float8_e4m3) holds their FP8 bytes at
  /// (element - fp8_start) and each such Parameter's fp8_data views its slice.
  ParamAndGradBuffer(std::vector<transformer::Parameter>& params, const std::vector<Shape>& shapes,
                     DType param_dtype, DType grad_dtype, Device device, bool allocate_grads = true,
                     const std::vector<bool>& fp8_weights = {});

  Tensor& param_data() { return param_data_; }
  Tensor& grad_data() { return grad_data_; }
  /// Element range [start, end) of parameter i (registration index) in the buffers.
  std::pair<int64_t, int64_t> range(size_t i) const { return ranges_[i]; }
  int64_t numel() const { return param_data_.numel(); }
  /// The FP8 parameter buffer (undefined without FP8 weights) and the buffer element where the
  /// FP8 weights' region starts (== numel() without FP8 weights).
  Tensor& fp8_data() { return fp8_data_; }
  int64_t fp8_start() const { return fp8_start_; }

 private:
  Tensor param_data_;
  Tensor grad_data_;
  Tensor fp8_data_;
  int64_t fp8_start_ = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

}  // namespace megatron::distributed
