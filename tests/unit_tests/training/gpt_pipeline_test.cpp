// Pipeline pieces of pretrain_gpt: Megatron's layer split over (virtual) pipeline stages,
// GPTModel's parked activations (several micro-batches in flight), its grad-ready reports, and
// DDP's own bucket for the tied embedding with the distributed optimizer.
#include <gtest/gtest.h>

#include <set>

#include "megatron/core/distributed/distributed_data_parallel.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tensor_parallel/random.h"
#include "megatron/core/utils/errors.h"
#include "megatron/training/gpt_pipeline.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using training::pipeline_chunks;

// Expected offsets from Megatron's formula (TransformerBlock layer offset):
// offset = vp_rank * L/VP + pp_rank * L/(PP*VP), computed by hand.
TEST(GPTPipelineLayout, EvenSplitMatchesMegatronOffsets) {
  auto r0 = pipeline_chunks(8, 2, 0, 1), r1 = pipeline_chunks(8, 2, 1, 1);
  ASSERT_EQ(r0.size(), 1u);
  EXPECT_EQ(r0[0].layer_offset, 0);
  EXPECT_EQ(r0[0].num_layers, 4);
  EXPECT_TRUE(r0[0].pre_process);
  EXPECT_FALSE(r0[0].post_process);
  EXPECT_EQ(r1[0].layer_offset, 4);
  EXPECT_FALSE(r1[0].pre_process);
  EXPECT_TRUE(r1[0].post_process);
  // PP2 x VP2, 8 layers: rank 0 holds stages 0 and 2 (layers 0-1, 4-5), rank 1 stages 1 and 3.
  auto v0 = pipeline_chunks(8, 2, 0, 2), v1 = pipeline_chunks(8, 2, 1, 2);
  ASSERT_EQ(v0.size(), 2u);
  EXPECT_EQ(v0[0].layer_offset, 0);
  EXPECT_EQ(v0[1].layer_offset, 4);
  EXPECT_EQ(v1[0].layer_offset, 2);
  EXPECT_EQ(v1[1].layer_offset, 6);
  for (auto* v : {&v0, &v1})
    for (auto& c : *v) EXPECT_EQ(c.num_layers, 2);
  EXPECT_TRUE(v0[0].pre_process && !v0[1].pre_process && !v0[1].post_process);
  EXPECT_TRUE(v1[1].post_process && !v1[0].post_process);
  // PP4 x VP3, 24 layers, rank 2: stages 2, 6, 10 of 2 layers.
  auto w = pipeline_chunks(24, 4, 2, 3);
  EXPECT_EQ(w[0].layer_offset, 4);
  EXPECT_EQ(w[1].layer_offset, 12);
  EXPECT_EQ(w[2].layer_offset, 20);
}

// --decoder-first/last-pipeline-num-layers, offsets by hand from Megatron's
// get_transformer_layer_offset: first stage F layers, last La, the rest split evenly; with VP the
// chunk c offset is c*(L/VP) + F/VP + middle_rank*(M/VP/middle_stages).
TEST(GPTPipelineLayout, UnevenSplitMatchesMegatronOffsets) {
  auto a0 = pipeline_chunks(6, 2, 0, 1, 2, std::nullopt), a1 = pipeline_chunks(6, 2, 1, 1, 2, std::nullopt);
  EXPECT_EQ(a0[0].layer_offset, 0);
  EXPECT_EQ(a0[0].num_layers, 2);
  EXPECT_EQ(a1[0].layer_offset, 2);
  EXPECT_EQ(a1[0].num_layers, 4);
  // PP3, 8 layers, first 1, last 3: [0,1) [1,5) [5,8).
  int64_t want_off[] = {0, 1, 5}, want_n[] = {1, 4, 3};
  for (int r = 0; r < 3; ++r) {
    auto c = pipeline_chunks(8, 3, r, 1, 1, 3);
    EXPECT_EQ(c[0].layer_offset, want_off[r]) << r;
    EXPECT_EQ(c[0].num_layers, want_n[r]) << r;
  }
  // PP2 x VP2, 8 layers, first 2, last 6: r0c0 [0,1), r1c0 [1,4), r0c1 [4,5), r1c1 [5,8).
  auto v0 = pipeline_chunks(8, 2, 0, 2, 2, 6), v1 = pipeline_chunks(8, 2, 1, 2, 2, 6);
  EXPECT_EQ(v0[0].layer_offset, 0);
  EXPECT_EQ(v0[0].num_layers, 1);
  EXPECT_EQ(v1[0].layer_offset, 1);
  EXPECT_EQ(v1[0].num_layers, 3);
  EXPECT_EQ(v0[1].layer_offset, 4);
  EXPECT_EQ(v1[1].layer_offset, 5);
  EXPECT_EQ(v1[1].num_layers, 3);
  EXPECT_THROW(pipeline_chunks(8, 2, 0, 1, 3, 3), UserError);     // 3 + 3 != 8 with two stages
  EXPECT_THROW(pipeline_chunks(8, 4, 0, 1, 1, 2), UserError);     // 5 layers left for 2 middle stages
  EXPECT_THROW(pipeline_chunks(8, 2, 0, 2, 1, 7), UserError);     // 1 and 7 not divisible by VP 2
  EXPECT_THROW(pipeline_chunks(8, 1, 0, 1, 2, std::nullopt), UserError);  // needs PP > 1
}

TEST(GPTPipelineLayout, IndivisibleEvenSplitIsAUserErrorNamingTheFlags) {
  try {
    pipeline_chunks(6, 4, 0, 1);
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--num-layers"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--pipeline-model-parallel-size"), std::string::npos) << e.what();
  }
}

transformer::TransformerConfig tiny(bool llama) {
  return llama ? megatron::testing::tiny_llama_config(32, 2, 64) : megatron::testing::tiny_gpt_config(32);
}

datasets::GPTBatch batch_of(uint64_t seed) {
  const int64_t b = 2, s = 8, vocab = 64;
  std::vector<int64_t> tok(b * s), lab(b * s);
  for (int64_t i = 0; i < b * s; ++i) {
    tok[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 2 * i) % vocab);
    lab[i] = static_cast<int64_t>(tensor_parallel::splitmix64(seed + 2 * i + 1) % vocab);
  }
  datasets::GPTBatch out;
  out.tokens = Tensor::from_vector_i64(tok, {b, s});
  out.labels = Tensor::from_vector_i64(lab, {b, s});
  return out;
}

Tensor seed_grad() { return Tensor::from_vector(std::vector<float>(16, 1.0f / 16), {2, 8}); }

// Reference: forward+backward of each micro-batch in turn (no pipelining). Parking activations
// (all three in flight, backwards in forward order as the schedules run them) must give
// bit-identical accumulated gradients.
TEST(GPTModelStash, InFlightMicroBatchesGiveTheSequentialGradients) {
  for (bool llama : {false, true}) {
    GPTModel ref(tiny(llama), 64, 8, 7), m(tiny(llama), 64, 8, 7);
    for (int i = 0; i < 3; ++i) {
      ref.forward(batch_of(100 + i), true);
      ref.backward(seed_grad());
    }
    for (int i = 0; i < 3; ++i) {
      m.forward(batch_of(100 + i), true);
      m.stash_activations(i);
    }
    EXPECT_EQ(m.num_stashed_activations(), 3u);
    for (int i : {0, 1, 2}) {
      m.restore_activations(i);
      m.backward(seed_grad());
    }
    EXPECT_EQ(m.num_stashed_activations(), 0u);
    auto a = ref.grad_buffer().to_float_vector(), b = m.grad_buffer().to_float_vector();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(a[k], b[k]) << "element " << k << (llama ? " llama" : " gpt");
  }
}

TEST(GPTModelStash, MisuseIsAnInternalError) {
  GPTModel m(tiny(false), 64, 8, 7);
  EXPECT_THROW(m.stash_activations(0), InternalError);  // nothing to park
  m.forward(batch_of(1), true);
  m.stash_activations(0);
  m.forward(batch_of(2), true);
  EXPECT_THROW(m.stash_activations(0), InternalError);  // key taken
  EXPECT_THROW(m.restore_activations(5), InternalError);  // unknown key
}

// The grad-ready hook reports every parameter exactly once per backward, the output layer
// first and the embedding last (backward order).
TEST(GPTModelGradReady, EveryParameterReportedOnceInBackwardOrder) {
  for (bool llama : {false, true}) {
    GPTModel m(tiny(llama), 64, 8, 7);
    std::vector<size_t> order;
    m.set_grad_ready_hook([&](const std::vector<size_t>& r) { order.insert(order.end(), r.begin(), r.end()); });
    m.forward(batch_of(3), true);
    m.backward(seed_grad());
    const auto& ps = m.parameters();
    ASSERT_EQ(order.size(), ps.size());
    EXPECT_EQ(std::set<size_t>(order.begin(), order.end()).size(), ps.size());
    EXPECT_TRUE(ps[order.back()].name.starts_with("embedding.")) << ps[order.back()].name;
    if (llama) EXPECT_EQ(ps[order.front()].name, "output_layer.weight");
    // Layer 1's parameters come before layer 0's.
    size_t first0 = order.size(), last1 = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      if (ps[order[k]].name.starts_with("decoder.layers.0.")) first0 = std::min(first0, k);
      if (ps[order[k]].name.starts_with("decoder.layers.1.")) last1 = k;
    }
    EXPECT_LT(last1, first0);
  }
}

// With the distributed optimizer and PP > 1, the tied word embedding sits alone in its bucket
// (Megatron's shared-embedding bucket), so first and last stage slice it alike.
TEST(DDPSharedEmbeddingBucket, WordEmbeddingGetsItsOwnBucket) {
  GPTModel m(tiny(false), 64, 8, 7);
  distributed::DistributedDataParallelConfig dc;
  dc.use_distributed_optimizer = true;
  dc.shared_embedding_own_bucket = true;
  distributed::DistributedDataParallel ddp(dc, m.buffers(), m.parameters(), comm::make_single_rank_group());
  size_t emb = m.parameters().size();
  for (size_t i = 0; i < m.parameters().size(); ++i)
    if (m.parameters()[i].name == "embedding.word_embeddings.weight") emb = i;
  ASSERT_LT(emb, m.parameters().size());
  int holding = 0;
  for (const auto& b : ddp.buckets())
    for (size_t p : b.params)
      if (p == emb) {
        ++holding;
        EXPECT_EQ(b.params.size(), 1u);
      }
  EXPECT_EQ(holding, 1);
  EXPECT_GE(ddp.buckets().size(), 2u);
  dc.shared_embedding_own_bucket = false;  // default: one bucket without overlap
  distributed::DistributedDataParallel plain(dc, m.buffers(), m.parameters(), comm::make_single_rank_group());
  EXPECT_EQ(plain.buckets().size(), 1u);
}

}  // namespace
}  // namespace megatron
