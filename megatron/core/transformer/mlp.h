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
  MLP(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
      const tensor_parallel::TPContext& tp);
  /// With `residual`: returns mlp(x) + residual (added in fc2's GEMM where possible).
  Tensor forward(const Tensor& x, MLPCtx& ctx, const Tensor* residual = nullptr) const;
  Tensor backward(const Tensor& dy, MLPCtx& ctx) const;

 private:
  const TransformerConfig& config_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> linear_fc1_;
  std::unique_ptr<tensor_parallel::RowParallelLinear> linear_fc2_;
};

}  // namespace megatron::transformer
