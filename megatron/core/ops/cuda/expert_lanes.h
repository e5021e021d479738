// What the per-expert GEMM loop of grouped_gemm.cu did with its streams (MEGATRON_MOE_GEMM_STREAMS,
// ops/grouped_gemm.h parse_moe_gemm_streams; docs/moe.md "Kernels"), for the GPU tests and
// bench/gpu/gpu_bench. Backend-internal: not an op.
#pragma once

#include <cstdint>

namespace megatron::ops::cuda {

/// Loop calls of grouped_linear_forward / grouped_linear_backward (each GEMM kind counts once)
/// since the process started or the last reset: `serial` ran on the compute stream alone (one
/// stream asked for, or at most one expert with rows), `forked` spread their experts over
/// several streams, the most in one call being `max_lanes` (1 if none forked).
struct ExpertLaneCounts {
  int64_t serial = 0;
  int64_t forked = 0;
  int max_lanes = 1;
};
/// The counts (grouped_gemm.cu); reset: zero them after reading.
ExpertLaneCounts expert_lane_counts(bool reset);

}  // namespace megatron::ops::cuda
