// --fp8-param-gather (docs/fp8.md, "FP8 parameters"): the distributed optimizer casts each rank's
// main-param shard of the FP8 GEMM weights to FP8 and all-gathers the FP8 bytes; the FP8 GEMMs use
// the gathered bytes. Runs as one rank in the unit-test binary and under mpirun -np 2 in
// tests/functional_tests/dist_fp8_param_gather.sh (the suite name starts with "Dist").
//
// References (independent of the gather path):
//  * the full fp32 main param, assembled from every rank's optimizer shard (an all-reduce SUM of
//    disjoint pieces, exact), rounded to bf16 (Megatron/TE cast main_param.to(model dtype) before the
//    FP8 cast "to keep numerical consistency") and quantized locally with the weight's scale must give
//    the gathered bytes bit for bit;
//  * the all-gather byte counts against the element counts of the FP8 weights (1 byte each) and of a
//    run without the flag (2 bytes each, bf16).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_utils/dist_test_util.h"
#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/distributed/finalize_model_grads.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/fp8/fp8_param.h"
#include "megatron/core/fp8/fp8_state.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/tensor/memory_stats.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using distributed::DistributedDataParallel;
using distributed::DistributedDataParallelConfig;
using models::gpt::GPTModel;

constexpr int64_t kVocab = 128, kSeq = 16;

transformer::TransformerConfig fp8_config(bool param_gather) {
  transformer::TransformerConfig c = megatron::testing::tiny_gpt_config(32);
  c.params_dtype = DType::kBFloat16;
  fp8::Fp8Config f;
  f.format = fp8::Fp8Format::kHybrid;
  f.amax_history_len = 4;
  f.amax_compute_algo = fp8::AmaxComputeAlgo::kMax;
  f.param_gather = param_gather;
  c.fp8 = f;
  return c;
}

datasets::GPTBatch sample(int iter, int index) {
  std::mt19937 gen(1000 * iter + index);
  std::uniform_int_distribution<int64_t> tok(0, kVocab - 1);
  std::vector<int64_t> t(kSeq + 1), pos(kSeq);
  for (auto& x : t) x = tok(gen);
  for (int64_t i = 0; i < kSeq; ++i) pos[i] = i;
  datasets::GPTBatch b;
  b.tokens = Tensor::from_vector_i64(std::vector<int64_t>(t.begin(), t.end() - 1), {1, kSeq});
  b.labels = Tensor::from_vector_i64(std::vector<int64_t>(t.begin() + 1, t.end()), {1, kSeq});
  b.position_ids = Tensor::from_vector_i64(pos, {1, kSeq});
  b.loss_mask = Tensor::from_vector(std::vector<float>(kSeq, 1.0f), {1, kSeq});
  return b;
}

double micro_step(GPTModel& m, const datasets::GPTBatch& b) {
  Tensor loss = m.forward(b, true);
  std::vector<float> l = loss.to_float_vector();
  double s = 0;
  for (float x : l) s += x;
  m.backward(Tensor::from_vector(std::vector<float>(l.size(), 1.0f / float(l.size())), loss.shape()));
  return s / double(l.size());
}

// A model + DDP (distributed optimizer) + Megatron optimizer trained for a few steps; the FP8 scales
// are updated at every step's end as pretrain_gpt does (reduce_and_update over the DP group).
struct PgRun {
  std::shared_ptr<comm::ProcessGroup> world = testing::dist_world();
  GPTModel model;
  DistributedDataParallel ddp;
  optimizer::MegatronOptimizer opt;
  std::vector<double> losses;

  static DistributedDataParallelConfig ddp_config(std::optional<int64_t> bucket) {
    DistributedDataParallelConfig d;
    d.use_distributed_optimizer = true;
    d.bucket_size = bucket;
    return d;
  }
  static optimizer::OptimizerConfig opt_config() {
    optimizer::OptimizerConfig oc;
    oc.lr = 3e-3;
    oc.weight_decay = 0.1;
    oc.clip_grad = 1.0;
    oc.bf16 = true;
    oc.use_distributed_optimizer = true;
    return oc;
  }
  PgRun(bool param_gather, std::optional<int64_t> bucket)
      : model(fp8_config(param_gather), kVocab, kSeq, /*seed=*/7),
        ddp(ddp_config(bucket), model.buffers(), model.parameters(), world),
        opt(opt_config(), optimizer::distributed_optimizer_params(ddp), world) {
    ddp.start_param_sync();  // pretrain_gpt's first cast + gather (FP8 buckets), a no-op refresh otherwise
    ddp.finish_param_sync();
    ddp.release_model_dtype_fp8_params();  // as pretrain_gpt: the FP8 weight is the parameter
  }
  void train(int iters) {
    for (int it = 0; it < iters; ++it) {
      ddp.zero_grad_buffer();
      double l = 0;
      for (int i = 0; i < 2; ++i) l += micro_step(model, sample(it, world->rank() * 2 + i)) / 2;
      distributed::FinalizeGroups fg;
      fg.dp_group = world;
      distributed::finalize_model_grads({&ddp}, fg);
      model.fp8_state()->reduce_and_update(world.get());
      opt.step();
      ddp.start_param_sync();
      ddp.finish_param_sync();
      Tensor t = Tensor::from_vector({float(l)}, {1});
      world->all_reduce(t, comm::ReduceOp::kAvg);
      losses.push_back(t.item());
    }
  }
};

TEST(DistFp8ParamGather, GatheredBytesEqualQuantizeOfFullMainParam) {
  PgRun run(/*param_gather=*/true, /*bucket=*/1999);  // several uneven FP8 buckets: the padded path too
  run.train(3);
  fp8::Fp8State& st = *run.model.fp8_state();
  EXPECT_EQ(st.weight_casts(), 0) << "the FP8 GEMMs must use the gathered FP8 weights, not quantize bf16 ones";
  // The full fp32 main params from every rank's disjoint shards.
  // Optimizer parameter j's buffer element: by address in the model-dtype buffer of the other
  // parameters or of the FP8 weights (reallocated for this: the run released it).
  auto& bufs = run.model.buffers();
  ASSERT_FALSE(bufs.fp8_model_data_held()) << "the FP8 weights' model-dtype copy must be released";
  ASSERT_TRUE(bufs.materialize_fp8_model_data());
  Tensor& pbuf = bufs.param_data();
  const int64_t N = bufs.numel();
  Tensor full = Tensor::zeros({N}, DType::kFloat32);
  const auto& ops = run.opt.params();
  for (size_t j = 0; j < ops.size(); ++j) {
    const bool in_fp8 = ops[j].param.shares_storage(bufs.fp8_model_data());
    const Tensor& base = in_fp8 ? bufs.fp8_model_data() : pbuf;
    const int64_t off = (static_cast<const char*>(ops[j].param.data_ptr()) - static_cast<const char*>(base.data_ptr())) /
                            int64_t(dtype_size(pbuf.dtype())) +
                        (in_fp8 ? bufs.fp8_start() : 0);
    full.flat_slice(off, Shape{ops[j].param.numel()}).copy_(run.opt.main_param(j).view(Shape{ops[j].param.numel()}));
  }
  run.world->all_reduce(full, comm::ReduceOp::kSum);
  int n_fp8 = 0;
  bool scale_moved = false;
  for (size_t i = 0; i < run.model.parameters().size(); ++i) {
    const auto& p = run.model.parameters()[i];
    const bool fp8_gemm_weight = p.name.ends_with(".weight") && p.name.find(".linear_") != std::string::npos;
    EXPECT_EQ(p.fp8_data.defined(), fp8_gemm_weight) << p.name;
    if (!p.fp8_data.defined()) continue;
    ++n_fp8;
    const auto [s, e] = run.model.buffers().range(i);
    Tensor ref_in = full.flat_slice(s, p.data.shape()).to(DType::kBFloat16);
    const fp8::Fp8TensorMeta& m = st.meta(p.fp8_base + fp8::kWeight);
    scale_moved |= m.scale != 1.0f;
    Tensor ref = Tensor::empty(p.data.shape(), m.dtype);
    fp8::quantize_cpu(ref_in, m, ref);
    EXPECT_EQ(0, std::memcmp(ref.data_ptr(), p.fp8_data.data_ptr(), ref.nbytes())) << p.name;
    // The GEMM operand is that FP8 weight dequantized with the scale it was cast with.
    const auto& c = st.weight_cache(p.fp8_base);
    EXPECT_TRUE(c.primary && c.valid) << p.name;
    EXPECT_EQ(c.param_scale_inv, m.scale_inv) << p.name;
    Tensor deq = Tensor::empty(p.data.shape(), DType::kFloat32);
    fp8::dequantize_cpu(ref, m.scale_inv, deq);
    EXPECT_EQ(deq.to_float_vector(), c.q.to_float_vector()) << p.name;
  }
  EXPECT_EQ(n_fp8, 2 * 4) << "QKV, proj, fc1, fc2 of each of 2 layers";
  EXPECT_TRUE(scale_moved) << "after 3 steps the weight scales follow the data (not the initial 1.0)";
}

TEST(DistFp8ParamGather, AllGatherMovesHalfTheBytesOfBf16ForFp8Weights) {
  // One bucket per parameter group: bf16 bytes = 2 x ceil(n / DP) x DP per bucket, FP8 = 1 x ...
  PgRun with(true, std::nullopt), without(false, std::nullopt);
  const int64_t dp = with.world->size();
  auto padded = [dp](int64_t n) { return (n + dp - 1) / dp * dp; };
  int64_t n_fp8 = 0, n_all = 0;
  for (const auto& p : with.model.parameters()) {
    n_all += p.data.numel();
    if (p.fp8_data.defined()) n_fp8 += p.data.numel();
  }
  // 2 layers x (qkv 96x32 + proj 32x32 + fc1 128x32 + fc2 32x128), from the shapes by hand.
  EXPECT_EQ(n_fp8, 2 * (96 * 32 + 32 * 32 + 128 * 32 + 32 * 128));
  // Each Run did one sync at construction; train two steps each (one sync per step).
  with.train(2);
  without.train(2);
  const int64_t syncs = 3;
  EXPECT_EQ(with.ddp.param_gather_bytes_fp8(), syncs * padded(n_fp8) * 1);
  EXPECT_EQ(with.ddp.param_gather_bytes(), syncs * (padded(n_fp8) * 1 + padded(n_all - n_fp8) * 2));
  EXPECT_EQ(without.ddp.param_gather_bytes_fp8(), 0);
  EXPECT_EQ(without.ddp.param_gather_bytes(), syncs * padded(n_all) * 2);
  // Both runs train the same numbers (the FP8 bytes are the ones the forward would have cast).
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t i = 0; i < with.losses.size(); ++i) EXPECT_NEAR(with.losses[i], without.losses[i], 1e-6 * with.losses[i]);
}


// The model parameter IS the FP8 tensor (Megatron/TE): with the flag the FP8 weights' bf16 copy is
// freed, so the parameter buffers hold 1 byte per FP8 weight element instead of 2 (bf16), and the
// bf16 values come back, whole and equal to the rounded fp32 main params, only on request.
TEST(DistFp8ParamGather, Bf16CopyOfFp8WeightsIsReleased) {
  // 2 layers x (qkv 96x32 + proj 32x32 + fc1 128x32 + fc2 32x128), by hand from the shapes.
  const int64_t n_fp8 = 2 * (96 * 32 + 32 * 32 + 128 * 32 + 32 * 128);
  PgRun without(false, std::nullopt);
  int64_t n_all = 0;
  for (const auto& p : without.model.parameters()) n_all += p.data.numel();
  EXPECT_EQ(without.model.buffers().param_bytes_held(), 2 * n_all) << "bf16: 2 bytes per parameter";

  const int64_t before = memory_stats(DeviceType::kCPU).allocated;
  PgRun with(true, /*bucket=*/1999);
  auto& bufs = with.model.buffers();
  // bf16 for the others + 1 FP8 byte per FP8 weight element: n_fp8 bytes less than without the flag.
  EXPECT_EQ(bufs.param_bytes_held(), 2 * (n_all - n_fp8) + n_fp8);
  EXPECT_EQ(without.model.buffers().param_bytes_held() - bufs.param_bytes_held(), n_fp8);
  EXPECT_FALSE(bufs.fp8_model_data_held());
  // Reading a released weight is an error, not stale data.
  for (const auto& p : with.model.parameters())
    if (p.fp8_data.defined()) EXPECT_ANY_THROW((void)p.data.data_ptr()) << p.name;
  with.train(2);  // trains without the bf16 copy (forward, backward, optimizer, FP8 cast + gather)

  // On request (checkpoint save, parameter dump) the bf16 values come back: exactly 2 bytes per
  // FP8 weight element are allocated, and freed again by the release.
  const int64_t held = memory_stats(DeviceType::kCPU).allocated;
  EXPECT_GT(held, before);
  with.ddp.gather_model_dtype_params();
  EXPECT_EQ(memory_stats(DeviceType::kCPU).allocated - held, 2 * n_fp8);
  ASSERT_TRUE(bufs.fp8_model_data_held());
  {
  // Reference: the full fp32 main params from every rank's disjoint shards (all-reduce SUM, exact),
  // rounded to bf16 by Tensor::to -- what the bf16 copy held without the flag (the optimizer
  // wrote bf16(main) after each step).
  const int64_t N = bufs.numel();
  Tensor full = Tensor::zeros({N}, DType::kFloat32);
  const auto& ops = with.opt.params();
  for (size_t j = 0; j < ops.size(); ++j) {
    if (!ops[j].param.shares_storage(bufs.fp8_model_data())) continue;
    const int64_t off = (static_cast<const char*>(ops[j].param.data_ptr()) -
                         static_cast<const char*>(bufs.fp8_model_data().data_ptr())) / 2 + bufs.fp8_start();
    full.flat_slice(off, Shape{ops[j].param.numel()}).copy_(with.opt.main_param(j).view(Shape{ops[j].param.numel()}));
  }
  with.world->all_reduce(full, comm::ReduceOp::kSum);
  int checked = 0;
  for (size_t i = 0; i < with.model.parameters().size(); ++i) {
    const auto& p = with.model.parameters()[i];
    if (!p.fp8_data.defined()) continue;
    const auto [s, e] = bufs.range(i);
    Tensor ref = full.flat_slice(s, p.data.shape()).to(DType::kBFloat16);
    EXPECT_EQ(0, std::memcmp(ref.data_ptr(), p.data.data_ptr(), ref.nbytes())) << p.name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
  }  // the reference tensors are freed
  with.ddp.release_model_dtype_fp8_params();
  EXPECT_EQ(memory_stats(DeviceType::kCPU).allocated, held);
  // Training goes on after a save-like gather/release, with the same losses as without the flag
  // (same calls: train() draws its batches from iteration 0 each time).
  with.train(1);
  without.train(2);
  without.train(1);
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t i = 0; i < with.losses.size(); ++i) EXPECT_NEAR(with.losses[i], without.losses[i], 1e-6 * with.losses[i]);
}

}  // namespace
}  // namespace megatron
