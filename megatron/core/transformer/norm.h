// LayerNorm / RMSNorm over the last dim (Megatron's torch_norm / TENorm), as chosen by
// TransformerConfig.normalization, with --apply-layernorm-1p (zero-centred gamma).
#pragma once

#include <string>

#include "megatron/core/fp8/fp8_input.h"
#include "megatron/core/tensor/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::transformer {

struct NormCtx {
  Tensor input;
  Tensor mean;  // LayerNorm only
  Tensor rstd;
};

class Norm {
 public:
  /// Registers "<prefix>.weight" [hidden] (init 1, or 0 zero-centred) and, for LayerNorm,
  /// "<prefix>.bias" [hidden] (init 0). Not TP-sharded.
  /// With config.sequence_parallel (TP > 1) the norm marks its parameters
  /// Parameter::sequence_parallel, as Megatron's TENorm / FusedLayerNorm set the parameters'
  /// `sequence_parallel` attribute: they see this rank's 1/TP of the sequence, so
  /// finalize_model_grads sums their gradients over TP. `sequence_sharded_input` = false for a
  /// norm whose input is not sequence-sharded (the per-head q/k layernorms, applied after the
  /// QKV projection has gathered the sequence): its parameters are not marked.
  Norm(ParamRegistry& reg, const std::string& prefix, int64_t hidden, const TransformerConfig& config,
       bool sequence_sharded_input = true);
  /// x [..., hidden] -> y, same shape/dtype.
  Tensor forward(const Tensor& x, NormCtx& ctx) const;
  /// RMSNorm forward whose output goes straight into the FP8 input of the linear at `base` of
  /// `st` (fp8::rmsnorm_fp8: no bf16 output). Returns an undefined Fp8Input (ctx untouched) for
  /// LayerNorm or where the fused kernel does not apply; then call forward().
  fp8::Fp8Input forward_fp8(const Tensor& x, NormCtx& ctx, fp8::Fp8State& st, int base) const;
  /// dy -> dx; accumulates the weight (and bias) gradients. With `dresidual` (dy's shape and
  /// dtype) returns dx + dresidual, added inside the norm's backward pass on CUDA.
  Tensor backward(const Tensor& dy, const NormCtx& ctx, const Tensor* dresidual = nullptr) const;

 private:
  ParamRef weight_, bias_;
  bool rms_, zero_centered_;
  float eps_;
};

}  // namespace megatron::transformer
