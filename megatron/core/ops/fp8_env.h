// The blockwise FP8 recipe's A/B and tuning switches (docs/environment.md), parsed in one place so
// the CUDA kernels that use them and pretrain's start-up check (training/pretrain.cpp check_env_switches) read the
// same values and refuse the same bad ones, also in runs that never reach the kernels (a CPU run,
// another recipe).
#pragma once

#include "megatron/core/utils/env.h"

namespace megatron::ops {

/// Number of cuBLASLt heuristic algorithms kept per block-scaled GEMM problem (ops/cuda/fp8_gemm.cu).
inline constexpr int kMaxBlockAlgos = 16;

/// MEGATRON_FP8_BLOCK_QUANT: "legacy" (the default until tests/gpu/blockq_check.sh has passed on a
/// GPU) -> true, the first blockwise quantize kernel; "tiled" -> false, the tiled one-read kernel.
/// Other values: UserError naming the variable. Not cached.
inline bool block_quant_legacy_from_env() {
  return env_choice("MEGATRON_FP8_BLOCK_QUANT", {"tiled", "legacy"}, "legacy") == "legacy";
}

/// MEGATRON_FP8_BLOCK_WGRAD_ALGO: the index (0..kMaxBlockAlgos-1, default 0) of the heuristic
/// algorithm of the 1x128 x 1x128 wgrad GEMM. Other values: UserError naming the variable. Not cached.
inline int block_wgrad_algo_from_env() { return env_int_in("MEGATRON_FP8_BLOCK_WGRAD_ALGO", 0, kMaxBlockAlgos - 1, 0); }

/// MEGATRON_FP8_BLOCK_FUSED=0|1 (default 0): the blockwise recipe's fused producers
/// (fp8_linear.h block_fusion_enabled(), which caches it). Other values: UserError. Not cached.
inline bool block_fused_from_env() { return env_switch("MEGATRON_FP8_BLOCK_FUSED", false); }

}  // namespace megatron::ops
