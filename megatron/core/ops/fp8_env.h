// The blockwise FP8 recipe's A/B and tuning switches (docs/environment.md), parsed in one place so
// the code that uses them and pretrain's start-up check (training/pretrain.cpp check_env_switches)
// read the same values and refuse the same bad ones, also in runs that never reach the kernels (a
// CPU run, another recipe).
#pragma once

#include <cstdlib>

#include "megatron/core/utils/env.h"
#include "megatron/core/utils/errors.h"

namespace megatron::ops {

/// Number of cuBLASLt heuristic algorithms kept per block-scaled GEMM problem (ops/cuda/fp8_gemm.cu).
inline constexpr int kMaxBlockAlgos = 16;

/// MEGATRON_FP8_BLOCK_QUANT selected between session 9's two blockwise quantize kernels; it was
/// removed in session 10 with the first ("legacy") kernel: the tiled kernel of ops/cuda/fp8_block.cu
/// is the only one (it wrote the same bits, measured on the H200; docs/performance.md "Session 9:
/// blockwise"). Throws UserError naming the variable when it is set (non-empty), so a run that
/// asked for a kernel choice is told there is none instead of ignoring it; unset or empty: nothing.
inline void refuse_removed_block_quant_env() {
  const char* v = std::getenv("MEGATRON_FP8_BLOCK_QUANT");
  if (v && *v)
    user_error("MEGATRON_FP8_BLOCK_QUANT=", v, ": this switch was removed; the tiled blockwise quantize kernel is "
               "the only one (bit-identical to the removed legacy kernel); unset it (docs/environment.md)");
}

/// MEGATRON_FP8_BLOCK_WGRAD_ALGO: the index (0..kMaxBlockAlgos-1, default 0) of the heuristic
/// algorithm of the 1x128 x 1x128 wgrad GEMM. Other values: UserError naming the variable. Not cached.
inline int block_wgrad_algo_from_env() { return env_int_in("MEGATRON_FP8_BLOCK_WGRAD_ALGO", 0, kMaxBlockAlgos - 1, 0); }

/// MEGATRON_FP8_BLOCK_GEMM=cublaslt|ours (default cublaslt): which block-scaled FP8 GEMM the
/// blockwise recipe runs on the GPU: cuBLASLt's, or our TMA + WGMMA kernel (ops/cuda/fp8_block_gemm.cu;
/// problems it cannot take still go to cuBLASLt). True for `ours`. Other values: UserError naming
/// the variable. Not cached.
inline bool block_gemm_ours_from_env() {
  return env_choice("MEGATRON_FP8_BLOCK_GEMM", {"cublaslt", "ours"}, "cublaslt") == "ours";
}

/// MEGATRON_FP8_BLOCK_FUSED=0|1 (default 1): the blockwise recipe's fused producers
/// (fp8_linear.h block_fusion_enabled(), which caches it); 0 keeps the unfused path for A/B runs.
/// Other values: UserError naming the variable. Not cached.
inline bool block_fused_from_env() { return env_switch("MEGATRON_FP8_BLOCK_FUSED", true); }

}  // namespace megatron::ops
