// Tensor parallelism of GPTModel, run in-process: two threads each hold one TP shard and
// all-reduce through a thread-backed ProcessGroup. Their losses must equal the single-rank
// model's and their gradients the matching slices of its gradients (docs/megatron-reference.md#tensor-parallel-layers, #vocab-parallel-cross-entropy).
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <thread>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/tensor_parallel/random.h"
#include "test_utils/tiny_model.h"

namespace megatron {
namespace {

using models::gpt::GPTModel;
using transformer::TransformerConfig;

/// State shared by the ranks of a ThreadGroup.
struct ThreadGroupState {
  explicit ThreadGroupState(int n) : size(n), slots(n), sync(n) {}
  int size;
  std::vector<std::vector<float>> slots;
  std::barrier<> sync;
};

class DoneWork final : public comm::Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};

/// Float32 all-reduce between threads (the only collective GPTModel needs for TP without SP).
class ThreadGroup final : public comm::ProcessGroup {
 public:
  ThreadGroup(std::shared_ptr<ThreadGroupState> st, int rank) : st_(std::move(st)), rank_(rank), ranks_(st_->size) {}
  int rank() const override { return rank_; }
  int size() const override { return st_->size; }
  const std::vector<int>& ranks() const override { return ranks_; }
  std::unique_ptr<comm::Work> all_reduce(Tensor& t, comm::ReduceOp op, bool) override {
    st_->slots[rank_] = t.to_float_vector();
    st_->sync.arrive_and_wait();
    std::vector<float> r = st_->slots[0];
    for (int k = 1; k < st_->size; ++k)
      for (size_t i = 0; i < r.size(); ++i)
        r[i] = op == comm::ReduceOp::kMax ? std::max(r[i], st_->slots[k][i]) : r[i] + st_->slots[k][i];
    st_->sync.arrive_and_wait();  // everyone has read the slots
    Tensor src = Tensor::from_vector(r, t.shape());
    t.copy_(src.to(t.dtype()));
    return std::make_unique<DoneWork>();
  }
  std::unique_ptr<comm::Work> all_gather(const Tensor&, Tensor&, bool) override { fail(); }
  std::unique_ptr<comm::Work> reduce_scatter(const Tensor&, Tensor&, comm::ReduceOp, bool) override {
    fail();
  }
  std::unique_ptr<comm::Work> broadcast(Tensor&, int, bool) override { fail(); }
  std::unique_ptr<comm::Work> send(const Tensor&, int, bool) override { fail(); }
  std::unique_ptr<comm::Work> recv(Tensor&, int, bool) override { fail(); }
  void barrier() override { st_->sync.arrive_and_wait(); }

 private:
  [[noreturn]] static void fail() { throw std::logic_error("ThreadGroup: only all_reduce is implemented"); }
  std::shared_ptr<ThreadGroupState> st_;
  int rank_;
  std::vector<int> ranks_;
};

datasets::GPTBatch make_batch(int64_t b, int64_t s, int64_t vocab) {
  std::vector<int64_t> tok(b * s), lab(b * s), pos(b * s);
  for (int64_t i = 0; i < b * s; ++i) {
    tok[i] = static_cast<int64_t>(tensor_parallel::splitmix64(2 * i) % vocab);
    lab[i] = static_cast<int64_t>(tensor_parallel::splitmix64(2 * i + 1) % vocab);
    pos[i] = i % s;
  }
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(tok, {b, s});
  batch.labels = Tensor::from_vector_i64(lab, {b, s});
  batch.position_ids = Tensor::from_vector_i64(pos, {b, s});
  return batch;
}

/// Local slice of the global tensor for a TP shard (same rule as the init test).
std::vector<float> shard_of(const Parameter& p, const std::vector<float>& gv, int r, int tp) {
  const Shape& gs = p.global_shape;
  if (p.partition_dim < 0) return gv;
  std::vector<float> out;
  if (p.partition_dim == 0) {
    const int64_t cols = gs.size() > 1 ? gs[1] : 1, block = gs[0] / p.partition_stride, per = block / tp;
    for (int64_t s = 0; s < p.partition_stride; ++s)
      for (int64_t row = s * block + r * per; row < s * block + (r + 1) * per; ++row)
        out.insert(out.end(), gv.begin() + row * cols, gv.begin() + (row + 1) * cols);
  } else {
    const int64_t per = gs[1] / tp;
    for (int64_t row = 0; row < gs[0]; ++row)
      out.insert(out.end(), gv.begin() + row * gs[1] + r * per, gv.begin() + row * gs[1] + (r + 1) * per);
  }
  return out;
}

double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(double(a[i]) - b[i])), ref = std::max(ref, std::abs(double(b[i])));
  return ref == 0 ? err : err / ref;
}

void check_tp2(TransformerConfig c) {
  c.hidden_dropout = c.attention_dropout = 0.0f;
  const int64_t V = 128, b = 2, s = 16;
  auto batch = make_batch(b, s, V);
  Tensor dloss = Tensor::zeros({b, s}, DType::kFloat32);
  dloss.fill_(1.0f / (b * s));

  GPTModel full(c, V, s, 42);
  auto loss_full = full.forward(batch, true).to_float_vector();
  full.backward(dloss);

  c.tensor_model_parallel_size = 2;
  auto state = std::make_shared<ThreadGroupState>(2);
  std::vector<std::vector<float>> losses(2);
  std::vector<std::vector<std::vector<float>>> grads(2);
  std::vector<std::string> errors(2);
  auto run = [&](int r) {
    try {
      models::gpt::GPTModelParallel par;
      par.tp_group = std::make_shared<ThreadGroup>(state, r);
      GPTModel m(c, V, s, 42, Device::cpu(), par);
      losses[r] = m.forward(batch, true).to_float_vector();
      m.backward(dloss);
      for (auto& p : m.parameters()) grads[r].push_back(p.main_grad.to_float_vector());
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  // fp32; TP only reorders sums (partial GEMMs + all-reduce, sharded softmax statistics), so
  // differences are rounding: 1e-5 of the largest magnitude.
  for (int r = 0; r < 2; ++r) {
    EXPECT_LE(max_rel(losses[r], loss_full), 1e-5) << "rank " << r;
    for (size_t i = 0; i < full.parameters().size(); ++i) {
      auto& p = full.parameters()[i];
      EXPECT_LE(max_rel(grads[r][i], shard_of(p, p.main_grad.to_float_vector(), r, 2)), 1e-5)
          << p.name << " rank " << r;
    }
  }
}

TEST(TensorParallelThreads, GPTWithTP2EqualsSingleRank) {
  TransformerConfig c = megatron::testing::tiny_gpt_config(64, megatron::testing::TinyDropout::kDefault);
  c.bias_activation_fusion = true;
  check_tp2(c);
}

TEST(TensorParallelThreads, LlamaWithTP2EqualsSingleRank) {
  check_tp2(megatron::testing::tiny_llama_config(64, 2, 176, megatron::testing::TinyDropout::kDefault));
}

}  // namespace
}  // namespace megatron
