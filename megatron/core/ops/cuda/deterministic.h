// The CUDA backend's deterministic mode (internal header).
#pragma once

#include "megatron/core/ops/deterministic.h"

namespace megatron::cuda {
/// ops::deterministic_mode() (set from Megatron's --deterministic-mode, or
/// MEGATRON_DETERMINISTIC=1 in the environment). Then every reduction of the CUDA backend
/// runs in a fixed order, so two runs of the same job give bitwise-equal results:
///  * LayerNorm/RMSNorm backward: dgamma/dbeta from per-warp partial rows (no shared-memory
///    atomics), summed in row order by the column-sum kernel (norm.cu); the register kernels
///    (h <= 1024) and the row-block kernel (1024 < h <= 8192, bf16 rows) have no atomics and run
///    as in the default mode;
///  * embedding backward: one thread per column adds the token rows in order (no atomics);
///  * attention (under MEGATRON_ATTENTION_BACKEND=auto or flash): not cuDNN's SDPA (measured not
///    reproducible run to run on an H200, docs/cuda.md "Deterministic mode"); our flash forward and
///    the two-pass flash backward (attention.cu): the dK/dV kernels without their dQ atomics, then
///    fa_bwd_dq_kernel, one block per query tile summing dS K over the key tiles in ascending order
///    and writing dQ once. bf16 calls with other head dims and other dtypes run the generic kernels
///    (no atomics). MEGATRON_ATTENTION_BACKEND=cudnn still runs cuDNN, with a note.
/// Slower (the embedding backward; the flash attention backward than cuDNN's); the default path is
/// unchanged.
inline bool deterministic() { return ops::deterministic_mode(); }
}  // namespace megatron::cuda
