// Routed experts (Megatron-Core's megatron/core/transformer/moe/experts.py): SequentialMLP (one MLP
// per local expert, parameters "<prefix>.local_experts.<e>.linear_fc1.weight") or, with
// --moe-grouped-gemm, the grouped layout of TEGroupedMLP ("<prefix>.linear_fc1.weight<e>"), both
// computed as GroupedMLP does: one grouped GEMM for every expert's fc1 (ops::grouped_linear_forward,
// each expert on its rows), the activation on all rows, * routing prob (Megatron applies the probs
// to the activation, before fc2), one grouped fc2. On the CPU the grouped op is the per-expert
// loop, so the results are those of SequentialMLP bit for bit (docs/moe.md "Kernels"). Expert-tensor-parallel shards: fc1 rows (both SwiGLU halves)
// and fc2 columns, no communication inside (the dispatcher reduces over expert-TP x EP).
//
// Names use the GLOBAL expert index <e> (equal to Megatron's named_parameters with EP = 1; Megatron's
// checkpoint keys are global too), so every expert is its own tensor in checkpoints and EP a -> b
// resharding is a renaming-free load; weights are initialized from (seed, name) and so are the same
// for every EP layout.
//
// FP8 (--fp8-format; docs/moe.md "FP8 experts"): as Megatron's TEGroupedMLP over Transformer Engine's
// GroupedLinear, every expert's fc1 and fc2 is its own FP8 GEMM with its own FP8 meta (amax
// histories and scales of input, weight and grad-output: an fp8::Fp8State linear named
// "<prefix>.local_experts.<e>.linear_fc1|2", e global), run as a per-expert loop of fp8::linear_forward
// / linear_backward on row views. Rows are padded per expert with zero rows to the FP8 GEMMs' row
// multiple (16; 128 for the blockwise recipe) where the tensors live on a GPU, as TEGroupedMLP's
// Fp8Padding does (zero rows change no amax, output or gradient); an expert without tokens still
// casts its weight (TE casts every GEMM's weight), and records no input / grad-output amax. On CUDA
// fc2's input and fc1's grad-output are quantized by their producers (moe_fp8_fuse_enabled below).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::fp8 {
class Fp8State;
}

namespace megatron::transformer::moe {

/// MEGATRON_MOE_FP8_FUSE (docs/environment.md; read at every FP8 Experts forward and backward):
/// unset or "1" (default) -> the FP8 experts' byte savings of docs/moe.md "FP8 experts" (Session 11):
/// on CUDA with the delayed recipe the forward quantizes fc2's input act * prob in the row-scaling
/// pass (ops/fp8_moe.h) and the backward fuses SwiGLU's backward into fc1's grad-output
/// quantization, per expert; the backward skips recomputing fc2's bf16 input where the forward's
/// FP8 transposes replace it; unpadding skips its zero fill. "0" -> the session-10 path.
/// Bit-identical results either way.
/// Other values: UserError naming the variable.
bool moe_fp8_fuse_enabled();

struct ExpertsCtx {
  std::vector<int64_t> tokens_per_expert;  // rows per local expert of the tensors below (FP8: padded)
  Tensor input;                  // [N, h] permuted rows
  Tensor fc1_out;                // [N, fc1_local] (all local experts, expert-major)
  Tensor act;                    // [N, ffn_local] activation before the probs scale (undefined: moe_act recompute)
  Tensor probs;                  // float32 [N]
  // FP8 only: the router's counts when the rows above are padded (empty: not padded), and per
  // expert the FP8 transposes of fc1's / fc2's inputs kept by the forward for the wgrad GEMMs
  // (CUDA, delayed recipe; undefined elsewhere).
  std::vector<int64_t> unpadded_tokens_per_expert;
  std::vector<Tensor> fc1_input_t, fc2_input_t;
};

class Experts {
 public:
  /// num_local_experts experts with global indices [first_expert, first_expert + num_local).
  /// etp_rank / etp_size: this rank's expert-tensor-parallel shard. `fp8`: run the expert GEMMs in
  /// FP8 with this state (registers 2 linears per local expert, fc1 then fc2, in local order).
  Experts(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t first_expert,
          int64_t num_local_experts, int etp_rank, int etp_size, std::shared_ptr<fp8::Fp8State> fp8 = nullptr);
  /// x [N, h] (rows grouped by local expert, tokens_per_expert[i] rows each), probs float32 [N] ->
  /// [N, h] partial over expert-TP (x's dtype).
  Tensor forward(const Tensor& x, const std::vector<int64_t>& tokens_per_expert, const Tensor& probs, ExpertsCtx& ctx) const;
  /// dy [N, h] -> dx [N, h]; *dprobs = d loss / d probs [N] (host); accumulates weight gradients.
  /// With --recompute-granularity selective --recompute-modules moe_act (TEGroupedMLP's
  /// activation_recompute; needs --moe-grouped-gemm, checked by the arguments) the forward keeps
  /// fc1's output only and this re-applies the activation to it (the probs scale is always redone).
  Tensor backward(const Tensor& dy, ExpertsCtx& ctx, std::vector<double>* dprobs) const;
  int64_t num_local_experts() const { return static_cast<int64_t>(fc1_.size()); }
  /// FP8: the Fp8State base index of local expert i's fc1 / fc2 (-1 without FP8).
  int fp8_base_fc1(int64_t i) const { return fp8_ ? fp8_fc1_.at(static_cast<size_t>(i)) : -1; }
  int fp8_base_fc2(int64_t i) const { return fp8_ ? fp8_fc2_.at(static_cast<size_t>(i)) : -1; }
  /// FP8 row multiple per expert for host tensors (default 1: no padding; the GPU's is 16, or 128
  /// for the blockwise recipe). Tests set it to run the padding path on the CPU.
  void set_fp8_host_row_multiple(int64_t m) { fp8_host_row_multiple_ = m; }

 private:
  Tensor forward_fp8(const Tensor& x, const std::vector<int64_t>& tokens_per_expert, const Tensor& probs,
                     ExpertsCtx& ctx) const;
  Tensor backward_fp8(const Tensor& dy, ExpertsCtx& ctx, std::vector<double>* dprobs) const;
  const TransformerConfig& config_;
  int64_t ffn_local_;
  bool recompute_act_;  // --recompute-modules moe_act
  std::vector<ParamRef> fc1_, fc2_;
  std::shared_ptr<fp8::Fp8State> fp8_;
  std::vector<int> fp8_fc1_, fp8_fc2_;
  int64_t fp8_host_row_multiple_ = 1;
};

}  // namespace megatron::transformer::moe
