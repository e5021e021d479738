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
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "megatron/core/tensor/parameter.h"
#include "megatron/core/transformer/transformer_config.h"

namespace megatron::transformer::moe {

struct ExpertsCtx {
  std::vector<int64_t> tokens_per_expert;
  Tensor input;                  // [N, h] permuted rows
  Tensor fc1_out;                // [N, fc1_local] (all local experts, expert-major)
  Tensor act;                    // [N, ffn_local] activation before the probs scale (undefined: moe_act recompute)
  Tensor probs;                  // float32 [N]
};

class Experts {
 public:
  /// num_local_experts experts with global indices [first_expert, first_expert + num_local).
  /// etp_rank / etp_size: this rank's expert-tensor-parallel shard.
  Experts(ParamRegistry& reg, const std::string& prefix, const TransformerConfig& config, int64_t first_expert,
          int64_t num_local_experts, int etp_rank, int etp_size);
  /// x [N, h] (rows grouped by local expert, tokens_per_expert[i] rows each), probs float32 [N] ->
  /// [N, h] partial over expert-TP (x's dtype).
  Tensor forward(const Tensor& x, const std::vector<int64_t>& tokens_per_expert, const Tensor& probs, ExpertsCtx& ctx) const;
  /// dy [N, h] -> dx [N, h]; *dprobs = d loss / d probs [N] (host); accumulates weight gradients.
  /// With --recompute-granularity selective --recompute-modules moe_act (TEGroupedMLP's
  /// activation_recompute; needs --moe-grouped-gemm, checked by the arguments) the forward keeps
  /// fc1's output only and this re-applies the activation to it (the probs scale is always redone).
  Tensor backward(const Tensor& dy, ExpertsCtx& ctx, std::vector<double>* dprobs) const;
  int64_t num_local_experts() const { return static_cast<int64_t>(fc1_.size()); }

 private:
  Tensor activation(const Tensor& f1) const;  // SwiGLU / squared ReLU / GeLU of fc1's output [N, ffn_local]
  const TransformerConfig& config_;
  int64_t ffn_local_;
  bool recompute_act_;  // --recompute-modules moe_act
  std::vector<ParamRef> fc1_, fc2_;
};

}  // namespace megatron::transformer::moe
