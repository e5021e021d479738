// MLP (Megatron's megatron/core/transformer/mlp.py): linear_fc1 (ColumnParallelLinear; with
// --swiglu it produces [gate; up], each TP rank holding its shard of both halves), GeLU or
// SwiGLU, linear_fc2 (RowParallelLinear, init std / sqrt(2 * num_layers)). [s, b, h] -> [s, b, h].
#pragma once

#include <memory>
#include <string>

#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::transformer {

struct MLPCtx {
  tensor_parallel::LinearCtx fc1, fc2;
  Tensor fc1_out;  // pre-activation
};

class MLP {
 public:
  /// `fp8`: the model's runtime FP8 state when config.fp8 is set (fc1 and fc2 run in FP8), else null.
  MLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
      const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// With `residual`: returns mlp(x) + residual (added in fc2's GEMM where possible).
  /// `xq`: the input already quantized for linear_fc1 by its producer (x then unused; see
  /// fused_fp8_input). With FP8 and SwiGLU the activation is quantized for linear_fc2 inside the
  /// SwiGLU kernel (fp8::swiglu_fp8) where it applies.
  Tensor forward(const Tensor& x, MLPCtx& ctx, const Tensor* residual = nullptr,
                 const fp8::Fp8Input* xq = nullptr) const;
  /// linear_fc1's FP8 state (and *base) when its input may come quantized from the norm before it
  /// (SwiGLU MLPs only).
  fp8::Fp8State* fused_fp8_input(const Tensor& like, int* base) const {
    return config_.gated_linear_unit ? linear_fc1_->fused_fp8_input(like, base) : nullptr;
  }
  Tensor backward(const Tensor& dy, MLPCtx& ctx) const;

 private:
  const TransformerConfig& config_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> linear_fc1_;
  std::unique_ptr<tensor_parallel::RowParallelLinear> linear_fc2_;
};

}  // namespace megatron::transformer
