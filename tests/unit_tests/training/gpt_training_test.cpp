// 10 optimizer steps of the tiny GPT through the Trainer equal a PyTorch training loop
// (tests/reference/training/gen_tiny_gpt_training.py: float64 model from the formulas,
// torch.optim.AdamW, clip_grad_norm_, Megatron's per-micro-batch loss normalisation), and the
// same seed gives bitwise-identical losses.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_utils/fixture_util.h"
#include "megatron/core/models/gpt/gpt_model.h"
#include "megatron/training/arguments.h"
#include "megatron/training/config_from_args.h"
#include "megatron/training/gpt_trainable.h"
#include "megatron/training/training.h"

using namespace megatron;
using namespace megatron::training;

namespace {

Arguments tiny_args(std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
      "--max-position-embeddings", "40", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters",
      "10", "--lr", "1e-3", "--lr-decay-style", "constant", "--weight-decay", "0.1", "--adam-beta2", "0.95",
      "--clip-grad", "1.0", "--hidden-dropout", "0", "--attention-dropout", "0", "--mock-data",
      "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--log-interval", "1"};
  f.insert(f.end(), extra.begin(), extra.end());
  Arguments a = parse_args(f);
  validate_args(a);
  set_padded_vocab_size(a, 128);
  return a;
}

struct Result {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> params;
};

Result train_tiny(const megatron::testing::Fixture& fx, bool load_weights) {
  Arguments args = tiny_args();
  models::gpt::GPTModel model(core_transformer_config_from_args(args), args.padded_vocab_size,
                              *args.max_position_embeddings, 1234);
  if (load_weights) {
    megatron::testing::Fixture w("tiny_gpt");
    for (auto& p : model.parameters()) p.data.copy_(w.get("param/" + p.name).to(p.data.dtype()));
  }
  GPTTrainable trainable(model);
  optimizer::MegatronOptimizer opt(optimizer_config_from_args(args), trainable.optimizer_params());
  OptimizerParamScheduler sched(scheduler_options_from_args(args));
  Trainer trainer(args, trainable, opt, sched, {}, [](const std::string&) {});
  int step = 0, mb = 0;
  BatchIterator data = [&]() -> std::optional<datasets::GPTBatch> {
    datasets::GPTBatch b;
    const std::string k = std::to_string(step) + "/" + std::to_string(mb);
    b.tokens = fx.get("tokens/" + k);
    b.labels = fx.get("labels/" + k);
    b.loss_mask = fx.get("loss_mask/" + k);
    std::vector<int64_t> pos(64);
    for (int i = 0; i < 64; ++i) pos[i] = i % 32;
    b.position_ids = Tensor::from_vector_i64(pos, {2, 32});
    if (++mb == 2) {
      mb = 0;
      ++step;
    }
    return b;
  };
  Result r;
  for (int i = 0; i < 10; ++i) {
    TrainStepResult s = trainer.train_step(data);
    r.losses.push_back(s.lm_loss.loss_sum / s.lm_loss.num_tokens);
    r.norms.push_back(*s.grad_norm);
  }
  for (auto& p : model.parameters()) r.params.push_back(p.data.to_float_vector());
  return r;
}

}  // namespace

TEST(GPTTraining, TenStepsMatchPyTorch) {
  megatron::testing::Fixture fx("../../training/data/tiny_gpt_training");
  Result r = train_tiny(fx, true);
  auto ref_loss = fx.get("lm_loss").to_float_vector();
  auto ref_norm = fx.get("grad_norm").to_float_vector();
  for (int i = 0; i < 10; ++i) {
    // fp32 model vs float64 reference: forward/backward agree to ~1e-6 relative (model tests use
    // 1e-5); after 10 Adam steps the drift stays well inside 1e-5 relative on the loss.
    EXPECT_NEAR(r.losses[i], ref_loss[i], 1e-5 * ref_loss[i]) << "step " << i + 1;
    EXPECT_NEAR(r.norms[i], ref_norm[i], 1e-4 * ref_norm[i]) << "step " << i + 1;
  }
  Arguments args = tiny_args();
  models::gpt::GPTModel names(core_transformer_config_from_args(args), 128, 40, 1);
  size_t i = 0;
  double worst = 0;
  for (auto& p : names.parameters()) {
    auto ref = fx.get("final/" + p.name).to_float_vector();
    double maxref = 0, maxdiff = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      maxref = std::max(maxref, std::fabs(static_cast<double>(ref[j])));
      maxdiff = std::max(maxdiff, std::fabs(static_cast<double>(r.params[i][j]) - ref[j]));
    }
    worst = std::max(worst, maxdiff / maxref);
    // 10 Adam steps of lr 1e-3 move a parameter by at most ~1e-2. Absolute tolerance 1e-5 (0.1% of
    // that budget; measured <= 1.7e-6). linear_qkv: 5e-5 (measured 2.8e-5) -- the key rows' grads
    // are tiny (the key-bias grad is exactly 0 in exact arithmetic: softmax is shift invariant),
    // so Adam's m/sqrt(v) normalisation magnifies fp32-vs-fp64 rounding noise there.
    const bool qkv = p.name.find("linear_qkv") != std::string::npos;
    EXPECT_LT(maxdiff, qkv ? 5e-5 : 1e-5) << p.name << " (max |param| " << maxref << ")";
    ++i;
  }
  (void)worst;
}

TEST(GPTTraining, SameSeedBitwiseIdentical) {
  megatron::testing::Fixture fx("../../training/data/tiny_gpt_training");
  Result a = train_tiny(fx, false), b = train_tiny(fx, false);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.params, b.params);
}
