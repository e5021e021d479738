// Activation memory per rank under tensor + sequence parallelism (run under mpirun -np 2 by
// tests/functional_tests/dist_tp_memory.sh; skipped as a single process).
//
// A LLaMA-shaped model scaled down (hidden 256, ffn 896, 8 heads in 2 query groups, seq 512,
// 4 layers, bf16 params and grads as --bf16 --grad-reduce-in-bf16) runs several micro-batches of
// forward + backward (gradient accumulation, no optimizer), once as TP1 on every rank (a
// single-rank group) and once as TP2 + --sequence-parallel over the world. The tensor allocator's
// counters (megatron::memory_stats: bytes of live tensor storages and their high-water mark)
// give, per micro-batch, the activation peak above the model's fixed buffers.
//
// Expected values (independent of our code: Korthikanti et al., "Reducing Activation
// Recomputation in Large Transformer Models", 2022, eq. 2 vs eq. 4 -- what Megatron's
// LinearWithGradAccumulationAndAsyncCommunication implements by saving the sequence shard and
// re-gathering it in backward): every stored activation of a layer is divided by TP with sequence
// parallelism, so the per-rank peak at TP2+SP is about half of TP1's. Hand count for this shape
// (units of s*h bf16 = 256 KiB): a layer stores 17 units at TP1 (norm inputs 2, qkv/fc1 inputs 2,
// q 1, k+v 0.5, core-attention output 1, fc1 output 7, SwiGLU output 3.5) and 8.5 at TP2+SP; the
// non-halved rest is per-token fp32 scalars and the one full-sequence transient of the linear
// being computed (its gathered input or pre-reduce-scatter output, 1-2 units). Measured: 0.523.
// Bound 0.55: the column-parallel linears used to keep their gathered input (full sequence, 2
// units per layer not halved): 0.563 with the old code, which this bound rejects; the margin
// below 0.55 (0.6 MB) is about 2 units, i.e. one more full-sequence tensor kept per layer fails.
// No growth with micro-batches: each micro-batch's peak above the fixed buffers equals the
// first's within 1 % (identical shapes; nothing of an earlier micro-batch may stay alive), and
// after each backward the live bytes are back to the fixed buffers exactly (no leak; the old
// communication worker still held the last collective's tensors when the waiter resumed).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "test_utils/dist_test_util.h"
#include "megatron/core/comm/process_group.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tensor/memory_stats.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
constexpr int64_t kVocab = 1024, kSeq = 512;
constexpr int kMicroBatches = 4;

transformer::TransformerConfig config(int tp, bool sp) {
  transformer::TransformerConfig c = megatron::testing::tiny_gpt_config(256, megatron::testing::TinyDropout::kOff, 4, 8);
  megatron::testing::make_llama(c, 2, 896);
  c.params_dtype = DType::kBFloat16;
  c.main_grads_dtype = DType::kBFloat16;
  c.tensor_model_parallel_size = tp;
  c.sequence_parallel = sp;
  return c;
}

datasets::GPTBatch sample(int mb) {
  std::mt19937 gen(777 + mb);
  std::uniform_int_distribution<int64_t> tok(0, kVocab - 1);
  std::vector<int64_t> t(kSeq), l(kSeq);
  for (int64_t i = 0; i < kSeq; ++i) t[i] = tok(gen), l[i] = tok(gen);
  datasets::GPTBatch x;
  x.tokens = Tensor::from_vector_i64(t, {1, kSeq});
  x.labels = Tensor::from_vector_i64(l, {1, kSeq});
  x.loss_mask = Tensor::from_vector(std::vector<float>(kSeq, 1.f), {1, kSeq});
  return x;
}

struct Measured {
  std::vector<int64_t> peak_above_fixed;  // per micro-batch
  std::vector<int64_t> left_after;        // live bytes above the fixed buffers after each backward
};

Measured measure(GPTModel& m) {
  Measured r;
  const Tensor dloss = Tensor::from_vector(std::vector<float>(kSeq, 1.f / kSeq), {1, kSeq});
  std::vector<datasets::GPTBatch> batches;
  for (int mb = 0; mb < kMicroBatches; ++mb) batches.push_back(sample(mb));
  m.zero_grad();
  const int64_t fixed = memory_stats(DeviceType::kCPU).allocated;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    reset_peak_memory_stats(DeviceType::kCPU);
    Tensor loss = m.forward(batches[mb], true);
    m.backward(dloss);
    loss = Tensor();
    const MemoryStats s = memory_stats(DeviceType::kCPU);
    r.peak_above_fixed.push_back(s.max_allocated - fixed);
    r.left_after.push_back(s.allocated - fixed);
  }
  return r;
}

void expect_no_growth(const Measured& m, const char* what) {
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    EXPECT_EQ(m.left_after[mb], 0) << what << ": bytes still allocated after micro-batch " << mb;
    EXPECT_LE(m.peak_above_fixed[mb], m.peak_above_fixed[0] + m.peak_above_fixed[0] / 100)
        << what << ": micro-batch " << mb << " peak grew over the first's";
  }
}

TEST(DistMemory, TP2SequenceParallelHalvesActivationPeak) {
  SKIP_UNLESS_MULTI_RANK();
  auto world = testing::dist_world();
  if (world->size() != 2) GTEST_SKIP() << "written for TP2 (mpirun -np 2)";
  Measured tp1, tp2;
  {
    GPTModel ref(config(1, false), kVocab, kSeq, 5);
    tp1 = measure(ref);
  }
  {
    models::gpt::GPTModelParallel par;
    par.tp_group = world;
    GPTModel model(config(2, true), kVocab, kSeq, 5, Device::cpu(), par);
    tp2 = measure(model);
  }
  const double ratio = static_cast<double>(tp2.peak_above_fixed[0]) / static_cast<double>(tp1.peak_above_fixed[0]);
  std::printf("[rank %d] activation peak per micro-batch (MB): TP1", world->rank());
  for (auto v : tp1.peak_above_fixed) std::printf(" %.2f", v / 1048576.0);
  std::printf(" | TP2+SP");
  for (auto v : tp2.peak_above_fixed) std::printf(" %.2f", v / 1048576.0);
  std::printf(" | ratio %.3f\n", ratio);
  expect_no_growth(tp1, "TP1");
  expect_no_growth(tp2, "TP2+SP");
  EXPECT_LE(ratio, 0.55) << "TP2+SP activation peak per rank should be about half of TP1's";
  EXPECT_GE(ratio, 0.40) << "TP2+SP activation peak implausibly low (counting broken?)";
}

}  // namespace
}  // namespace megatron
