// OptimizerParamScheduler: learning-rate warmup/decay and weight-decay increment, counted in
// samples (megatron/core/optimizer_param_scheduler.py; docs/megatron-reference.md#lr-and-wd-schedule).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace megatron {

/// Per-group overrides of the schedule (Megatron's param_group 'max_lr'/'min_lr'/'lr_mult'/'wd_mult').
struct SchedulerGroup {
  double max_lr;
  double min_lr;
  double lr_mult = 1.0;
  double wd_mult = 1.0;
};

/// All step counts are in samples (iteration-based runs multiply iterations by the global batch
/// size, docs/megatron-reference.md#lr-and-wd-schedule). Throws UserError for an unknown style or an inconsistent configuration.
class OptimizerParamScheduler {
 public:
  struct Options {
    double init_lr = 0.0;         // --lr-warmup-init
    double max_lr = 0.0;          // --lr
    double min_lr = 0.0;          // --min-lr
    double lr_warmup_steps = 0;   // may be fractional (--lr-warmup-fraction × decay steps)
    int64_t lr_decay_steps = 0;
    std::string lr_decay_style = "linear";  // constant|linear|cosine|inverse-square-root|WSD
    double start_wd = 0.01;
    double end_wd = 0.01;
    int64_t wd_incr_steps = 0;
    std::string wd_incr_style = "constant";  // constant|linear|cosine
    int64_t wsd_decay_steps = 0;             // WSD only
    std::string lr_wsd_decay_style = "exponential";  // exponential|linear|cosine|minus_sqrt
    /// --override-opt_param-scheduler: load_state_dict keeps these options (the flags' values).
    bool override_opt_param_scheduler = false;
    /// --use-checkpoint-opt_param-scheduler: load_state_dict takes the checkpoint's values.
    bool use_checkpoint_opt_param_scheduler = false;
  };
  /// Constructs and steps with 0, as Megatron does.
  explicit OptimizerParamScheduler(const Options& o);

  /// LR for a group with the given max/min (the docs/megatron-reference.md#lr-and-wd-schedule function of num_steps()).
  double get_lr(double max_lr, double min_lr) const;
  /// LR for the default group (max_lr/min_lr of the options).
  double get_lr() const { return get_lr(o_.max_lr, o_.min_lr); }
  /// Weight decay at num_steps() (before the group's wd_mult).
  double get_wd() const;
  /// Advances by `increment` samples (the global batch size after a successful step).
  void step(int64_t increment) { num_steps_ += increment; }
  int64_t num_steps() const { return num_steps_; }
  void set_num_steps(int64_t n) { num_steps_ = n; }
  const Options& options() const { return o_; }
  /// Replaces the schedule's options (Megatron's load_state_dict with checkpoint values); not
  /// re-validated: the values come from a run that validated them.
  void set_options(const Options& o) { o_ = o; }

  /// Megatron's OptimizerParamScheduler.state_dict(): {"max_lr", "lr_warmup_steps", "num_steps",
  /// "lr_decay_style", "lr_decay_steps", "min_lr", "start_wd", "end_wd", "wd_incr_style",
  /// "wd_incr_steps"} (the checkpoint's "opt_param_scheduler" object).
  nlohmann::json state_dict() const;
  /// Megatron's OptimizerParamScheduler.load_state_dict (_check_and_set of each schedule field
  /// present in `sd`): with override_opt_param_scheduler the options stay and `log` gets
  /// " > overriding <name> value to <ours>"; with use_checkpoint_opt_param_scheduler the
  /// checkpoint's value is taken (" > using checkpoint value <theirs> for <name>"); otherwise a
  /// value that differs from ours is a UserError naming both flags, an equal one is logged as
  /// used. Restores num_steps. UserError when both flags are set. Values are printed with the
  /// shortest round-trip digits (an integral float prints as "1", where Python prints "1.0").
  /// `log` may be empty.
  void load_state_dict(const nlohmann::json& sd, const std::function<void(const std::string&)>& log);

 private:
  Options o_;
  int64_t num_steps_ = 0;
};

}  // namespace megatron
