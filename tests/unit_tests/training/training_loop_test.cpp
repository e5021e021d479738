// The Trainer loop on a toy bigram model (logits = W[token] + b): loss normalisation (docs/megatron-reference.md#loss-normalisation,
// default and --calculate-per-token-loss) against a direct per-token gradient sum, the lm loss
// report, token-weighted evaluation (docs/megatron-reference.md#validation-log-line), exit conditions, log cadence, determinism, and the
// --profile trace JSON.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
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

// Megatron's training_log: should_reset = not is_first_iteration. The run's first iteration (the
// first after a --load too) is printed but leaves the interval's accumulators as they are, so the
// next line averages over both (docs/megatron-reference.md#training-log-line; Megatron's own log of
// tests/reference/torch_dist/megatron_gpt_tp1 shows it in its iteration-2 elapsed time). The
// expected lines are built from that rule and the per-iteration losses the TensorBoard hook gets
// (written every iteration); printed with %.6E, so 1e-6 relative.
TEST(Trainer, FirstLoggedIterationDoesNotResetTheInterval) {
  for (const int64_t start : {int64_t{0}, int64_t{5}}) {  // a fresh run, and a run resumed at iteration 5
    for (const int64_t interval : {int64_t{1}, int64_t{2}}) {
      SCOPED_TRACE("start " + std::to_string(start) + ", --log-interval " + std::to_string(interval));
      Arguments args = make_args({"--log-interval", std::to_string(interval), "--train-iters", "10"});
      Bigram model;
      optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), model.optimizer_params());
      OptimizerParamScheduler sched(scheduler_options_from_args(args));
      std::map<int64_t, double> per_iteration;
      TrainingHooks h;
      h.add_scalar = [&](const std::string& tag, double v, int64_t step) {
        if (tag == "lm loss") per_iteration[step] = v;
      };
      std::vector<std::string> lines;
      Trainer t(args, model, opt, sched, h, [&](const std::string& l) { lines.push_back(l); });
      t.state().iteration = start;
      t.state().consumed_train_samples = start * 6;
      BatchIterator train = make_data(4);
      t.pretrain(train, nullptr, nullptr);
      std::map<int64_t, double> printed;
      std::regex re(R"( iteration +(\d+)/ +10 \|.* lm loss: ([0-9.E+-]+) \|)");
      std::smatch m;
      for (const auto& l : lines)
        if (std::regex_search(l, m, re)) printed[std::stoll(m[1])] = std::stod(m[2]);
      ASSERT_EQ(per_iteration.size(), static_cast<size_t>(10 - start));
      // Megatron's accumulators: the first iteration logs, the next log line (the next multiple of
      // the interval) averages everything since the run's start, later lines their interval.
      std::map<int64_t, double> want;
      double sum = 0;
      int64_t n = 0;
      for (int64_t it = start + 1; it <= 10; ++it) {
        sum += per_iteration.at(it);
        n += 1;
        if (it == start + 1 || it % interval == 0) {
          want[it] = sum / static_cast<double>(n);
          if (it != start + 1) sum = 0, n = 0;
        }
      }
      ASSERT_EQ(printed.size(), want.size());
      for (const auto& [it, v] : want) {
        ASSERT_TRUE(printed.count(it)) << "iteration " << it << " not printed";
        EXPECT_NEAR(printed[it], v, 1e-6 * std::abs(v)) << "iteration " << it;
      }
      // The second line is not the iteration's own loss (the model learns: the losses differ).
      const int64_t second = std::next(want.begin())->first;
      EXPECT_GT(std::abs(printed[second] - per_iteration.at(second)), 1e-4) << "iteration " << second;
    }
  }
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

// ---- issue 20: exit flags, TensorBoard tags, collectives vs rank-conditional code, NaN ----

namespace {
/// Every logging/TensorBoard/timer option of Megatron's training_log at once (plus eval).
std::vector<std::string> all_logging_flags() {
  return {"--train-iters", "4", "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1",
          "--log-params-norm", "--log-num-zeros-in-grad", "--log-throughput", "--log-timers-to-tensorboard",
          "--log-memory-to-tensorboard", "--log-world-size-to-tensorboard", "--log-validation-ppl-to-tensorboard",
          "--timing-log-level", "2", "--tensorboard-dir", "/nonexistent-unused", "--exit-signal-handler",
          "--exit-duration-in-mins", "0"};
}
}  // namespace

// Megatron: `if args.exit_duration_in_mins:` -- 0 (like None) never stops the run.
TEST(Trainer, ExitDurationZeroIsOff) {
  TrainRun r(make_args({"--exit-duration-in-mins", "0", "--train-iters", "3"}));
  r.trainer->set_start_time(std::chrono::steady_clock::now() - std::chrono::hours(10));
  BatchIterator train = make_data(1);
  r.trainer->pretrain(train, nullptr, nullptr);
  EXPECT_EQ(r.trainer->state().iteration, 3);
  for (auto& l : r.lines) EXPECT_EQ(l.find("exiting program"), std::string::npos) << l;
}

// The TensorBoard tags of a run with every option on are exactly Megatron's (read off
// Megatron-LM's training.py training_log and evaluate_and_print_results and core/timers.py
// Timers.write), at Megatron's steps: training tags every iteration, iteration-time from the
// second, the validation tags at the periodic evaluation (3) and twice at the end (validation
// and test set, 4).
TEST(Trainer, TensorBoardTagsAreMegatrons) {
  Arguments args = make_args(all_logging_flags());
  Bigram model;
  optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), model.optimizer_params());
  OptimizerParamScheduler sched(scheduler_options_from_args(args));
  std::map<std::string, std::vector<int64_t>> steps;
  TrainingHooks h;
  h.add_scalar = [&](const std::string& tag, double, int64_t step) { steps[tag].push_back(step); };
  Trainer t(args, model, opt, sched, h, [](const std::string&) {});
  BatchIterator train = make_data(1), valid = make_data(2), test = make_data(3);
  t.pretrain(train, &valid, &test);
  std::set<std::string> got;
  for (auto& [tag, s] : steps) got.insert(tag);
  const std::set<std::string> want = {
      "learning-rate", "learning-rate vs samples", "batch-size", "batch-size vs samples", "lm loss",
      "lm loss vs samples", "loss-scale", "loss-scale vs samples", "world-size", "world-size vs samples",
      "grad-norm", "grad-norm vs samples", "num-zeros", "num-zeros vs samples", "params-norm",
      "params-norm vs samples", "mem-reserved-bytes", "mem-allocated-bytes", "mem-max-allocated-bytes",
      "mem-allocated-count", "iteration-time", "throughput", "forward-backward-time", "optimizer-time",
      "batch-generator-time", "forward-compute-time", "backward-compute-time", "lm loss validation",
      "lm loss validation vs samples", "lm loss validation ppl", "lm loss validation ppl vs samples"};
  EXPECT_EQ(got, want);
  EXPECT_EQ(steps["lm loss"], (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(steps["params-norm vs samples"], (std::vector<int64_t>{6, 12, 18, 24}));
  EXPECT_EQ(steps["iteration-time"], (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(steps["lm loss validation"], (std::vector<int64_t>{3, 4, 4}));
  EXPECT_EQ(steps["optimizer-time"], (std::vector<int64_t>{1, 2, 3, 4}));
}

// The kind behind the TP2/PP2/DP2 hang: whether a rank writes TensorBoard and prints (the last
// rank) must not change which collectives it reaches. Two trainers, one with the writer and the
// printer, one with neither, record the same sequence of collective hook calls.
TEST(Trainer, CollectivesDoNotDependOnTheRankThatLogs) {
  auto sequence = [](bool last_rank) {
    const std::string dir = std::filesystem::temp_directory_path() / ("mkcoll_" + std::to_string(::getpid()));
    std::vector<std::string> f = all_logging_flags();
    f.insert(f.end(), {"--save", dir, "--save-interval", "2", "--log-progress", "--timing-log-option", "all"});
    Arguments args = make_args(f);
    args.rank = last_rank ? 0 : 1;  // rank 0 writes progress.txt, another rank does not
    args.world_size = 2;
    Bigram model;
    optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), model.optimizer_params());
    OptimizerParamScheduler sched(scheduler_options_from_args(args));
    std::vector<std::string> calls;
    TrainingHooks h;
    if (last_rank) h.add_scalar = [](const std::string&, double, int64_t) {};
    h.barrier = [&] { calls.push_back("barrier"); };
    h.all_gather_times = [&](const std::vector<double>& local) {
      calls.push_back("all_gather_times " + std::to_string(local.size()));
      std::vector<double> all = local;
      all.insert(all.end(), local.begin(), local.end());
      return all;
    };
    h.any_rank = [&](bool flag) {
      calls.push_back("any_rank");
      return flag;
    };
    h.reduce_loss = [&](LossReport&) { calls.push_back("reduce_loss"); };
    h.save_checkpoint = [&](int64_t it) { calls.push_back("save " + std::to_string(it)); };
    std::function<void(const std::string&)> print = [](const std::string&) {};
    if (last_rank) print = [](const std::string& s) { (void)s; };
    Trainer t(args, model, opt, sched, h, print);
    BatchIterator train = make_data(1), valid = make_data(2), test = make_data(3);
    t.pretrain(train, &valid, &test);
    std::filesystem::remove_all(dir);
    return calls;
  };
  const std::vector<std::string> last = sequence(true), other = sequence(false);
  EXPECT_EQ(last, other);
  // The run did reach the collectives (the comparison is not vacuous).
  EXPECT_GE(std::count(last.begin(), last.end(), std::string("barrier")), 8);
  EXPECT_EQ(std::count(last.begin(), last.end(), std::string("all_gather_times 5")), 4);
  EXPECT_GE(std::count(last.begin(), last.end(), std::string("any_rank")), 4);
}

// A NaN loss is the user's diverged run: Megatron's message (rerun_state_machine.validate_result
// with reruns disabled), a UserError (exit 1), not an internal error.
TEST(Trainer, NanLossIsAUserErrorWithMegatronsMessage) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    TrainRun r(make_args({"--log-interval", "1"}));
    // NaN: every logit NaN. Inf: the label's logit -inf (labels are (token + 1) % V), so
    // loss = logsumexp - z[label] = +inf.
    for (int64_t t = 0; t < V; ++t)
      for (int64_t v = 0; v < V; ++v)
        if (std::isnan(bad) || v == (t + 1) % V) r.model.w_.data<float>()[t * V + v] = std::isnan(bad) ? bad : -bad;
    // Every position counted (inf x a 0 mask would be NaN, in Megatron's torch.sum too).
    BatchIterator train = [d = make_data(1)]() mutable {
      auto b = d();
      for (int64_t i = 0; i < b->loss_mask.numel(); ++i) b->loss_mask.data<float>()[i] = 1.0f;
      return b;
    };
    try {
      r.trainer->train_step(train);
      ADD_FAILURE() << "no error for a " << bad << " loss";
    } catch (const UserError& e) {
      const std::string what = std::isnan(bad) ? "NaN" : "Inf";
      const std::regex re("^Rank 0, node [^,]+, device cpu, iteration 1: Unexpected result (nan|inf|-inf) \\(message='found " +
                          what + " in local forward loss calculation'\\)");
      EXPECT_TRUE(std::regex_search(e.what(), re)) << e.what();
    }
  }
  // --no-check-for-nan-in-loss-and-grad: Megatron trains on.
  TrainRun off(make_args({"--no-check-for-nan-in-loss-and-grad", "--clip-grad", "0"}));
  for (int64_t i = 0; i < V * V; ++i) off.model.w_.data<float>()[i] = std::nanf("");
  BatchIterator train = make_data(1);
  EXPECT_NO_THROW(off.trainer->train_step(train));
}

// --log-progress: <save>/progress.txt in Megatron's format ("Starting job", then one "Saved
// checkpoint" line per save with throughputs, FLOPs and tokens).
TEST(Trainer, LogProgressWritesProgressTxt) {
  const std::string dir = std::filesystem::temp_directory_path() / ("mkprog_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Arguments args = make_args({"--save", dir, "--save-interval", "2", "--train-iters", "4", "--log-progress"});
  Bigram model;
  optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), model.optimizer_params());
  OptimizerParamScheduler sched(scheduler_options_from_args(args));
  TrainingHooks h;
  std::vector<int64_t> saves;
  h.save_checkpoint = [&](int64_t it) { saves.push_back(it); };
  Trainer t(args, model, opt, sched, h, [](const std::string&) {});
  BatchIterator train = make_data(1);
  t.pretrain(train, nullptr, nullptr);
  EXPECT_EQ(saves, (std::vector<int64_t>{2, 4}));
  std::ifstream f(dir + "/progress.txt");
  ASSERT_TRUE(f);
  std::vector<std::string> lines;
  for (std::string l; std::getline(f, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u);
  const std::string ts = R"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)";
  EXPECT_TRUE(std::regex_match(lines[0], std::regex(ts + "\tJob ID: [^\t]*\t# GPUs: 1\tStarting job"))) << lines[0];
  // FLOPs: num_floating_point_operations(args, 6) per iteration (the formula's own test is
  // TrainingLog.FlopsGptHandComputed); tokens = consumed samples x seq length = 24 x 4.
  const std::regex saved(ts + "\tJob ID: [^\t]*\t# GPUs: 1\tSaved checkpoint\tIteration: (\\d+)\tJob throughput: "
                              "\\d+\\.\\d TFLOP/s/GPU\tCumulative throughput: \\d+\\.\\d TFLOP/s/GPU\tFloating-point "
                              "operations: (\\d\\.\\d\\de[+-]\\d\\d)\tTokens \\(in billions\\): 0\\.00");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(lines[1], m, saved)) << lines[1];
  EXPECT_EQ(m[1], "2");
  const double f2 = std::stod(m[2]);
  ASSERT_TRUE(std::regex_match(lines[2], m, saved)) << lines[2];
  EXPECT_EQ(m[1], "4");
  EXPECT_NEAR(std::stod(m[2]) / f2, 2.0, 0.01);  // printed with 3 significant digits
  std::filesystem::remove_all(dir);
}
