// GPU activity profile of a few training iterations: the analysis half of the kernel profiler
// (the recording half, CUPTI, is megatron/core/ops/cuda/kernel_profiler.cpp). Pure host code so
// that the arithmetic (interval union, categories, idle gaps) is unit-tested on the CPU.
//
// There is no Megatron counterpart (Megatron-LM profiles with nsys / torch.profiler through
// --profile --profile-step-start --profile-step-end); this gives the same window a built-in
// step-time breakdown: GEMM, attention, communication, optimizer, memcpy/memset, other, and the
// GPU idle gaps (host overhead) with the kernels around them. docs/performance.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megatron::profiling {

/// What a GPU activity record was.
enum class ActivityKind { kKernel, kMemcpy, kMemset };

/// Step-time categories, in the priority order used to split overlapping time (a moment when a
/// GEMM and an NCCL kernel both run counts as GEMM; the NCCL time is "overlapped").
enum class Category { kGemm = 0, kAttention, kOptimizer, kOther, kMemcpy, kMemset, kCommunication };
inline constexpr int kNumCategories = 7;

/// "gemm", "attention", ... (the JSON keys and table rows).
const char* category_name(Category c);

/// One GPU activity: [start_ns, end_ns) on the GPU clock (nanoseconds), its stream and name
/// (kernel name as the driver reports it, possibly mangled; "" for memcpy/memset).
struct Activity {
  ActivityKind kind = ActivityKind::kKernel;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t device = 0;
  uint32_t stream = 0;
  std::string name;
  uint64_t bytes = 0;  // memcpy/memset only
};

/// The category of an activity, from its kind and (lower-cased) name:
///  communication: "nccl" in the name;
///  attention: our flash kernels (fa_fwd*, fa_bwd*, fa_dq_convert, attention_merge) and cuDNN
///    SDPA / fused attention ("sdpa", "fmha", "flash", "attention", "attn");
///  GEMM: cuBLAS/cuBLASLt/CUTLASS kernels ("gemm", "gemv", "nvjet", "xmma", "cutlass",
///    "cublas", "matmul"), FP8 GEMMs included (they carry the same names);
///  optimizer: the fused Adam/SGD kernels and the grad-norm reductions (adam_kernel, sgd,
///    reduce_stage1/2, multi_tensor);
///  memcpy / memset: by kind; everything else: other.
Category categorize(ActivityKind kind, const std::string& name);

/// A half-open time interval [begin, end) in ns.
struct Interval {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const Interval&) const = default;
};

/// Union of intervals (any order, any overlap; empty intervals ignored): disjoint, sorted,
/// touching intervals merged ([0,2) and [2,3) give [0,3)).
std::vector<Interval> interval_union(std::vector<Interval> v);
/// Total length of a union (intervals need not be disjoint).
uint64_t union_length(std::vector<Interval> v);
/// Length of (union of a) ∩ (union of b).
uint64_t intersection_length(std::vector<Interval> a, std::vector<Interval> b);

/// One idle gap of the GPU: no activity on any stream during [begin, end); `before` / `after`:
/// the (demangled, shortened) names of the activity that ended at `begin` and of the one that
/// started at `end` ("<window start>" / "<window end>" at the borders).
struct Gap {
  uint64_t begin = 0, end = 0;  // GPU clock, ns
  std::string before, after;
  double at_ms = 0.0;  // begin - window begin, ms
};

/// Per-kernel totals (the "top kernels" table).
struct KernelStat {
  std::string name;  // demangled, shortened
  Category category = Category::kOther;
  int64_t count = 0;
  double total_us = 0.0;
};

/// The analysis of a profiled window [window_begin, window_end) (GPU clock, ns) spanning `steps`
/// training iterations.
struct ProfileSummary {
  int rank = 0;
  int64_t first_iteration = 0, last_iteration = 0, steps = 0;
  double wall_ms = 0.0;  // window length
  double busy_ms = 0.0;  // union of all activity intervals (clipped to the window)
  double idle_ms = 0.0;  // wall - busy: nothing ran on the GPU (host gaps)
  /// Busy time split by category with the priority of Category (sums to busy_ms).
  double exclusive_ms[kNumCategories] = {};
  /// Sum of activity durations per category (overlapping streams count twice).
  double total_ms[kNumCategories] = {};
  int64_t count[kNumCategories] = {};
  /// Communication time hidden under other GPU work (union of comm ∩ union of the rest).
  double comm_overlapped_ms = 0.0;
  std::vector<KernelStat> top_kernels;  // by total time, descending, at most `top_k`
  std::vector<Gap> longest_gaps;        // by length, descending, at most `top_gaps`
  /// All idle gaps by length: [0, 10 us), [10, 100 us), [100 us, 1 ms), >= 1 ms -- many short
  /// gaps mean launch-bound host code, few long ones synchronizations or host work.
  int64_t gap_count[4] = {};
  double gap_ms[4] = {};
  uint64_t dropped_records = 0;         // records CUPTI reported lost (0 = complete)
};

/// Analyses `acts` (any order; activities are clipped to the window, those outside dropped).
ProfileSummary summarize(const std::vector<Activity>& acts, uint64_t window_begin, uint64_t window_end,
                         int64_t first_iteration, int64_t last_iteration, int rank, size_t top_k = 25,
                         size_t top_gaps = 10);

/// Readable kernel name: demangled (C++ ABI) and cut at `max_len` characters.
std::string short_kernel_name(const std::string& name, size_t max_len = 80);

/// The per-rank text report (several lines, each starting with "[Rank r] kernel profile").
std::string format_summary(const ProfileSummary& s);
/// The same as JSON (keys: rank, iterations, wall_ms, busy_ms, idle_ms, categories{name:
/// {exclusive_ms, total_ms, count}}, communication_overlapped_ms, top_kernels, longest_gaps).
nlohmann::json summary_json(const ProfileSummary& s);

/// Recorder interface the training loop drives (implemented with CUPTI in CUDA builds).
class KernelProfiler {
 public:
  virtual ~KernelProfiler() = default;
  /// Starts recording before iteration `first_iteration` (1-based number of the first profiled
  /// iteration). Synchronizes the device. Returns false (after one warning line) when recording
  /// is unavailable; then stop() is not called.
  virtual bool start(int64_t first_iteration) = 0;
  /// Stops after iteration `last_iteration`, synchronizes, collects the records and returns the
  /// analysis.
  virtual ProfileSummary stop(int64_t last_iteration, int rank) = 0;
};

/// A new profiler of the compiled-in GPU backend, or nullptr when there is none (CPU build).
std::unique_ptr<KernelProfiler> make_kernel_profiler();
/// Called once by the GPU backend's static initializer.
void set_kernel_profiler_factory(std::function<std::unique_ptr<KernelProfiler>()> f);

/// Writes `s` as JSON to `path` (temporary file + rename). Throws UserError naming the path.
void write_summary_json(const ProfileSummary& s, const std::string& path);

}  // namespace megatron::profiling
