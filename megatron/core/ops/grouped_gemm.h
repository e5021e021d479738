// Shape check shared by the CPU reference and the CUDA backend of the grouped GEMM ops
// (grouped_linear_forward / grouped_linear_backward, op_table.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "megatron/core/tensor/tensor.h"
#include "megatron/core/utils/errors.h"

namespace megatron::ops {

/// Checks one grouped call: one weight per count, every weight 2-D [out, in] of one shape and x's
/// dtype, counts >= 0 summing to x's rows, x 2-D [N, in]. Throws (internal check) naming `op`.
inline void check_grouped_linear(const char* op, const Tensor& x, const std::vector<Tensor>& ws,
                                 const std::vector<int64_t>& counts) {
  MEGATRON_CHECK(ws.size() == counts.size() && !ws.empty())
      << op << ": " << ws.size() << " weights for " << counts.size() << " counts";
  int64_t total = 0;
  for (size_t e = 0; e < ws.size(); ++e) {
    MEGATRON_CHECK(counts[e] >= 0 && ws[e].dim() == 2 && ws[e].shape() == ws.front().shape() &&
                   ws[e].dtype() == x.dtype())
        << op << ": expert " << e << " weight " << ws[e].str() << " count " << counts[e] << " for x " << x.str();
    total += counts[e];
  }
  MEGATRON_CHECK(x.dim() == 2 && total == x.size(0) && x.size(1) == ws.front().size(1))
      << op << ": counts sum to " << total << " for x " << x.str() << " and weights " << ws.front().str();
}

/// check_grouped_linear plus y [N, out] for grouped_linear_forward.
inline void check_grouped_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts,
                                  const Tensor& y) {
  check_grouped_linear("grouped_linear_forward", x, ws, counts);
  MEGATRON_CHECK(y.dim() == 2 && y.size(0) == x.size(0) && y.size(1) == ws.front().size(0))
      << "grouped_linear_forward: y " << y.str();
}

/// How the CUDA backend runs one grouped GEMM call (one GEMM kind of all local experts).
enum class GroupedGemmPath {
  kGrouped,  ///< one cublasGemmGroupedBatchedEx_64 call, one group per expert with rows
  kLoop,     ///< the per-expert loop of cuBLASLt GEMMs (linear_forward / linear_backward)
};

/// MEGATRON_MOE_GROUPED_GEMM (docs/environment.md): unset or "auto" -> the per-call rule of
/// choose_grouped_gemm_path, "1" -> grouped wherever cuBLAS takes the types, "0" -> the loop.
enum class GroupedGemmMode { kAuto, kGrouped, kLoop };

/// Parses the value of MEGATRON_MOE_GROUPED_GEMM (nullptr = unset). Throws UserError naming the
/// variable for any other value.
inline GroupedGemmMode parse_grouped_gemm_mode(const char* v) {
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return GroupedGemmMode::kAuto;
  if (std::strcmp(v, "1") == 0) return GroupedGemmMode::kGrouped;
  if (std::strcmp(v, "0") == 0) return GroupedGemmMode::kLoop;
  user_error("MEGATRON_MOE_GROUPED_GEMM=", v, ": expected auto, 1 (grouped cuBLAS) or 0 (per-expert loop)");
}

/// Auto rule's threshold: the largest mean per-expert GEMM, in FLOPs (2 m n k summed over the
/// experts with rows, divided by their number), that still goes to the grouped kernel. From the
/// first H200 run of bench/gpu/moe_bench.sh (d1cba35; docs/moe.md "Kernels" and "Performance"),
/// six expert GEMMs fwd + bwd, where the wgrad loops on both paths (see below), so that the
/// forward + dgrad rates follow by taking a third (its FLOP share) of the loop's time as wgrad:
///   Qwen3-30B-A3B shape, 128 experts x 256 rows, hidden 2048, ffn 768: 0.8-1.6 GFLOP per expert
///   GEMM; grouped 5.03 ms vs loop 7.61 ms (forward + dgrad: ~250 vs ~120 TFLOP/s, grouped 2x;
///   the loop spends ~10 us per GEMM, launch plus a GEMM of 12-32 output tiles on 132 SMs).
///   Mixtral-8x7B shape, 8 experts x 1024 rows, hidden 4096, ffn 14336: 120-240 GFLOP per expert
///   GEMM; grouped 27.5 ms vs loop 15.0 ms (forward + dgrad: ~257 vs ~580 TFLOP/s, loop 2.2x:
///   each cuBLASLt GEMM fills the GPU by itself, the grouped kernel stays at ~250 TFLOP/s).
/// 10 GFLOP lies between the two points (geometric mean of 1.6 and 120: 14 GFLOP) and above the
/// crossover of the model loop = 8 us + f / 580 TFLOP/s, grouped = f / 250 TFLOP/s (f = 3.5
/// GFLOP), which the loop's lower rate on small GEMMs moves up. A shape between the two points
/// (gpu_bench moe's sweep) would place it better.
inline constexpr double kGroupedGemmMaxMeanFlops = 1e10;

/// The path of one grouped call: `groups` experts with rows, `total_flops` = Σ 2 m n k over them,
/// inputs of dtype `in` and output (C) of dtype `out`. Always the loop when fewer than 2 experts
/// have rows, for float32 inputs (they stay true fp32 on cuBLASLt) and when out != in: cuBLAS's
/// grouped GEMM has no bf16/fp16 -> fp32 entry (its type table; the H200 run's cuBLAS refused the
/// wgrad into the fp32 main grads with status 15), so the wgrad always loops. Otherwise kGrouped
/// and kLoop force their path, and kAuto takes grouped when total_flops / groups is below
/// kGroupedGemmMaxMeanFlops.
inline GroupedGemmPath choose_grouped_gemm_path(GroupedGemmMode mode, DType in, DType out, int64_t groups,
                                                double total_flops) {
  if (groups < 2 || mode == GroupedGemmMode::kLoop) return GroupedGemmPath::kLoop;
  if ((in != DType::kBFloat16 && in != DType::kFloat16) || out != in) return GroupedGemmPath::kLoop;
  if (mode == GroupedGemmMode::kGrouped) return GroupedGemmPath::kGrouped;
  return total_flops / static_cast<double>(groups) < kGroupedGemmMaxMeanFlops ? GroupedGemmPath::kGrouped
                                                                              : GroupedGemmPath::kLoop;
}

/// MEGATRON_MOE_GEMM_STREAMS (docs/environment.md, docs/moe.md "Kernels"): how many CUDA streams
/// the per-expert loop of one grouped call spreads its GEMMs over. 1 is the serial loop on the
/// compute stream; S > 1 runs expert lanes 1..S-1 on side streams forked from the compute stream
/// (lane 0 stays on it) and joined back before the call returns. The GEMMs write disjoint outputs,
/// so every S gives bitwise the same results. Unset: moe_gemm_streams_for's rule (4 streams for
/// small per-expert GEMMs, the serial loop for large ones).
inline constexpr int kDefaultMoeGemmStreams = 4;
inline constexpr int kMaxMoeGemmStreams = 8;

/// Parses the value of MEGATRON_MOE_GEMM_STREAMS (nullptr or "" = unset: kDefaultMoeGemmStreams).
/// Throws UserError naming the variable unless it is a whole number 1..kMaxMoeGemmStreams.
inline int parse_moe_gemm_streams(const char* v) {
  if (v == nullptr || *v == '\0') return kDefaultMoeGemmStreams;
  int n = 0;
  const char* p = v;
  for (; *p >= '0' && *p <= '9' && n <= kMaxMoeGemmStreams; ++p) n = n * 10 + (*p - '0');
  if (*p != '\0' || n < 1 || n > kMaxMoeGemmStreams)
    user_error("MEGATRON_MOE_GEMM_STREAMS=", v, ": expected a whole number from 1 (the serial per-expert loop) to ",
               kMaxMoeGemmStreams, " (CUDA streams for the experts' GEMMs)");
  return n;
}

/// The stream count of one per-expert loop: MEGATRON_MOE_GEMM_STREAMS when set (`v`, parsed as
/// above), else kDefaultMoeGemmStreams when the call's mean GEMM (total_flops / groups, 2 m n k
/// per expert with rows) is below kGroupedGemmMaxMeanFlops and 1 (the serial loop) otherwise.
/// Measured on an H200 (docs/moe.md "Session 11", device calls 19 and 21, gpu_bench moe_gemms):
/// at Mixtral's shape (120-240 GFLOP per expert GEMM) the loop on 4 streams ran at 0.81-0.87 of
/// the dense rate against 0.85-0.86 serially (never more than 1 % ahead, up to 6 % behind), while
/// the many small wgrad GEMMs of Qwen3's shape (0.8-1.6 GFLOP) ran 1.27x faster on 4 streams. Throws as
/// parse_moe_gemm_streams for a bad value.
inline int moe_gemm_streams_for(const char* v, double total_flops, int64_t groups) {
  if (v != nullptr && *v != '\0') return parse_moe_gemm_streams(v);
  if (groups < 1) return 1;
  return total_flops / static_cast<double>(groups) < kGroupedGemmMaxMeanFlops ? kDefaultMoeGemmStreams : 1;
}

/// The lane (0..lanes-1) of every expert of a per-expert loop over `counts` (-1 for experts
/// without rows): experts in order, each to the lane with the fewest rows so far (the lowest such
/// lane on ties), so that equal counts go round-robin and the lanes' rows stay balanced when the
/// router's split is not. lanes >= 1.
inline std::vector<int> assign_expert_lanes(const std::vector<int64_t>& counts, int lanes) {
  std::vector<int> lane(counts.size(), -1);
  std::vector<int64_t> rows(static_cast<size_t>(lanes), 0);
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] <= 0) continue;
    int best = 0;
    for (int l = 1; l < lanes; ++l)
      if (rows[l] < rows[best]) best = l;
    lane[e] = best;
    rows[best] += counts[e];
  }
  return lane;
}

/// Calls fn(e, first_row, rows) for every expert e with rows = counts[e] > 0, first_row being the
/// sum of the counts before it (the expert-major row blocks of a grouped call).
template <class Fn>
void for_each_expert_rows(const std::vector<int64_t>& counts, Fn&& fn) {
  int64_t off = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] > 0) fn(e, off, counts[e]);
    off += counts[e];
  }
}

/// The per-expert loop of grouped_linear_forward: linear(x rows, ws[e], nullptr, y rows) for every
/// expert with rows (linear: a backend's linear_forward).
template <class Linear>
void per_expert_forward(const Tensor& x, const std::vector<Tensor>& ws, const std::vector<int64_t>& counts, Tensor& y,
                        Linear&& linear) {
  for_each_expert_rows(counts, [&](size_t e, int64_t off, int64_t n) {
    Tensor ye = y.narrow0(off, n);
    linear(x.narrow0(off, n), ws[e], nullptr, ye);
  });
}

}  // namespace megatron::ops
