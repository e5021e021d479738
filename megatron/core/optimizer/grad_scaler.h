// Loss scalers (Megatron megatron/core/optimizer/grad_scaler.py; docs/megatron-reference.md#loss-scaling).
#pragma once

namespace megatron::optimizer {

/// A loss scaler: the loss is multiplied by scale() before backward, grads by inv_scale() after.
class MegatronGradScaler {
 public:
  virtual ~MegatronGradScaler() = default;
  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  /// Called once per optimizer step with whether any (unscaled) grad was inf/NaN.
  virtual void update(bool found_inf) = 0;

 protected:
  explicit MegatronGradScaler(double initial) : scale_(initial) {}
  double scale_;
};

/// --loss-scale X: the scale never changes.
class ConstantGradScaler : public MegatronGradScaler {
 public:
  explicit ConstantGradScaler(double scale) : MegatronGradScaler(scale) {}
  void update(bool) override {}
};

/// Dynamic scaler for --fp16: starts at initial_scale; after `growth_interval` (--loss-scale-window)
/// consecutive clean steps the scale is multiplied by growth_factor (2) and the hysteresis tracker
/// is reset; on inf/NaN the growth tracker is reset, the hysteresis tracker is decremented, and once
/// it is <= 0 the scale becomes max(scale * backoff_factor (0.5), min_scale).
class DynamicGradScaler : public MegatronGradScaler {
 public:
  DynamicGradScaler(double initial_scale, double min_scale, double growth_factor, double backoff_factor,
                    int growth_interval, int hysteresis);
  void update(bool found_inf) override;
  int growth_tracker() const { return growth_tracker_; }
  int hysteresis_tracker() const { return hysteresis_tracker_; }
  /// Checkpoint state (Megatron's state_dict: scale, growth_tracker, hysteresis_tracker).
  void load_state(double scale, int growth_tracker, int hysteresis_tracker) {
    scale_ = scale;
    growth_tracker_ = growth_tracker;
    hysteresis_tracker_ = hysteresis_tracker;
  }

 private:
  double min_scale_, growth_factor_, backoff_factor_;
  int growth_interval_, hysteresis_;
  int growth_tracker_ = 0;
  int hysteresis_tracker_;
};

}  // namespace megatron::optimizer
