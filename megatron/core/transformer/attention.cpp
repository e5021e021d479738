#include "megatron/core/transformer/attention.h"

#include <cmath>

#include "megatron/core/transformer/inference_context.h"

namespace megatron::transformer {

SelfAttention::SelfAttention(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config,
                             const tensor_parallel::TPContext& tp, std::shared_ptr<fp8::Fp8State> fp8)
    : config_(config),
      heads_local_(config.num_attention_heads / tp.size()),
      groups_local_(config.num_query_groups / tp.size()) {
  rope_.enabled = config.position_embedding_type == PositionEmbeddingType::kRope;
  rope_.base = config.rotary_base;
  rope_.percent = config.rotary_percent;
  rope_.interleaved = config.rotary_interleaved;
  rope_.scaling.enabled = config.rope_scaling;
  rope_.scaling.factor = config.rope_scaling_factor;
  rope_.position_scale = ops::rope_position_scale(config.seq_len_interpolation_factor);
  const float out_std = config.init_method_std / std::sqrt(2.0f * static_cast<float>(config.num_layers));
  const int64_t q_size = config.num_attention_heads * config.kv_channels;
  linear_proj_ = std::make_unique<tensor_parallel::RowParallelLinear>(reg, prefix + ".linear_proj", q_size,
                                                                       config.hidden_size, config.add_bias_linear,
                                                                       out_std, tp);
  linear_qkv_ = std::make_unique<tensor_parallel::ColumnParallelLinear>(
      reg, prefix + ".linear_qkv", config.hidden_size, config.qkv_projection_size(),
      config.add_bias_linear || config.add_qkv_bias, config.init_method_std, tp);
  if (fp8) {
    linear_qkv_->enable_fp8(fp8, prefix + ".linear_qkv");
    linear_proj_->enable_fp8(fp8, prefix + ".linear_proj");
  }
  if (config.qk_layernorm) {
    // Per-head norms on the gathered sequence: not sequence-parallel parameters.
    q_layernorm_ = std::make_unique<Norm>(reg, prefix + ".q_layernorm", config.kv_channels, config,
                                          /*sequence_sharded_input=*/false);
    k_layernorm_ = std::make_unique<Norm>(reg, prefix + ".k_layernorm", config.kv_channels, config,
                                          /*sequence_sharded_input=*/false);
  }
}

Tensor SelfAttention::forward(const Tensor& x_in, ForwardContext& fc, AttentionCtx& ctx, const Tensor* residual,
                             const fp8::Fp8Input* xq) const {
  Tensor qkv = xq ? linear_qkv_->forward_fp8(*xq, ctx.qkv) : linear_qkv_->forward(x_in, ctx.qkv);
  const Tensor& x = qkv;  // dtype and device of the activations below
  const int64_t s = qkv.size(0), b = qkv.size(1), d = config_.kv_channels;  // s: full sequence with SP
  ctx.rope_positions = fc.rotary_position_ids;
  const Tensor* rope_pos = ctx.rope_positions.defined() ? &ctx.rope_positions : nullptr;
  ctx.q = ctx.k = ctx.v = Tensor();
  // MHA without RoPE / qk-layernorm / CP / mask / dropout: where the backend fuses it (cuDNN),
  // attention reads Q, K, V straight from the fused QKV output (no split copies; same values as
  // the split path below).
  const float dropout = fc.training ? config_.attention_dropout : 0.0f;
  const bool cp = fc.cp_group && fc.cp_group->size() > 1;
  if (!rope_.enabled && !q_layernorm_ && heads_local_ == groups_local_ && !cp &&
      !fc.attention_mask.defined() && dropout == 0.0f && !fc.inference_context) {
    ctx.params = {};
    ctx.params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
    ctx.params.causal = true;
    ctx.mask = Tensor();
    ctx.cp_group = nullptr;
    ctx.out = Tensor::empty({s, b, heads_local_, d}, x.dtype(), x.device());
    ctx.lse = Tensor::empty({b, heads_local_, s}, DType::kFloat32, x.device());
    if (ops::attention_forward_packed_qkv(qkv, heads_local_, ctx.params, ctx.out, ctx.lse)) {
      ctx.qkv_out = qkv;
      if (residual) return linear_proj_->forward_add(ctx.out.view({s, b, heads_local_ * d}), ctx.proj, *residual);
      return linear_proj_->forward(ctx.out.view({s, b, heads_local_ * d}), ctx.proj);
    }
  }
  ctx.qkv_out = Tensor();
  ctx.q = Tensor::empty({s, b, heads_local_, d}, x.dtype(), x.device());
  if (fc.inference_context && !q_layernorm_) {
    // Generation: the split writes K and V straight into this forward's rows of the KV cache.
    fc.inference_context->kv_slots(this, {s, b, groups_local_, d}, x.dtype(), x.device(), ctx.k, ctx.v);
  } else {
    ctx.k = Tensor::empty({s, b, groups_local_, d}, x.dtype(), x.device());
    ctx.v = Tensor::empty({s, b, groups_local_, d}, x.dtype(), x.device());
  }
  if (!q_layernorm_) {
    ops::qkv_split_rope_forward(qkv, heads_local_, groups_local_, rope_, rope_pos, ctx.q, ctx.k, ctx.v);
  } else {
    ops::RopeParams no_rope;
    Tensor q_raw = Tensor::empty(ctx.q.shape(), x.dtype(), x.device());
    Tensor k_raw = Tensor::empty(ctx.k.shape(), x.dtype(), x.device());
    ops::qkv_split_rope_forward(qkv, heads_local_, groups_local_, no_rope, nullptr, q_raw, k_raw, ctx.v);
    ctx.q = q_layernorm_->forward(q_raw, ctx.q_norm);
    ctx.k = k_layernorm_->forward(k_raw, ctx.k_norm);
    if (rope_.enabled) {
      ops::rope_forward(ctx.q, rope_, rope_pos, ctx.q);
      ops::rope_forward(ctx.k, rope_, rope_pos, ctx.k);
    }
  }
  ctx.params = {};
  ctx.params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(d));
  ctx.params.causal = true;
  ctx.mask = fc.attention_mask;
  ctx.params.attention_mask = ctx.mask.defined() ? &ctx.mask : nullptr;
  ctx.params.dropout_p = fc.training ? config_.attention_dropout : 0.0f;
  ctx.params.seed = fc.tp_seed;
  ctx.params.offset = ctx.params.dropout_p > 0.0f ? fc.next_offset() : 0;
  // KV cache (generation): attend to every cached token of the sequence, this forward's appended.
  if (fc.inference_context) fc.inference_context->update_kv_cache(this, ctx.k, ctx.v, ctx.params, ctx.mask);
  ctx.out = Tensor::empty(ctx.q.shape(), x.dtype(), x.device());
  ctx.cp_group = fc.cp_group && fc.cp_group->size() > 1 ? fc.cp_group : nullptr;
  if (ctx.cp_group) {
    // Context parallelism: K/V ring over the CP ranks (context_parallel.h).
    ctx.cp_comm_type = fc.cp_comm_type;
    context_parallel_attention_forward(ctx.q, ctx.k, ctx.v, ctx.params, *ctx.cp_group, ctx.cp_comm_type, ctx.out,
                                       ctx.cp);
  } else {
    ctx.lse = Tensor::empty({b, heads_local_, s}, DType::kFloat32, x.device());
    ops::attention_forward(ctx.q, ctx.k, ctx.v, ctx.params, ctx.out, ctx.lse);
  }
  if (residual) return linear_proj_->forward_add(ctx.out.view({s, b, heads_local_ * d}), ctx.proj, *residual);
  return linear_proj_->forward(ctx.out.view({s, b, heads_local_ * d}), ctx.proj);
}

Tensor SelfAttention::backward(const Tensor& dy, AttentionCtx& ctx) const {
  if (ctx.qkv_out.defined()) {  // the packed forward (see forward)
    const Tensor& qkv = ctx.qkv_out;
    Tensor dout = linear_proj_->backward(dy, ctx.proj, true).view(ctx.out.shape());
    Tensor dqkv = Tensor::empty(qkv.shape(), dy.dtype(), dy.device());
    if (!ops::attention_backward_packed_qkv(dout, qkv, heads_local_, ctx.out, ctx.lse, ctx.params, dqkv)) {
      // cuDNN took the forward but not this backward: split now and run the general path.
      ops::RopeParams no_rope;
      Tensor q = Tensor::empty(ctx.out.shape(), qkv.dtype(), qkv.device());
      Tensor k = Tensor::empty(ctx.out.shape(), qkv.dtype(), qkv.device());
      Tensor v = Tensor::empty(ctx.out.shape(), qkv.dtype(), qkv.device());
      ops::qkv_split_rope_forward(qkv, heads_local_, groups_local_, no_rope, nullptr, q, k, v);
      Tensor dq = Tensor::empty(q.shape(), dy.dtype(), dy.device());
      Tensor dk = Tensor::empty(k.shape(), dy.dtype(), dy.device());
      Tensor dv = Tensor::empty(v.shape(), dy.dtype(), dy.device());
      ops::attention_backward(dout, q, k, v, ctx.out, ctx.lse, ctx.params, dq, dk, dv);
      ops::qkv_split_rope_backward(dq, dk, dv, heads_local_, groups_local_, no_rope, nullptr, dqkv);
    }
    return linear_qkv_->backward(dqkv, ctx.qkv, true);
  }
  const int64_t s = ctx.q.size(0), b = ctx.q.size(1), d = config_.kv_channels;  // dy: sequence shard with SP
  ctx.params.attention_mask = ctx.mask.defined() ? &ctx.mask : nullptr;
  Tensor dout = linear_proj_->backward(dy, ctx.proj, true).view(ctx.q.shape());
  Tensor dq = Tensor::empty(ctx.q.shape(), dy.dtype(), dy.device());
  Tensor dk = Tensor::empty(ctx.k.shape(), dy.dtype(), dy.device());
  Tensor dv = Tensor::empty(ctx.v.shape(), dy.dtype(), dy.device());
  if (ctx.cp_group) {
    context_parallel_attention_backward(dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.params, *ctx.cp_group,
                                        ctx.cp_comm_type, ctx.cp, dq, dk, dv);
  } else {
    ops::attention_backward(dout, ctx.q, ctx.k, ctx.v, ctx.out, ctx.lse, ctx.params, dq, dk, dv);
  }
  const Tensor* rope_pos = ctx.rope_positions.defined() ? &ctx.rope_positions : nullptr;
  Tensor dqkv = Tensor::empty({s, b, groups_local_ * (heads_local_ / groups_local_ + 2) * d}, dy.dtype(), dy.device());
  if (!q_layernorm_) {
    ops::qkv_split_rope_backward(dq, dk, dv, heads_local_, groups_local_, rope_, rope_pos, dqkv);
  } else {
    if (rope_.enabled) {
      ops::rope_backward(dq, rope_, rope_pos, dq);
      ops::rope_backward(dk, rope_, rope_pos, dk);
    }
    Tensor dq_raw = q_layernorm_->backward(dq, ctx.q_norm);
    Tensor dk_raw = k_layernorm_->backward(dk, ctx.k_norm);
    ops::RopeParams no_rope;
    ops::qkv_split_rope_backward(dq_raw, dk_raw, dv, heads_local_, groups_local_, no_rope, nullptr, dqkv);
  }
  return linear_qkv_->backward(dqkv, ctx.qkv, true);
}

}  // namespace megatron::transformer
