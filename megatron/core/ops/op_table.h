// The op table: every op of the op contract (megatron/core/ops/ops.h), declared ONCE.
//
// This file is an X-macro list, deliberately without an include guard: each includer defines
//   MEGATRON_OP(ret, name, params, args, dev)
// (and MEGATRON_OP_DEFAULT(value), the default-argument marker), includes this file and undefines
// them. From this one list come the declarations of megatron::ops (ops.h, with defaults),
// megatron::ops::cpu (cpu/cpu_ops.h), megatron::ops::cuda (cuda/cuda_ops.h) and the dispatch
// wrappers (dispatch.cpp), so the four cannot drift apart. Fields:
//   ret    return type
//   name   op name (the same in ops::, ops::cpu:: and ops::cuda::)
//   params the parenthesized parameter list; MEGATRON_OP_DEFAULT(v) marks a default argument
//          (it expands to "= v" in ops.h only)
//   args   the parameter names, parenthesized, as passed on by the dispatch wrapper
//   dev    the argument whose device picks the implementation (a Tensor, a Tensor list or an
//          AdamTensor list; dispatch.cpp, on_cuda()). All tensors of one call are on that device.
//
// Every op has a CPU reference in ops/cpu/ (fp32 math; the ground truth the CUDA kernels are
// tested against). Ops whose fusion only a backend has return bool: the CPU reference returns
// false ("not fused here", nothing written) and the caller composes the documented fallback from
// other ops. Ops documented "composes when not fused" always do the whole job: a backend that
// cannot fuse a call runs the listed ops itself (the CPU reference always does).
// Only add an op here; never declare one by hand in cpu_ops.h, cuda_ops.h or ops.h.

// ------------------------------------------------------------------------------------------
// Elementwise / utility
// ------------------------------------------------------------------------------------------

/// dst = src converted to dst's dtype (same numel; any float dtypes).
MEGATRON_OP(void, cast, (const Tensor& src, Tensor& dst), (src, dst), src)
/// x[:] = value.
MEGATRON_OP(void, fill, (Tensor& x, float value), (x, value), x)
/// y += alpha * x (same numel; y may be wider than x).
MEGATRON_OP(void, add_, (Tensor& y, const Tensor& x, float alpha MEGATRON_OP_DEFAULT(1.0f)), (y, x, alpha), y)
/// x *= alpha (the loss scaler's unscale and the gradient clip coefficient use it per tensor).
MEGATRON_OP(void, scale_, (Tensor& x, float alpha), (x, alpha), x)
/// Sum of squares of all elements, accumulated in fp64, returned to the host (synchronizes).
MEGATRON_OP(double, sum_of_squares, (const Tensor& x), (x), x)
/// Number of elements equal to zero (for --log-num-zeros-in-grad).
MEGATRON_OP(int64_t, count_zeros, (const Tensor& x), (x), x)
/// True if any element is inf or NaN (fp16 loss-scaler check).
MEGATRON_OP(bool, has_inf_or_nan, (const Tensor& x), (x), x)
/// y[a, b, rest...] = x[b, a, rest...]: swaps the first two dims (batch-first <-> sequence-first).
/// Any dtype (elements are moved, not converted); x and y have the same dtype, y is [x1, x0, ...].
MEGATRON_OP(void, transpose01, (const Tensor& x, Tensor& y), (x, y), x)
/// y[N, n] += bias[n] for every row (RowParallelLinear adds its bias after the TP reduction).
MEGATRON_OP(void, bias_add_, (Tensor& y, const Tensor& bias), (y, bias), y)

// ------------------------------------------------------------------------------------------
// Multi-tensor reductions (the gradient statistics of optimizer/clip_grads.cpp): one call for a
// whole list of tensors, all on one device; an empty list gives 0 / false. The CUDA backend
// reduces every tensor into one buffer and synchronizes the host once for the list (a per-tensor
// sum_of_squares would synchronize once per parameter); the CPU reference sums the per-tensor
// results in list order (fp64), which is what Megatron's clip_grads does per bucket.
// ------------------------------------------------------------------------------------------

/// Σ sum_of_squares(x) over xs (float tensors), fp64, deterministic for a fixed thread count.
MEGATRON_OP(double, sum_of_squares_many, (const std::vector<Tensor>& xs), (xs), xs)
/// Σ count_zeros(x) over xs (--log-num-zeros-in-grad).
MEGATRON_OP(int64_t, count_zeros_many, (const std::vector<Tensor>& xs), (xs), xs)
/// Any inf/NaN in any of xs (the fp16 loss scaler's found_inf check).
MEGATRON_OP(bool, has_inf_or_nan_many, (const std::vector<Tensor>& xs), (xs), xs)

// ------------------------------------------------------------------------------------------
// GEMM and linear layers
// ------------------------------------------------------------------------------------------

/// C[m,n] = alpha * op(A) @ op(B) + beta * C, row-major. A is [m,k] ([k,m] if trans_a),
/// B is [k,n] ([n,k] if trans_b). A and B share a dtype; C is float32 or that dtype.
/// fp32 accumulation. Higher-rank tensors are viewed as 2-D with all leading dims folded.
MEGATRON_OP(void, gemm,
            (const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
             float alpha MEGATRON_OP_DEFAULT(1.0f), float beta MEGATRON_OP_DEFAULT(0.0f)),
            (a, trans_a, b, trans_b, c, alpha, beta), a)
/// y[N, out] = x[N, in] @ w[out, in]^T (+ bias[out]). x may have any leading dims.
MEGATRON_OP(void, linear_forward, (const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y), (x, w, bias, y), x)
/// Backward of linear_forward. dx[N,in] = dy @ w (skipped if dx == nullptr);
/// dw[out,in] (+)= dy^T @ x; dbias[out] (+)= column sums of dy (skipped if nullptr).
MEGATRON_OP(void, linear_backward,
            (const Tensor& dy, const Tensor& x, const Tensor& w, Tensor* dx, Tensor* dw, Tensor* dbias, bool accumulate),
            (dy, x, w, dx, dw, dbias, accumulate), dy)
/// y[N,out] = x[N,in] @ w[out,in]^T (+ bias[out]) + residual[N,out] in one GEMM (CUDA: cuBLASLt
/// reads the residual as C with beta 1, one rounding). bf16/fp16 y, residual, bias; residual must
/// not alias y. Returns false, writing nothing, when not fused (CPU; fp32; dtype mismatch; empty;
/// MEGATRON_GEMM_EPILOGUES=0): the caller then runs linear_forward + add_.
MEGATRON_OP(bool, linear_forward_residual,
            (const Tensor& x, const Tensor& w, const Tensor* bias, const Tensor& residual, Tensor& y),
            (x, w, bias, residual, y), x)
/// Fused fc1 + GeLU (CUDA: cuBLASLt GELU_AUX_BIAS epilogue, the tanh approximation, Megatron's
/// bias_gelu): pre[N,out] = x[N,in] @ w[out,in]^T + bias[out] (the GeLU input, saved for the
/// backward) and act = gelu_tanh(pre). bf16/fp16, out % 8 == 0. Returns false, writing nothing,
/// when not fused (CPU; fp32; no cuBLASLt kernel; MEGATRON_GEMM_EPILOGUES=0): the caller then
/// runs linear_forward + gelu_forward(approximate_tanh = true).
MEGATRON_OP(bool, linear_bias_gelu_forward,
            (const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& pre, Tensor& act), (x, w, bias, pre, act), x)
/// GeLU (tanh approximation) backward with the bias gradient in the same pass: dpre[N,f] =
/// dy[N,f] * gelu_tanh'(pre[N,f]) and, if dbias, dbias[f] (+)= Σ_rows dpre (the dpre values as
/// stored, summed in fp32 in a fixed order, rounded once to dpre's dtype, then added: Megatron's
/// bf16 bias .grad accumulated into the main grad). dy, pre, dpre bf16 or fp16 of one dtype,
/// f % 8 == 0, 16-byte aligned. Returns false, writing nothing, when not fused (CPU; other
/// shapes/dtypes; MEGATRON_GEMM_EPILOGUES=0): the caller then runs gelu_backward and leaves the
/// bias gradient to the fc1 backward.
MEGATRON_OP(bool, gelu_backward_bgrad, (const Tensor& dy, const Tensor& pre, Tensor& dpre, Tensor* dbias, bool accumulate),
            (dy, pre, dpre, dbias, accumulate), dy)

// ------------------------------------------------------------------------------------------
// Embeddings
// ------------------------------------------------------------------------------------------

/// out[..., h] = table[ids[...] - vocab_start] for ids in [vocab_start, vocab_start + V_local),
/// zeros otherwise (Megatron's VocabParallelEmbedding masking). ids int64, table [V_local, h].
MEGATRON_OP(void, embedding_forward,
            (const Tensor& ids, const Tensor& table, Tensor& out, int64_t vocab_start MEGATRON_OP_DEFAULT(0)),
            (ids, table, out, vocab_start), ids)
/// dtable[ids - vocab_start] += dout rows (only ids in range). Always accumulates.
MEGATRON_OP(void, embedding_backward,
            (const Tensor& dout, const Tensor& ids, Tensor& dtable, int64_t vocab_start MEGATRON_OP_DEFAULT(0)),
            (dout, ids, dtable, vocab_start), dout)

// ------------------------------------------------------------------------------------------
// Normalization (rows of x [N, h])
// ------------------------------------------------------------------------------------------

/// LayerNorm: y = (x - mean) * rstd * g + b, with g = gamma (or 1 + gamma when zero_centered_gamma,
/// Megatron's --apply-layernorm-1p). mean/rstd: float32 [N], written for backward.
MEGATRON_OP(void, layernorm_forward,
            (const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, bool zero_centered_gamma, Tensor& y,
             Tensor& mean, Tensor& rstd),
            (x, gamma, beta, eps, zero_centered_gamma, y, mean, rstd), x)
/// dx = dL/dx (overwritten); dgamma, dbeta (+)= per accumulate.
MEGATRON_OP(void, layernorm_backward,
            (const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
             bool zero_centered_gamma, Tensor& dx, Tensor& dgamma, Tensor& dbeta, bool accumulate),
            (dy, x, gamma, mean, rstd, zero_centered_gamma, dx, dgamma, dbeta, accumulate), dy)
/// layernorm_backward with the residual branch's gradient added to dx: dx = LN-backward(dy) +
/// dresidual (dresidual: dy's numel; may not alias dx). CUDA adds it inside the backward pass
/// (bf16/fp32 with dresidual of dy's dtype); composes when not fused: layernorm_backward + add_.
MEGATRON_OP(void, layernorm_backward_residual,
            (const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd,
             bool zero_centered_gamma, const Tensor& dresidual, Tensor& dx, Tensor& dgamma, Tensor& dbeta,
             bool accumulate),
            (dy, x, gamma, mean, rstd, zero_centered_gamma, dresidual, dx, dgamma, dbeta, accumulate), dy)
/// RMSNorm: y = x * rstd * g, rstd = 1/sqrt(mean(x^2) + eps).
MEGATRON_OP(void, rmsnorm_forward,
            (const Tensor& x, const Tensor& gamma, float eps, bool zero_centered_gamma, Tensor& y, Tensor& rstd),
            (x, gamma, eps, zero_centered_gamma, y, rstd), x)
/// Only the statistics of rmsnorm_forward: rstd [rows] (float32), bit-identical to what
/// rmsnorm_forward writes; no output (the FP8 path normalizes and quantizes in
/// fp8_rmsnorm_quantize instead). gamma only selects the kernel instance.
MEGATRON_OP(void, rmsnorm_rstd, (const Tensor& x, const Tensor& gamma, float eps, Tensor& rstd), (x, gamma, eps, rstd), x)
MEGATRON_OP(void, rmsnorm_backward,
            (const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma,
             Tensor& dx, Tensor& dgamma, bool accumulate),
            (dy, x, gamma, rstd, zero_centered_gamma, dx, dgamma, accumulate), dy)
/// rmsnorm_backward with dx = RMSNorm-backward(dy) + dresidual, as layernorm_backward_residual
/// (composes when not fused: rmsnorm_backward + add_).
MEGATRON_OP(void, rmsnorm_backward_residual,
            (const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma,
             const Tensor& dresidual, Tensor& dx, Tensor& dgamma, bool accumulate),
            (dy, x, gamma, rstd, zero_centered_gamma, dresidual, dx, dgamma, accumulate), dy)

// ------------------------------------------------------------------------------------------
// Activations
// ------------------------------------------------------------------------------------------

/// GeLU. approximate_tanh=false: exact erf form (torch F.gelu); true: tanh approximation
/// (Megatron's fused bias_gelu, the default of pretrain_gpt with biases).
MEGATRON_OP(void, gelu_forward, (const Tensor& x, Tensor& y, bool approximate_tanh), (x, y, approximate_tanh), x)
MEGATRON_OP(void, gelu_backward, (const Tensor& dy, const Tensor& x, Tensor& dx, bool approximate_tanh),
            (dy, x, dx, approximate_tanh), dy)
/// SwiGLU on x [N, 2f] = [gate | up] (Megatron's fc1 layout): y[N, f] = silu(gate) * up.
MEGATRON_OP(void, swiglu_forward, (const Tensor& x, Tensor& y), (x, y), x)
MEGATRON_OP(void, swiglu_backward, (const Tensor& dy, const Tensor& x, Tensor& dx), (dy, x, dx), dy)
/// Squared ReLU (Megatron's --squared-relu, megatron/core/activations.py squared_relu):
/// y = relu(x)^2 elementwise; backward dx = dy * 2 relu(x). x, y, dy, dx: any shape, equal numel,
/// fp32/bf16/fp16 (computed in fp32).
MEGATRON_OP(void, squared_relu_forward, (const Tensor& x, Tensor& y), (x, y), x)
MEGATRON_OP(void, squared_relu_backward, (const Tensor& dy, const Tensor& x, Tensor& dx), (dy, x, dx), dy)
/// Dropout with keep-probability 1-p: y = x * mask / (1-p). mask uint8 [numel] is written
/// (1 = kept). Random stream: (seed, offset) select a counter-based stream; CPU and CUDA
/// need not produce the same mask. p == 0 copies x and fills mask with 1.
MEGATRON_OP(void, dropout_forward, (const Tensor& x, Tensor& y, Tensor& mask, float p, uint64_t seed, uint64_t offset),
            (x, y, mask, p, seed, offset), x)
MEGATRON_OP(void, dropout_backward, (const Tensor& dy, const Tensor& mask, float p, Tensor& dx), (dy, mask, p, dx), dy)

// ------------------------------------------------------------------------------------------
// Attention (core attention after the QKV projection; RopeParams / AttentionParams in ops.h)
// ------------------------------------------------------------------------------------------

/// Splits Megatron's fused QKV projection output qkv [s, b, ng * (np/ng + 2) * d] — rows grouped
/// per query group: [q_1..q_{np/ng}, k, v] — into q [s, b, np, d], k [s, b, ng, d], v [s, b, ng, d],
/// applying RoPE to q and k when rope.enabled.
MEGATRON_OP(void, qkv_split_rope_forward,
            (const Tensor& qkv, int64_t num_heads, int64_t num_query_groups, const RopeParams& rope,
             const Tensor* position_ids, Tensor& q, Tensor& k, Tensor& v),
            (qkv, num_heads, num_query_groups, rope, position_ids, q, k, v), qkv)
/// Backward: dqkv (overwritten) from dq, dk, dv (undoing RoPE).
MEGATRON_OP(void, qkv_split_rope_backward,
            (const Tensor& dq, const Tensor& dk, const Tensor& dv, int64_t num_heads, int64_t num_query_groups,
             const RopeParams& rope, const Tensor* position_ids, Tensor& dqkv),
            (dq, dk, dv, num_heads, num_query_groups, rope, position_ids, dqkv), dq)
/// RoPE alone, on x [s, b, n, d] -> y [s, b, n, d] (y may alias x). Used when --qk-layernorm
/// puts the norms between the QKV split and the rotation (Megatron's order).
MEGATRON_OP(void, rope_forward, (const Tensor& x, const RopeParams& rope, const Tensor* position_ids, Tensor& y),
            (x, rope, position_ids, y), x)
/// dx from dy (the inverse rotation); dx may alias dy.
MEGATRON_OP(void, rope_backward, (const Tensor& dy, const RopeParams& rope, const Tensor* position_ids, Tensor& dx),
            (dy, rope, position_ids, dx), dy)
/// Scaled dot-product attention with grouped-query K/V (no repeated K/V materialized):
/// q [s, b, np, d], k, v [sk, b, ng, d] -> out [s, b, np, d]; head j uses K/V group j / (np/ng).
/// lse float32 [b, np, s] = log-sum-exp of the scaled, masked scores (for backward).
MEGATRON_OP(void, attention_forward,
            (const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, Tensor& out, Tensor& lse),
            (q, k, v, p, out, lse), q)
/// dq, dk, dv overwritten. The probabilities are recomputed from `lse` and the softmax
/// correction term is D = rowsum(dout * out) (FlashAttention-2's backward), so a call on a
/// subset of the keys, given the final out/lse over all keys, returns exactly that subset's
/// dk/dv and its contribution to dq (ring attention sums these over key blocks).
MEGATRON_OP(void, attention_backward,
            (const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
             const Tensor& lse, const AttentionParams& p, Tensor& dq, Tensor& dk, Tensor& dv),
            (dout, q, k, v, out, lse, p, dq, dk, dv), dout)
/// Online-softmax merge of a partial attention result into an accumulator (the log-sum-exp
/// correction of FlashAttention / ring attention, Liu et al. 2023 "Ring Attention with Blockwise
/// Transformers"): (acc_out, acc_lse) and (part_out, part_lse) are attention over two disjoint
/// key sets for the same queries; afterwards the accumulator holds attention over their union:
///   lse' = log(exp(acc_lse) + exp(part_lse)),
///   acc_out' = acc_out * exp(acc_lse - lse') + part_out * exp(part_lse - lse').
/// acc_out float32 [s, b, np, d]; part_out [s, b, np, d] any float dtype; acc_lse, part_lse
/// float32 [b, np, s]. A row whose lse is -inf on both sides (no visible key yet) stays (0, -inf);
/// start an accumulator with out = 0, lse = -inf.
MEGATRON_OP(void, attention_merge_, (Tensor& acc_out, Tensor& acc_lse, const Tensor& part_out, const Tensor& part_lse),
            (acc_out, acc_lse, part_out, part_lse), acc_out)
/// Self-attention straight from the fused QKV GEMM output: qkv [s, b, 3·h·d] bf16 in the
/// interleaved [s, b, h, (q, k, v), d] layout (num_query_groups == heads, no RoPE, no
/// qk-layernorm), causal, out [s, b, h, d], lse float32 [b, h, s]: the same result as
/// qkv_split_rope_forward (no RoPE) followed by attention_forward, without the split copies.
/// CUDA: cuDNN only. Returns false, writing nothing, when not fused (CPU; cuDNN unavailable or
/// rejecting the call; a mask or dropout; MEGATRON_ATTENTION_BACKEND=flash/generic;
/// MEGATRON_PACKED_QKV=0): the caller then splits and calls attention_forward.
MEGATRON_OP(bool, attention_forward_packed_qkv,
            (const Tensor& qkv, int64_t heads, const AttentionParams& p, Tensor& out, Tensor& lse),
            (qkv, heads, p, out, lse), qkv)
/// The backward of attention_forward_packed_qkv: dQ, dK, dV into dqkv (qkv's layout), like
/// attention_backward followed by qkv_split_rope_backward. False (nothing written) when not fused;
/// the caller then splits qkv and runs those two.
MEGATRON_OP(bool, attention_backward_packed_qkv,
            (const Tensor& dout, const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& lse,
             const AttentionParams& p, Tensor& dqkv),
            (dout, qkv, heads, out, lse, p, dqkv), dout)

// ------------------------------------------------------------------------------------------
// Cross entropy over a (possibly vocab-parallel) logits shard
// ------------------------------------------------------------------------------------------

/// One pass over logits [N, V_local] with labels int64 [N]: per row the local max m, the local
/// sum s = sum exp(logit - m), and pred = logit[label - vocab_start] if the label falls in this
/// shard else 0 (all float32 [N]). Vocab-parallel callers combine shards:
/// M = allreduce_max(m); S = allreduce_sum(s * exp(m - M)); P = allreduce_sum(pred);
/// loss = log(S) + M - P, lse = log(S) + M.
MEGATRON_OP(void, cross_entropy_stats,
            (const Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& row_max, Tensor& row_sumexp,
             Tensor& pred),
            (logits, labels, vocab_start, row_max, row_sumexp, pred), logits)
/// Vocab-parallel combine step: row_sumexp[i] *= exp(row_max[i] - global_max[i]) (all float32 [N]).
MEGATRON_OP(void, cross_entropy_rescale_, (Tensor& row_sumexp, const Tensor& row_max, const Tensor& global_max),
            (row_sumexp, row_max, global_max), row_sumexp)
/// loss = log(sumexp) + max - pred and lse = log(sumexp) + max (all float32 [N]; loss/lse written).
MEGATRON_OP(void, cross_entropy_loss,
            (const Tensor& global_max, const Tensor& global_sumexp, const Tensor& pred, Tensor& loss, Tensor& lse),
            (global_max, global_sumexp, pred, loss, lse), global_max)
/// dlogits[N, V_local] = (softmax(logits) - onehot(label)) * dloss[row], with softmax from the
/// global lse [N]. dlogits may be the same tensor as logits (in-place, saves memory).
MEGATRON_OP(void, cross_entropy_backward,
            (const Tensor& logits, const Tensor& labels, int64_t vocab_start, const Tensor& lse, const Tensor& dloss,
             Tensor& dlogits),
            (logits, labels, vocab_start, lse, dloss, dlogits), logits)
/// Fused cross entropy of a training forward whose row holds the whole softmax (no vocab
/// parallelism, TP = 1): per row of logits [N, V] (float32/bf16/fp16) with labels int64 [N],
/// lse = log(sum exp(logit)) and loss = lse - logit[label - vocab_start] (the logit term is 0
/// for a label outside [vocab_start, vocab_start + V)), both float32 [N] (written); and logits
/// is OVERWRITTEN in place with the unscaled gradient g = softmax(logits) - onehot(label) in
/// its own dtype. Backward then needs only dlogits = diag(dloss) g, which the caller applies to
/// the small GEMM operands (GPTModel: rows of the output layer's input and dgrad) instead of to
/// the [N, V] tensor. Same loss as cross_entropy_stats + cross_entropy_loss up to fp32 summation
/// order; the fused classifier of llm.c and Megatron's vocab-parallel cross entropy
/// (megatron/core/tensor_parallel/cross_entropy.py) with the whole vocab on one rank.
MEGATRON_OP(void, cross_entropy_fused_,
            (Tensor& logits, const Tensor& labels, int64_t vocab_start, Tensor& loss, Tensor& lse),
            (logits, labels, vocab_start, loss, lse), logits)
/// out[r, :] = x[r, :] * scale[r] for x, out [N, H] of one float dtype (rounded once to it) and
/// scale float32 [N]; out may be x (in place).
MEGATRON_OP(void, scale_rows, (const Tensor& x, const Tensor& scale, Tensor& out), (x, scale, out), x)

// ------------------------------------------------------------------------------------------
// Optimizer (AdamParams / AdamTensor in ops.h)
// ------------------------------------------------------------------------------------------

/// One Adam(W) step on fp32 master params (Kingma & Ba 2015; Loshchilov & Hutter 2019; Apex/TE
/// FusedAdam with bias correction), all float32 and equal numel, with g = grad * p.grad_scale
/// (the scaled value is not written back):
///   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
///   p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p)   (decoupled; else wd p joins g).
/// Bias corrections: b^t in fp64; the CPU reference rounds b^t to fp32 and subtracts in fp32, the
/// CUDA kernels round 1-b^t once from fp64 (Apex's multi_tensor_adam), so the two may differ in
/// the last bit of the correction (GPU tests compare within 1e-6). If model_param is given
/// (bf16/fp16/fp32 of the same numel), it receives the updated p cast (round to nearest even).
MEGATRON_OP(void, adam_step,
            (Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq, const AdamParams& p,
             Tensor* model_param MEGATRON_OP_DEFAULT(nullptr)),
            (param, grad, exp_avg, exp_avg_sq, p, model_param), param)
/// adam_step over many tensors, all on one device (p.lr / p.weight_decay are taken from each
/// AdamTensor, the rest from p): the same per-element arithmetic as adam_step per tensor. CUDA:
/// one launch per model-param dtype (multi-tensor Adam; the tensor table goes to the GPU through
/// the asynchronous staged copy, no host synchronization), or one adam_step launch per tensor in
/// list order when a tensor does not fit the multi-tensor kernel (or a dev/cuda driver forces it: ops/cuda/variants.h).
/// CPU: adam_step per tensor in list order.
MEGATRON_OP(void, adam_step_multi, (const std::vector<AdamTensor>& ts, const AdamParams& p), (ts, p), ts)

// ------------------------------------------------------------------------------------------
// Initialization
// ------------------------------------------------------------------------------------------

/// Fills `out` with std * normal_at(key, global index) of the parameter shard `spec` describes
/// (normal_init.h; tensor_parallel::initialize_parameter's counter-based N(0, std) stream), rounded
/// to out's dtype, on out's device without a host round trip. Returns false, writing nothing, when
/// not fused (CPU: initialize_parameter draws the same values on the host; CUDA: a dtype other
/// than fp32/bf16/fp16 or more than kMaxDims dims).
MEGATRON_OP(bool, normal_init, (Tensor& out, const NormalInitSpec& spec), (out, spec), out)

// ------------------------------------------------------------------------------------------
// FP8 (megatron/core/fp8/fp8_linear.h, docs/fp8.md). Scale / amax arguments point at one float
// on the tensor's device (CUDA: device memory, no host round trip; CPU: host memory).
// ------------------------------------------------------------------------------------------

/// Fused quantize (+ transpose) + amax of x viewed as [rows, cols] = [numel / x.size(-1), x.size(-1)]
/// (float32/bfloat16/float16):
///   q   [rows, cols] = sat_rne_cast(x * scale[0])   (if q != nullptr)
///   q_t [cols, rows] = the same values transposed     (if q_t != nullptr)
///   amax[0] = max(amax[0], max |x|)                  (if amax != nullptr; NaN propagates)
/// q/q_t dtype: float8_e4m3 or float8_e5m2 (both the same); the cast saturates to the finite
/// range with round to nearest even (CUDA's __nv_cvt_float_to_fp8(v, __NV_SATFINITE, fmt)).
MEGATRON_OP(void, fp8_quantize, (const Tensor& x, const float* scale, float* amax, Tensor* q, Tensor* q_t),
            (x, scale, amax, q, q_t), x)
/// SwiGLU fused with the quantization of its output (the fc2 input): for x [..., 2f] = [gate | up]
/// (bfloat16/float32) the value v = act_dtype(silu(gate) * up) -- bit for bit what swiglu_forward
/// writes into an act_dtype tensor -- is quantized into q [rows, f] and q_t [f, rows]
/// (sat_rne_cast(v * scale[0])) and amax[0] = max(amax[0], max |v|) (if amax != nullptr), without
/// writing v. Returns false (nothing written) when not fused (CPU; rows % 16, f % 8, alignment;
/// both q and q_t needed): the caller then runs swiglu_forward + fp8_quantize.
MEGATRON_OP(bool, fp8_swiglu_quantize,
            (const Tensor& x, DType act_dtype, const float* scale, float* amax, Tensor* q, Tensor* q_t),
            (x, act_dtype, scale, amax, q, q_t), x)
/// SwiGLU's backward fused with the quantization of its result (fc1's output gradient): for
/// x [..., 2f] and dy [..., f] (both bfloat16 or both float32) the gradient v [rows, 2f] -- bit for
/// bit what swiglu_backward writes into a dx of dy's dtype -- is quantized into q [rows, 2f] and
/// q_t [2f, rows] with amax as fp8_swiglu_quantize. False when not fused (CPU; shapes): the caller
/// then runs swiglu_backward + fp8_quantize.
MEGATRON_OP(bool, fp8_swiglu_backward_quantize,
            (const Tensor& dy, const Tensor& x, const float* scale, float* amax, Tensor* q, Tensor* q_t),
            (dy, x, scale, amax, q, q_t), dy)
/// RMSNorm's output fused with its quantization: v = out_dtype(x * rstd[row] * (gamma + (zero_centered
/// ? 1 : 0))) -- bit for bit what rmsnorm_forward writes into an out_dtype tensor, given the rstd of
/// rmsnorm_rstd -- quantized into q [rows, h] and q_t [h, rows] with amax as fp8_swiglu_quantize.
/// x [..., h], gamma [h] (bfloat16/float32), rstd float32 [rows]. False when not fused (CPU; shapes):
/// the caller then runs rmsnorm_forward + fp8_quantize.
MEGATRON_OP(bool, fp8_rmsnorm_quantize,
            (const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma, DType out_dtype,
             const float* scale, float* amax, Tensor* q, Tensor* q_t),
            (x, gamma, rstd, zero_centered_gamma, out_dtype, scale, amax, q, q_t), x)
/// q_t [cols, rows] = q [rows, cols] transposed, byte for byte (1-byte dtypes: the FP8 weight's
/// dgrad layout after --fp8-param-gather's all-gather).
MEGATRON_OP(void, fp8_transpose, (const Tensor& q, Tensor& q_t), (q, q_t), q)
/// amax[0] = max(amax[0], max |x|) only (NaN propagates).
MEGATRON_OP(void, fp8_amax, (const Tensor& x, float* amax), (x, amax), x)
/// Tensorwise (current) scaling: with a = cur_amax[0] (float32 [1]), if a is finite and > 0,
/// scale[0] = fp8_max / a / 2^margin (FLT_MAX if that overflows), scale_inv[0] = 1/scale; else
/// both unchanged. Folds a into step_amax (max, NaN propagates) when step_amax != nullptr. Then
/// sets cur_amax[0] = 0, so a persistent scratch needs no memset before the next fp8_amax.
MEGATRON_OP(void, fp8_scale_from_amax,
            (Tensor& cur_amax, float fp8_max, int margin, float* scale, float* scale_inv, float* step_amax),
            (cur_amax, fp8_max, margin, scale, scale_inv, step_amax), cur_amax)
/// The delayed-scaling step boundary for `roles` FP8 roles in one call (fp8_state.h;
/// Fp8TensorMeta::record_amax + update of fp8_recipe.h, bit-identical): for role r, with its amax
/// at amax[r * slot] (amax: float32 tensor), scale/scale_inv at scale[r * slot] / scale_inv[r * slot],
/// and its history a ring hist[r * history_len + (pos + i) % history_len] (logical entry i):
/// entry 0 = max(entry 0, amax) (NaN propagates); if update_scale, the amax used (fmaxf over the
/// window when max_algo, else entry 0) gives scale = fmax[r] / used / 2^margin when finite and
/// > 0 (FLT_MAX on overflow; else the old scale) and scale_inv = 1 / scale; then the window rolls
/// by one (the caller advances pos by 1; the new entry 0 is zeroed) and the amax is zeroed.
MEGATRON_OP(void, fp8_update_scales,
            (Tensor& amax, int64_t slot, float* hist, int history_len, int64_t pos, int roles, const float* fmax,
             int margin, bool max_algo, bool update_scale, float* scale, float* scale_inv),
            (amax, slot, hist, history_len, pos, roles, fmax, margin, max_algo, update_scale, scale, scale_inv), amax)
/// FP8 GEMM in the "TN" layout (both operands K-major, i.e. row-major with K last):
///   C[m, n] = a_scale_inv[0] * b_scale_inv[0] * (A[m, k] @ B[n, k]^T) + beta * C
/// A, B: float8_e4m3/e5m2 (not both e5m2); C: bfloat16/float16/float32 (beta != 0 accumulates in
/// place, e.g. into fp32 main grads). FP32 accumulation; fast_accum selects cuBLASLt's FAST_ACCUM
/// (TE uses it for the forward GEMM only; the CPU reference ignores it). CUDA: k % 16 == 0
/// (cuBLASLt's FP8 requirement), else UserError naming the shape.
MEGATRON_OP(void, fp8_gemm_tn,
            (const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv, Tensor& c,
             float beta, bool fast_accum),
            (a, a_scale_inv, b, b_scale_inv, c, beta, fast_accum), a)
/// fp8_gemm_tn with the residual added in the GEMM's epilogue: d[m, n] = a_scale_inv[0] *
/// b_scale_inv[0] * (A @ B^T) + residual (bfloat16/float16, d's dtype and shape; not modified), one
/// rounding to d's dtype. Returns false (nothing written) when not fused (CPU; no cuBLASLt
/// algorithm; MEGATRON_GEMM_EPILOGUES=0): the caller then runs fp8_gemm_tn and add_.
MEGATRON_OP(bool, fp8_gemm_tn_residual,
            (const Tensor& a, const float* a_scale_inv, const Tensor& b, const float* b_scale_inv,
             const Tensor& residual, Tensor& d, bool fast_accum),
            (a, a_scale_inv, b, b_scale_inv, residual, d, fast_accum), a)

// ------------------------------------------------------------------------------------------
// Text generation (megatron/core/inference/, docs/inference.md)
// ------------------------------------------------------------------------------------------

/// Greedy decoding's torch.argmax(logits, dim=-1) (Megatron's sample() with top_k 1): for x
/// [..., V] (float32/bfloat16/float16, contiguous, V >= 1) idx int64 [rows] = the index of the
/// FIRST maximum of each row; a NaN counts as larger than every number (torch's argmax), so a row
/// with a NaN gives its first NaN. Lets the generation loop copy b token ids to the host instead
/// of b x V logits.
MEGATRON_OP(void, argmax_last_dim, (const Tensor& x, Tensor& idx), (x, idx), x)

// ------------------------------------------------------------------------------------------
// Blockwise FP8 (--fp8-recipe blockwise: Transformer Engine's Float8BlockScaling, DeepSeek-V3's
// recipe; docs/fp8.md "Blockwise recipe"). Current scaling per block, no amax history.
// ------------------------------------------------------------------------------------------

/// Blockwise quantization of x viewed as [rows, cols] = [numel / x.size(-1), x.size(-1)]
/// (float32/bfloat16). Each block (block_2d: 128 x 128; else a 1 x 128 row tile, and for q_t a
/// 128 x 1 column tile) gets scale = fp8_max / amax(block) (TE's compute_scale_from_amax with
/// epsilon 0: 1 if the amax is 0, inf or NaN; FLT_MAX if the division overflows; with pow2_scales
/// the mantissa bits are cleared, i.e. rounded down to a power of 2); values are
/// sat_rne_cast(v * scale) and the stored factor is scale_inv = 1 / scale. Partial blocks at the
/// edges take the amax of their valid elements.
///   q [rows, cols] (if q): row tiles along cols (block_2d: 128 x 128 blocks);
///   s: q's scale_inv, float32; 1 x 128: [ceil(cols/128), round4(rows)] with s[c/128][r];
///      128 x 128: [ceil(rows/128), round4(ceil(cols/128))] with s[r/128][c/128];
///   q_t [cols, rows] (if q_t): 1 x 128: x quantized in 128 x 1 column tiles (along rows), stored
///      transposed -- TE's "columnwise" data, not q transposed; 128 x 128: q transposed;
///   s_t: q_t's scale_inv laid out as s is for a [cols, rows] tensor.
/// The layouts are TE's GEMM_READY ones, which cuBLASLt's VEC128_32F / BLK128x128_32F scale modes
/// read; padding entries (round4) are 0. q / q_t dtype float8_e4m3 or float8_e5m2 (the same).
MEGATRON_OP(void, fp8_block_quantize,
            (const Tensor& x, bool block_2d, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t, Tensor* s_t),
            (x, block_2d, pow2_scales, q, s, q_t, s_t), x)
/// The blockwise analogues of fp8_swiglu_quantize / fp8_swiglu_backward_quantize / fp8_rmsnorm_quantize:
/// the producer's output v (bit for bit what swiglu_forward into act_dtype, swiglu_backward into dy's
/// dtype, or rmsnorm_forward into out_dtype writes; same inputs and conditions as those ops) is
/// quantized as fp8_block_quantize(v, block_2d=false, pow2_scales, q, s, q_t, s_t) would (the same
/// bytes and scale_inv, the same layouts; both q and q_t required), without writing v. Returns false
/// (nothing written) when not fused (CPU; last dim % 8, alignment, dtypes): the caller then runs the
/// producer + fp8_block_quantize.
MEGATRON_OP(bool, fp8_block_swiglu_quantize,
            (const Tensor& x, DType act_dtype, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t, Tensor* s_t),
            (x, act_dtype, pow2_scales, q, s, q_t, s_t), x)
MEGATRON_OP(bool, fp8_block_swiglu_backward_quantize,
            (const Tensor& dy, const Tensor& x, bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t, Tensor* s_t),
            (dy, x, pow2_scales, q, s, q_t, s_t), dy)
MEGATRON_OP(bool, fp8_block_rmsnorm_quantize,
            (const Tensor& x, const Tensor& gamma, const Tensor& rstd, bool zero_centered_gamma, DType out_dtype,
             bool pow2_scales, Tensor* q, Tensor* s, Tensor* q_t, Tensor* s_t),
            (x, gamma, rstd, zero_centered_gamma, out_dtype, pow2_scales, q, s, q_t, s_t), x)
/// Block-scaled FP8 GEMM, "TN" layout: C[m, n] = sum_k A~[m, k] B~[n, k] + beta * C, where A~ is A
/// dequantized with its scale_inv tensor a_s (1 x 128 tiles along k, or 128 x 128 blocks when
/// a_2d; layouts of fp8_block_quantize's s) and B~ likewise. Not both 2d. A, B float8_e4m3/e5m2
/// (not both e5m2); C bfloat16/float32. FP32 accumulation (no fast accumulation, as TE requires
/// for this recipe). CUDA: cuBLASLt's block-scaled FP8 GEMM (Hopper, CUDA >= 12.9); m, n, k
/// multiples of 128 here, else a UserError naming the shape.
MEGATRON_OP(void, fp8_block_gemm_tn,
            (const Tensor& a, const Tensor& a_s, bool a_2d, const Tensor& b, const Tensor& b_s, bool b_2d, Tensor& c,
             float beta),
            (a, a_s, a_2d, b, b_s, b_2d, c, beta), a)

// ------------------------------------------------------------------------------------------
// Grouped GEMM of the routed experts (moegemm block; docs/moe.md "Kernels"). Megatron's
// GroupedMLP / Transformer Engine's GroupedLinear: one call for all local experts, the rows of
// expert e being the counts[e] rows after those of experts 0..e-1 (expert-major order from the
// token dispatcher). counts live on the host (Megatron syncs tokens_per_expert to the host too).
// The CPU reference is the per-expert loop of linear_forward / linear_backward (so the CPU
// results equal the former per-expert loop bit for bit); CUDA runs cuBLAS's
// cublasGemmGroupedBatchedEx where it supports the dtypes (else the same loop on cuBLASLt).
// ------------------------------------------------------------------------------------------

/// y[rows_e, out] = x[rows_e, in] @ ws[e]^T for every expert e (no bias). x [N, in], y [N, out]
/// (same dtype as x), ws[e] [out, in] (x's dtype), Σ counts = N, counts[e] >= 0; rows of experts
/// with no tokens are absent. Throws (internal check) on a shape mismatch.
MEGATRON_OP(void, grouped_linear_forward,
            (const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts, Tensor& y),
            (x, ws, counts, y), x)
/// Backward of grouped_linear_forward: dx[rows_e] = dy[rows_e] @ ws[e] (dgrad; skipped if dx is
/// nullptr, every row written) and dws[e] (+)= dy[rows_e]^T @ x[rows_e] (wgrad; skipped if dws is
/// nullptr; dws[e] float32 or ws' dtype). An expert with no tokens gets dws[e] = 0 when
/// !accumulate and is left untouched when accumulating.
MEGATRON_OP(void, grouped_linear_backward,
            (const Tensor& dy, const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts,
             Tensor* dx, std::vector<Tensor>* dws, bool accumulate),
            (dy, x, ws, counts, dx, dws, accumulate), dy)
/// out[r] = Σ_j a[r, j] b[r, j] for a, b [N, H] of one float dtype, out float64 [N], summed in
/// float64 over the float-widened values (the experts' d probs = <d scaled act, act> per routed
/// row). CPU reference: j ascending per row; CUDA: one block per row, fp64 tree sum (same
/// products, another order: differences ~1e-16 relative).
MEGATRON_OP(void, row_dot_f64, (const Tensor& a, const Tensor& b, Tensor& out), (a, b, out), a)

// ------------------------------------------------------------------------------------------
// Text generation's decode step with its position in device memory (the step as a CUDA graph,
// megatron/core/inference/text_generation.h, docs/inference.md "CUDA graph of the decode step")
// ------------------------------------------------------------------------------------------

/// This token's keys and values into the KV caches at a position read from memory:
/// k_cache[pos] = k[0], v_cache[pos] = v[0] with pos = offset[0] (int64, on the caches' device);
/// k, v [1, b, ng, d], caches [S, b, ng, d], one dtype (any). Nothing is written when pos is outside
/// [0, S) (the caller checks the position on the host before uploading it). No host
/// synchronization, no allocation (capturable in a CUDA graph).
MEGATRON_OP(void, kv_cache_write,
            (const Tensor& k, const Tensor& v, const Tensor& offset, Tensor& k_cache, Tensor& v_cache),
            (k, v, offset, k_cache, v_cache), k)

// ------------------------------------------------------------------------------------------
// MoE router and token permutation on the device (moerouter block; docs/moe.md "Kernels").
// Fusions only the CUDA backend has: the CPU reference returns false (nothing written) and the
// caller runs the host float64 router and permutation of megatron/core/transformer/moe/
// (moe_utils.h), which is also the reference the CUDA kernels are tested against
// (gpu_ops_test --only moe_router). Token t is row t of [T, E]; sequence b of token t is t % bsz.
// ------------------------------------------------------------------------------------------

/// Megatron's topk_routing_with_score_function (moe_utils.py; the host version is moe_utils.h's)
/// per token in float32: logits [T, E] (float32 / bfloat16 / float16); score_function 0 softmax,
/// 1 sigmoid, 2 sqrtsoftplus; pre_softmax (softmax only); scaling = --moe-router-topk-scaling-factor
/// (1 if unset); expert_bias float32 [E] (sigmoid / sqrtsoftplus; added to the scores for the
/// selection only) or nullptr. Writes topk_idx int64 [T, k] (best first; ties toward the lower
/// expert index, as the host's stable sort) and topk_probs float32 [T, k] (the routing probs,
/// rounded to the logits' dtype as probs.type_as(logits)). stats (nullptr: none) float64
/// [2 bsz E + E + 1]: [0, bsz E) Σ over the tokens of sequence b of compute_routing_scores_for_aux_loss's
/// score of expert e at column b E + e; [bsz E, 2 bsz E) the count of that function's top-k map
/// likewise; [2 bsz E, 2 bsz E + E) the tokens routed to e; [2 bsz E + E] Σ_t logsumexp(logits[t])²
/// (the z-loss's sum). The sums run in float64 in a fixed order (bitwise reproducible). Returns
/// false when not fused (CPU; E > 1024; k > E; groups that do not divide E or cannot hold k).
MEGATRON_OP(bool, moe_router_forward,
            (const Tensor& logits, const Tensor* expert_bias, int64_t topk, int64_t score_function, bool pre_softmax,
             float scaling, int64_t num_groups, int64_t group_topk, int64_t bsz, Tensor& topk_idx, Tensor& topk_probs,
             Tensor* stats),
            (logits, expert_bias, topk, score_function, pre_softmax, scaling, num_groups, group_topk, bsz, topk_idx,
             topk_probs, stats),
            logits)
/// Megatron's permute() row map from the top-k choices topk_idx int64 [T, k] of E experts: rows
/// expert-major, tokens ascending within an expert (the stable argsort of routing_map.T), by a
/// per-expert block scan (deterministic). Writes row_token int64 [T k] (token of every permuted
/// row), row_of int64 [T, k] (the permuted row of choice (t, j)), permuted_probs float32 [T k]
/// (topk_probs float32 [T, k] moved to their rows) and counts int64 [E] (rows per expert).
/// Returns false when not fused (CPU; E > 65535).
MEGATRON_OP(bool, moe_permute_map,
            (const Tensor& topk_idx, const Tensor& topk_probs, int64_t num_experts, Tensor& row_token, Tensor& row_of,
             Tensor& permuted_probs, Tensor& counts),
            (topk_idx, topk_probs, num_experts, row_token, row_of, permuted_probs, counts), topk_idx)
/// Unpermute: out[t] = Σ_j rows[row_of[t, j]] for j = 0 … k−1 in that order, in float32, rounded
/// once to out's dtype (no atomics: deterministic). rows [N, h], row_of int64 [T, k], out [T, h].
/// Returns false when not fused (CPU).
MEGATRON_OP(bool, moe_unpermute, (const Tensor& rows, const Tensor& row_of, Tensor& out), (rows, row_of, out), rows)
/// Backward of moe_router_forward plus the aux losses and the z-loss, per token in float32:
/// dlogits float32 [T, E] = d/dlogits of Σ_j dprobs[row_of[t, j]] · topk_probs[t, j] (dprobs
/// float32 [T k], the gradient of the permuted probs; topk_idx the forward's choice; same
/// score_function / pre_softmax / scaling), + the backward of the aux-loss scores with their
/// gradient aux_coef[(t % bsz) E + e] (float32 [bsz E], constant per column as in Megatron's
/// switch_load_balancing_loss_func; nullptr: none), + z_coef · lse_t · softmax(logits[t]) (z_coef
/// = 2 coeff / T times the loss scale; 0: none). Returns false when not fused (CPU; E > 1024).
MEGATRON_OP(bool, moe_router_backward,
            (const Tensor& logits, const Tensor& topk_idx, const Tensor& dprobs, const Tensor& row_of,
             int64_t score_function, bool pre_softmax, float scaling, int64_t bsz, const Tensor* aux_coef,
             float z_coef, Tensor& dlogits),
            (logits, topk_idx, dprobs, row_of, score_function, pre_softmax, scaling, bsz, aux_coef, z_coef, dlogits),
            logits)
