// FP8 training flags (Megatron's --fp8-* arguments and TransformerConfig fields;
// docs/megatron-reference.md#fp8-delayed-scaling). Kept free of tensor headers so TransformerConfig can hold it.
#pragma once

#include <string>

namespace megatron::fp8 {

/// --fp8-format: e4m3 everywhere, or hybrid (E4M3 forward, E5M2 for gradients).
enum class Fp8Format { kE4M3, kHybrid };
/// --fp8-recipe. delayed: scales from the amax history; tensorwise: from the current tensor;
/// blockwise: one scale per 1 x 128 tile (inputs, gradients) / 128 x 128 block (weights) from the
/// block itself (TE's Float8BlockScaling; docs/fp8.md "Blockwise recipe").
enum class Fp8Recipe { kDelayed, kTensorwise, kBlockwise };
/// --fp8-amax-compute-algo.
enum class AmaxComputeAlgo { kMax, kMostRecent };

/// Parsed FP8 flags (Megatron's names).
struct Fp8Config {
  Fp8Format format = Fp8Format::kHybrid;
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int margin = 0;                   // --fp8-margin
  int amax_history_len = 1;         // --fp8-amax-history-len
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMostRecent;  // --fp8-amax-compute-algo
  bool wgrad = true;                // false with --no-fp8-wgrad
  bool param_gather = false;        // --fp8-param-gather
  /// --fp8-output-proj: the output layer's (LM head's) three GEMMs in FP8 too, with roles of its
  /// own ("output_layer") and the same recipe as the layers' linears. Megatron accepts the flag with
  /// --fp8-recipe mxfp8 only (Blackwell); here with the Hopper recipes (docs/fp8.md "FP8 output layer").
  bool output_proj = false;
  /// Blockwise recipe: scales rounded down to powers of 2 (TE's power_2_scale, default on;
  /// NVTE_FP8_BLOCK_SCALING_FP32_SCALES=1 turns it off, as in TE).
  bool block_pow2_scales = true;
};

/// Parses --fp8-format / --fp8-recipe / --fp8-amax-compute-algo values; UserError naming the flag.
Fp8Format parse_fp8_format(const std::string& v);
Fp8Recipe parse_fp8_recipe(const std::string& v);
AmaxComputeAlgo parse_amax_compute_algo(const std::string& v);

}  // namespace megatron::fp8
