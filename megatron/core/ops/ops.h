// The op set of megatron.cpp: every numerical kernel the models and optimizers use.
//
// Each op is declared once, in the op table megatron/core/ops/op_table.h (with its contract:
// shapes, dtypes, accumulate semantics), and implemented twice: megatron/core/ops/cpu/ (reference,
// fp32 math, OpenMP/OpenBLAS, reduced formats emulated by rounding on store) and
// megatron/core/ops/cuda/ (fast). ops/dispatch.cpp, generated from the same table, picks the
// implementation from the device of the op's dispatch argument; all tensor arguments of one call
// must be on that device. This is the only device switch of the library: code above ops/ calls
// megatron::ops:: and never a backend (docs/architecture.md, "The op contract"). Device
// capabilities that are not ops (synchronization, memory statistics, profiler ranges) are in
// ops/device.h.
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

#include "megatron/core/ops/normal_init.h"
#include "megatron/core/ops/rope_freq.h"
#include "megatron/core/tensor/tensor.h"

namespace megatron::ops {

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

struct AttentionParams {
  float softmax_scale = 1.0f;  // usually 1/sqrt(d)
  bool causal = true;
  /// Optional boolean mask [b, 1, s, sk] (true = masked out), used instead of `causal`
  /// (Megatron's attention_mask with --reset-attention-mask).
  const Tensor* attention_mask = nullptr;
  float dropout_p = 0.0f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  /// Optional key count in memory of k's device (int64, element 0; text generation's decode step
  /// as a CUDA graph, docs/inference.md): only keys [0, *kv_len) of k/v [sk_max, b, ng, d] take
  /// part, 1 <= *kv_len <= sk_max. Only for s == 1, no mask, not causal, no dropout; the CUDA
  /// backend takes it in its decode kernel only (other calls: InternalError).
  const Tensor* kv_len = nullptr;
};

struct AdamParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;        // 1-based, for bias correction
  bool decoupled = true;   // AdamW (Megatron default); false folds wd*p into the gradient
  /// The gradient is read as grad * grad_scale (the clip coefficient applied inside the step:
  /// bit for bit the result of scaling the gradient in place first, as Megatron's
  /// clip_grad_by_total_norm_fp32 does, without the extra pass). The gradient is not modified.
  float grad_scale = 1.0f;
  /// adam_step_multi on CUDA: device memory (uint8, at least kAdamTableBytesPerTensor bytes per
  /// tensor of the call) for the multi-tensor launch's tensor table, filled through the staged
  /// host-to-device copy on the current stream and reused by every launch of the call (they are
  /// stream-ordered); nullptr: a stream-ordered allocation per launch. The overlapped optimizer
  /// step passes one so its stream allocates nothing. Ignored by the CPU reference.
  Tensor* table_workspace = nullptr;
};

/// Bytes of AdamParams::table_workspace needed per tensor of an adam_step_multi call.
constexpr int64_t kAdamTableBytesPerTensor = 128;

/// One tensor of adam_step_multi: fp32 master param, grad, exp_avg, exp_avg_sq (all on one
/// device, equal numel), the optional model param written from the updated param (bf16/fp16/fp32),
/// and its param group's lr and weight decay.
struct AdamTensor {
  Tensor* param = nullptr;
  const Tensor* grad = nullptr;
  Tensor* exp_avg = nullptr;
  Tensor* exp_avg_sq = nullptr;
  Tensor* model_param = nullptr;
  float lr = 0.0f;
  float weight_decay = 0.0f;

  /// The step's hyper-parameters for this tensor: `p` with this tensor's lr and weight decay
  /// (checks that the four fp32 tensors are given).
  AdamParams params(const AdamParams& p) const {
    MEGATRON_CHECK(param && grad && exp_avg && exp_avg_sq) << "AdamTensor: param, grad, exp_avg, exp_avg_sq needed";
    AdamParams q = p;
    q.lr = lr;
    q.weight_decay = weight_decay;
    return q;
  }
};

// The op declarations, generated from the op table (docstrings there).
#define MEGATRON_OP_DEFAULT(v) = v
#define MEGATRON_OP(ret, name, params, args, dev) ret name params;
#include "megatron/core/ops/op_table.h"
#undef MEGATRON_OP
#undef MEGATRON_OP_DEFAULT

/// A new tensor holding t converted to `dtype`, on t's device. CPU: Tensor::to(dtype) (the
/// conversion CPU code always used, so CPU results keep their bits); a device tensor: ops::cast
/// (round to nearest even, as the CPU conversion). The same dtype: a copy. Use this, not
/// Tensor::to(dtype), for any tensor that may live on a device (Tensor::to(dtype) is host-only and
/// throws on a device tensor, because the tensor layer cannot call ops).
inline Tensor cast_to(const Tensor& t, DType dtype) {
  if (t.is_cpu() || t.dtype() == dtype) return t.to(dtype);
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  if (t.numel() > 0) cast(t, out);
  return out;
}

}  // namespace megatron::ops
