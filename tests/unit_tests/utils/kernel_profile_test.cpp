// Kernel profiler analysis (megatron/core/utils/kernel_profile.h). Every expectation is computed
// by hand from the intervals written in the test (comments show the arithmetic).
#include "megatron/core/utils/kernel_profile.h"

#include <gtest/gtest.h>

namespace megatron::profiling {
namespace {

constexpr uint64_t kMs = 1000000;  // ns per ms
// ns -> ms is a multiplication by 1e-6 in double: exact up to rounding (~1e-15 relative).
constexpr double kTol = 1e-9;

TEST(KernelProfileTest, IntervalUnionMergesOverlapAndTouching) {
  // [0,2) ∪ [1,3) ∪ [3,4) = [0,4) (touching merges); [5,7) apart; [10,10) empty is dropped.
  const std::vector<Interval> u = interval_union({{5, 7}, {0, 2}, {1, 3}, {3, 4}, {10, 10}});
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0], (Interval{0, 4}));
  EXPECT_EQ(u[1], (Interval{5, 7}));
  EXPECT_EQ(union_length({{5, 7}, {0, 2}, {1, 3}, {3, 4}}), 6u);  // 4 + 2
  EXPECT_EQ(union_length({}), 0u);
}

TEST(KernelProfileTest, IntersectionLength) {
  // [0,10) ∩ ([2,4) ∪ [8,12)) = [2,4) + [8,10) = 4; nested/overlapping inputs are unioned first.
  EXPECT_EQ(intersection_length({{0, 10}}, {{2, 4}, {8, 12}, {3, 4}}), 4u);
  EXPECT_EQ(intersection_length({{0, 5}}, {{5, 9}}), 0u);
  EXPECT_EQ(intersection_length({{0, 5}, {6, 9}}, {{4, 7}}), 2u);  // [4,5) + [6,7)
}

TEST(KernelProfileTest, CategorizeByName) {
  // Names as cuBLASLt, CUTLASS, NCCL, cuDNN and our kernels (mangled by nvcc) report them.
  auto k = [](const char* n) { return categorize(ActivityKind::kKernel, n); };
  EXPECT_EQ(k("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"), Category::kGemm);
  EXPECT_EQ(k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"), Category::kGemm);
  EXPECT_EQ(k("cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128_1x1x1_0_tnn_align16"),
            Category::kGemm);
  EXPECT_EQ(k("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
            Category::kCommunication);
  EXPECT_EQ(k("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"),
            Category::kAttention);
  EXPECT_EQ(k("_Z16fa_fwd_v2_kernelILi128EEvPK6bf16_t"), Category::kAttention);
  EXPECT_EQ(k("_Z15fa_bwd_v2_kernelILi64EEvPKv"), Category::kAttention);
  EXPECT_EQ(k("_Z11adam_kernelIfEvPfPKfS0_S0_"), Category::kOptimizer);
  // The multi-tensor Adam in its anonymous namespace (nvcc's mangling of adam_multi_kernel<bf16_t>).
  EXPECT_EQ(k("_ZN8megatron3ops4cuda61_GLOBAL__N__5c1b4f2a_13_adam_multi_cu_8d4e6f01"
              "17adam_multi_kernelI6bf16_tEEvPKNS2_4DescEifffffbf"),
            Category::kOptimizer);
  EXPECT_EQ(k("_Z13reduce_stage1IfLi0EEvPKT_lbPd"), Category::kOptimizer);
  EXPECT_EQ(k("_Z15norm_fwd_kernelv"), Category::kOther);
  EXPECT_EQ(categorize(ActivityKind::kMemcpy, "[memcpy HtoD]"), Category::kMemcpy);
  EXPECT_EQ(categorize(ActivityKind::kMemset, "[memset]"), Category::kMemset);
}

TEST(KernelProfileTest, ShortNameDemangles) {
  // Itanium ABI: _Z 11adam_kernel I f E v P f = void adam_kernel<float>(float*); "void " dropped.
  EXPECT_EQ(short_kernel_name("_Z11adam_kernelIfEvPf"), "adam_kernel<float>(float*)");
  EXPECT_EQ(short_kernel_name("nvjet_tst"), "nvjet_tst");
  EXPECT_EQ(short_kernel_name("abcdefghij", 8), "abcde...");
}

TEST(KernelProfileTest, SummaryHandComputed) {
  // Window [0, 110) ms, iterations 4-5 (2 steps). Timeline (ms):
  //   GEMM      [10,45)  stream 7
  //   NCCL      [30,60)  stream 9
  //   other     [50,55)  stream 7
  //   memcpy    [70,80)
  //   attention [80,90)
  //   outside   [200,210) (dropped: after the window)
  std::vector<Activity> a = {
      {ActivityKind::kKernel, 10 * kMs, 45 * kMs, 0, 7, "nvjet_tst_gemm", 0},
      {ActivityKind::kKernel, 30 * kMs, 60 * kMs, 0, 9, "ncclDevKernel_AllReduce", 0},
      {ActivityKind::kKernel, 50 * kMs, 55 * kMs, 0, 7, "_Z15norm_fwd_kernelv", 0},
      {ActivityKind::kMemcpy, 70 * kMs, 80 * kMs, 0, 7, "[memcpy HtoD]", 1024},
      {ActivityKind::kKernel, 80 * kMs, 90 * kMs, 0, 7, "_Z16fa_fwd_v2_kernelv", 0},
      {ActivityKind::kKernel, 200 * kMs, 210 * kMs, 0, 7, "late", 0},
  };
  const ProfileSummary s = summarize(a, 0, 110 * kMs, 4, 5, /*rank=*/3);
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(s.rank, 3);
  EXPECT_NEAR(s.wall_ms, 110.0, kTol);
  // Busy = [10,60) ∪ [70,90) = 50 + 20 = 70; idle = 110 - 70 = 40.
  EXPECT_NEAR(s.busy_ms, 70.0, kTol);
  EXPECT_NEAR(s.idle_ms, 40.0, kTol);
  // Exclusive split (priority gemm > attention > optimizer > other > memcpy > memset > comm):
  // gemm [10,45) = 35; comm alone [45,50) + [55,60) = 10; other [50,55) = 5; memcpy 10;
  // attention 10. Sum 70 = busy.
  auto ex = [&](Category c) { return s.exclusive_ms[static_cast<int>(c)]; };
  auto tot = [&](Category c) { return s.total_ms[static_cast<int>(c)]; };
  EXPECT_NEAR(ex(Category::kGemm), 35.0, kTol);
  EXPECT_NEAR(ex(Category::kCommunication), 10.0, kTol);
  EXPECT_NEAR(ex(Category::kOther), 5.0, kTol);
  EXPECT_NEAR(ex(Category::kMemcpy), 10.0, kTol);
  EXPECT_NEAR(ex(Category::kAttention), 10.0, kTol);
  EXPECT_NEAR(ex(Category::kOptimizer), 0.0, kTol);
  double sum = 0;
  for (double v : s.exclusive_ms) sum += v;
  EXPECT_NEAR(sum, s.busy_ms, kTol);
  // Totals are plain durations: comm 30 of which [30,45) + [50,55) = 20 under other work.
  EXPECT_NEAR(tot(Category::kCommunication), 30.0, kTol);
  EXPECT_NEAR(tot(Category::kGemm), 35.0, kTol);
  EXPECT_NEAR(s.comm_overlapped_ms, 20.0, kTol);
  EXPECT_EQ(s.count[static_cast<int>(Category::kGemm)], 1);
  EXPECT_EQ(s.count[static_cast<int>(Category::kOther)], 1);  // "late" is outside the window
  // Top kernels: gemm 35 ms, then NCCL 30 ms.
  ASSERT_GE(s.top_kernels.size(), 2u);
  EXPECT_EQ(s.top_kernels[0].name, "nvjet_tst_gemm");
  EXPECT_NEAR(s.top_kernels[0].total_us, 35000.0, 1e-6);
  EXPECT_EQ(s.top_kernels[1].category, Category::kCommunication);
  // Gaps: [90,110) = 20 after attention; [0,10) = 10 at the start; [60,70) = 10 between the
  // NCCL kernel (furthest end so far) and the memcpy.
  ASSERT_EQ(s.longest_gaps.size(), 3u);
  EXPECT_NEAR(s.longest_gaps[0].at_ms, 90.0, kTol);
  EXPECT_EQ(s.longest_gaps[0].before, "fa_fwd_v2_kernel()");
  EXPECT_EQ(s.longest_gaps[0].after, "<window end>");
  EXPECT_EQ(s.longest_gaps[1].before, "<window start>");
  EXPECT_EQ(s.longest_gaps[1].after, "nvjet_tst_gemm");
  EXPECT_NEAR(s.longest_gaps[2].at_ms, 60.0, kTol);
  EXPECT_EQ(s.longest_gaps[2].before, "ncclDevKernel_AllReduce");
  EXPECT_EQ(s.longest_gaps[2].after, "[memcpy HtoD]");

  // All three gaps are >= 1 ms: 20 + 10 + 10 = 40 = idle.
  EXPECT_EQ(s.gap_count[3], 3);
  EXPECT_NEAR(s.gap_ms[3], 40.0, kTol);

  // JSON and text carry the same numbers (text is per step: 35 / 2 = 17.5 ms).
  const nlohmann::json j = summary_json(s);
  EXPECT_NEAR(j["categories"]["gemm"]["exclusive_ms"].get<double>(), 35.0, kTol);
  EXPECT_NEAR(j["idle_ms"].get<double>(), 40.0, kTol);
  const std::string t = format_summary(s);
  EXPECT_NE(t.find("[Rank 3] kernel profile | gemm                    17.500"), std::string::npos) << t;
  EXPECT_NE(t.find("GPU idle (host gaps) 20.000 ms/step"), std::string::npos) << t;
}

TEST(KernelProfileTest, IdleGapsByLength) {
  // Kernels of 1 us separated by gaps of 5 us, 50 us, 500 us and 5 ms; the window starts at the
  // first kernel and ends at the last (no border gaps). Buckets: one gap each; sums in ms.
  const uint64_t us = 1000;
  std::vector<Activity> a;
  uint64_t t = 0;
  for (uint64_t gap : {5 * us, 50 * us, 500 * us, 5000 * us, uint64_t{0}}) {
    a.push_back({ActivityKind::kKernel, t, t + us, 0, 0, "k", 0});
    t += us + gap;
  }
  const uint64_t end = a.back().end_ns;  // 5 kernels + 5555 us of gaps = 5560 us
  ASSERT_EQ(end, 5560 * us);
  const ProfileSummary s = summarize(a, 0, end, 1, 1, 0);
  for (int b = 0; b < 4; ++b) EXPECT_EQ(s.gap_count[b], 1) << b;
  EXPECT_NEAR(s.gap_ms[0], 0.005, kTol);
  EXPECT_NEAR(s.gap_ms[1], 0.050, kTol);
  EXPECT_NEAR(s.gap_ms[2], 0.500, kTol);
  EXPECT_NEAR(s.gap_ms[3], 5.000, kTol);
  EXPECT_NEAR(s.idle_ms, 5.555, kTol);
  EXPECT_NEAR(s.busy_ms, 0.005, kTol);  // 5 kernels of 1 us
}

TEST(KernelProfileTest, EmptyWindowIsAllIdle) {
  const ProfileSummary s = summarize({}, 5 * kMs, 8 * kMs, 1, 1, 0);
  EXPECT_NEAR(s.idle_ms, 3.0, kTol);
  EXPECT_NEAR(s.busy_ms, 0.0, kTol);
  ASSERT_EQ(s.longest_gaps.size(), 1u);
  EXPECT_EQ(s.longest_gaps[0].before, "<window start>");
}

}  // namespace
}  // namespace megatron::profiling
