// The op set of megatron.cpp: every numerical kernel the models and optimizers use.
//
// Each op is declared here once and implemented twice: megatron/core/ops/cpu/ (reference,
// fp32 math, OpenMP/OpenBLAS, reduced formats emulated by rounding on store) and
// megatron/core/ops/cuda/ (fast). ops/dispatch.cpp picks the implementation from the device
// of the first tensor argument; all tensor arguments of one call must be on that device.
//
// Conventions
//  * Tensors are contiguous row-major (see tensor.h). Activations are sequence-first
//    [s, b, h] like Megatron; ops that only care about rows take [N, h] views (N = s*b).
//  * "float" inputs may be float32, bfloat16 or float16 unless stated; math is fp32, results
//    are rounded to the output's dtype (round to nearest even).
//  * Gradient outputs documented as "accumulate" are added into (+=) when `accumulate` is
//    true, otherwise overwritten. Weight gradients may have a wider dtype than the weights
//    (fp32 main grads for bf16 params, as Megatron's DDP does).
//  * Statistics saved for backward (mean, rstd, lse) are float32.
//  * A violated shape/dtype contract throws InternalError naming the shapes (MEGATRON_CHECK).
#pragma once

#include <cstdint>
#include <vector>

#include "megatron/core/ops/rope_freq.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::ops {

// ------------------------------------------------------------------------------------------
// Elementwise / utility
// ------------------------------------------------------------------------------------------

/// dst = src converted to dst's dtype (same numel; any float dtypes).
void cast(const Tensor& src, Tensor& dst);
/// x[:] = value.
void fill(Tensor& x, float value);
/// y += alpha * x (same numel; y may be wider than x).
void add_(Tensor& y, const Tensor& x, float alpha = 1.0f);
/// x *= alpha.
void scale_(Tensor& x, float alpha);
/// Sum of squares of all elements, accumulated in fp64, returned to the host (synchronizes).
double sum_of_squares(const Tensor& x);
/// Number of elements equal to zero (for --log-num-zeros-in-grad).
int64_t count_zeros(const Tensor& x);
/// True if any element is inf or NaN (fp16 loss-scaler check).
bool has_inf_or_nan(const Tensor& x);
/// y[a, b, rest...] = x[b, a, rest...]: swaps the first two dims (batch-first <-> sequence-first).
/// Any dtype (elements are moved, not converted); x and y have the same dtype, y is [x1, x0, ...].
void transpose01(const Tensor& x, Tensor& y);
/// y[N, n] += bias[n] for every row (RowParallelLinear adds its bias after the TP reduction).
void bias_add_(Tensor& y, const Tensor& bias);

// ------------------------------------------------------------------------------------------
// GEMM and linear layers
// ------------------------------------------------------------------------------------------

/// C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major. A is [m,k] ([k,m] if trans_a),
/// B is [k,n] ([n,k] if trans_b). A and B share a dtype; C is float32 or that dtype.
/// fp32 accumulation. Higher-rank tensors are viewed as 2-D with all leading dims folded.
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha = 1.0f,
          float beta = 0.0f);

/// y[N, out] = x[N, in] @ w[out, in]^T (+ bias[out]). x may have any leading dims.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y);
/// Backward of linear_forward. dx[N,in] = dy @ w (skipped if dx == nullptr);
/// dw[out,in] (+)= dy^T @ x; dbias[out] (+)= column sums of dy (skipped if nullptr).
void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias,
                     bool accumulate);

// ------------------------------------------------------------------------------------------
// Embeddings
// ------------------------------------------------------------------------------------------

/// out[..., h] = table[ids[...] - vocab_start] for ids in [vocab_start, vocab_start + V_local),
/// zeros otherwise (Megatron's VocabParallelEmbedding masking). ids int64, table [V_local, h].
void embedding_forward(const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start = 0);
/// dtable[ids - vocab_start] += dout rows (only ids in range). Always accumulates.
void embedding_backward(const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start = 0);

// ------------------------------------------------------------------------------------------
// Normalization (rows of x [N, h])
// ------------------------------------------------------------------------------------------

/// LayerNorm: y = (x - mean) * rstd * g + b, with g = gamma (or 1 + gamma when zero_centered_gamma,
/// Megatron's --apply-layernorm-1p). mean/rstd: float32 [N], written for backward.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma,
                       Tensor& y, Tensor& mean, Tensor& rstd);
/// dx = dL/dx (overwritten); dgamma, dbeta (+)= per accumulate.
void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
                        bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate);
/// RMSNorm: y = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y, Tensor& rstd);
void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                      bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, bool accumulate);

// ------------------------------------------------------------------------------------------
// Activations
// ------------------------------------------------------------------------------------------

/// GeLU. approximate_tanh=false: exact erf form (torch F.gelu); true: tanh approximation
/// (Megatron's fused bias_gelu, the default of pretrain_gpt with biases).
void gelu_forward(const Tensor& x, Tensor& y, bool approximate_tanh);
void gelu_backward(const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh);
/// SwiGLU on x [N, 2f] = [gate | up] (Megatron's fc1 layout): y[N, f] = silu(gate) * up.
void swiglu_forward(const Tensor& x, Tensor& y);
void swiglu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);
/// Squared ReLU (Megatron's --squared-relu, megatron/core/activations.py squared_relu):
/// y = relu(x)^2 elementwise; backward dx = dy * 2 relu(x). x, y, dy, dx: any shape, equal numel,
/// fp32/bf16/fp16 (computed in fp32).
void squared_relu_forward(const Tensor& x, Tensor& y);
void squared_relu_backward(const Tensor& dy, const Tensor& x, Tensor& dx);

/// Dropout with keep-probability 1-p: y = x * mask / (1-p). mask uint8 [numel] is written
/// (1 = kept). Random stream: (seed, offset) select a counter-based stream; CPU and CUDA
/// need not produce the same mask. p == 0 copies x and fills mask with 1.
void dropout_forward(const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset);
void dropout_backward(const Tensor& dy, const Tensor& mask, float p, Tensor& dx);

// ------------------------------------------------------------------------------------------
// Attention (core attention after the QKV projection)
// ------------------------------------------------------------------------------------------

/// Rotary embedding parameters (Megatron RotaryEmbedding): the first rot_dim = d*rotary_percent
/// channels of each head are rotated with inv_freq[i] = base^(-2i/rot_dim) (Llama-3.1-scaled with scaling.enabled)
/// at angle (position * position_scale) * inv_freq (rope_freq.h, shared by both backends); rotate-half unless
/// interleaved. Positions come from `position_ids` int64 [s, b] if given, else 0..s-1.
struct RopeParams {
  bool enabled = false;
  float base = 10000.0f;
  float percent = 1.0f;
  bool interleaved = false;
  /// Llama-3.1 frequency scaling (--use-rope-scaling); see rope_freq.h.
  RopeScaling scaling;
  /// Positions are multiplied by this before the angle: float32(1 / --rotary-seq-len-interpolation-factor),
  /// 1 without the flag (rope_position_scale in rope_freq.h).
  float position_scale = 1.0f;
};

/// Splits Megatron's fused QKV projection output qkv [s, b, ng * (np/ng + 2) * d] — rows grouped
/// per query group: [q_1..q_{np/ng}, k, v] — into q [s, b, np, d], k [s, b, ng, d], v [s, b, ng, d],
/// applying RoPE to q and k when rope.enabled.
void qkv_split_rope_forward(const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope,
                            const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v);
/// Backward: dqkv (overwritten) from dq, dk, dv (undoing RoPE).
void qkv_split_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads,
                             int64_t num_query_groups, const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv);

/// RoPE alone, on x [s, b, n, d] -> y [s, b, n, d] (y may alias x). Used when --qk-layernorm
/// puts the norms between the QKV split and the rotation (Megatron's order).
void rope_forward(const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y);
/// dx from dy (the inverse rotation); dx may alias dy.
void rope_backward(const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx);

struct AttentionParams {
  float softmax_scale = 1.0f;  // usually 1/sqrt(d)
  bool causal = true;
  /// Optional boolean mask [b, 1, s, sk] (true = masked out), used instead of `causal`
  /// (Megatron's attention_mask with --reset-attention-mask).
  const Tensor* attention_mask = nullptr;
  float dropout_p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

/// Scaled dot-product attention with grouped-query K/V (no repeated K/V materialized):
/// q [s, b, np, d], k, v [sk, b, ng, d] -> out [s, b, np, d]; head j uses K/V group j / (np/ng).
/// lse float32 [b, np, s] = log-sum-exp of the scaled, masked scores (for backward).
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out,
                       Tensor& lse);
/// dq, dk, dv overwritten. The probabilities are recomputed from `lse` and the softmax
/// correction term is D = rowsum(dout * out) (FlashAttention-2's backward), so a call on a
/// subset of the keys, given the final out/lse over all keys, returns exactly that subset's
/// dk/dv and its contribution to dq (ring attention sums these over key blocks).
void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv);

/// Online-softmax merge of a partial attention result into an accumulator (the log-sum-exp
/// correction of FlashAttention / ring attention, Liu et al. 2023 "Ring Attention with Blockwise
/// Transformers"): (acc_out, acc_lse) and (part_out, part_lse) are attention over two disjoint
/// key sets for the same queries; afterwards the accumulator holds attention over their union:
///   lse' = log(exp(acc_lse) + exp(part_lse)),
///   acc_out' = acc_out * exp(acc_lse - lse') + part_out * exp(part_lse - lse').
/// acc_out float32 [s, b, np, d]; part_out [s, b, np, d] any float dtype; acc_lse, part_lse
/// float32 [b, np, s]. A row whose lse is -inf on both sides (no visible key yet) stays (0, -inf);
/// start an accumulator with out = 0, lse = -inf.
void attention_merge_(Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse);

// ------------------------------------------------------------------------------------------
// Cross entropy over a (possibly vocab-parallel) logits shard
// ------------------------------------------------------------------------------------------

/// One pass over logits [N, V_local] with labels int64 [N]: per row the local max m, the local
/// sum s = sum exp(logit - m), and pred = logit[label - vocab_start] if the label falls in this
/// shard else 0 (all float32 [N]). Vocab-parallel callers combine shards (docs/megatron-reference.md#vocab-parallel-cross-entropy):
/// M = allreduce_max(m); S = allreduce_sum(s * exp(m - M)); P = allreduce_sum(pred);
/// loss = log(S) + M - P, lse = log(S) + M.
void cross_entropy_stats(const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max,
                         Tensor& row_sumexp, Tensor& pred);
/// Vocab-parallel combine step: row_sumexp[i] *= exp(row_max[i] - global_max[i]) (all float32 [N]).
void cross_entropy_rescale_(Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max);
/// loss = log(sumexp) + max - pred and lse = log(sumexp) + max (all float32 [N]; loss/lse written).
void cross_entropy_loss(const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss,
                        Tensor& lse);
/// dlogits[N, V_local] = (softmax(logits) - onehot(label)) * dloss[row], with softmax from the
/// global lse [N]. dlogits may be the same tensor as logits (in-place, saves memory).
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse,
                            const Tensor& dloss, Tensor& dlogits);
/// Fused cross entropy of a training forward whose row holds the whole softmax (no vocab
/// parallelism, TP = 1): per row of logits [N, V] (float32/bf16/fp16) with labels int64 [N],
/// lse = log(sum exp(logit)) and loss = lse - logit[label - vocab_start] (the logit term is 0
/// for a label outside [vocab_start, vocab_start + V)), both float32 [N] (written); and logits
/// is OVERWRITTEN in place with the unscaled gradient g = softmax(logits) - onehot(label) in
/// its own dtype. Backward then needs only dlogits = diag(dloss) g, which the caller applies to
/// the small GEMM operands (GPTModel: rows of the output layer's input and dgrad) instead of to
/// the [N, V] tensor. Same loss as cross_entropy_stats + cross_entropy_loss up to fp32 summation
/// order; the fused classifier of llm.c and Megatron's vocab-parallel cross entropy
/// (megatron/core/tensor_parallel/cross_entropy.py, docs/megatron-reference.md#vocab-parallel-cross-entropy) with the whole vocab on one rank.
void cross_entropy_fused_(Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse);
/// out[r, :] = x[r, :] * scale[r] for x, out [N, H] of one float dtype (rounded once to it) and
/// scale float32 [N]; out may be x (in place).
void scale_rows(const Tensor& x, const Tensor& scale, Tensor& out);

// ------------------------------------------------------------------------------------------
// Optimizer
// ------------------------------------------------------------------------------------------

struct AdamParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;        // 1-based, for bias correction
  bool decoupled = true;   // AdamW (Megatron default); false folds wd*p into the gradient
};

/// One Adam(W) step on fp32 master params (docs/megatron-reference.md#adam), all float32 and equal numel:
/// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p).
/// If model_param is given (bf16/fp16/fp32 of the same numel), it receives the updated p cast.
void adam_step(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
               Tensor* model_param = nullptr);

}  // namespace megatron::ops
