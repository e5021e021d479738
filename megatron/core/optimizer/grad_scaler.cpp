#include "megatron/core/optimizer/grad_scaler.h"

#include <algorithm>

#include "megatron/core/utils/errors.h"

namespace megatron::optimizer {

DynamicGradScaler::DynamicGradScaler(double initial_scale, double min_scale, double growth_factor,
                                     double backoff_factor, int growth_interval, int hysteresis)
    : MegatronGradScaler(initial_scale),
      min_scale_(min_scale),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor),
      growth_interval_(growth_interval),
      hysteresis_(hysteresis),
      hysteresis_tracker_(hysteresis) {
  if (initial_scale <= 0) user_error("--initial-loss-scale must be > 0 (got ", initial_scale, ")");
  if (min_scale <= 0 || min_scale > initial_scale)
    user_error("--min-loss-scale must be in (0, --initial-loss-scale] (got ", min_scale, ")");
  if (growth_interval <= 0) user_error("--loss-scale-window must be > 0 (got ", growth_interval, ")");
  if (hysteresis <= 0) user_error("--hysteresis must be > 0 (got ", hysteresis, ")");
}

void DynamicGradScaler::update(bool found_inf) {
  if (found_inf) {
    growth_tracker_ = 0;
    hysteresis_tracker_ -= 1;
    if (hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * backoff_factor_, min_scale_);
  } else {
    growth_tracker_ += 1;
    if (growth_tracker_ == growth_interval_) {
      growth_tracker_ = 0;
      hysteresis_tracker_ = hysteresis_;
      scale_ = scale_ * growth_factor_;
    }
  }
}

}  // namespace megatron::optimizer
