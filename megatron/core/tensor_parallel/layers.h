// Tensor-parallel linear layers and the vocab-parallel embedding (Megatron's
// megatron/core/tensor_parallel/layers.py; docs/megatron-reference.md#tensor-parallel-layers). Activations are sequence-first
// [s, b, h]; each layer holds this rank's shard of the global weight and talks to the other
// TP ranks only through the ProcessGroup `tp_group` (a single-rank group when TP = 1).
// Sequence parallelism (all-gather / reduce-scatter along s) is a flag reserved for the
// distributed layer; with TP = 1 every collective is the identity.
//
// No autograd: forward() stores what backward() needs in a context object owned by the caller.
// Weight/bias gradients are always ACCUMULATED into the parameters' main_grad.
#pragma once

#include <memory>
#include <string>

#include "megatron/core/comm/process_group.h"
#include "megatron/core/fp8/fp8_input.h"
#include "megatron/core/tensor/tensor.h"
#include "megatron/core/tensor/parameter.h"

namespace megatron::fp8 {
class Fp8State;
}

namespace megatron::tensor_parallel {

/// What ColumnParallelLinear/RowParallelLinear backward needs: their input. With sequence
/// parallelism the column-parallel layer keeps only this rank's sequence shard and all-gathers it
/// again in backward (Megatron's LinearWithGradAccumulationAndAsyncCommunication), so no layer
/// holds a full-sequence activation between forward and backward.
struct LinearCtx {
  Tensor input;
  bool regather = false;  // input is the sequence shard; backward all-gathers it over TP
  // FP8: the input's FP8 transpose made in forward (by a fused producer or the forward's
  // quantize) for the wgrad GEMM. With a fused producer `input` stays undefined (no bf16 copy
  // exists) and input_shape holds its shape.
  Tensor fp8_input_t;
  Tensor fp8_input_st;  // blockwise recipe: fp8_input_t's scale_inv (fp8::Fp8Input::s_t); else undefined
  Shape input_shape;
  Shape in_shape() const { return input.defined() ? input.shape() : input_shape; }
};

/// Options shared by the TP layers.
struct TPContext {
  std::shared_ptr<comm::ProcessGroup> group;  // never null (single-rank group when TP = 1)
  bool sequence_parallel = false;
  int rank() const { return group->rank(); }
  int size() const { return group->size(); }
};

/// Y = X W^T + b with W [out, in] split by rows (output features) across TP ranks: this rank
/// holds rows [r*out/TP, (r+1)*out/TP) (with partition_stride 2, the rank's rows of each half,
/// Megatron's SwiGLU fc1 layout). Forward: identity on X, or with sequence parallelism the
/// all-gather of X's sequence shards [s/TP, ...] -> [s, ...]; output stays split (no
/// gather_output). Backward: dX all-reduced over TP (SP: the saved shard is all-gathered again
/// for dW, and dX is reduce-scattered back to [s/TP, ...]).
class ColumnParallelLinear {
 public:
  /// Registers "<prefix>.weight" (and "<prefix>.bias" if bias) with global shape
  /// [output_size, input_size], init N(0, init_std). `weight` may instead be supplied by
  /// set_shared_weight (tied output layer), then nothing is registered for it.
  ColumnParallelLinear(ParamRegistry& reg, const std::string& prefix, int64_t input_size,
                       int64_t output_size, bool bias, float init_std, const TPContext& tp,
                       int partition_stride = 1, bool skip_weight = false, bool is_embedding_or_output = false);
  /// Uses `w` (e.g. the word embedding [V/TP, h]) as the weight.
  void set_shared_weight(ParamRef w) { weight_ = w; }

  /// x [..., in] -> y [..., out/TP] in x's dtype.
  Tensor forward(const Tensor& x, LinearCtx& ctx) const;
  /// dy [..., out/TP] -> dx [..., in] (undefined if !need_dx); accumulates dW, and db unless
  /// bias_grad_done (a fused epilogue of the next layer's backward already accumulated it).
  Tensor backward(const Tensor& dy, const LinearCtx& ctx, bool need_dx, bool bias_grad_done = false) const;
  /// forward followed by the tanh GeLU (Megatron's bias_gelu): returns the GeLU input
  /// pre = x W^T + b [..., out/TP] (what the MLP keeps for backward) and writes act = gelu(pre)
  /// (same shape and dtype). With a bias and no FP8, ops::linear_bias_gelu_forward (one GEMM with
  /// the GeLU in its epilogue where the backend fuses it); otherwise forward + gelu_forward.
  Tensor forward_bias_gelu(const Tensor& x, LinearCtx& ctx, Tensor& act) const;
  /// This layer's bias gradient (main_grad view), or nullptr without a bias.
  Tensor* bias_grad() const { return bias_.defined() ? &bias_.grad() : nullptr; }

  int64_t output_size_per_partition() const { return out_local_; }
  ParamRef weight() const { return weight_; }
  /// Runs this layer's GEMMs in FP8 with the roles registered under `name` (fp8/fp8_linear.h).
  void enable_fp8(std::shared_ptr<fp8::Fp8State> st, const std::string& name);
  /// The FP8 state when this layer's input may come quantized from a fused producer
  /// (fp8::rmsnorm_fp8; needs FP8, no bias, no sequence-parallel gather, fp8::fused_input_ok for
  /// `like`), with *base its role base; else nullptr.
  fp8::Fp8State* fused_fp8_input(const Tensor& like, int* base) const;
  /// forward() for an input already quantized by its producer (see fused_fp8_input).
  Tensor forward_fp8(const fp8::Fp8Input& xq, LinearCtx& ctx) const;
  /// backward() for an output gradient already quantized by its producer
  /// (fp8::swiglu_backward_fp8; the conditions of fused_fp8_input hold): dx in dyq.dtype.
  Tensor backward_fp8(const fp8::Fp8Input& dyq, const LinearCtx& ctx, bool need_dx) const;

 private:
  ParamRef weight_, bias_;
  int64_t in_, out_local_;
  TPContext tp_;
  std::shared_ptr<fp8::Fp8State> fp8_;
  int fp8_base_ = -1;
};

/// Y = X W^T + b with W [out, in] split by columns (input features): the input arrives split
/// along its last dim; the partial products are all-reduced over TP and the (unsplit) bias is
/// added after the reduction. With sequence parallelism the reduction is a reduce-scatter along
/// the sequence ([s, ...] -> [s/TP, ...]) and backward all-gathers dY first (the bias gradient of
/// the gathered dY equals Megatron's per-shard bias gradient all-reduced over TP). Backward:
/// identity for dY; dX stays split.
class RowParallelLinear {
 public:
  RowParallelLinear(ParamRegistry& reg, const std::string& prefix, int64_t input_size,
                    int64_t output_size, bool bias, float init_std, const TPContext& tp);
  /// x [..., in/TP] -> y [..., out].
  Tensor forward(const Tensor& x, LinearCtx& ctx) const;
  /// forward(x) + residual ([..., out], x's dtype; not modified). Without TP,
  /// ops::linear_forward_residual (one GEMM adds bias and residual in its epilogue where the
  /// backend fuses it: C = residual, beta 1); with FP8 likewise in the FP8 GEMM when there is no
  /// bias; otherwise forward + add_.
  /// The backward is backward() (dy passes to the residual unchanged).
  Tensor forward_add(const Tensor& x, LinearCtx& ctx, const Tensor& residual) const;
  /// dy [..., out] -> dx [..., in/TP]; accumulates dW, db.
  Tensor backward(const Tensor& dy, const LinearCtx& ctx, bool need_dx) const;
  /// backward whose dx GEMM also applies the tanh-GeLU backward: returns d(pre) =
  /// gelu'(pre) * dx for the GeLU input `pre` of this layer's input (fc2 after fc1 + GeLU) and,
  /// with pre_bias_grad, accumulates Σ_rows d(pre) into it (fc1's bias gradient; *bias_grad_done
  /// says whether that happened). backward, then without FP8 ops::gelu_backward_bgrad (GeLU
  /// backward + fc1's bias gradient in one pass where the backend fuses it); otherwise
  /// gelu_backward (bias_grad_done false).
  Tensor backward_dgelu(const Tensor& dy, const LinearCtx& ctx, const Tensor& pre, Tensor* pre_bias_grad,
                        bool* bias_grad_done) const;
  /// Runs this layer's GEMMs in FP8 with the roles registered under `name` (fp8/fp8_linear.h).
  void enable_fp8(std::shared_ptr<fp8::Fp8State> st, const std::string& name);
  /// As ColumnParallelLinear::fused_fp8_input (FP8, no bias, fp8::fused_input_ok).
  fp8::Fp8State* fused_fp8_input(const Tensor& like, int* base) const;
  /// forward() / forward_add() (residual != nullptr) for an input already quantized by its
  /// producer (fp8::swiglu_fp8).
  Tensor forward_fp8(const fp8::Fp8Input& xq, LinearCtx& ctx, const Tensor* residual) const;

 private:
  Tensor finish_forward(Tensor y) const;  // TP reduction + bias after the GEMM
  ParamRef weight_, bias_;
  int64_t in_local_, out_;
  TPContext tp_;
  std::shared_ptr<fp8::Fp8State> fp8_;
  int fp8_base_ = -1;
};

/// Word embedding with rows split across TP ranks (Megatron's VocabParallelEmbedding): ids
/// outside this rank's range give zero rows, then the outputs are all-reduced.
class VocabParallelEmbedding {
 public:
  VocabParallelEmbedding(ParamRegistry& reg, const std::string& name, int64_t num_embeddings,
                         int64_t embedding_dim, float init_std, const TPContext& tp);
  /// ids int64 [s, b] -> [s, b, h] in the weight's dtype.
  Tensor forward(const Tensor& ids) const;
  /// Accumulates dout [s, b, h] into the weight's main_grad.
  void backward(const Tensor& dout, const Tensor& ids) const;
  ParamRef weight() const { return weight_; }
  int64_t vocab_start() const { return vocab_start_; }

 private:
  ParamRef weight_;
  int64_t vocab_start_, vocab_local_, dim_;
  TPContext tp_;
};

}  // namespace megatron::tensor_parallel
