// Contiguous parameter and gradient buffers (Megatron's _ParamAndGradBuffer,
// megatron/core/distributed/param_and_grad_buffer.py; docs/megatron-reference.md#ddp-buffers).
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
#include "megatron/core/tensor/parameter.h"

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
  /// (element - fp8_start) and each such Parameter's fp8_data views its slice. Their model-dtype
  /// values live in a buffer of their own, fp8_model_data [total - fp8_start] (param_dtype; each
  /// such Parameter's data views it), which release_fp8_model_data() frees once the FP8 weights
  /// exist (Megatron/TE: the model parameter IS the FP8 tensor; docs/fp8.md "FP8 parameters");
  /// param_data then holds the other parameters only ([fp8_start]).
  ///
  /// `include` (one flag per parameter, or empty = all): the parameters this buffer holds; the
  /// others are left untouched (has(i) false). Megatron groups a model's parameters into buffers
  /// by (param dtype, grad dtype, is_expert_parallel); the model builds one buffer for the dense
  /// parameters and one for the expert-parallel ones (Parameter::allreduce false).
  ParamAndGradBuffer(std::vector<Parameter>& params, const std::vector<Shape>& shapes,
                     DType param_dtype, DType grad_dtype, Device device, bool allocate_grads = true,
                     const std::vector<bool>& fp8_weights = {}, const std::vector<bool>& include = {});

  /// Model-dtype values of the parameters other than the FP8 weights: [fp8_start()] (== all
  /// parameters without FP8 weights).
  Tensor& param_data() { return param_data_; }
  Tensor& grad_data() { return grad_data_; }
  /// Element range [start, end) of parameter i (registration index) in the buffers.
  std::pair<int64_t, int64_t> range(size_t i) const { return ranges_[i]; }
  /// Whether parameter i (registration index) lives in this buffer (see `include`).
  bool has(size_t i) const { return i < ranges_.size() && ranges_[i].first >= 0; }
  /// Elements of all parameters (FP8 weights included).
  int64_t numel() const { return numel_; }
  /// The model-dtype values of buffer elements [start, start + n) (a range on one side of
  /// fp8_start): a view of param_data or of fp8_model_data.
  Tensor model_data(int64_t start, int64_t n);
  /// --fp8-param-gather: frees the memory of fp8_model_data (every FP8 weight's Parameter::data
  /// then views freed storage: reading it throws until materialize_fp8_model_data()).
  void release_fp8_model_data();
  /// Reallocates fp8_model_data's memory (uninitialized) if it was released; returns whether it
  /// did. The caller fills it (DistributedDataParallel::gather_model_dtype_params).
  bool materialize_fp8_model_data();
  /// fp8_model_data exists and holds memory.
  bool fp8_model_data_held() const;
  Tensor& fp8_model_data() { return fp8_model_data_; }
  /// Bytes of memory held now by the parameter buffers: param_data + fp8_data + fp8_model_data
  /// (0 for the latter once released). Gradients not included.
  int64_t param_bytes_held() const;
  /// The FP8 parameter buffer (undefined without FP8 weights) and the buffer element where the
  /// FP8 weights' region starts (== numel() without FP8 weights).
  Tensor& fp8_data() { return fp8_data_; }
  int64_t fp8_start() const { return fp8_start_; }

 private:
  Tensor param_data_;
  Tensor grad_data_;
  Tensor fp8_data_;
  Tensor fp8_model_data_;
  int64_t fp8_start_ = 0;
  int64_t numel_ = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
};

}  // namespace megatron::distributed
