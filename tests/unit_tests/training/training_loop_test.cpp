// The Trainer loop on a toy bigram model (logits = W[token] + b): loss normalisation (docs/megatron-reference.md#loss-normalisation,
// default and --calculate-per-token-loss) against a direct per-token gradient sum, the lm loss
// report, token-weighted evaluation (docs/megatron-reference.md#validation-log-line), exit conditions, log cadence, determinism, and the
// --profile trace JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "megatron/core/utils/errors.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "megatron/training/training.h"

using namespace megatron;
using namespace megatron::training;

namespace {

constexpr int64_t V = 8;

/// Bigram LM: per-token loss = CE(W[token] + b, label). W [V, V], b [V], fp32.
class Bigram final : public TrainableModel {
 public:
  Bigram() {
    w_ = Tensor::zeros({V, V}, DType::kFloat32);
    b_ = Tensor::zeros({V}, DType::kFloat32);
    gw_ = Tensor::zeros({V, V}, DType::kFloat32);
    gb_ = Tensor::zeros({V}, DType::kFloat32);
    std::mt19937 g(7);
    std::normal_distribution<float> n(0.0f, 0.5f);
    for (int64_t i = 0; i < V * V; ++i) w_.data<float>()[i] = n(g);
  }
  Tensor forward(const datasets::GPTBatch& batch, bool) override {
    last_ = batch;
    const int64_t N = batch.tokens.numel();
    Tensor loss = Tensor::zeros(batch.tokens.shape(), DType::kFloat32);
    probs_.assign(N * V, 0.0);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = batch.tokens.data<int64_t>()[i], y = batch.labels.data<int64_t>()[i];
      double mx = -1e30, s = 0;
      std::vector<double> z(V);
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, z[v] = w_.data<float>()[t * V + v] + b_.data<float>()[v]);
      for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
      for (int64_t v = 0; v < V; ++v) probs_[i * V + v] = std::exp(z[v] - mx) / s;
      loss.data<float>()[i] = static_cast<float>(std::log(s) + mx - z[y]);
    }
    return loss;
  }
  void backward(const Tensor& dloss) override {
    const int64_t N = last_.tokens.numel();
    for (int64_t i = 0; i < N; ++i) {
      const int64_t t = last_.tokens.data<int64_t>()[i], y = last_.labels.data<int64_t>()[i];
      const double d = dloss.data<float>()[i];
      for (int64_t v = 0; v < V; ++v) {
        const double g = (probs_[i * V + v] - (v == y ? 1.0 : 0.0)) * d;
        gw_.data<float>()[t * V + v] += static_cast<float>(g);
        gb_.data<float>()[v] += static_cast<float>(g);
      }
    }
  }
  std::vector<optimizer::OptimizerParam> optimizer_params() override {
    std::vector<optimizer::OptimizerParam> p(2);
    p[0].name = "w.weight";
    p[0].param = w_;
    p[0].main_grad = gw_;
    p[1].name = "w.bias";
    p[1].param = b_;
    p[1].main_grad = gb_;
    return p;
  }
  /// d(token-loss i)/dW as a dense vector (for the independent gradient sum).
  std::vector<double> token_grad(int64_t t, int64_t y) const {
    std::vector<double> out(V * V + V, 0.0);
    double mx = -1e30, s = 0;
    std::vector<double> z(V);
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, z[v] = w_.data<float>()[t * V + v] + b_.data<float>()[v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    for (int64_t v = 0; v < V; ++v) {
      const double g = std::exp(z[v] - mx) / s - (v == y ? 1.0 : 0.0);
      out[t * V + v] += g;
      out[V * V + v] += g;
    }
    return out;
  }
  double token_loss(int64_t t, int64_t y) const {
    double mx = -1e30, s = 0;
    std::vector<double> z(V);
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, z[v] = w_.data<float>()[t * V + v] + b_.data<float>()[v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[v] - mx);
    return std::log(s) + mx - z[y];
  }
  Tensor w_, b_, gw_, gb_;

 private:
  datasets::GPTBatch last_;
  std::vector<double> probs_;
};

/// Deterministic micro-batches [b=2, s=4] with a pattern to learn (label = (token+1) % V) and
/// some masked positions (the mask count differs between micro-batches).
BatchIterator make_data(uint32_t seed, int64_t limit = -1) {
  auto gen = std::make_shared<std::mt19937>(seed);
  auto count = std::make_shared<int64_t>(0);
  return [gen, count, limit]() -> std::optional<datasets::GPTBatch> {
    if (limit >= 0 && *count >= limit) return std::nullopt;
    ++*count;
    datasets::GPTBatch b;
    std::vector<int64_t> tok(8), lab(8), pos(8);
    std::vector<float> mask(8);
    for (int i = 0; i < 8; ++i) {
      tok[i] = (*gen)() % V;
      lab[i] = (tok[i] + 1) % V;
      pos[i] = i % 4;
      mask[i] = ((*gen)() % 4 == 0) ? 0.0f : 1.0f;
    }
    b.tokens = Tensor::from_vector_i64(tok, {2, 4});
    b.labels = Tensor::from_vector_i64(lab, {2, 4});
    b.position_ids = Tensor::from_vector_i64(pos, {2, 4});
    b.loss_mask = Tensor::from_vector(mask, {2, 4});
    return b;
  };
}

Arguments make_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {"--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "1",
                                "--seq-length", "4", "--max-position-embeddings", "4", "--micro-batch-size", "2",
                                "--global-batch-size", "6", "--train-iters", "20", "--lr", "0.1", "--min-lr",
                                "0.01", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--mock-data",
                                "--tokenizer-type", "NullTokenizer", "--vocab-size", "8", "--log-interval", "5",
                                "--weight-decay", "0.0"};
  f.insert(f.end(), extra.begin(), extra.end());
  Arguments a = parse_args(f);
  validate_args(a);
  set_padded_vocab_size(a, 8);
  return a;
}

struct TrainRun {
  Arguments args;
  Bigram model;
  std::unique_ptr<optimizer::MegatronOptimizer> opt;
  std::unique_ptr<OptimizerParamScheduler> sched;
  std::vector<std::string> lines;
  std::unique_ptr<Trainer> trainer;
  explicit TrainRun(Arguments a) : args(std::move(a)) {
    opt = std::make_unique<optimizer::MegatronOptimizer>(optimizer_config_from_args(args), model.optimizer_params());
    sched = std::make_unique<OptimizerParamScheduler>(scheduler_options_from_args(args));
    trainer = std::make_unique<Trainer>(args, model, *opt, *sched, TrainingHooks{},
                                        [this](const std::string& s) { lines.push_back(s); });
  }
};

/// Expected main grads after one iteration, summed independently over tokens (docs/megatron-reference.md#loss-normalisation).
std::vector<double> expected_grads(const Bigram& m, uint32_t seed, int nmb, bool per_token, double* loss_out) {
  BatchIterator data = make_data(seed);
  std::vector<double> g(V * V + V, 0.0);
  double tokens_total = 0, loss_sum = 0;
  std::vector<datasets::GPTBatch> mbs;
  for (int k = 0; k < nmb; ++k) mbs.push_back(*data());
  for (auto& b : mbs) {
    double ntok = 0;
    for (int i = 0; i < 8; ++i) ntok += b.loss_mask.data<float>()[i];
    tokens_total += ntok;
    for (int i = 0; i < 8; ++i) {
      const double mk = b.loss_mask.data<float>()[i];
      if (mk == 0) continue;
      const int64_t t = b.tokens.data<int64_t>()[i], y = b.labels.data<int64_t>()[i];
      loss_sum += m.token_loss(t, y);
      auto tg = m.token_grad(t, y);
      const double c = per_token ? 1.0 : 1.0 / (std::max(ntok, 1.0) * nmb);
      for (size_t j = 0; j < g.size(); ++j) g[j] += tg[j] * c;
    }
  }
  if (per_token)
    for (auto& x : g) x /= tokens_total;
  *loss_out = loss_sum / tokens_total;
  return g;
}

void check_grads(TrainRun& r, const std::vector<double>& g) {
  for (int64_t j = 0; j < V * V; ++j)
    // fp32 accumulation of a few dozen terms vs fp64: 1e-6 absolute.
    EXPECT_NEAR(r.model.gw_.data<float>()[j], g[j], 1e-6) << j;
  for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(r.model.gb_.data<float>()[v], g[V * V + v], 1e-6) << v;
}

}  // namespace

TEST(Trainer, DefaultLossNormalisation) {
  // lr 0 and no clipping: the step leaves the grads as the loop produced them.
  TrainRun r(make_args({"--lr", "0", "--min-lr", "0", "--clip-grad", "0"}));
  double loss = 0;
  auto g = expected_grads(r.model, 11, 3, false, &loss);
  BatchIterator data = make_data(11);
  TrainStepResult s = r.trainer->train_step(data);
  check_grads(r, g);
  EXPECT_NEAR(s.lm_loss.loss_sum / s.lm_loss.num_tokens, loss, 1e-6);  // token-weighted report
}

TEST(Trainer, PerTokenLossNormalisation) {
  TrainRun r(make_args({"--lr", "0", "--min-lr", "0", "--clip-grad", "0", "--calculate-per-token-loss"}));
  double loss = 0;
  auto g = expected_grads(r.model, 11, 3, true, &loss);
  BatchIterator data = make_data(11);
  r.trainer->train_step(data);
  check_grads(r, g);
}

TEST(Trainer, TrainsLogsAndEvaluates) {
  TrainRun r(make_args({"--eval-interval", "10", "--eval-iters", "2"}));
  BatchIterator train = make_data(1), valid = make_data(2), test = make_data(3);
  r.trainer->pretrain(train, &valid, &test);
  std::vector<std::string> log;
  for (auto& l : r.lines)
    if (l.find(" iteration ") != std::string::npos && l.find("lm loss:") != std::string::npos) log.push_back(l);
  // First iteration, then every --log-interval 5: 1, 5, 10, 15, 20.
  ASSERT_EQ(log.size(), 5u);
  std::regex re(R"(^ \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] iteration +(\d+)/ +20 \| consumed samples: +(\d+) \| )"
                R"(elapsed time per iteration \(ms\): \d+\.\d \| learning rate: \d\.\d{6}E[+-]\d\d \| global batch size: +6 \| )"
                R"(lm loss: (\d\.\d{6}E[+-]\d\d) \| loss scale: 1\.0 \| grad norm: \d+\.\d{3} \| )"
                R"(number of skipped iterations: +0 \| number of nan iterations: +0 \|$)");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(log[0], m, re)) << log[0];
  EXPECT_EQ(m[1], "1");
  EXPECT_EQ(m[2], "6");
  const double first = std::stod(m[3]);
  ASSERT_TRUE(std::regex_match(log[4], m, re)) << log[4];
  EXPECT_EQ(m[1], "20");
  EXPECT_EQ(m[2], "120");
  EXPECT_LT(std::stod(m[3]), first);  // it learns
  // Iteration 1 logs the lr after one step: warmup 2 iters = 12 samples, n = 6 -> 0.1 * 6/12.
  EXPECT_NE(log[0].find("learning rate: 5.000000E-02"), std::string::npos) << log[0];
  // Validation at 10 and 20 plus the final validation and test blocks.
  int valid_blocks = 0, test_blocks = 0;
  for (auto& l : r.lines) {
    if (l.rfind(" validation loss at iteration ", 0) == 0) ++valid_blocks;
    if (l.find("on test set") != std::string::npos) ++test_blocks;
  }
  EXPECT_EQ(valid_blocks, 4);
  EXPECT_EQ(test_blocks, 1);
  EXPECT_EQ(r.trainer->state().iteration, 20);
  EXPECT_EQ(r.trainer->state().consumed_train_samples, 120);
}

TEST(Trainer, EvaluationIsTokenWeighted) {
  TrainRun r(make_args({"--eval-iters", "2"}));
  // Hand computation: Σ loss·mask / Σ mask over the 2 iterations × 3 micro-batches.
  BatchIterator data = make_data(5);
  double s = 0, n = 0;
  for (int k = 0; k < 6; ++k) {
    auto b = *data();
    for (int i = 0; i < 8; ++i) {
      const double mk = b.loss_mask.data<float>()[i];
      s += mk * r.model.token_loss(b.tokens.data<int64_t>()[i], b.labels.data<int64_t>()[i]);
      n += mk;
    }
  }
  BatchIterator eval = make_data(5);
  auto v = r.trainer->evaluate(eval);
  ASSERT_TRUE(v);
  EXPECT_NEAR(*v, s / n, 1e-6);
  EXPECT_EQ(r.trainer->state().consumed_valid_samples, 12);
}

TEST(Trainer, ExitDurationHonoured) {
  TrainRun r(make_args({"--exit-duration-in-mins", "1", "--eval-interval", "100", "--eval-iters", "1"}));
  r.trainer->set_start_time(std::chrono::steady_clock::now() - std::chrono::seconds(61));
  BatchIterator train = make_data(1), valid = make_data(2);
  r.trainer->pretrain(train, &valid, nullptr);
  EXPECT_EQ(r.trainer->state().iteration, 1);
  bool said = false, validated = false;
  for (auto& l : r.lines) {
    if (l.rfind("[exiting program after 1.0", 0) == 0 && l.find(" minutes] datetime: ") != std::string::npos) said = true;
    if (l.find("validation loss") != std::string::npos) validated = true;
  }
  EXPECT_TRUE(said);
  EXPECT_FALSE(validated);  // Megatron exits without the final evaluation
}

TEST(Trainer, ExitIntervalAndDataRunningOut) {
  TrainRun r(make_args({"--exit-interval", "3"}));
  BatchIterator train = make_data(1);
  r.trainer->pretrain(train, nullptr, nullptr);
  EXPECT_EQ(r.trainer->state().iteration, 3);
  EXPECT_EQ(r.lines.back().rfind("[exiting program at iteration 3] datetime: ", 0), 0u) << r.lines.back();
  TrainRun r2(make_args());
  BatchIterator few = make_data(1, 4);
  EXPECT_THROW(r2.trainer->pretrain(few, nullptr, nullptr), UserError);
}

TEST(Trainer, SameSeedBitwiseIdenticalLosses) {
  auto losses = [] {
    TrainRun r(make_args({"--log-interval", "1"}));
    BatchIterator train = make_data(9);
    r.trainer->pretrain(train, nullptr, nullptr);
    std::vector<std::string> out;
    for (auto& l : r.lines) {
      auto p = l.find("lm loss: ");
      if (p != std::string::npos) out.push_back(l.substr(p, 22));
    }
    return std::make_pair(out, r.model.w_.to_float_vector());
  };
  auto a = losses(), b = losses();
  EXPECT_EQ(a.first.size(), 20u);
  EXPECT_EQ(a.first, b.first);
  EXPECT_EQ(a.second, b.second);  // bitwise equal parameters
}

TEST(Trainer, ProfileWritesChromeTrace) {
  const std::string dir = std::filesystem::temp_directory_path() / ("mtrace_" + std::to_string(::getpid()));
  TrainRun r(make_args({"--profile", "--profile-step-start", "2", "--profile-step-end", "4", "--tensorboard-dir", dir,
                   "--train-iters", "6"}));
  BatchIterator train = make_data(1);
  r.trainer->pretrain(train, nullptr, nullptr);
  std::ifstream f(dir + "/trace_rank0.json");
  ASSERT_TRUE(f);
  nlohmann::json j = nlohmann::json::parse(f);
  int iterations = 0, fb = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "iteration") ++iterations;
    if (e["ph"] == "X" && e["name"] == "forward-backward") ++fb;
  }
  EXPECT_EQ(iterations, 2);  // iterations 3 and 4
  EXPECT_EQ(fb, 2);
  std::filesystem::remove_all(dir);
}

// The kernel profiler's hooks bracket Megatron's --profile window: start before iteration
// profile_step_start + 1, stop after iteration profile_step_end (its log line printed first); a
// run that ends inside the window stops at its last iteration.
TEST(Trainer, ProfileHooksBracketTheWindow) {
  const std::string dir = std::filesystem::temp_directory_path() / ("mkprof_" + std::to_string(::getpid()));
  for (const auto& [end, want_stop] : std::vector<std::pair<std::string, std::string>>{{"4", "stop 4 after log 4"},
                                                                                        {"10", "stop 6 after log 6"}}) {
    Arguments args = make_args({"--profile", "--profile-step-start", "2", "--profile-step-end", end, "--tensorboard-dir",
                                dir, "--train-iters", "6", "--log-interval", "1"});
    Bigram model;
    optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), model.optimizer_params());
    OptimizerParamScheduler sched(scheduler_options_from_args(args));
    std::vector<std::string> events;
    std::string last_log = "none";
    TrainingHooks h;
    h.profile_start = [&](int64_t first) { events.push_back("start " + std::to_string(first) + " after log " + last_log); };
    h.profile_stop = [&](int64_t last) { events.push_back("stop " + std::to_string(last) + " after log " + last_log); };
    Trainer t(args, model, opt, sched, h, [&](const std::string& s) {
      std::smatch m;
      if (std::regex_search(s, m, std::regex(R"(\] iteration +(\d+)/)"))) last_log = m[1];
    });
    BatchIterator train = make_data(1);
    t.pretrain(train, nullptr, nullptr);
    EXPECT_EQ(events, (std::vector<std::string>{"start 3 after log 2", want_stop})) << "--profile-step-end " << end;
  }
  std::filesystem::remove_all(dir);
}
