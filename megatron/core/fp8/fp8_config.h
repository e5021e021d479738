// FP8 training flags (Megatron's --fp8-* arguments and TransformerConfig fields;
// docs/megatron-reference.md#fp8-delayed-scaling). Kept free of tensor headers so TransformerConfig can hold it.
#pragma once

#include <string>

namespace megatron::fp8 {

/// --fp8-format: e4m3 everywhere, or hybrid (E4M3 forward, E5M2 for gradients).
enum class Fp8Format { kE4M3, kHybrid };
/// --fp8-recipe. delayed: scales from the amax history; tensorwise: from the current tensor.
enum class Fp8Recipe { kDelayed, kTensorwise };
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
};

/// Parses --fp8-format / --fp8-recipe / --fp8-amax-compute-algo values; UserError naming the flag.
Fp8Format parse_fp8_format(const std::string& v);
Fp8Recipe parse_fp8_recipe(const std::string& v);
AmaxComputeAlgo parse_amax_compute_algo(const std::string& v);

}  // namespace megatron::fp8
