// OptimizerParamScheduler vs Megatron-LM's own OptimizerParamScheduler (run as an oracle by
// tests/reference/training/gen_scheduler.py -> scheduler_cases.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>

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
