// The overlapped optimizer step (optimizer/step_overlap.h) on the CPU, with a fake stream backend:
//  * the wait/finish contract of OptimizerStepOverlap (which events are recorded and waited on,
//    and when nothing is queued), from a log of the backend's calls;
//  * a "lazy" fake that runs the side stream's work as late as the queued waits allow (what a GPU
//    may do): MegatronOptimizer's chunks then hold exactly their params, and training a tiny GPT
//    and LLaMA (GPTModel's param-wait hook, the grad zeroing on the side stream) gives results
//    bit-identical to the serial step. A run without the hook's waits must differ (the emulation
//    can see a missing wait), so the equality is not vacuous.
// The reference is the serial step of the same code (the change moves work between streams only);
// the serial Adam itself is checked against torch elsewhere (optimizer_test.cpp).
#include "megatron/core/optimizer/step_overlap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/core/optimizer/distributed_optimizer.h"
#include "megatron/core/optimizer/optimizer.h"
#include "megatron/core/utils/errors.h"
#include "test_utils/tiny_model.h"

namespace megatron::optimizer {
namespace {

// Events are named by creation order: OptimizerStepOverlap creates the chunk events 0..n-1, then
// its start event (n) and its done event (n+1). `schedule_seed` != 0 (lazy only): besides what the
// waits force, each backend call also runs 0-2 more queued side-stream items (drawn from the
// seed): the side stream running ahead of the waits by a random amount, as a GPU may (between the
// serial extreme, everything at once, and the lazy one, nothing before its wait).
class FakeBackend final : public StepStreamBackend {
 public:
  FakeBackend(bool lazy, std::vector<std::string>* log, uint32_t schedule_seed = 0)
      : lazy_(lazy), log_(log), rng_(schedule_seed), random_(schedule_seed != 0) {}
  ~FakeBackend() override { drain(); }
  void* side_stream() override { return &side_; }
  void* compute_stream() override { return &main_; }
  void run_on_side(const std::function<void()>& fn) override {
    in_side_ = true;
    if (lazy_) queue_.push_back(fn);
    else if (fn) fn();
    in_side_ = false;
    add("run");
  }
  void* create_event() override {
    events_.push_back(std::make_unique<int>(static_cast<int>(events_.size())));
    return events_.back().get();
  }
  void destroy_event(void*) override { ++destroyed_; }
  void record(void* e, void* stream) override {
    add("record e" + std::to_string(*static_cast<int*>(e)) + " " + name(stream));
    if (stream == &side_) mark_[e] = queue_.size();
  }
  void wait(void* stream, void* e) override {
    add("wait " + name(stream) + " e" + std::to_string(*static_cast<int*>(e)));
    if (stream == &main_ && mark_.count(e)) run_until(mark_[e]);
  }
  // Everything queued runs (the GPU reaches the end of the side stream eventually).
  void drain() { run_until(queue_.size()); }
  bool in_side() const { return in_side_; }
  int destroyed() const { return destroyed_; }

 private:
  std::string name(void* s) const { return s == &side_ ? "side" : s == &main_ ? "main" : "?"; }
  void add(const std::string& s) {
    if (log_) log_->push_back(s);
    if (random_) run_until(done_ + rng_() % 3);
  }
  void run_until(size_t n) {
    for (; done_ < n && done_ < queue_.size(); ++done_)
      if (queue_[done_]) queue_[done_]();
  }
  bool lazy_;
  std::vector<std::string>* log_;
  std::mt19937 rng_;
  bool random_;
  int main_ = 0, side_ = 0;
  std::vector<std::unique_ptr<int>> events_;
  std::map<void*, size_t> mark_;  // side event -> queue length when it was recorded
  std::vector<std::function<void()>> queue_;
  size_t done_ = 0;
  bool in_side_ = false;
  int destroyed_ = 0;
};

using Log = std::vector<std::string>;

TEST(OptimizerStepOverlap, WaitAndFinishContract) {
  Log log;
  auto* fake = new FakeBackend(/*lazy=*/false, &log);
  {
    OptimizerStepOverlap ov(3, std::unique_ptr<StepStreamBackend>(fake));
    ASSERT_EQ(ov.num_chunks(), 3u);
    // Nothing in flight: waits queue nothing.
    ov.wait(0);
    ov.finish();
    EXPECT_TRUE(log.empty());
    EXPECT_FALSE(ov.in_flight());

    ov.begin();  // start event (e3) on the compute stream, the side stream waits for it
    EXPECT_EQ(log, (Log{"record e3 main", "wait side e3"}));
    EXPECT_TRUE(ov.in_flight());
    bool ran_on_side = false;
    ov.run_chunk(0, [&] { ran_on_side = fake->in_side(); });
    EXPECT_TRUE(ran_on_side);
    EXPECT_THROW(ov.run_chunk(2, nullptr), InternalError);  // out of order
    EXPECT_THROW(ov.wait(1), InternalError);                // chunk 1 not enqueued yet
    EXPECT_THROW(ov.finish(), InternalError);               // the step has not ended
    log.clear();
    ov.wait(0);
    ov.wait(0);  // already waited: nothing
    EXPECT_EQ(log, (Log{"wait main e0"}));
    ov.run_chunk(1, nullptr);
    ov.run_chunk(2, nullptr);
    EXPECT_THROW(ov.run_chunk(3, nullptr), InternalError);
    ov.end(nullptr);
    log.clear();
    ov.wait(2);  // covers chunk 1 (side-stream order): one wait
    ov.wait(1);
    EXPECT_EQ(log, (Log{"wait main e2"}));
    EXPECT_TRUE(ov.in_flight());  // the end() work (done event) not waited for yet
    ov.finish();
    EXPECT_EQ(log, (Log{"wait main e2", "wait main e4"}));
    EXPECT_FALSE(ov.in_flight());
    ov.finish();
    ov.wait(7);
    EXPECT_EQ(log.size(), 2u);
    EXPECT_EQ(ov.waits_queued(), 3);

    // A new step while one is in flight finishes it first; wait(k >= num_chunks) = finish.
    ov.begin();
    for (size_t k = 0; k < 3; ++k) ov.run_chunk(k, nullptr);
    ov.end(nullptr);
    log.clear();
    ov.begin();
    EXPECT_EQ(log, (Log{"wait main e4", "record e3 main", "wait side e3"}));
    for (size_t k = 0; k < 3; ++k) ov.run_chunk(k, nullptr);
    ov.end(nullptr);
    log.clear();
    ov.wait(99);
    EXPECT_EQ(log, (Log{"wait main e4"}));
    // An exception of the enqueue function propagates (the CUDA backend restores the compute
    // stream in a scope guard).
    ov.begin();
    EXPECT_THROW(ov.run_chunk(0, [] { throw std::runtime_error("x"); }), std::runtime_error);
  }
}

TEST(OptimizerStepOverlap, RejectsNoChunksOrBackend) {
  EXPECT_THROW(OptimizerStepOverlap(0, std::make_unique<FakeBackend>(false, nullptr)), InternalError);
  EXPECT_THROW(OptimizerStepOverlap(2, nullptr), InternalError);
}

std::vector<OptimizerParam> random_params(uint32_t seed, bool bf16) {
  const char* names[] = {"embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight",
                         "decoder.layers.0.mlp.linear_fc1.bias", "decoder.layers.1.self_attention.linear_qkv.weight",
                         "output_layer.weight"};
  const Shape shapes[] = {{16, 8}, {12, 8}, {12}, {24, 8}, {16, 8}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<OptimizerParam> ps;
  for (int k = 0; k < 5; ++k) {
    OptimizerParam p;
    p.name = names[k];
    std::vector<float> v(static_cast<size_t>(shape_numel(shapes[k])));
    for (auto& x : v) x = nd(rng);
    Tensor t = Tensor::from_vector(v, shapes[k]);
    p.param = bf16 ? t.to(DType::kBFloat16) : t;
    p.main_grad = Tensor::zeros(shapes[k], DType::kFloat32);
    ps.push_back(std::move(p));
  }
  return ps;
}

OptimizerConfig adam_config(bool bf16) {
  OptimizerConfig c;
  c.optimizer = "adam";
  c.lr = 1e-2;
  c.weight_decay = 0.1;
  c.clip_grad = 1.0;
  c.bf16 = bf16;
  return c;
}

std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }
// Writes `v` into the fp32 CPU tensor t (a handle: the optimizer's params() are const).
void set_values(const Tensor& t, const std::vector<float>& v) {
  ASSERT_EQ(static_cast<int64_t>(v.size()), t.numel());
  std::copy(v.begin(), v.end(), t.data<float>());
}

// Chunked on the (lazy) side stream: chunk k's params are updated exactly when the compute
// stream waits for chunk k, the others not before; the results equal the serial step's bits, the
// grads are zeroed by the step (take_zeroed_grads once), and the state accessors finish the step.
TEST(OptimizerStepOverlap, ChunksHoldTheirParamsAndMatchTheSerialStep) {
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 params" : "fp32 params");
    auto serial_ps = random_params(7, bf16), over_ps = random_params(7, bf16);
    MegatronOptimizer serial(adam_config(bf16), serial_ps), over(adam_config(bf16), over_ps);
    std::vector<Tensor> grads;
    for (auto& p : over.params()) grads.push_back(p.main_grad);
    Log log;
    auto* fake = new FakeBackend(/*lazy=*/true, &log);
    // Chunks: embedding 0, layer 0 -> 1, layer 1 -> 2, output layer 3.
    const std::vector<size_t> chunk = {0, 1, 1, 2, 3};
    over.enable_step_overlap(chunk, 4, grads, std::unique_ptr<StepStreamBackend>(fake));
    EXPECT_THROW(over.enable_step_overlap(chunk, 4, grads, std::make_unique<FakeBackend>(true, nullptr)),
                 InternalError);
    std::mt19937 rng(11);
    std::normal_distribution<float> nd(0.0f, 3.0f);  // norm > 1: the clip coefficient applies
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      for (size_t i = 0; i < 5; ++i) {
        std::vector<float> g(static_cast<size_t>(serial.params()[i].main_grad.numel()));
        for (auto& x : g) x = nd(rng);
        set_values(serial.params()[i].main_grad, g);
        set_values(over.params()[i].main_grad, g);
      }
      std::vector<std::vector<float>> before;
      for (size_t i = 0; i < 5; ++i) before.push_back(values(over.params()[i].param));
      const StepResult a = serial.step(), b = over.step();
      ASSERT_TRUE(a.grad_norm && b.grad_norm);
      EXPECT_EQ(*a.grad_norm, *b.grad_norm);
      EXPECT_TRUE(over.take_zeroed_grads());
      EXPECT_FALSE(over.take_zeroed_grads());
      for (size_t k = 0; k < 4; ++k) {
        over.wait_for_params(k);
        for (size_t i = 0; i < 5; ++i) {
          const auto got = values(over.params()[i].param);
          if (chunk[i] <= k) EXPECT_EQ(got, values(serial.params()[i].param)) << "param " << i << " after chunk " << k;
          else EXPECT_EQ(got, before[i]) << "param " << i << " updated before its chunk " << chunk[i] << " (at " << k << ")";
        }
      }
      // The grad zeroing runs after the last chunk, on the side stream: still pending here.
      EXPECT_NE(values(over.params()[0].main_grad), std::vector<float>(16 * 8, 0.0f));
      if (step == 2) {
        // The state accessors finish the step (the zeroing included).
        (void)over.exp_avg(0);
      } else {
        over.finish_optimizer_step();
      }
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(values(over.main_param(i)), values(serial.main_param(i))) << i;
        EXPECT_EQ(values(over.exp_avg(i)), values(serial.exp_avg(i))) << i;
        EXPECT_EQ(values(over.exp_avg_sq(i)), values(serial.exp_avg_sq(i))) << i;
        EXPECT_EQ(values(over.params()[i].main_grad), std::vector<float>(over.params()[i].main_grad.numel(), 0.0f)) << i;
      }
    }
    // params_norm finishes a step in flight itself.
    for (const auto* o : {&over, &serial})
      for (const auto& p : o->params()) set_values(p.main_grad, std::vector<float>(p.main_grad.numel(), 0.5f));
    serial.step();
    over.step();
    EXPECT_EQ(over.params_norm(), serial.params_norm());
  }
}

// Tiny GPT / LLaMA trained 3 steps of 2 micro-batches with the overlapped step (lazy side stream,
// GPTModel's param-wait hook, grads zeroed on the side stream) and with the serial step:
// identical losses, grad norms and parameters, bit for bit. Without the hook's waits the lazy
// emulation makes the forward read stale weights and the zeroing land after the backward: the
// results must then differ.
struct TrainResult {
  std::vector<float> losses;
  std::vector<double> norms;
  std::vector<std::vector<float>> params;
};

// schedule_seed: the fake's random run-ahead (0: lazy only).
TrainResult train_tiny(const transformer::TransformerConfig& cfg, bool overlap, bool hook, uint32_t schedule_seed = 0) {
  models::gpt::GPTModel m(cfg, /*padded_vocab=*/64, /*max_seq=*/16, /*seed=*/1234);
  const bool bf16 = cfg.params_dtype == DType::kBFloat16;
  MegatronOptimizer opt(adam_config(bf16), optimizer_params(m.parameters()));
  if (overlap) {
    opt.enable_step_overlap(m.forward_stage_of_params(), m.num_forward_stages(), {m.grad_buffer()},
                            std::make_unique<FakeBackend>(/*lazy=*/true, nullptr, schedule_seed));
    if (hook) m.set_param_wait_hook([&opt](size_t s) { opt.wait_for_params(s); });
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<int64_t> tok(0, 63);
  TrainResult r;
  const int64_t b = 2, s = 16;
  for (int step = 0; step < 3; ++step) {
    if (!opt.take_zeroed_grads()) m.zero_grad();
    float loss_sum = 0.0f;
    for (int mb = 0; mb < 2; ++mb) {
      datasets::GPTBatch batch;
      std::vector<int64_t> t(static_cast<size_t>(b * (s + 1)));
      for (auto& x : t) x = tok(rng);
      std::vector<int64_t> in, lab;
      for (int64_t i = 0; i < b; ++i)
        for (int64_t j = 0; j < s; ++j) {
          in.push_back(t[static_cast<size_t>(i * (s + 1) + j)]);
          lab.push_back(t[static_cast<size_t>(i * (s + 1) + j + 1)]);
        }
      batch.tokens = Tensor::from_vector_i64(in, {b, s});
      batch.labels = Tensor::from_vector_i64(lab, {b, s});
      batch.loss_mask = Tensor::zeros({b, s}, DType::kFloat32);
      batch.loss_mask.fill_(1.0f);
      Tensor loss = m.forward(batch, /*training=*/true);
      for (float v : loss.to_float_vector()) loss_sum += v;
      Tensor dloss = Tensor::zeros({b, s}, DType::kFloat32);
      dloss.fill_(1.0f / static_cast<float>(2 * b * s));
      m.backward(dloss);
    }
    r.losses.push_back(loss_sum);
    r.norms.push_back(*opt.step().grad_norm);
  }
  opt.finish_optimizer_step();
  for (auto& p : m.parameters()) r.params.push_back(p.data.to_float_vector());
  return r;
}

void expect_overlap_matches_serial(transformer::TransformerConfig cfg) {
  const TrainResult serial = train_tiny(cfg, false, false);
  const TrainResult over = train_tiny(cfg, true, true);
  EXPECT_EQ(over.losses, serial.losses);
  EXPECT_EQ(over.norms, serial.norms);
  ASSERT_EQ(over.params.size(), serial.params.size());
  for (size_t i = 0; i < serial.params.size(); ++i) EXPECT_EQ(over.params[i], serial.params[i]) << "param " << i;
  // The side stream running ahead of the waits by random amounts (three schedules).
  for (uint32_t seed : {1u, 2u, 3u}) {
    const TrainResult ahead = train_tiny(cfg, true, true, seed);
    EXPECT_EQ(ahead.losses, serial.losses) << "schedule " << seed;
    EXPECT_EQ(ahead.norms, serial.norms) << "schedule " << seed;
    EXPECT_EQ(ahead.params, serial.params) << "schedule " << seed;
  }
  // The negative control: no waits in the forward/backward.
  const TrainResult unsynced = train_tiny(cfg, true, false);
  EXPECT_NE(unsynced.losses, serial.losses);
}

TEST(OptimizerStepOverlap, TinyGptTrainsBitIdenticalToSerial) {
  transformer::TransformerConfig c = megatron::testing::tiny_gpt_config(32);  // tied embedding
  expect_overlap_matches_serial(c);
}

TEST(OptimizerStepOverlap, TinyLlamaBf16WithRecomputeTrainsBitIdenticalToSerial) {
  transformer::TransformerConfig c = megatron::testing::tiny_llama_config(32, 2, 64);  // untied output layer
  c.params_dtype = DType::kBFloat16;
  c.recompute_granularity = transformer::RecomputeGranularity::kFull;
  c.recompute_method = transformer::RecomputeMethod::kUniform;
  c.recompute_num_layers = 1;
  expect_overlap_matches_serial(c);
}

// GPTModel's forward stages: by parameter name (Megatron's names), in forward order.
TEST(OptimizerStepOverlap, GptModelForwardStagesAndHookOrder) {
  transformer::TransformerConfig c = megatron::testing::tiny_llama_config(32, 2, 64);
  models::gpt::GPTModel m(c, 64, 16, 1234);
  ASSERT_EQ(m.num_forward_stages(), 5u);  // embedding, 2 layers, final norm, output layer
  const std::vector<size_t> stage = m.forward_stage_of_params();
  ASSERT_EQ(stage.size(), m.parameters().size());
  for (size_t i = 0; i < stage.size(); ++i) {
    const std::string& n = m.parameters()[i].name;
    size_t want = 0;
    if (n.rfind("decoder.layers.0.", 0) == 0) want = 1;
    else if (n.rfind("decoder.layers.1.", 0) == 0) want = 2;
    else if (n.rfind("decoder.final_layernorm", 0) == 0) want = 3;
    else if (n.rfind("output_layer", 0) == 0) want = 4;
    else EXPECT_EQ(n.rfind("embedding.", 0), 0u) << n;
    EXPECT_EQ(stage[i], want) << n;
  }
  std::vector<size_t> calls;
  m.set_param_wait_hook([&](size_t s) { calls.push_back(s); });
  datasets::GPTBatch batch;
  batch.tokens = Tensor::from_vector_i64(std::vector<int64_t>(16, 3), {1, 16});
  batch.labels = Tensor::from_vector_i64(std::vector<int64_t>(16, 4), {1, 16});
  m.forward(batch, true);
  EXPECT_EQ(calls, (std::vector<size_t>{0, 1, 2, 3, 4}));
  calls.clear();
  m.backward(Tensor::zeros({1, 16}, DType::kFloat32));
  EXPECT_EQ(calls, (std::vector<size_t>{5}));
}

}  // namespace
}  // namespace megatron::optimizer
