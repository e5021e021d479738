// OptimizerParamScheduler vs Megatron-LM's own OptimizerParamScheduler (run as an oracle by
// tests/reference/training/gen_scheduler.py -> scheduler_cases.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "megatron/core/optimizer_param_scheduler.h"
#include "megatron/core/utils/errors.h"

using megatron::OptimizerParamScheduler;

TEST(OptimizerParamScheduler, MatchesMegatronForEveryStyle) {
  std::ifstream f(std::string(MEGATRON_SOURCE_DIR) + "/tests/reference/training/scheduler_cases.txt");
  ASSERT_TRUE(f) << "fixture missing";
  std::string line;
  std::unique_ptr<OptimizerParamScheduler> s;
  double dec_max = 0, dec_min = 0;
  std::string name;
  int64_t prev = 0, checked = 0;
  std::set<std::string> styles;
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string kind;
    is >> kind;
    if (kind == "case") {
      OptimizerParamScheduler::Options o;
      int64_t warm;
      is >> name >> o.init_lr >> o.max_lr >> o.min_lr >> warm >> o.lr_decay_steps >> o.lr_decay_style >> o.start_wd >>
          o.end_wd >> o.wd_incr_steps >> o.wd_incr_style >> o.wsd_decay_steps >> o.lr_wsd_decay_style >> dec_max >>
          dec_min;
      o.lr_warmup_steps = static_cast<double>(warm);
      s = std::make_unique<OptimizerParamScheduler>(o);
      styles.insert(o.lr_decay_style == "WSD" ? "WSD-" + o.lr_wsd_decay_style : o.lr_decay_style);
      styles.insert("wd-" + o.wd_incr_style);
      prev = 0;
    } else if (kind == "step") {
      int64_t n;
      double lr, lr_dec, wd;
      is >> n >> lr >> lr_dec >> wd;
      s->step(n - prev);
      prev = n;
      ASSERT_EQ(s->num_steps(), n);
      // Same formula in double precision; tolerance: a few ulps from pow/cos/sqrt differences.
      EXPECT_NEAR(s->get_lr(), lr, 1e-15 + 1e-12 * std::fabs(lr)) << name << " step " << n;
      EXPECT_NEAR(s->get_lr(dec_max, dec_min), lr_dec, 1e-15 + 1e-12 * std::fabs(lr_dec)) << name << " step " << n;
      EXPECT_NEAR(s->get_wd(), wd, 1e-15 + 1e-12 * std::fabs(wd)) << name << " step " << n;
      ++checked;
    }
  }
  EXPECT_GT(checked, 500);
  for (const char* st : {"constant", "linear", "cosine", "inverse-square-root", "WSD-exponential", "WSD-linear",
                         "WSD-cosine", "WSD-minus_sqrt", "wd-constant", "wd-linear", "wd-cosine"}) {
    EXPECT_TRUE(styles.count(st)) << st;
  }
}

TEST(OptimizerParamScheduler, HandValuesAndErrors) {
  // Hand computation of docs/megatron-reference.md#lr-and-wd-schedule: warmup 10, decay 110, max 1, min 0.1, cosine.
  OptimizerParamScheduler::Options o;
  o.max_lr = 1.0;
  o.min_lr = 0.1;
  o.lr_warmup_steps = 10;
  o.lr_decay_steps = 110;
  o.lr_decay_style = "cosine";
  OptimizerParamScheduler s(o);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.0);  // n = 0 in warmup: init_lr
  s.step(5);
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.5);
  s.step(55);  // n = 60: r = 0.5 -> coeff 0.5 -> 0.1 + 0.5 * 0.9
  EXPECT_NEAR(s.get_lr(), 0.55, 1e-15);
  s.step(60);  // n = 120 > decay: min
  EXPECT_DOUBLE_EQ(s.get_lr(), 0.1);
  o.lr_warmup_steps = 110;
  EXPECT_THROW(OptimizerParamScheduler{o}, megatron::UserError);
}

namespace {
OptimizerParamScheduler::Options cosine_options(double max_lr) {
  OptimizerParamScheduler::Options o;
  o.max_lr = max_lr;
  o.min_lr = 0.1;
  o.lr_warmup_steps = 10;
  o.lr_decay_steps = 110;
  o.lr_decay_style = "cosine";
  return o;
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const megatron::UserError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// state_dict / load_state_dict against Megatron's optimizer_param_scheduler.py: the keys of its
// state_dict(), and _check_and_set's three behaviours (equal values continue; a differing value
// asserts unless --use-checkpoint-opt_param-scheduler takes the checkpoint's or
// --override-opt_param-scheduler keeps the class's, with Megatron's messages).
TEST(OptimizerParamScheduler, StateDictRoundTripAndCheckpointFlags) {
  OptimizerParamScheduler saved(cosine_options(1.0));
  saved.step(60);
  const nlohmann::json sd = saved.state_dict();
  std::set<std::string> keys;
  for (const auto& [k, v] : sd.items()) keys.insert(k);
  const std::set<std::string> megatron_keys = {"max_lr",   "lr_warmup_steps", "num_steps", "lr_decay_style",
                                               "lr_decay_steps", "min_lr",     "start_wd",  "end_wd",
                                               "wd_incr_style",  "wd_incr_steps"};
  EXPECT_EQ(keys, megatron_keys);
  EXPECT_EQ(sd.at("num_steps"), 60);

  // Same options: the position is restored, the schedule continues where it was.
  std::vector<std::string> log;
  auto sink = [&log](const std::string& s) { log.push_back(s); };
  OptimizerParamScheduler same(cosine_options(1.0));
  same.load_state_dict(sd, sink);
  EXPECT_EQ(same.num_steps(), 60);
  EXPECT_EQ(same.get_lr(), saved.get_lr());
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), " > using checkpoint value 1 for learning rate");

  // A different --lr: refused without a flag, naming both flags.
  OptimizerParamScheduler other(cosine_options(2.0));
  const std::string err = error_of([&] { other.load_state_dict(sd, nullptr); });
  EXPECT_NE(err.find("class input value 2 and checkpoint value 1 for learning rate"), std::string::npos) << err;
  EXPECT_NE(err.find("--use-checkpoint-opt_param-scheduler"), std::string::npos) << err;
  EXPECT_NE(err.find("--override-opt_param-scheduler"), std::string::npos) << err;

  // --use-checkpoint-opt_param-scheduler: the checkpoint's schedule (lr = the saved run's).
  OptimizerParamScheduler::Options use = cosine_options(2.0);
  use.use_checkpoint_opt_param_scheduler = true;
  OptimizerParamScheduler from_ckpt(use);
  from_ckpt.load_state_dict(sd, nullptr);
  EXPECT_EQ(from_ckpt.options().max_lr, 1.0);
  EXPECT_EQ(from_ckpt.get_lr(), saved.get_lr());

  // --override-opt_param-scheduler: the class's values stay, num_steps still comes back.
  OptimizerParamScheduler::Options ov = cosine_options(2.0);
  ov.override_opt_param_scheduler = true;
  OptimizerParamScheduler overridden(ov);
  log.clear();
  overridden.load_state_dict(sd, sink);
  EXPECT_EQ(overridden.options().max_lr, 2.0);
  EXPECT_EQ(overridden.num_steps(), 60);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.front(), " > overriding learning rate value to 2");

  // Both flags: refused (Megatron asserts 'both override and use-checkpoint are set.').
  OptimizerParamScheduler::Options both = ov;
  both.use_checkpoint_opt_param_scheduler = true;
  OptimizerParamScheduler b(both);
  EXPECT_NE(error_of([&] { b.load_state_dict(sd, nullptr); }).find("give at most one"), std::string::npos);
}
