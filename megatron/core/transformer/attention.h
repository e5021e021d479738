// SelfAttention (Megatron's megatron/core/transformer/attention.py): linear_qkv
// (ColumnParallelLinear, rows grouped per query group: [q_1..q_{np/ng}, k, v] per group),
// split + RoPE, optional q/k layernorm (before RoPE, as Megatron), core attention (causal or
// masked softmax, GQA without repeated K/V, attention dropout), linear_proj
// (RowParallelLinear). Input/output [s, b, h].
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/layers.h"
#include "megatron/core/transformer/context_parallel.h"
#include "megatron/core/transformer/forward_context.h"
#include "megatron/core/transformer/norm.h"

namespace megatron::transformer {

struct AttentionCtx {
  tensor_parallel::LinearCtx qkv, proj;
  NormCtx q_norm, k_norm;    // with qk_layernorm
  Tensor q, k, v, out, lse;  // core attention inputs/outputs
  Tensor qkv_out;  // packed path (CUDA, MHA without RoPE): the fused QKV output; q, k, v undefined
  ops::AttentionParams params;
  Tensor mask;  // keeps params.attention_mask alive
  Tensor rope_positions;  // RoPE positions of the forward (undefined = 0..s-1)
  // Context parallelism: the CP group of the forward (null = none) and its ring state.
  std::shared_ptr<comm::ProcessGroup> cp_group;
  std::string cp_comm_type;
  ContextParallelAttnCtx cp;
};

class SelfAttention {
 public:
  /// Registers, in Megatron's order: linear_proj.{weight,bias}, linear_qkv.{weight,bias},
  /// q_layernorm, k_layernorm (prefix = "decoder.layers.<i>.self_attention").
  /// `fp8`: the model's runtime FP8 state (amax histories, scales; owned by the model, not part
  /// of the config) when config.fp8 is set, else null: the linear layers then run in FP8.
  SelfAttention(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// With `residual`: returns attention(x) + residual (added in the output projection's GEMM
  /// where possible, RowParallelLinear::forward_add).
  /// `xq`: the input already quantized for linear_qkv by its producer (x then unused; see
  /// fused_fp8_input).
  Tensor forward(const Tensor& x, ForwardContext& fc, AttentionCtx& ctx, const Tensor* residual = nullptr,
                 const fp8::Fp8Input* xq = nullptr) const;
  /// linear_qkv's FP8 state (and *base) when its input may come quantized from the norm before it.
  fp8::Fp8State* fused_fp8_input(const Tensor& like, int* base) const { return linear_qkv_->fused_fp8_input(like, base); }
  Tensor backward(const Tensor& dy, AttentionCtx& ctx) const;

 private:
  const TransformerConfig& config_;
  int64_t heads_local_, groups_local_;
  ops::RopeParams rope_;
  std::unique_ptr<tensor_parallel::RowParallelLinear> linear_proj_;
  std::unique_ptr<tensor_parallel::ColumnParallelLinear> linear_qkv_;
  std::unique_ptr<Norm> q_layernorm_, k_layernorm_;
};

}  // namespace megatron::transformer
