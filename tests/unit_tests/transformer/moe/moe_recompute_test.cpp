// Full activation recomputation (--recompute-granularity full) of transformer layers that
// contain an MoELayer, as Megatron's CheckpointFunction (tensor_parallel/random.py): the first
// forward of a recomputed chunk runs under torch.no_grad(), so the router skips the aux losses,
// the z-loss, their tracker records and the expert-bias token counts (router.py gates them on
// torch.is_grad_enabled()); the replay in backward does them once, with the same jitter and
// dropout streams. Everything must therefore be BITWISE equal to the run that kept activations:
// the replay runs the same CPU kernels (deterministic) on the same inputs in the same order.
// Selective recomputation of the MoE layers (--recompute-modules moe) works the same way, and so
// do its finer modules: moe_act (the grouped experts' activation, re-applied to the kept fc1
// output in backward: TEGroupedMLP's activation_recompute) and shared_experts (the shared-expert
// MLP re-run from its input in backward: MoELayer's shared_experts_recompute), whose saving is
// checked exactly in tensor bytes held between forward and backward (memory_stats.h).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tensor/memory_stats.h"
#include "megatron/core/transformer/moe/moe_utils.h"
#include "megatron/core/transformer/moe/router.h"
#include "test_utils/dist_test_util.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using transformer::RecomputeGranularity;
using transformer::RecomputeMethod;
using transformer::TransformerConfig;
using transformer::moe::MoEAuxLossAutoScaler;
using transformer::moe::MoEMetricsTracker;

constexpr int64_t kV = 128, kS = 16, kB = 2, kTopK = 2, kMicroBatches = 2;

// A 4-layer LLaMA-flavoured model, layers dense / MoE / dense / MoE (--moe-layer-freq
// [0,1,0,1]), 4 SwiGLU experts top-2, dropout on, every tracked loss type (aux_loss,
// seq_aux_loss, global_aux_loss), z-loss and the expert bias; jitter optional.
TransformerConfig moe_config(bool jitter, int64_t mtp) {
  TransformerConfig c = testing::tiny_llama_config(64, 2, 128, testing::TinyDropout::kDefault);
  c.num_layers = 4;
  c.num_moe_experts = 4;
  c.moe_ffn_hidden_size = 64;
  c.moe_router_topk = kTopK;
  c.moe_layer_pattern = {0, 1, 0, 1};
  c.moe_router_load_balancing_type = {"aux_loss", "seq_aux_loss", "global_aux_loss"};
  c.moe_aux_loss_coeff = {0.05, 0.02, 0.03};
  c.moe_z_loss_coeff = 0.01;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_score_function = "sigmoid";  // Megatron's expert bias needs sigmoid routing
  if (jitter) c.moe_input_jitter_eps = 0.1;
  c.mtp_num_layers = mtp;
  return c;
}

/// What one training step (two micro-batches, forward + backward each) leaves behind.
struct StepResult {
  std::vector<float> losses;                           // per-token losses of both micro-batches
  std::vector<std::vector<float>> grads;               // main_grad per parameter
  std::map<std::string, std::vector<double>> tracked;  // MoEMetricsTracker values per name
  std::vector<std::vector<double>> tokens_per_expert;  // local_tokens_per_expert per router
  std::vector<std::vector<float>> expert_bias;         // after finalize_router_state
};

StepResult step(const TransformerConfig& c) {
  GPTModel m(c, kV, kS, 31);
  MoEAuxLossAutoScaler::set_loss_scale(1.0 / kMicroBatches);
  MoEMetricsTracker::get().clear();
  m.zero_grad();
  StepResult r;
  for (int64_t mb = 0; mb < kMicroBatches; ++mb) {
    Tensor loss = m.forward(testing::random_gpt_batch(static_cast<uint32_t>(100 + 7 * mb), kB, kS, kV), true);
    const auto l = loss.to_float_vector();
    r.losses.insert(r.losses.end(), l.begin(), l.end());
    Tensor seed = Tensor::zeros(loss.shape(), DType::kFloat32);
    seed.fill_(1.0f / static_cast<float>(loss.numel() * kMicroBatches));
    if (c.mtp_num_layers > 0) m.set_mtp_loss_scale(1.0 / kMicroBatches);
    m.backward(seed);
  }
  for (auto& p : m.parameters()) r.grads.push_back(p.main_grad.to_float_vector());
  for (auto& [name, e] : MoEMetricsTracker::get().entries()) r.tracked[name] = e.values;
  const auto routers = m.moe_routers();
  for (auto* rt : routers) r.tokens_per_expert.push_back(rt->local_tokens_per_expert());
  transformer::moe::finalize_router_state(routers);
  for (auto* rt : routers) r.expert_bias.push_back(rt->expert_bias().to_float_vector());
  if (c.mtp_num_layers > 0) m.take_mtp_metrics();
  return r;
}

bool bitwise(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool bitwise(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

void expect_same(const StepResult& ref, const StepResult& got, const std::string& what) {
  EXPECT_TRUE(bitwise(ref.losses, got.losses)) << what << ": losses";
  ASSERT_EQ(ref.grads.size(), got.grads.size()) << what;
  for (size_t i = 0; i < ref.grads.size(); ++i) EXPECT_TRUE(bitwise(ref.grads[i], got.grads[i])) << what << ": grad " << i;
  ASSERT_EQ(ref.tracked.size(), got.tracked.size()) << what;
  for (const auto& [name, v] : ref.tracked) {
    ASSERT_TRUE(got.tracked.count(name)) << what << ": " << name << " not tracked";
    EXPECT_TRUE(bitwise(v, got.tracked.at(name))) << what << ": tracked " << name;
  }
  ASSERT_EQ(ref.tokens_per_expert.size(), got.tokens_per_expert.size()) << what;
  for (size_t i = 0; i < ref.tokens_per_expert.size(); ++i) {
    EXPECT_EQ(ref.tokens_per_expert[i], got.tokens_per_expert[i]) << what << ": router " << i;
    EXPECT_TRUE(bitwise(ref.expert_bias[i], got.expert_bias[i])) << what << ": expert bias " << i;
  }
}

// The reference run itself: each router counted every routed token exactly once (top-k per
// token, both micro-batches) and every loss type was recorded for the MoE layers only; this is
// what a double-counting recompute would break even if it were compared with itself.
void expect_counted_once(const StepResult& r, size_t num_routers) {
  ASSERT_EQ(r.tokens_per_expert.size(), num_routers);
  for (const auto& t : r.tokens_per_expert) {
    double sum = 0;
    for (double x : t) sum += x;
    EXPECT_EQ(sum, static_cast<double>(kTopK * kB * kS * kMicroBatches));
  }
  for (const char* name : {"load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss"}) {
    ASSERT_TRUE(r.tracked.count(name)) << name;
    const auto& v = r.tracked.at(name);
    ASSERT_GE(v.size(), 4u) << name;
    EXPECT_EQ(v[0], 0.0) << name << " recorded for dense layer 1";
    EXPECT_EQ(v[2], 0.0) << name << " recorded for dense layer 3";
    EXPECT_GT(v[1], 0.0) << name << " not recorded for MoE layer 2";
    EXPECT_GT(v[3], 0.0) << name << " not recorded for MoE layer 4";
  }
}

TEST(MoERecompute, FullRecomputationIsBitwiseIncludingTrackedMetrics) {
  for (bool jitter : {false, true}) {
    const TransformerConfig plain = moe_config(jitter, 0);
    const StepResult ref = step(plain);
    expect_counted_once(ref, 2);
    for (auto [m, k] : {std::pair{RecomputeMethod::kUniform, 1}, {RecomputeMethod::kUniform, 3},
                        {RecomputeMethod::kBlock, 2}, {RecomputeMethod::kBlock, 4}}) {
      TransformerConfig rec = plain;
      rec.recompute_granularity = RecomputeGranularity::kFull;
      rec.recompute_method = m;
      rec.recompute_num_layers = k;
      expect_same(ref, step(rec), std::string(jitter ? "jitter " : "") +
                                      (m == RecomputeMethod::kUniform ? "uniform " : "block ") + std::to_string(k));
    }
    // --recompute-granularity selective --recompute-modules moe: each MoELayer checkpointed alone
    // (Megatron's moe_layer_recompute), the same no-grad first forward and replay.
    TransformerConfig sel = plain;
    sel.recompute_granularity = RecomputeGranularity::kSelective;
    sel.recompute_modules = {"core_attn", "moe"};
    expect_same(ref, step(sel), std::string(jitter ? "jitter " : "") + "selective moe");
  }
}

// The MTP layer (an MoE layer here: the last decoder layer is MoE) is checkpointed as a whole by
// uniform recomputation (multi_token_prediction.cpp), its MoELayer alone by selective moe: its
// router must also count once.
TEST(MoERecompute, MtpMoeLayerRecomputationIsBitwise) {
  const TransformerConfig plain = moe_config(true, 1);
  const StepResult ref = step(plain);
  expect_counted_once(ref, 3);
  TransformerConfig rec = plain;
  rec.recompute_granularity = RecomputeGranularity::kFull;
  rec.recompute_method = RecomputeMethod::kUniform;
  rec.recompute_num_layers = 1;
  expect_same(ref, step(rec), "mtp uniform 1");
  TransformerConfig sel = plain;
  sel.recompute_granularity = RecomputeGranularity::kSelective;
  sel.recompute_modules = {"moe"};
  expect_same(ref, step(sel), "mtp selective moe");
}

// The model above with --moe-grouped-gemm (moe_act needs it) and a shared expert of kShared.
constexpr int64_t kShared = 48;
TransformerConfig moe_shared_config() {
  TransformerConfig c = moe_config(true, 0);
  c.moe_grouped_gemm = true;
  c.moe_shared_expert_intermediate_size = kShared;
  return c;
}

// Tensor bytes that one training micro-batch's forward leaves allocated for its backward (the
// stored activations, the loss), measured after a warm-up step so lazily built state does not count.
int64_t stored_bytes(const TransformerConfig& c) {
  GPTModel m(c, kV, kS, 31);
  MoEAuxLossAutoScaler::set_loss_scale(1.0);
  const datasets::GPTBatch b = testing::random_gpt_batch(100, kB, kS, kV);
  int64_t stored = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t before = memory_stats(DeviceType::kCPU).allocated;
    Tensor loss = m.forward(b, true);
    stored = memory_stats(DeviceType::kCPU).allocated - before;
    Tensor seed = Tensor::zeros(loss.shape(), DType::kFloat32);
    seed.fill_(1.0f / static_cast<float>(loss.numel()));
    m.backward(seed);
  }
  MoEMetricsTracker::get().clear();
  return stored;
}

TEST(MoERecompute, SelectiveMoeActAndSharedExpertsAreBitwise) {
  const TransformerConfig plain = moe_shared_config();
  const StepResult ref = step(plain);
  expect_counted_once(ref, 2);
  for (const std::vector<std::string>& mods : std::vector<std::vector<std::string>>{
           {"moe_act"}, {"shared_experts"}, {"core_attn", "moe_act", "shared_experts"}, {"moe", "moe_act", "shared_experts"}}) {
    TransformerConfig sel = plain;
    sel.recompute_granularity = RecomputeGranularity::kSelective;
    sel.recompute_modules = mods;
    std::string what = "selective";
    for (const auto& m : mods) what += " " + m;
    expect_same(ref, step(sel), what);
  }
  // The modules only act with selective granularity (Megatron reads them only then).
  TransformerConfig none = plain;
  none.recompute_modules = {"moe_act", "shared_experts"};
  expect_same(ref, step(none), "no granularity");
}

// --moe-shared-expert-gate under recomputation: the gate's scores, input and ungated output are
// rebuilt with the shared expert (shared_experts) or the whole layer (moe); same bits as without.
TEST(MoERecompute, SharedExpertGateRecomputeIsBitwise) {
  TransformerConfig plain = moe_shared_config();
  plain.moe_shared_expert_gate = true;
  const StepResult ref = step(plain);
  ASSERT_EQ(ref.grads.size(), step(moe_shared_config()).grads.size() + 2) << "one gate_weight per MoE layer";
  for (const std::vector<std::string>& mods : std::vector<std::vector<std::string>>{{"shared_experts"}, {"moe"}}) {
    TransformerConfig sel = plain;
    sel.recompute_granularity = RecomputeGranularity::kSelective;
    sel.recompute_modules = mods;
    expect_same(ref, step(sel), "gate, selective " + mods[0]);
  }
}

// What the two modules stop storing, per MoE layer (2 here), fp32 (4 bytes), T = kB * kS tokens:
//   moe_act: the experts' SwiGLU output [T * topk routed rows, moe_ffn_hidden_size] (fc1's output
//            stays: the recompute's input; the probs-scaled fc2 input is never kept, experts.cpp);
//   shared_experts: the shared MLP's fc1 output [T, 2 * kShared] (SwiGLU's [gate; up]) and its
//            SwiGLU output [T, kShared] (fc2's input); its input is the layer's (kept either way).
// Equality in bytes: the allocator counts exact storage sizes and nothing else changes.
TEST(MoERecompute, SelectiveMoeActAndSharedExpertsStoreLess) {
  const TransformerConfig plain = moe_shared_config();
  const int64_t T = kB * kS, layers = 2, f = plain.moe_ffn_hidden_size;
  const int64_t act_bytes = layers * T * kTopK * f * 4, shared_bytes = layers * T * 3 * kShared * 4;
  const int64_t ref = stored_bytes(plain);
  auto with = [&](std::vector<std::string> mods) {
    TransformerConfig c = plain;
    c.recompute_granularity = RecomputeGranularity::kSelective;
    c.recompute_modules = std::move(mods);
    return stored_bytes(c);
  };
  EXPECT_EQ(ref - with({"moe_act"}), act_bytes);
  EXPECT_EQ(ref - with({"shared_experts"}), shared_bytes);
  EXPECT_EQ(ref - with({"moe_act", "shared_experts"}), act_bytes + shared_bytes);
  // SequentialMLP (no --moe-grouped-gemm): Megatron's moe_act is TEGroupedMLP's only; nothing changes.
  TransformerConfig seq = plain;
  seq.moe_grouped_gemm = false;
  TransformerConfig seq_act = seq;
  seq_act.recompute_granularity = RecomputeGranularity::kSelective;
  seq_act.recompute_modules = {"moe_act"};
  EXPECT_EQ(stored_bytes(seq), stored_bytes(seq_act));
  std::printf("stored bytes per micro-batch: none %lld, moe_act -%lld, shared_experts -%lld\n",
              static_cast<long long>(ref), static_cast<long long>(act_bytes), static_cast<long long>(shared_bytes));
}

}  // namespace
}  // namespace megatron
