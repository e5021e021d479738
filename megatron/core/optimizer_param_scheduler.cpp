#include "megatron/core/optimizer_param_scheduler.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>

#include "megatron/core/utils/errors.h"

namespace megatron {

OptimizerParamScheduler::OptimizerParamScheduler(const Options& o) : o_(o) {
  if (o_.min_lr < 0.0) user_error("--min-lr must be >= 0 (got ", o_.min_lr, ")");
  if (o_.max_lr < o_.min_lr) user_error("--lr (", o_.max_lr, ") must be >= --min-lr (", o_.min_lr, ")");
  if (o_.lr_decay_steps <= 0) user_error("the lr decay length (--lr-decay-iters/--lr-decay-samples or the training length) must be > 0");
  if (o_.lr_warmup_steps >= static_cast<double>(o_.lr_decay_steps))
    user_error("the lr warmup (", o_.lr_warmup_steps, " samples) must be shorter than the lr decay (",
               o_.lr_decay_steps, " samples)");
  if (o_.init_lr > o_.max_lr) user_error("--lr-warmup-init (", o_.init_lr, ") must be <= --lr (", o_.max_lr, ")");
  const std::string& s = o_.lr_decay_style;
  if (s != "constant" && s != "linear" && s != "cosine" && s != "inverse-square-root" && s != "WSD")
    user_error("--lr-decay-style: unsupported '", s, "'");
  if (s == "WSD") {
    if (o_.wsd_decay_steps <= 0) user_error("--lr-decay-style WSD needs --lr-wsd-decay-iters/-samples > 0");
    const std::string& w = o_.lr_wsd_decay_style;
    if (w != "exponential" && w != "linear" && w != "cosine" && w != "minus_sqrt")
      user_error("--lr-wsd-decay-style: unsupported '", w, "'");
  }
  if (o_.start_wd < 0 || o_.end_wd < 0) user_error("weight decay must be >= 0");
  if (o_.wd_incr_style != "constant" && o_.wd_incr_style != "linear" && o_.wd_incr_style != "cosine")
    user_error("--weight-decay-incr-style: unsupported '", o_.wd_incr_style, "'");
  if (o_.wd_incr_style == "constant" && o_.start_wd != o_.end_wd)
    user_error("--weight-decay-incr-style constant needs --start-weight-decay == --end-weight-decay");
  step(0);
}

double OptimizerParamScheduler::get_wd() const {
  if (num_steps_ > o_.wd_incr_steps) return o_.end_wd;
  if (o_.wd_incr_style == "constant") return o_.end_wd;
  const double ratio = static_cast<double>(num_steps_) / static_cast<double>(o_.wd_incr_steps);
  const double delta = o_.end_wd - o_.start_wd;
  double coeff = ratio;
  if (o_.wd_incr_style == "cosine") coeff = 0.5 * (std::cos(M_PI * (1.0 - ratio)) + 1.0);
  return o_.start_wd + coeff * delta;
}

double OptimizerParamScheduler::get_lr(double max_lr, double min_lr) const {
  const double n = static_cast<double>(num_steps_);
  if (o_.lr_warmup_steps > 0 && n <= o_.lr_warmup_steps) {
    return o_.init_lr + (max_lr - o_.init_lr) * n / o_.lr_warmup_steps;
  }
  if (o_.lr_decay_style == "constant") return max_lr;
  if (num_steps_ > o_.lr_decay_steps) return min_lr;
  if (o_.lr_decay_style == "inverse-square-root") {
    const double warmup = std::max(o_.lr_warmup_steps, 1.0);
    const double steps = static_cast<double>(std::max<int64_t>(num_steps_, 1));
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
  }
  const double ratio = (n - o_.lr_warmup_steps) / (static_cast<double>(o_.lr_decay_steps) - o_.lr_warmup_steps);
  const double delta = max_lr - min_lr;
  double coeff = 0.0;
  if (o_.lr_decay_style == "linear") {
    coeff = 1.0 - ratio;
  } else if (o_.lr_decay_style == "cosine") {
    coeff = 0.5 * (std::cos(M_PI * ratio) + 1.0);
  } else {  // WSD
    const int64_t anneal_start = o_.lr_decay_steps - o_.wsd_decay_steps;
    if (num_steps_ <= anneal_start) {
      coeff = 1.0;
    } else {
      const double r = static_cast<double>(num_steps_ - anneal_start) / static_cast<double>(o_.wsd_decay_steps);
      const std::string& w = o_.lr_wsd_decay_style;
      if (w == "linear") coeff = 1.0 - r;
      else if (w == "cosine") coeff = 0.5 * (std::cos(M_PI * r) + 1.0);
      else if (w == "exponential") coeff = 2.0 * std::pow(0.5, r) - 1.0;
      else coeff = 1.0 - std::sqrt(r);  // minus_sqrt
    }
  }
  return min_lr + coeff * delta;
}

nlohmann::json OptimizerParamScheduler::state_dict() const {
  return {{"max_lr", o_.max_lr},           {"lr_warmup_steps", o_.lr_warmup_steps}, {"num_steps", num_steps_},
          {"lr_decay_style", o_.lr_decay_style}, {"lr_decay_steps", o_.lr_decay_steps}, {"min_lr", o_.min_lr},
          {"start_wd", o_.start_wd},       {"end_wd", o_.end_wd},                   {"wd_incr_style", o_.wd_incr_style},
          {"wd_incr_steps", o_.wd_incr_steps}};
}

void OptimizerParamScheduler::load_state_dict(const nlohmann::json& sd,
                                              const std::function<void(const std::string&)>& log) {
  if (o_.override_opt_param_scheduler && o_.use_checkpoint_opt_param_scheduler)
    user_error("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler: give at most one");
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  auto text = [](const nlohmann::json& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof(buf), v.get<double>());
    return std::string(buf, r.ptr);
  };
  Options o = o_;
  const nlohmann::json mine = state_dict();
  auto check_and_set = [&](const char* key, const char* name, auto& field) {
    if (!sd.contains(key)) return;
    const nlohmann::json& ck = sd.at(key);
    if (o_.override_opt_param_scheduler) {
      say(std::string(" > overriding ") + name + " value to " + text(mine.at(key)));
      return;
    }
    if (!o_.use_checkpoint_opt_param_scheduler && ck != mine.at(key))
      user_error("OptimizerParamScheduler: class input value ", text(mine.at(key)), " and checkpoint value ", text(ck),
                 " for ", name, " do not match; pass --use-checkpoint-opt_param-scheduler to continue the "
                 "checkpoint's schedule or --override-opt_param-scheduler to use the flags' values");
    say(std::string(" > using checkpoint value ") + text(ck) + " for " + name);
    field = ck.get<std::remove_reference_t<decltype(field)>>();
  };
  check_and_set("max_lr", "learning rate", o.max_lr);
  check_and_set("min_lr", "minimum learning rate", o.min_lr);
  check_and_set("lr_warmup_steps", "warmup iterations", o.lr_warmup_steps);
  check_and_set("lr_decay_steps", "total number of iterations", o.lr_decay_steps);
  check_and_set("lr_decay_style", "learning rate decay style", o.lr_decay_style);
  check_and_set("start_wd", "start weight decay", o.start_wd);
  check_and_set("end_wd", "end weight decay", o.end_wd);
  check_and_set("wd_incr_steps", "total number of weight decay iterations", o.wd_incr_steps);
  check_and_set("wd_incr_style", "weight decay incr style", o.wd_incr_style);
  o_ = o;
  if (sd.contains("num_steps")) num_steps_ = sd.at("num_steps").get<int64_t>();
}

}  // namespace megatron
