#include "megatron/core/tensor_parallel/layers.h"

#include <cstdlib>
#include <cstring>

#include "megatron/core/fp8/fp8_linear.h"
#include "megatron/core/ops/ops.h"
#include "megatron/core/tensor_parallel/mappings.h"

namespace megatron::tensor_parallel {

namespace {
Shape with_last_shape(Shape s, int64_t last) {
  s.back() = last;
  return s;
}
Shape with_last(const Tensor& x, int64_t last) { return with_last_shape(x.shape(), last); }

ParamRef add_param(ParamRegistry& reg, const std::string& name, Shape global, int partition_dim, int stride,
                   const TPContext& tp, InitKind init, float std, bool is_embedding_or_output) {
  Parameter p;
  p.name = name;
  p.global_shape = global;
  p.no_weight_decay = global.size() == 1 || name.ends_with(".bias");
  p.is_embedding_or_output = is_embedding_or_output;
  p.tensor_parallel = partition_dim >= 0;
  p.partition_dim = partition_dim;
  p.partition_stride = stride;
  p.tp_rank = tp.rank();
  p.tp_size = tp.size();
  p.init = init;
  p.init_std = std;
  Shape local = global;
  if (partition_dim >= 0) {
    if (global[partition_dim] % (tp.size() * stride) != 0)
      user_error(name, ": dimension ", global[partition_dim], " is not divisible by --tensor-model-parallel-size ",
                 tp.size(), stride > 1 ? " times 2 (SwiGLU halves)" : "");
    local[partition_dim] = global[partition_dim] / tp.size();
  }
  return ParamRef(&reg, reg.add(std::move(p), local));
}
}  // namespace

ColumnParallelLinear::ColumnParallelLinear(ParamRegistry& reg, const std::string& prefix, int64_t input_size,
                                           int64_t output_size, bool bias, float init_std, const TPContext& tp,
                                           int partition_stride, bool skip_weight, bool is_embedding_or_output)
    : in_(input_size), out_local_(output_size / tp.size()), tp_(tp) {
  if (!skip_weight)
    weight_ = add_param(reg, prefix + ".weight", {output_size, input_size}, 0, partition_stride, tp, InitKind::kNormal,
                        init_std, is_embedding_or_output);
  if (bias) bias_ = add_param(reg, prefix + ".bias", {output_size}, 0, partition_stride, tp, InitKind::kZeros, 0.0f, false);
}

Tensor ColumnParallelLinear::forward(const Tensor& x, LinearCtx& ctx) const {
  // Into the TP region: identity, or with SP the all-gather of the sequence shards. Backward
  // needs the gathered input too, but only the shard is kept (1/TP of the memory; re-gathered).
  ctx.regather = tp_.sequence_parallel && tp_.size() > 1;
  ctx.input = x;
  ctx.fp8_input_t = Tensor();
  ctx.fp8_input_st = Tensor();
  const Tensor xin = ctx.regather ? gather_along_first_dim(x, *tp_.group) : x;
  Tensor y = Tensor::empty(with_last(xin, out_local_), xin.dtype(), xin.device());
  if (fp8_) fp8::linear_forward(*fp8_, fp8_base_, xin, weight_.data(), bias_.defined() ? &bias_.data() : nullptr, y);
  else ops::linear_forward(xin, weight_.data(), bias_.defined() ? &bias_.data() : nullptr, y);
  return y;
}

Tensor ColumnParallelLinear::forward_bias_gelu(const Tensor& x, LinearCtx& ctx, Tensor& act) const {
  if (!fp8_ && bias_.defined()) {
    // As forward(): only the sequence shard is kept for backward (re-gathered there).
    ctx.regather = tp_.sequence_parallel && tp_.size() > 1;
    ctx.input = x;
    ctx.fp8_input_t = Tensor();
    ctx.fp8_input_st = Tensor();
    const Tensor xin = ctx.regather ? gather_along_first_dim(x, *tp_.group) : x;
    Tensor pre = Tensor::empty(with_last(xin, out_local_), xin.dtype(), xin.device());
    act = Tensor::empty(pre.shape(), xin.dtype(), xin.device());
    // The GeLU in the GEMM's epilogue where the backend fuses it; else forward()'s GEMM + GeLU.
    if (!ops::linear_bias_gelu_forward(xin, weight_.data(), bias_.data(), pre, act)) {
      ops::linear_forward(xin, weight_.data(), &bias_.data(), pre);
      ops::gelu_forward(pre, act, /*approximate_tanh=*/true);
    }
    return pre;
  }
  Tensor pre = forward(x, ctx);
  act = Tensor::empty(pre.shape(), pre.dtype(), pre.device());
  ops::gelu_forward(pre, act, /*approximate_tanh=*/true);
  return pre;
}

fp8::Fp8State* ColumnParallelLinear::fused_fp8_input(const Tensor& like, int* base) const {
  if (!fp8_ || bias_.defined() || (tp_.sequence_parallel && tp_.size() > 1) || !fp8::fused_input_ok(*fp8_, like))
    return nullptr;
  *base = fp8_base_;
  return fp8_.get();
}

Tensor ColumnParallelLinear::forward_fp8(const fp8::Fp8Input& xq, LinearCtx& ctx) const {
  MEGATRON_CHECK(fp8_ && xq.defined() && !bias_.defined()) << "ColumnParallelLinear::forward_fp8";
  ctx.regather = false;
  ctx.input = Tensor();
  ctx.input_shape = xq.shape;
  ctx.fp8_input_t = xq.q_t;
  ctx.fp8_input_st = xq.s_t;
  Tensor y = Tensor::empty(with_last_shape(xq.shape, out_local_), xq.dtype, xq.q.device());
  fp8::linear_forward(*fp8_, fp8_base_, Tensor(), weight_.data(), nullptr, y, &xq);
  return y;
}

Tensor ColumnParallelLinear::backward_fp8(const fp8::Fp8Input& dyq, const LinearCtx& ctx, bool need_dx) const {
  MEGATRON_CHECK(fp8_ && dyq.defined() && !bias_.defined() && !ctx.regather) << "ColumnParallelLinear::backward_fp8";
  Tensor dx;
  if (need_dx) dx = Tensor::empty(ctx.in_shape(), dyq.dtype, dyq.q.device());
  fp8::linear_backward(*fp8_, fp8_base_, Tensor(), ctx.input, weight_.data(), need_dx ? &dx : nullptr, &weight_.grad(),
                       nullptr, /*accumulate=*/true, &ctx.fp8_input_t, &dyq,
                       &ctx.fp8_input_st);
  if (need_dx && tp_.size() > 1) {
    if (tp_.sequence_parallel) return reduce_scatter_along_first_dim(dx, *tp_.group);
    tp_.group->all_reduce(dx);
  }
  return dx;
}

Tensor ColumnParallelLinear::backward(const Tensor& dy, const LinearCtx& ctx, bool need_dx, bool bias_grad_done) const {
  // The forward's (gathered) input, bit-identical to what forward multiplied.
  const Tensor input = ctx.regather ? gather_along_first_dim(ctx.input, *tp_.group) : ctx.input;
  Tensor dx;
  if (need_dx) dx = Tensor::empty(ctx.regather ? input.shape() : ctx.in_shape(), dy.dtype(), dy.device());
  Tensor* db = bias_.defined() && !bias_grad_done ? &bias_.grad() : nullptr;
  if (fp8_)
    fp8::linear_backward(*fp8_, fp8_base_, dy, input, weight_.data(), need_dx ? &dx : nullptr, &weight_.grad(), db,
                         /*accumulate=*/true, &ctx.fp8_input_t, nullptr, &ctx.fp8_input_st);
  else
    ops::linear_backward(dy, input, weight_.data(), need_dx ? &dx : nullptr, &weight_.grad(), db, /*accumulate=*/true);
  if (need_dx && tp_.size() > 1) {
    if (tp_.sequence_parallel) return reduce_scatter_along_first_dim(dx, *tp_.group);
    tp_.group->all_reduce(dx);
  }
  return dx;
}

RowParallelLinear::RowParallelLinear(ParamRegistry& reg, const std::string& prefix, int64_t input_size,
                                     int64_t output_size, bool bias, float init_std, const TPContext& tp)
    : in_local_(input_size / tp.size()), out_(output_size), tp_(tp) {
  weight_ = add_param(reg, prefix + ".weight", {output_size, input_size}, 1, 1, tp, InitKind::kNormal, init_std, false);
  if (bias) bias_ = add_param(reg, prefix + ".bias", {output_size}, -1, 1, tp, InitKind::kZeros, 0.0f, false);
}

Tensor RowParallelLinear::forward(const Tensor& x, LinearCtx& ctx) const {
  ctx.input = x;
  ctx.fp8_input_t = Tensor();
  ctx.fp8_input_st = Tensor();
  Tensor y = Tensor::empty(with_last(x, out_), x.dtype(), x.device());
  // Without TP there is no reduction between the GEMM and the bias: the bias goes into the
  // GEMM (the cuBLASLt BIAS epilogue on CUDA) instead of a separate pass over y.
  const bool bias_in_gemm = bias_.defined() && tp_.size() == 1;
  const Tensor* b = bias_in_gemm ? &bias_.data() : nullptr;
  // FP8: the input's quantize also writes its transpose, kept for this micro-batch's wgrad GEMM
  // (one read of x instead of a second one in backward; where fp8::fused_input_ok).
  if (fp8_) fp8::linear_forward(*fp8_, fp8_base_, x, weight_.data(), b, y, nullptr, &ctx.fp8_input_t, nullptr,
                                &ctx.fp8_input_st);
  else ops::linear_forward(x, weight_.data(), b, y);
  if (bias_in_gemm) return y;
  return finish_forward(std::move(y));
}

Tensor RowParallelLinear::finish_forward(Tensor y) const {
  if (tp_.size() > 1) {
    if (tp_.sequence_parallel)
      y = reduce_scatter_along_first_dim(y, *tp_.group);  // out of the TP region into the sequence shards
    else
      tp_.group->all_reduce(y);
  }
  if (bias_.defined()) ops::bias_add_(y, bias_.data());
  return y;
}

fp8::Fp8State* RowParallelLinear::fused_fp8_input(const Tensor& like, int* base) const {
  if (!fp8_ || bias_.defined() || !fp8::fused_input_ok(*fp8_, like)) return nullptr;
  *base = fp8_base_;
  return fp8_.get();
}

Tensor RowParallelLinear::forward_fp8(const fp8::Fp8Input& xq, LinearCtx& ctx, const Tensor* residual) const {
  MEGATRON_CHECK(fp8_ && xq.defined() && !bias_.defined()) << "RowParallelLinear::forward_fp8";
  ctx.input = Tensor();
  ctx.input_shape = xq.shape;
  ctx.fp8_input_t = xq.q_t;
  ctx.fp8_input_st = xq.s_t;
  Tensor y = Tensor::empty(with_last_shape(xq.shape, out_), xq.dtype, xq.q.device());
  if (residual && tp_.size() == 1) {
    // The residual in the FP8 GEMM's epilogue (where fused), as forward_add.
    fp8::linear_forward(*fp8_, fp8_base_, Tensor(), weight_.data(), nullptr, y, &xq, nullptr, residual);
    return y;
  }
  fp8::linear_forward(*fp8_, fp8_base_, Tensor(), weight_.data(), nullptr, y, &xq);
  y = finish_forward(std::move(y));
  if (residual) ops::add_(y, *residual);
  return y;
}

Tensor RowParallelLinear::forward_add(const Tensor& x, LinearCtx& ctx, const Tensor& residual) const {
  if (tp_.size() == 1 && !bias_.defined() && fp8_) {
    // FP8: the residual goes into the FP8 GEMM's epilogue where fused (fp8::linear_forward adds
    // it otherwise), as in bf16 below.
    ctx.input = x;
    ctx.fp8_input_t = Tensor();
    ctx.fp8_input_st = Tensor();
    Tensor y = Tensor::empty(with_last(x, out_), x.dtype(), x.device());
    fp8::linear_forward(*fp8_, fp8_base_, x, weight_.data(), nullptr, y, nullptr, &ctx.fp8_input_t, &residual,
                        &ctx.fp8_input_st);
    return y;
  }
  if (tp_.size() == 1 && !fp8_) {
    // No reduction between the GEMM and the residual: the residual in the GEMM's epilogue where
    // the backend fuses it, else forward()'s GEMM (bias inside it) + add_.
    ctx.input = x;
    ctx.fp8_input_t = Tensor();
    ctx.fp8_input_st = Tensor();
    Tensor y = Tensor::empty(with_last(x, out_), x.dtype(), x.device());
    const Tensor* b = bias_.defined() ? &bias_.data() : nullptr;
    if (!ops::linear_forward_residual(x, weight_.data(), b, residual, y)) {
      ops::linear_forward(x, weight_.data(), b, y);
      ops::add_(y, residual);
    }
    return y;
  }
  Tensor y = forward(x, ctx);
  ops::add_(y, residual);
  return y;
}

Tensor RowParallelLinear::backward(const Tensor& dy_in, const LinearCtx& ctx, bool need_dx) const {
  // SP: the all-gather of the output's sequence shards. The bias gradient of the gathered dY is
  // the TP sum of the shards' bias gradients (Megatron computes per shard, then all-reduces).
  const Tensor dy = tp_.sequence_parallel && tp_.size() > 1 ? gather_along_first_dim(dy_in, *tp_.group) : dy_in;
  Tensor dx;
  if (need_dx) dx = Tensor::empty(ctx.in_shape(), dy.dtype(), dy.device());
  if (fp8_)
    fp8::linear_backward(*fp8_, fp8_base_, dy, ctx.input, weight_.data(), need_dx ? &dx : nullptr, &weight_.grad(),
                         bias_.defined() ? &bias_.grad() : nullptr, /*accumulate=*/true, &ctx.fp8_input_t, nullptr,
                         &ctx.fp8_input_st);
  else
    ops::linear_backward(dy, ctx.input, weight_.data(), need_dx ? &dx : nullptr, &weight_.grad(),
                         bias_.defined() ? &bias_.grad() : nullptr, /*accumulate=*/true);
  return dx;
}

Tensor RowParallelLinear::backward_dgelu(const Tensor& dy_in, const LinearCtx& ctx, const Tensor& pre,
                                         Tensor* pre_bias_grad, bool* bias_grad_done) const {
  if (bias_grad_done) *bias_grad_done = false;
  Tensor dact = backward(dy_in, ctx, /*need_dx=*/true);
  Tensor dpre = Tensor::empty(pre.shape(), dact.dtype(), dact.device());
  // GeLU backward with fc1's bias gradient in the same pass where the backend fuses it (then fc1's
  // backward skips its bias gradient); else the plain GeLU backward.
  if (!fp8_ && ops::gelu_backward_bgrad(dact, pre, dpre, pre_bias_grad, /*accumulate=*/true)) {
    if (bias_grad_done) *bias_grad_done = pre_bias_grad != nullptr;
  } else {
    ops::gelu_backward(dact, pre, dpre, /*approximate_tanh=*/true);
  }
  return dpre;
}

void ColumnParallelLinear::enable_fp8(std::shared_ptr<fp8::Fp8State> st, const std::string& name) {
  fp8_base_ = st->register_linear(name);
  fp8_ = std::move(st);
}

void RowParallelLinear::enable_fp8(std::shared_ptr<fp8::Fp8State> st, const std::string& name) {
  fp8_base_ = st->register_linear(name);
  fp8_ = std::move(st);
}

VocabParallelEmbedding::VocabParallelEmbedding(ParamRegistry& reg, const std::string& name, int64_t num_embeddings,
                                               int64_t embedding_dim, float init_std, const TPContext& tp)
    : vocab_start_(0), vocab_local_(num_embeddings / tp.size()), dim_(embedding_dim), tp_(tp) {
  weight_ = add_param(reg, name, {num_embeddings, embedding_dim}, 0, 1, tp, InitKind::kNormal, init_std, true);
  vocab_start_ = tp.rank() * vocab_local_;
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  Shape s = ids.shape();
  s.push_back(dim_);
  Tensor out = Tensor::empty(s, weight_.data().dtype(), weight_.data().device());
  ops::embedding_forward(ids, weight_.data(), out, vocab_start_);
  if (tp_.size() > 1) tp_.group->all_reduce(out);
  return out;
}

void VocabParallelEmbedding::backward(const Tensor& dout, const Tensor& ids) const {
  ops::embedding_backward(dout, ids, weight_.grad(), vocab_start_);
}

}  // namespace megatron::tensor_parallel
