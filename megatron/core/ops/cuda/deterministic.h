// The CUDA backend's deterministic mode (internal header).
#pragma once

#include "megatron/core/ops/deterministic.h"

namespace megatron::cuda {
/// ops::deterministic_mode() (set from Megatron's --deterministic-mode, or
/// MEGATRON_DETERMINISTIC=1 in the environment). Then every reduction of the CUDA backend
/// runs in a fixed order, so two runs of the same job give bitwise-equal results:
///  * LayerNorm/RMSNorm backward: dgamma/dbeta from per-warp partial rows (no shared-memory
///    atomics), summed in row order by the column-sum kernel (norm.cu);
///  * embedding backward: one thread per column adds the token rows in order (no atomics);
///  * attention backward: cuDNN's SDPA only with an engine that does not report
///    CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC and with deterministic reductions, else the generic
///    kernels (no atomics); our flash backward (atomics into dq) is not used.
/// Slower (the norm and embedding backward, and attention backward without a deterministic cuDNN
/// engine); the default path is unchanged.
inline bool deterministic() { return ops::deterministic_mode(); }
}  // namespace megatron::cuda
